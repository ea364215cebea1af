"""Multi-stage commands: they call the stages in order and hand each what it needs.

``start`` = resolve/pull a model -> find the engine -> render its LaunchSpec -> launch.up.
``connect`` = find out what answers at a URL (engine adapters' probes).
Checks and bench never import the launcher; the flow gives them a ServerInfo.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from . import engines, launch, models
from .engines.base import ServerInfo
from .errors import BadInput
from .store import Store

DEFAULT_PORT = 8080


def start(
    model_ref: str,
    *,
    ctx: int | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    threads: int | None = None,
    parallel: int | None = None,
    engine_bin: str | None = None,
    chat_template_file: Path | None = None,
    tools_template: bool = False,
    extra_args: Sequence[str] = (),
    timeout: float = 300.0,
    engine: str = engines.DEFAULT_ENGINE,
    say: Callable[[str], None] | None = None,
    on_wait: Callable[[str, float], None] | None = None,
) -> launch.ServerState:
    """Pull if needed, render the engine command line and start it; return once healthy."""
    adapter = engines.adapter(engine)
    binary = adapter.find_binary(engine_bin)
    mref, path = models.local_model(model_ref, say)
    template = chat_template_file
    if tools_template:
        if template is not None:
            raise BadInput("give either --chat-template-file or --tools-template, not both.")
        if mref.tool_template is None:
            raise BadInput(f"{model_ref} has no tool-capable chat template in engineroom; pass --chat-template-file.")
        template = mref.tool_template
    spec = adapter.render(
        binary, path, port=port or DEFAULT_PORT, host=host, ctx=ctx, threads=threads,
        parallel=parallel, chat_template_file=template, extra_args=extra_args,
        model_ref=mref.name,
    )
    return launch.up(spec, timeout=timeout, on_wait=on_wait)


def switch(model_ref: str, **kwargs) -> launch.ServerState:
    """down + up, keeping the previous port unless another is given."""
    previous = launch.down()
    if previous and not kwargs.get("port"):
        kwargs["port"] = previous.port
    return start(model_ref, **kwargs)


def connect(url: str | None) -> ServerInfo:
    """ServerInfo for ``url``, or for the managed server when no URL is given."""
    target = url.rstrip("/") if url else launch.managed_url()
    if not target.startswith(("http://", "https://")):
        raise BadInput(f"--url must start with http:// or https:// (got {target!r}).")
    return engines.detect(target)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_summary() -> dict[str, object]:
    """CPU / RAM / GPU of this machine for a run's conditions (hardware names, no identities)."""
    import psutil

    from .hardware import detect_rig

    summary: dict[str, object] = {
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
    }
    try:
        rig = detect_rig()
        summary["gpus"] = [{"name": g.name, "vram_bytes": g.vram_bytes} for g in rig.gpus]
    except Exception as exc:  # hardware detection must never break a run
        summary["gpus"] = []
        summary["gpu_note"] = f"GPU detection failed: {type(exc).__name__}"
    return summary


def run_conditions(info: ServerInfo) -> dict[str, object]:
    """What a measurement depends on: engine + version, model file, argv, host."""
    cond: dict[str, object] = {
        "engine": info.engine, "engine_version": info.engine_version, "model_id": info.model_id,
        "url": info.url, "n_ctx": info.n_ctx, "total_slots": info.total_slots, "host": host_summary(),
    }
    state = launch.read_state()
    if state is not None and state.url == info.url:
        cond.update(model=state.model, model_path=state.model_path, argv=state.argv)
        if state.engine_version:   # the binary's own --version beats a server's "b0-unknown"
            cond.update(engine_version=state.engine_version, engine_build_info=info.engine_version)
        model_file = Path(state.model_path)
        if model_file.is_file():
            cond["model_size_bytes"] = model_file.stat().st_size
            packaged = models.packaged_models().get(state.model)
            if packaged and packaged.size == cond["model_size_bytes"]:
                cond["model_sha256"] = packaged.sha256          # checked when it was pulled
            elif cond["model_size_bytes"] <= 4 * 1024**3:
                cond["model_sha256"] = models.sha256_file(model_file)
    return cond


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
        except Exception:  # the store itself failed; the original error is the one to report
            pass
        raise


@dataclass
class VerifyOutcome:
    run_id: int
    results: list
    failed: int


def verify(info: ServerInfo, store: Store, *, run_id: int | None = None,
           on_result: Callable[[object], None] | None = None) -> VerifyOutcome:
    """Run the smoke suite, storing each check as it finishes."""
    from dataclasses import asdict

    from .checks import run_smoke
    from .client import OpenAIClient

    own_run = run_id is None
    if own_run:
        run_id = store.start_run("verify", run_conditions(info))

    def record(result) -> None:
        store.add_record(run_id, "check", asdict(result))
        if on_result:
            on_result(result)

    with _closing_run(store, run_id), OpenAIClient(info.url) as client:
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


def bench(info: ServerInfo, store: Store, plan, *, run_id: int | None = None,
          progress: Callable[[int, int, str], None] | None = None) -> BenchOutcome:
    """Run the bench plan, storing each request as it finishes; summary from the records."""
    from .bench import bench_conditions, run_bench
    from .client import OpenAIClient

    conditions = {**bench_conditions(info, plan), **run_conditions(info)}
    own_run = run_id is None
    if own_run:
        run_id = store.start_run("bench", conditions)
    with _closing_run(store, run_id), OpenAIClient(info.url) as client:
        result = run_bench(client, info, plan, progress=progress,
                           on_record=lambda rec: store.add_record(run_id, "bench_request", rec))
    if own_run:
        store.finish_run(run_id, result.status, result.summary)
    return BenchOutcome(run_id, result.summary)


@dataclass
class DemoOutcome:
    run_id: int
    card: str
    failed: int
    bench_status: str


def demo(store: Store, *, model: str = "smollm2-135m", port: int | None = None, ctx: int = 4096,
         threads: int | None = None, max_tokens: int = 256, warmup: int = 3, measured: int = 5,
         tools_template: bool = True, keep: bool = False,
         say: Callable[[str], None] | None = None,
         on_wait: Callable[[str, float], None] | None = None,
         on_result: Callable[[object], None] | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> DemoOutcome:
    """pull -> up -> verify -> bench -> card -> down, all in one stored run."""
    from .bench import BenchPlan, default_workloads
    from .report import render_card

    say = say or (lambda _m: None)
    models.pull(model, say)
    state = start(model, ctx=ctx, port=port or launch.free_port(), threads=threads,
                  tools_template=tools_template and models.resolve(model).tool_template is not None,
                  say=say, on_wait=on_wait)
    try:
        info = connect(state.url)
        plan = BenchPlan(workloads=default_workloads(max_tokens), warmup=warmup, measured=measured,
                         full_length=True)
        from .bench import bench_conditions

        run_id = store.start_run("demo", {**bench_conditions(info, plan), **run_conditions(info)},
                                 label=f"engineroom demo: {model}")
        with _closing_run(store, run_id):
            say("verify")
            checked = verify(info, store, run_id=run_id, on_result=on_result)
            say("bench")
            benched = bench(info, store, plan, run_id=run_id, progress=progress)
        status = "OK" if checked.failed == 0 and benched.summary.get("status") == "OK" else "FAILED"
        store.finish_run(run_id, status, {"verify_failed": checked.failed, "bench": benched.summary})
    finally:
        if not keep:
            launch.down()
    card = render_card(store.get_run(run_id), store.records(run_id))
    return DemoOutcome(run_id, card, checked.failed, benched.summary.get("status", "?"))
