"""What a run uses while it runs: GPU memory per device (NVML), the engine's unique memory, host
RAM and CPU — sampled by a background thread, stored raw.

- ``gpu_memory()``: one reading per NVIDIA GPU (NVML: used / total bytes, utilisation); None
  where NVML is absent (no driver, no GPU, no ``nvidia-ml-py``) — the caller says so, never 0.
- ``process_tree_memory(pid)``: the unique set size (USS: pages only this tree holds) and the
  RSS of ``pid`` and its children. USS, not RSS, is what a leak grows: RSS counts the mapped
  model file, which the page cache shares.
- ``ResourceSampler``: a context manager that samples both, plus host RAM used and CPU %, every
  ``interval_s``; ``record()`` is the raw series with idle (first), peak and after (last) per
  quantity, as bench and verify store it.

Reading these costs a few hundred microseconds per sample (USS reads /proc/PID/smaps), so the
default interval is 0.5 s: negligible next to a serving engine, and fine-grained enough for a
peak during a prefill.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ResourceSampler", "gpu_memory", "gpu_memory_of", "process_tree_memory", "summarize_samples"]


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """The pynvml module, initialised for the block and shut down after; None when NVML is
    unavailable (no driver, no GPU, no ``nvidia-ml-py``)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVML raises its own error types, or the module is absent
        yield None
        return
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def gpu_memory() -> list[dict[str, Any]] | None:
    """Per GPU: ``index``, ``name``, ``used_bytes``, ``total_bytes``, ``util_pct`` (None where
    the driver does not say); None when NVML is unavailable."""
    with _nvml() as pynvml:
        if pynvml is None:
            return None
        try:
            out: list[dict[str, Any]] = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                name = pynvml.nvmlDeviceGetName(h)
                try:
                    util: int | None = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                except pynvml.NVMLError:
                    util = None
                out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                            "used_bytes": int(mem.used), "total_bytes": int(mem.total), "util_pct": util})
            return out
        except Exception:  # noqa: BLE001
            return None


def gpu_memory_of(pids: set[int]) -> dict[int, int] | None:
    """GPU memory used by processes ``pids`` on each NVIDIA GPU (NVML), {gpu index: bytes};
    None when NVML is unavailable (no GPU, no driver) — the caller says so, never a zero."""
    with _nvml() as pynvml:
        if pynvml is None:
            return None
        try:
            out: dict[int, int] = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                used = sum(int(p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                           if p.pid in pids and p.usedGpuMemory)
                if used:
                    out[i] = used
            return out
        except Exception:  # noqa: BLE001
            return None


def process_tree_memory(pid: int) -> dict[str, Any] | None:
    """``uss_bytes`` / ``rss_bytes`` summed over ``pid`` and its children, ``cpu_s`` (user +
    system), ``pids``; ``uss_bytes`` is None where the OS does not give it. None when ``pid`` is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    uss: int | None = 0
    rss = 0
    cpu = 0.0
    pids: list[int] = []
    for proc in procs:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                times = proc.cpu_times()
                cpu += times.user + times.system
                try:
                    full = proc.memory_full_info()
                    uss = None if uss is None else uss + int(getattr(full, "uss", 0))
                except (psutil.AccessDenied, AttributeError):
                    uss = None
            pids.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    if not pids:
        return None
    return {"uss_bytes": uss, "rss_bytes": rss, "cpu_s": round(cpu, 3), "pids": pids}


def _host() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    return {"ram_used_bytes": int(vm.total - vm.available), "ram_total_bytes": int(vm.total),
            "cpu_pct": psutil.cpu_percent(interval=None)}


class ResourceSampler:
    """Sample GPU memory, the engine's process tree and the host every ``interval_s`` (context manager).

    ``pid``: the engine's process (the managed server), or None for a ``--url`` server, whose
    memory this machine cannot see (GPU and host figures are still taken). ``gpus`` False skips
    NVML (the caller knows there is none)."""

    def __init__(self, pid: int | None = None, *, interval_s: float = 0.5, gpus: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.gpus = gpus
        self.clock = clock
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engineroom-resources", daemon=True)
        self._nvml = True

    def sample(self) -> dict[str, Any]:
        """One reading now (also appended to ``samples``)."""
        out: dict[str, Any] = {"t": self.clock(), "host": _host()}
        if self.pid is not None:
            out["engine"] = process_tree_memory(self.pid)
        if self.gpus and self._nvml:
            gpu = gpu_memory()
            if gpu is None:
                self._nvml = False       # absent once, absent for the run: stop asking
            out["gpus"] = gpu
        self.samples.append(out)
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> ResourceSampler:
        import psutil

        psutil.cpu_percent(interval=None)       # prime: the first call measures from here
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    def record(self) -> dict[str, Any]:
        """The stored payload: the raw samples, and idle / peak / after per quantity."""
        return {"interval_s": self.interval_s, "pid": self.pid, "samples": list(self.samples),
                "summary": summarize_samples(self.samples)}


def _series(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}

    def put(key: str, value: object) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.setdefault(key, []).append(float(value))

    for s in samples:
        host = s.get("host") or {}
        put("host_ram_used_bytes", host.get("ram_used_bytes"))
        put("host_cpu_pct", host.get("cpu_pct"))
        engine = s.get("engine") or {}
        put("engine_uss_bytes", engine.get("uss_bytes"))
        put("engine_rss_bytes", engine.get("rss_bytes"))
        for gpu in s.get("gpus") or []:
            put(f"gpu{gpu.get('index')}_used_bytes", gpu.get("used_bytes"))
            put(f"gpu{gpu.get('index')}_util_pct", gpu.get("util_pct"))
    return out


def summarize_samples(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per quantity: ``idle`` (the first reading, before the load), ``peak``, ``after`` (the last)
    and ``n``; the engine's CPU seconds over the run as ``engine_cpu_s`` when both ends have it."""
    out: dict[str, dict[str, float]] = {}
    for key, values in _series(samples).items():
        out[key] = {"idle": values[0], "peak": max(values), "after": values[-1], "n": float(len(values))}
    cpu = [(s.get("engine") or {}).get("cpu_s") for s in samples]
    cpu_known = [c for c in cpu if isinstance(c, (int, float))]
    if len(cpu_known) >= 2:
        t = [s["t"] for s in samples if isinstance((s.get("engine") or {}).get("cpu_s"), (int, float))]
        wall = t[-1] - t[0]
        out["engine_cpu_s"] = {"total": cpu_known[-1] - cpu_known[0], "wall_s": wall,
                               "cores": (cpu_known[-1] - cpu_known[0]) / wall if wall > 0 else 0.0}
    return out
