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


def check_port(port: int | None) -> int | None:
    """None: the default port; 0: a free port; anything else must be a TCP port number."""
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be between 1 and 65535 (0 picks a free port); got {port}.")
    return port


def check_ctx(ctx: int | None, arch, extra_args: Sequence[str], adapter) -> None:
    """fit's rule (positive, not beyond the model's positions unless RoPE scaling is asked for),
    with the engine's RoPE-scaling arguments found among the extra ones by its adapter."""
    from .fit import check_ctx as fit_check_ctx

    if ctx is None:
        return
    rope = adapter.rope_scaling_arg(extra_args)
    try:
        fit_check_ctx(arch, ctx, rope)
    except BadInput as exc:
        example = adapter.rope_scaling_example(-(-ctx // max(arch.max_position or 1, 1)))
        raise BadInput(f"{str(exc).rstrip('.')}: engine arguments go after `--`, e.g. `-- {example}`.") from None


@dataclass(frozen=True)
class Prepared:
    """Everything checked before anything is stopped or started (``switch`` relies on that)."""

    spec: object                # the adapter's LaunchSpec
    options: dict               # the launch options as the user gave them (kept for `switch`)


def prepare(
    model_ref: str,
    *,
    ctx: int | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    threads: int | None = None,
    parallel: int | None = None,
    kv_unified: bool | None = None,
    engine_bin: str | None = None,
    chat_template_file: Path | None = None,
    tools_template: bool = False,
    extra_args: Sequence[str] = (),
    timeout: float = 300.0,
    engine: str = engines.DEFAULT_ENGINE,
    say: Callable[[str], None] | None = None,
) -> Prepared:
    """Resolve and pull the model, find and check the engine, render its LaunchSpec; start nothing."""
    from .cpuprobe import probe_cpu

    options = dict(ctx=ctx, port=port, host=host, threads=threads, parallel=parallel, kv_unified=kv_unified,
                   engine_bin=str(engine_bin) if engine_bin else None,
                   chat_template_file=str(chat_template_file) if chat_template_file else None,
                   tools_template=tools_template, extra_args=list(extra_args), timeout=timeout, engine=engine)
    port = check_port(port)
    if ctx is not None and ctx <= 0:
        raise BadInput(f"--ctx must be a positive number of tokens; got {ctx}.")
    if parallel is not None and parallel <= 0:
        raise BadInput(f"--parallel must be at least 1; got {parallel}.")
    if threads is not None and threads <= 0:
        raise BadInput(f"--threads must be at least 1; got {threads}.")
    adapter = engines.adapter(engine)
    binary = adapter.find_binary(engine_bin)
    probe = probe_cpu()
    check_cpu = getattr(adapter, "check_binary_cpu", None)
    if check_cpu:
        check_cpu(binary, probe)
    mref, path = models.local_model(model_ref, say)
    if ctx is not None:
        from .arch import arch_from_gguf

        try:
            arch = arch_from_gguf(path)      # the GGUF header alone
        except BadInput:
            arch = None                      # a GGUF engineroom cannot describe: the engine has the last word
        if arch is not None:
            check_ctx(ctx, arch, extra_args, adapter)
    template = chat_template_file
    if tools_template:
        if template is not None:
            raise BadInput("give either --chat-template-file or --tools-template, not both.")
        if mref.tool_template is None:
            raise BadInput(f"{model_ref} has no tool-capable chat template in engineroom; pass --chat-template-file.")
        template = mref.tool_template
    adjust = getattr(adapter, "cpu_adjustments", None)
    changes = adjust(probe, extra_args) if adjust else []
    if port is None:
        port = DEFAULT_PORT
    elif port == 0:
        port = launch.free_port(host)
    spec = adapter.render(
        binary, path, port=port, host=host, ctx=ctx, threads=threads,
        parallel=parallel, kv_unified=kv_unified, chat_template_file=template, extra_args=extra_args,
        changes=changes, model_ref=mref.name,
    )
    return Prepared(spec, options)


def start(model_ref: str, *, timeout: float = 300.0,
          on_wait: Callable[[str, float], None] | None = None,
          on_spawn: Callable[[int], None] | None = None, **options) -> launch.ServerState:
    """Pull if needed, check the engine for this machine, render its command line, start it; return once healthy."""
    prepared = prepare(model_ref, timeout=timeout, **options)
    return launch.up(prepared.spec, timeout=timeout, on_wait=on_wait, on_spawn=on_spawn,
                     options=prepared.options)


def switch(model_ref: str, *, given: Sequence[str] = (), on_wait: Callable[[str, float], None] | None = None,
           **options) -> launch.ServerState:
    """Start MODEL in the managed server's place: checked first, stopped only once the new one is ready to go.

    Options the user did not give this time (``given`` lists the ones they did) are taken
    from the running server's launch, extra engine arguments included, and so is its port.
    """
    current = launch.read_state()
    previous = dict(current.options) if current and current.options else {}
    merged = dict(options)
    for key, value in previous.items():
        if key in merged and key not in given:
            merged[key] = value
    if current and "port" not in given:
        merged["port"] = current.port
    timeout = merged.pop("timeout", 300.0)
    prepared = prepare(model_ref, timeout=timeout, **merged)
    launch.down()
    return launch.up(prepared.spec, timeout=timeout, on_wait=on_wait, options=prepared.options)


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
    """What a measurement depends on: engine + version, model file, argv, host, and what engineroom changed."""
    cond: dict[str, object] = {
        "engine": info.engine, "engine_version": info.engine_version, "model_id": info.model_id,
        "url": info.url, "n_ctx": info.n_ctx, "total_slots": info.total_slots, "host": host_summary(),
    }
    from .cpuprobe import probe_cpu

    probe = probe_cpu()
    cond["cpu_probe"] = {"results": dict(probe.results), "forced": list(probe.forced)}
    state = launch.read_state()
    if state is not None and state.url == info.url:
        cond.update(model=state.model, model_path=state.model_path, argv=state.argv)
        if state.changes:
            cond["launch_changes"] = list(state.changes)
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
         tools_template: bool = True, keep: bool = False, extra_args: Sequence[str] = (),
         on_spawn: Callable[[int], None] | None = None,
         say: Callable[[str], None] | None = None,
         on_wait: Callable[[str, float], None] | None = None,
         on_result: Callable[[object], None] | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> DemoOutcome:
    """pull -> up -> verify -> bench -> card -> down, all in one stored run."""
    from .bench import BenchPlan, default_workloads
    from .report import render_card

    say = say or (lambda _m: None)
    models.pull(model, say)
    state = start(model, ctx=ctx, port=port if port is not None else 0, threads=threads,
                  tools_template=tools_template and models.resolve(model).tool_template is not None,
                  extra_args=extra_args, say=say, on_wait=on_wait, on_spawn=on_spawn)
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
