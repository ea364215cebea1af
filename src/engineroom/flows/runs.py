"""Measuring: connect to a server, run verify and bench into the store (``demo``, ``try``, ``ab``, ``tune`` and
``bakeoff`` chain them with the stage runner)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import apikey, engines, hardware, launch, models
from ..engines.base import ServerInfo
from ..errors import BadInput, EngineroomError
from ..redaction import redact_data
from ..speedpoints import POINT_KEY, point_from
from ..store import Store

if TYPE_CHECKING:
    from ..bench import BenchPlan
    from ..checks import CheckResult
    from ..checks.soak import SoakOptions

from .engineproc import (
    EnginePid,
    engine_process,
    listening_engine,
    managed_pid,
    quiet_host,
    recording_resources,
    sampling_resources,
    soak_memory,
)

__all__ = [
    "BenchOutcome", "HostGuard", "VerifyOutcome", "bench", "bench_suite", "client_key", "closing_run", "connect",
    "run_conditions", "verify", "verify_options",
]


def connect(url: str | None, api_key: str | None = None) -> ServerInfo:
    """ServerInfo for ``url``, or for the managed server when no URL is given."""
    from .. import net

    target = url.rstrip("/") if url else launch.managed_url()
    if not target.startswith(("http://", "https://")):
        raise BadInput(f"--url must start with http:// or https:// (got {target!r}).")
    try:
        return engines.detect(target, api_key=api_key)
    except EngineroomError:
        try:       # a server that wants a key says 401 where the probes expected an answer
            auth = {"Authorization": f"Bearer {api_key}"} if api_key else None
            refused = net.get(f"{target}/v1/models", timeout=5.0, headers=auth).status_code == 401
        except Exception:  # noqa: BLE001 - the original error is the one to report
            refused = False
        if refused:
            raise BadInput(apikey.unauthorized_message(bool(api_key))) from None
        raise


def client_key(url: str | None, *, api_key: str | None = None, api_key_env: str | None = None) -> str | None:
    """The key verify / bench send: the one given, else, for the managed server, the key of the file it
    was launched with (so no shell needs the key again), else none."""
    server_key_file = None
    if not api_key and not api_key_env:
        state = launch.read_state()
        if state is not None and (url is None or url.rstrip("/") == state.url) and engines.has_adapter(state.engine):
            server_key_file = engines.adapter(state.engine).api_key_file_in(state.argv)
    return apikey.for_client(api_key=api_key, api_key_env=api_key_env, server_key_file=server_key_file)


def run_conditions(info: ServerInfo) -> dict[str, object]:
    """What a measurement depends on: engine + version, model file, argv, host, and what engineroom changed."""
    cond: dict[str, object] = {
        "engine": info.engine, "engine_version": info.engine_version, "model_id": info.model_id,
        "url": info.url, "n_ctx": info.n_ctx, "total_slots": info.total_slots, "host": hardware.host_summary(),
    }
    from ..cpuprobe import probe_cpu

    probe = probe_cpu()
    cond["cpu_probe"] = {"results": dict(probe.results), "forced": list(probe.forced)}
    state = launch.read_state()
    if state is not None and state.url == info.url:
        cond.update(model=state.model, model_path=state.model_path, argv=state.argv)
        if state.changes:
            cond["launch_changes"] = list(state.changes)
        if state.memory.get("rows"):      # fit's prediction beside the engine's report, for the card
            cond["memory"] = {k: state.memory.get(k) for k in ("rows", "measured_source", "predicted_for",
                                                                 "prediction_missing", "placement")}
        if state.engine_version:   # the binary's own --version beats a server's "b0-unknown"
            cond.update(engine_version=state.engine_version, engine_build_info=info.engine_version)
        model_file = Path(state.model_path)
        if model_file.is_file():
            cond["model_size_bytes"] = model_file.stat().st_size
            # the served file's own digest (cached by path, size and mtime), never the catalog's copied
            cond["model_sha256"] = digest = models.file_sha256(model_file)
            packaged = models.packaged_models().get(state.model)
            if packaged and packaged.sha256 != digest:
                cond["model_sha256_catalog"] = packaged.sha256   # the file differs from the one pulled
    return redact_data(cond)      # argv and URL are stored: no secret may ride along


# --------------------------------------------------------------------------- verify / bench
@contextlib.contextmanager
def closing_run(store: Store, run_id: int) -> Iterator[None]:
    """A run that ends by Ctrl-C or an error is closed as INTERRUPTED / ERROR, never left 'running'."""
    try:
        yield
    except KeyboardInterrupt:
        store.finish_run(run_id, "INTERRUPTED")
        raise
    except Exception as exc:
        try:
            store.finish_run(run_id, "ERROR", {"error": f"{type(exc).__name__}: {exc}"})
        except Exception:  # noqa: BLE001 - the store itself failed; the original error is the one to report
            pass
        raise


def verify_options(suite: str, repeat: int = 1, mode: str | None = None, minutes: float | None = None,
                   turns: int | None = None, tries: int | None = None,
                   only: Sequence[str] = ()) -> SoakOptions | None:
    """The verify flags checked together, before a server is asked or a run stored: each soak /
    toolstream flag with its suite, each value sane, each ``--check`` a check of the suite
    (``BadInput``, one sentence); the soak's options."""
    from ..checks.suites import SELF_REPEATING, check_tries, suite_checks

    checks = suite_checks(suite)          # an unknown suite is refused
    if only:
        if not checks:
            raise BadInput(f"--check goes with --suite smoke or full (the {suite} suite is one run, not checks).")
        unknown = [n for n in only if n not in {name for name, _ in checks}]
        if unknown:
            raise BadInput(f"no check named {', '.join(unknown)} in the {suite} suite "
                           f"(its checks: {', '.join(name for name, _ in checks)}).")
    if repeat < 1:
        raise BadInput(f"--repeat must be at least 1, not {repeat}.")
    if suite in SELF_REPEATING and repeat != 1:
        raise BadInput(f"the {suite} suite repeats by {SELF_REPEATING[suite]}, not --repeat.")
    if tries is not None:
        if suite != "toolstream":
            raise BadInput("--tries goes with --suite toolstream.")
        check_tries(tries)
    if suite == "soak":
        from ..checks.soak import soak_options

        return soak_options(mode, minutes, turns)
    if mode is not None or minutes is not None or turns is not None:
        raise BadInput("--mode, --minutes and --turns go with --suite soak.")
    return None


@dataclass
class VerifyOutcome:
    run_id: int
    results: list
    failed: int
    suite: str = "smoke"
    baseline: dict | None = None      # checks.baseline.compare against --baseline RUN


def verify(info: ServerInfo, store: Store, *, run_id: int | None = None,
           on_result: Callable[[CheckResult], None] | None = None, api_key: str | None = None,
           suite: str = "smoke", repeat: int = 1, fast: bool = False, baseline: int | None = None,
           timeout_scale: float = 1.0, mode: str | None = None, minutes: float | None = None,
           turns: int | None = None, tries: int | None = None, only: Sequence[str] = (),
           on_turn: Callable[[dict], None] | None = None) -> VerifyOutcome:
    """Run a verify suite (smoke by default; full, stress, soak, toolstream), storing each check as it finishes.

    ``repeat`` runs each check K times (pass k/K); ``baseline`` names a stored run whose checks
    this one is compared with (what regressed). The stress suite gets the engine's tokenizer and
    counters through its adapter, and a restart callback when it checks the managed server. The
    soak suite (``mode``, bounded by ``minutes`` / ``turns``) stores each turn as a ``soak_turn``
    record as it ends (``on_turn`` sees it too) and reads memory per turn: VRAM through NVML when
    the server runs on this machine's GPUs, else the managed engine's process-tree USS, else the
    engine's own /metrics. The toolstream suite runs ``tries`` streamed tool calls. ``only``: the
    named checks of the smoke or full suite, in suite order.
    """
    from dataclasses import asdict

    from ..checks import run_smoke

    soak_opts = verify_options(suite, repeat, mode, minutes, turns, tries, only)
    before = None
    if baseline is not None:
        before = [r["payload"] for r in store.records(baseline, "check")]
        if not before:
            raise BadInput(f"run {baseline} holds no verify checks to compare with.")
    own_run = run_id is None
    if run_id is None:
        asked: dict[str, object] = {"suite": suite, "repeat": repeat, "fast": fast}
        if only:
            asked["checks"] = list(only)
        if soak_opts is not None:
            asked.update(mode=soak_opts.mode, minutes=soak_opts.minutes, turns=soak_opts.turns)
        if suite == "toolstream":
            asked["tries"] = tries
        conditions = {**run_conditions(info), "verify": asked}
        run_id = store.start_run("verify", conditions, label="" if suite == "smoke" else f"verify --suite {suite}")
    rid: int = run_id       # (for the closure: mypy does not narrow a captured variable)

    def record(result: CheckResult) -> None:
        store.add_record(rid, "check", asdict(result))
        if on_result:
            on_result(result)

    with closing_run(store, run_id):
        if suite == "smoke" and repeat == 1 and not only:
            from ..client import OpenAIClient

            with OpenAIClient(info.url, api_key=api_key) as client:
                results = run_smoke(client, info, on_result=record, timeout_scale=timeout_scale)
        else:
            results = _run_suite(info, store, rid, suite, repeat=repeat, fast=fast, api_key=api_key,
                                 on_result=record, timeout_scale=timeout_scale, soak=soak_opts, tries=tries,
                                 on_turn=on_turn, only=only)
        compared = None
        if before is not None and baseline is not None:
            from ..checks.baseline import compare

            compared = compare(before, [asdict(r) for r in results], baseline)
            store.add_record(rid, "check_baseline", compared)
    failed = sum(1 for r in results if r.status == "FAIL")
    if own_run:
        counts: dict[str, object] = {s: sum(1 for r in results if r.status == s) for s in ("PASS", "FAIL", "SKIP")}
        if compared is not None:
            counts["regressed"] = len(compared["regressed"])
        store.finish_run(run_id, "OK" if failed == 0 else "FAILED", counts)
    return VerifyOutcome(run_id, results, failed, suite, compared)


def _run_suite(info: ServerInfo, store: Store, run_id: int, suite: str, *, repeat: int, fast: bool,
               api_key: str | None, on_result: Callable[[CheckResult], None], timeout_scale: float,
               soak: SoakOptions | None = None, tries: int | None = None,
               on_turn: Callable[[dict], None] | None = None, only: Sequence[str] = ()) -> list:
    """The full / stress / soak / toolstream suites: the dialect stored first, the engine's own helpers
    handed in as callables (and, for the soak, how memory is read)."""
    from ..checks.context import RecordingClient
    from ..checks.suites import dialect_record, make_ctx, run_suite

    engine = engines.adapter(info.engine) if engines.has_adapter(info.engine) else None
    state = launch.read_state()
    managed = state is not None and state.url == info.url
    with RecordingClient(info.url, api_key=api_key) as client:
        ctx = make_ctx(client, info, timeout_scale=timeout_scale, fast=fast)
        if engine is not None:
            ctx.count_tokens = lambda text: engine.count_tokens(info.url, text, api_key=api_key)
            ctx.metrics = lambda: engine.metrics(info.url, api_key=api_key)
        store.add_record(run_id, "verify_dialect", dialect_record(ctx.dialect, info))
        restart = (lambda: _restart_managed(api_key)) if managed else None
        if suite != "soak":
            return run_suite(suite, client, info, repeat=repeat, on_result=on_result, timeout_scale=timeout_scale,
                             fast=fast, ctx=ctx, restart=restart, tries=tries, only=only)
        # the managed server's pid; a --url server on this machine: the process listening on its port
        engine_pid = EnginePid(managed_pid(info)) if managed else listening_engine(info.url)
        pid = engine_pid.pid
        probe, note, sampler = soak_memory(info, pid, api_key, engine_pid)

        def turn_done(rec: dict) -> None:
            store.add_record(run_id, "soak_turn", rec)
            if on_turn is not None:
                on_turn(rec)

        with recording_resources(sampler, pid, store, run_id, engine_pid):
            return run_suite(suite, client, info, on_result=on_result, timeout_scale=timeout_scale, fast=fast,
                             ctx=ctx, soak=soak, memory=probe, memory_note=note, on_turn=turn_done)


def _restart_managed(api_key: str | None) -> ServerInfo:
    """Start the managed server again with the argv it was launched with (a stress probe killed it)."""
    state = launch.read_state()
    if state is None:
        raise BadInput("there is no managed server to restart.")
    from ..engines.base import LaunchSpec

    spec = LaunchSpec(engine=state.engine, argv=tuple(state.argv), port=state.port, host=state.host,
                      env=dict(state.env), log_path=Path(state.log_path), model=state.model,
                      model_path=state.model_path, health_path=state.health_path,
                      engine_version=state.engine_version, changes=tuple(state.changes))
    launch.down()                 # whatever is left of it (a hung process) goes first
    launch.up(spec, args=state.args)
    return connect(state.url, api_key=api_key)


@dataclass
class BenchOutcome:
    run_id: int
    summary: dict


@dataclass(frozen=True)
class HostGuard:
    """The bench pre-flight's settings: wait up to ``wait_s`` for the machine to quiet down, then
    refuse unless ``busy_ok`` (``engineproc.quiet_host``)."""

    wait_s: float = 60.0
    busy_ok: bool = False
    say: Callable[[str], None] | None = None


def bench(info: ServerInfo, store: Store, plan: BenchPlan, *, run_id: int | None = None,
          progress: Callable[[int, int, str], None] | None = None, api_key: str | None = None,
          host: HostGuard | None = None) -> BenchOutcome:
    """Run the bench plan, storing each request as it finishes; summary (with the quick / long
    integrity checklist, ``bench.guards.summarize_bench``) from the stored records."""
    from ..bench import bench_conditions, run_bench
    from ..bench.clientside import ClientMonitor
    from ..bench.guards import PREFLIGHT_KIND, SLOT_SAMPLES_KIND, summarize_bench
    from ..bench.stats import CLIENT_LOAD_KIND
    from ..bench.watchdog import ABORT_KIND
    from ..client import OpenAIClient

    host = host or HostGuard()
    proc = engine_process(info)
    preflight = quiet_host(proc, wait_s=host.wait_s, busy_ok=host.busy_ok, say=host.say)
    conditions = {**bench_conditions(info, plan), **run_conditions(info)}
    own_run = run_id is None
    if run_id is None:
        run_id = store.start_run("bench", conditions)
    rid: int = run_id       # (for the closure: mypy does not narrow a captured variable)
    store.add_record(rid, PREFLIGHT_KIND, preflight)
    engine = engines.adapter(info.engine) if engines.has_adapter(info.engine) else None

    def counters(when: str) -> bool:
        """The engine's own counters (/metrics, neutral names) around the requests: the card
        sets their difference beside what the records add up to. False: the server has none."""
        found = engine.metrics(info.url, api_key=api_key) if engine is not None else None
        if found:
            store.add_record(rid, "engine_metrics", {"when": when, "counters": found})
        return bool(found)

    monitor = ClientMonitor()
    with closing_run(store, rid), OpenAIClient(info.url, api_key=api_key) as client:
        counted = counters("before")
        slots = _SlotSampler(engine, info.url, api_key) if engine is not None and not counted else None
        with sampling_resources(info, store, rid, proc), slots or contextlib.nullcontext():
            try:
                with monitor:
                    result = run_bench(client, info, plan, progress=progress,
                                       on_record=lambda rec: store.add_record(rid, "bench_request", rec))
            finally:
                store.add_record(rid, CLIENT_LOAD_KIND, monitor.record())
                if slots is not None and slots.record()["samples"]:
                    store.add_record(rid, SLOT_SAMPLES_KIND, slots.record())
        if result.aborted:
            store.add_record(rid, ABORT_KIND, result.aborted)
        counters("after")
    summary = summarize_bench(store.records(rid), conditions)
    point = _speed_point(info, summary)
    if point is not None:          # a calibration point for the next plan on this machine (speedpoints)
        summary[POINT_KEY] = point
    if own_run:
        store.finish_run(run_id, summary["status"], summary)
    return BenchOutcome(run_id, summary)


def _speed_point(info: ServerInfo, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The speed point of this bench: the managed server at ``info.url`` launched from a plan's pick."""
    state = launch.read_state()
    if state is None or state.url != info.url or not isinstance(state.memory, dict):
        return None
    kept = state.memory.get("plan")
    if not isinstance(kept, dict) or kept.get("typed"):    # no pick, or settings typed over it
        return None
    row = kept.get("row")
    return point_from(row, summary) if isinstance(row, dict) else None


class _SlotSampler:
    """Busy slots of a server without counters, sampled every ``interval_s`` while bench runs its
    sequential requests (a context manager; a thread): two busy at once is another client's request."""

    def __init__(self, engine: engines.Engine, url: str, api_key: str | None, interval_s: float = 0.25) -> None:
        self._engine, self._url, self._key, self._interval = engine, url, api_key, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slot-sampler", daemon=True)
        self.samples = self.max_busy = self.overlapping = 0

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            busy = self._engine.busy_slots(self._url, api_key=self._key)
            if busy is None:
                continue
            self.samples += 1
            self.max_busy = max(self.max_busy, busy)
            self.overlapping += busy >= 2

    def __enter__(self) -> _SlotSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def record(self) -> dict:
        return {"samples": self.samples, "max_busy": self.max_busy, "overlapping": self.overlapping,
                "interval_s": self._interval}


def _roofline_basis(info: ServerInfo, depths: Sequence[int]) -> dict:
    """What the roofline share needs (bench.roofline): the model file (the managed server's, or
    the one the engine names), the KV type launched, and this machine's memory bandwidth."""
    from ..bench.roofline import roofline_basis
    from ..hardware import detect_rig

    state = launch.read_state()
    ours = state is not None and state.url == info.url
    model_path = state.model_path if state is not None and ours else info.extra.get("model_path")
    kv, kv_source = None, "assumed: the server was not launched by engineroom, so its KV type is not known"
    if state is not None and ours:
        request = state.memory.get("fit_request") if isinstance(state.memory, dict) else None
        kv = request.get("kv_dtype") if isinstance(request, dict) else None
        kv_source = "the launch's (its fit request)" if kv else "assumed: the launch recorded no KV type"
    rig = detect_rig()
    if rig.gpus:
        known = [g.bandwidth_gbs for g in rig.gpus if g.bandwidth_gbs]
        bw = min(known) if known and len(known) == len(rig.gpus) else None
        source = "the GPU's datasheet bandwidth (catalog)"
    else:
        bw, source = rig.cpu_bandwidth_gbs, rig.cpu_bandwidth_source
    basis = roofline_basis(str(model_path) if model_path else None, info.engine, kv, info.n_ctx, bw, source,
                           depths=depths)
    return {**basis, "kv_source": kv_source}


def bench_suite(info: ServerInfo, store: Store, name: str, *, streams: int | None = None,
                prompt_file: Path | None = None, measured: int | None = None, warmup: int | None = None,
                max_tokens: int | None = None, depths: Sequence[int] | None = None, prompt_tokens: int | None = None,
                turns: int | None = None, budget_s: float | None = None, rate: float | None = None,
                duration_s: float | None = None, requests: int | None = None, slo_ttft_ms: float | None = None,
                slo_itl_ms: float | None = None, stall_floor_s: float | None = None, host: HostGuard | None = None,
                progress: Callable[[int, int, str], None] | None = None, api_key: str | None = None) -> BenchOutcome:
    """Run a longer suite (bench.suites: standard, depth, concurrency, spec, agentic, sweep, rate),
    storing each request as it finishes, with the engine's tokenizer, counters and slot count
    through its adapter. ``depths`` are the sweep's prompt sizes for ``sweep``; ``duration_s`` /
    ``requests`` bound the rate schedule (one given alone replaces the suite's default)."""
    from ..bench.agentic.session import ToolKindClient
    from ..bench.clientside import KindClient
    from ..bench.suites.context import SuiteContext, suite_conditions
    from ..bench.suites.run import run_suite
    from ..bench.suites.specs import load_prompt_file, suite_spec

    spec = suite_spec(name)
    if spec is None:
        raise BadInput(f"there is no bench suite {name!r}.")
    changes: dict = {}
    if measured is not None:
        changes.update(measured=measured, rounds=measured)
    if warmup is not None:
        changes["warmup"] = warmup
    if max_tokens is not None:
        changes["max_tokens"] = max_tokens
    if prompt_tokens is not None:
        changes["prompt_tokens"] = prompt_tokens
    if depths and spec.kind == "sweep":
        changes["contexts"] = tuple(sorted({int(d) for d in depths}))
    elif depths:
        changes.update(depths=tuple(sorted(int(d) for d in depths)), near_end=False)
    for key, value in (("turns", turns), ("budget_s", budget_s), ("rate", rate), ("slo_ttft_ms", slo_ttft_ms),
                       ("slo_itl_ms", slo_itl_ms)):
        if value is not None:
            changes[key] = value
    if duration_s is not None or requests is not None:
        changes.update(duration_s=duration_s, requests=requests)
    spec = spec.with_(**changes) if changes else spec
    engine = engines.adapter(info.engine) if engines.has_adapter(info.engine) else None
    extra = load_prompt_file(prompt_file, max_tokens or 256) if prompt_file else ()
    if extra and spec.kind != "standard":
        raise BadInput("--prompts goes with the standard suite.")
    ctx = SuiteContext(
        server=info, new_client=lambda: (ToolKindClient if spec.kind == "agentic" else KindClient)(info.url,
                                                                                                 api_key=api_key),
        count_tokens=(lambda text: engine.count_tokens(info.url, text, api_key=api_key)) if engine else None,
        metrics=(lambda: engine.metrics(info.url, api_key=api_key)) if engine else None,
        progress=progress, streams=streams, extra_workloads=extra)
    if stall_floor_s is not None:
        ctx.stall_floor_s = stall_floor_s
    if engine is not None and ctx.count_tokens and ctx.count_tokens("tokenizer probe") is None:
        ctx.count_tokens = None          # the engine has no tokenizer endpoint: sizes are estimated, and say so
    conditions = {**suite_conditions(spec, ctx), **run_conditions(info)}
    conditions["roofline"] = _roofline_basis(info, conditions["bench"].get("depths") or ())
    from ..bench.guards import PREFLIGHT_KIND

    host = host or HostGuard()
    proc = engine_process(info)
    preflight = quiet_host(proc, wait_s=host.wait_s, busy_ok=host.busy_ok, say=host.say)
    run_id = store.start_run("bench", conditions, label=f"bench {spec.name}")
    store.add_record(run_id, PREFLIGHT_KIND, preflight)
    ctx.emit = lambda kind, payload: store.add_record(run_id, kind, payload)
    with closing_run(store, run_id), sampling_resources(info, store, run_id, proc):
        result = run_suite(spec, ctx)
    from ..bench.suites.summary import summarize_suite

    summary = summarize_suite(store.records(run_id), store.get_run(run_id)["conditions"])
    store.finish_run(run_id, summary["status"], summary)
    return BenchOutcome(run_id, summary if result is not None else {})
