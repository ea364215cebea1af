"""Multi-stage commands: they call the stages in order and hand each what it needs.

``start`` = resolve/pull a model -> find the engine -> render its LaunchSpec -> launch.up.
``connect`` = find out what answers at a URL (engine adapters' probes).
Checks and bench never import the launcher; the flow gives them a ServerInfo.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Callable, Sequence

from . import engines, launch, models
from .engines import llamacpp
from .engines.base import ServerInfo
from .errors import BadInput

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
    say: Callable[[str], None] | None = None,
    on_wait: Callable[[str, float], None] | None = None,
) -> launch.ServerState:
    """Pull if needed, render the engine command line and start it; return once healthy."""
    binary = llamacpp.find_binary(engine_bin)      # the embedded default engine
    mref, path = models.local_model(model_ref, say)
    template = chat_template_file
    if tools_template:
        if template is not None:
            raise BadInput("give either --chat-template-file or --tools-template, not both.")
        if mref.tool_template is None:
            raise BadInput(f"{model_ref} has no tool-capable chat template in engineroom; pass --chat-template-file.")
        template = mref.tool_template
    spec = llamacpp.render(
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


def host_summary() -> dict[str, object]:
    """CPU / RAM / GPU of this machine for a run's conditions (names, not identities)."""
    import psutil

    from .hardware import detect as detect_hw  # type: ignore[attr-defined]

    summary: dict[str, object] = {
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 1e9, 1),
    }
    try:
        rig = detect_hw()
        summary["gpus"] = [g.name for g in rig.gpus]
    except Exception as exc:  # hardware detection must never break a run
        summary["gpus"] = []
        summary["gpu_note"] = f"detection failed: {type(exc).__name__}"
    return summary
