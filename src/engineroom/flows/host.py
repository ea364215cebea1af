"""This machine, as a run's conditions name it (hardware names, no identities)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass



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

    from ..hardware import detect_rig

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
    except Exception as exc:  # noqa: BLE001 - hardware detection must never break a run
        summary["gpus"] = []
        summary["gpu_note"] = f"GPU detection failed: {type(exc).__name__}"
    return summary
