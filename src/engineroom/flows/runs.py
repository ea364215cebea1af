"""Measuring: connect to a server, run verify and bench into the store, the demo that chains it all."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import apikey, engines, launch, models
from ..engines.base import ServerInfo
from ..errors import BadInput, EngineroomError
from ..redaction import redact_data
from ..store import Store

if TYPE_CHECKING:
    from ..bench import BenchPlan
    from ..checks import CheckResult

from .host import host_summary
from .serving import start, stop


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
        "url": info.url, "n_ctx": info.n_ctx, "total_slots": info.total_slots, "host": host_summary(),
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
                                                                 "prediction_missing")}
        if state.engine_version:   # the binary's own --version beats a server's "b0-unknown"
            cond.update(engine_version=state.engine_version, engine_build_info=info.engine_version)
        model_file = Path(state.model_path)
        if model_file.is_file():
            cond["model_size_bytes"] = size = model_file.stat().st_size
            packaged = models.packaged_models().get(state.model)
            if packaged and packaged.size == size:
                cond["model_sha256"] = packaged.sha256          # checked when it was pulled
            elif size <= 4 * 1024**3:
                cond["model_sha256"] = models.sha256_file(model_file)
    return redact_data(cond)      # argv and URL are stored: no secret may ride along


# --------------------------------------------------------------------------- verify / bench
@contextlib.contextmanager
def _closing_run(store: Store, run_id: int) -> Iterator[None]:
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


@dataclass
class VerifyOutcome:
    run_id: int
    results: list
    failed: int


def verify(info: ServerInfo, store: Store, *, run_id: int | None = None,
           on_result: Callable[[CheckResult], None] | None = None, api_key: str | None = None) -> VerifyOutcome:
    """Run the smoke suite, storing each check as it finishes."""
    from dataclasses import asdict

    from ..checks import run_smoke
    from ..client import OpenAIClient

    own_run = run_id is None
    if run_id is None:
        run_id = store.start_run("verify", run_conditions(info))
    rid: int = run_id       # (for the closure: mypy does not narrow a captured variable)

    def record(result: CheckResult) -> None:
        store.add_record(rid, "check", asdict(result))
        if on_result:
            on_result(result)

    with _closing_run(store, run_id), OpenAIClient(info.url, api_key=api_key) as client:
        results = run_smoke(client, info, on_result=record)
    failed = sum(1 for r in results if r.status == "FAIL")
    if own_run:
        counts = {s: sum(1 for r in results if r.status == s) for s in ("PASS", "FAIL", "SKIP")}
        store.finish_run(run_id, "OK" if failed == 0 else "FAILED", counts)
    return VerifyOutcome(run_id, results, failed)


@dataclass
class BenchOutcome:
    run_id: int
    summary: dict


def bench(info: ServerInfo, store: Store, plan: BenchPlan, *, run_id: int | None = None,
          progress: Callable[[int, int, str], None] | None = None, api_key: str | None = None) -> BenchOutcome:
    """Run the bench plan, storing each request as it finishes; summary from the records."""
    from ..bench import bench_conditions, run_bench
    from ..client import OpenAIClient

    conditions = {**bench_conditions(info, plan), **run_conditions(info)}
    own_run = run_id is None
    if run_id is None:
        run_id = store.start_run("bench", conditions)
    rid: int = run_id       # (for the closure: mypy does not narrow a captured variable)
    engine = engines.adapter(info.engine) if engines.has_adapter(info.engine) else None

    def counters(when: str) -> None:
        """The engine's own counters (/metrics, neutral names) around the requests: the card
        sets their difference beside what the records add up to."""
        found = engine.metrics(info.url, api_key=api_key) if engine is not None else None
        if found:
            store.add_record(rid, "engine_metrics", {"when": when, "counters": found})

    with _closing_run(store, rid), OpenAIClient(info.url, api_key=api_key) as client:
        counters("before")
        result = run_bench(client, info, plan, progress=progress,
                           on_record=lambda rec: store.add_record(rid, "bench_request", rec))
        counters("after")
    if own_run:
        store.finish_run(run_id, result.status, result.summary)
    return BenchOutcome(run_id, result.summary)


@dataclass
class DemoOutcome:
    run_id: int
    card: str
    failed: int
    bench_status: str


def demo(store: Store, *, model: str = "smollm2-135m", port: int | None = None, ctx: int = 2048,
         threads: int | None = None, max_tokens: int = 256, warmup: int = 3, measured: int = 5,
         tools_template: bool = True, keep: bool = False, extra_args: Sequence[str] = (),
         on_spawn: Callable[[int], None] | None = None,
         say: Callable[[str], None] | None = None,
         on_wait: Callable[[str, float], None] | None = None,
         on_result: Callable[[CheckResult], None] | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> DemoOutcome:
    """pull -> up -> verify -> bench -> card -> down, all in one stored run."""
    from ..bench import BenchPlan, default_workloads
    from ..report import render_card

    say = say or (lambda _m: None)
    ref = models.resolve(model)          # resolved once; every stage below gets the same reference
    models.pull(ref, say)
    state = start(ref, ctx=ctx, port=port if port is not None else 0, threads=threads,
                  tools_template=tools_template and ref.tool_template is not None,
                  extra_args=extra_args, say=say, on_wait=on_wait, on_spawn=on_spawn)
    try:
        key = client_key(state.url)          # a key after `--` was moved to a file: read it back
        info = connect(state.url, api_key=key)
        plan = BenchPlan(workloads=default_workloads(max_tokens), warmup=warmup, measured=measured,
                         full_length=True)
        from ..bench import bench_conditions

        run_id = store.start_run("demo", {**bench_conditions(info, plan), **run_conditions(info)},
                                 label=f"engineroom demo: {model}")
        with _closing_run(store, run_id):
            say("verify")
            checked = verify(info, store, run_id=run_id, on_result=on_result, api_key=key)
            say("bench")
            benched = bench(info, store, plan, run_id=run_id, progress=progress, api_key=key)
        status = "OK" if checked.failed == 0 and benched.summary.get("status") == "OK" else "FAILED"
        store.finish_run(run_id, status, {"verify_failed": checked.failed, "bench": benched.summary})
    finally:
        if not keep:
            stop()
    card = render_card(store.get_run(run_id), store.records(run_id))
    return DemoOutcome(run_id, card, checked.failed, benched.summary.get("status", "?"))
