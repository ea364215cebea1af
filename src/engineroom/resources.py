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
- Contention (``cpu_reading``, ``contention``, ``busy_now``): each sample also keeps the CPU time
  of the cores the engine and this client may run on (their affinity: busy and steal seconds,
  ``psutil.cpu_times(percpu=True)``), this process's own CPU time and the load average; between
  two samples, the busy time of those cores less the engine's process tree and this client is
  what *other processes* took of them. llama.cpp's threads spin-wait, so a core shared with
  another process costs it far more than that process's share (decode fell ~50x on a busy
  2-core VM); bench judges the share (``bench.hostload``).

Reading these costs a few hundred microseconds per sample (USS reads /proc/PID/smaps), so the
default interval is 0.5 s: negligible next to a serving engine, and fine-grained enough for a
peak during a prefill.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ResourceSampler", "busy_now", "contention", "cpu_reading", "gpu_memory", "gpu_memory_of",
           "process_tree_memory", "summarize_samples", "watched_cores"]


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
    system, with what children that exited and were reaped had used: a worker that ends between
    two samples must not turn its CPU seconds into another process's), ``pids``; ``uss_bytes`` is
    None where the OS does not give it. None when ``pid`` is gone."""
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
                cpu += times.user + times.system + getattr(times, "children_user", 0.0) \
                    + getattr(times, "children_system", 0.0)
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


def watched_cores(pid: int | None) -> list[int]:
    """The cores the engine (``pid``'s affinity) and this client may run on, sorted; every core
    where the OS does not say."""
    import psutil

    n = psutil.cpu_count() or 1
    cores: set[int] = set()
    for proc_pid in ([pid] if pid is not None else []) + [os.getpid()]:
        try:
            cores.update(psutil.Process(proc_pid).cpu_affinity() or [])
        except (psutil.Error, AttributeError, OSError):     # no affinity call on this OS, or the pid is gone
            return list(range(n))
    return sorted(c for c in cores if 0 <= c < n) or list(range(n))


def cpu_reading(cores: list[int]) -> dict[str, Any]:
    """Cumulative CPU seconds of ``cores``: ``busy_s`` (user, nice, system, irq, softirq),
    ``steal_s`` (taken by the hypervisor), ``total_s``; this process's own CPU seconds
    (``self_cpu_s``: the client, every thread) and the 1-minute load average."""
    import psutil

    per = psutil.cpu_times(percpu=True)
    busy = steal = total = 0.0
    for i in cores:
        if i >= len(per):
            continue
        t = per[i]
        b = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        busy += b
        steal += getattr(t, "steal", 0.0)
        total += b + t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)
    own = psutil.Process().cpu_times()
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cores": list(cores), "busy_s": round(busy, 3), "steal_s": round(steal, 3), "total_s": round(total, 3),
            "self_cpu_s": round(own.user + own.system, 3), "load1": load}


def _window(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """What other processes took of the watched cores between samples ``a`` and ``b``."""
    ca, cb = a.get("cpu") or {}, b.get("cpu") or {}
    need = ("busy_s", "total_s", "self_cpu_s")
    if not all(isinstance(ca.get(k), (int, float)) and isinstance(cb.get(k), (int, float)) for k in need):
        return None
    cores = len(cb.get("cores") or []) or 1
    total = float(cb["total_s"]) - float(ca["total_s"])
    if total <= 0:
        return None
    ea, eb = (a.get("engine") or {}).get("cpu_s"), (b.get("engine") or {}).get("cpu_s")
    engine = float(eb) - float(ea) if isinstance(ea, (int, float)) and isinstance(eb, (int, float)) else None
    busy = float(cb["busy_s"]) - float(ca["busy_s"])
    own = float(cb["self_cpu_s"]) - float(ca["self_cpu_s"])
    others = busy - own - (engine or 0.0)
    steal = float(cb.get("steal_s") or 0.0) - float(ca.get("steal_s") or 0.0)
    return {"t": float(b.get("t") or 0.0), "wall_core_s": total, "cores": float(cores),
            "others_pct": max(0.0, others) / total * 100.0, "steal_pct": max(0.0, steal) / total * 100.0,
            "engine_pct": (engine / total * 100.0) if engine is not None else None,
            "client_pct": max(0.0, own) / total * 100.0, "engine_known": engine is not None}


def contention(samples: list[dict[str, Any]], *, window_s: float = 2.0) -> dict[str, Any] | None:
    """Other processes' share of the watched cores over ``samples`` (``ResourceSampler``'s): the
    mean over the whole run, the peak over windows of at least ``window_s`` (consecutive samples
    merged), the hypervisor's steal, the highest load average; None without two CPU readings."""
    with_cpu = [s for s in samples if isinstance(s.get("cpu"), dict)]
    if len(with_cpu) < 2:
        return None
    whole = _window(with_cpu[0], with_cpu[-1])
    if whole is None:
        return None
    peaks: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(with_cpu)):
        t0, t1 = with_cpu[start].get("t"), with_cpu[i].get("t")
        if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) and t1 - t0 >= window_s:
            w = _window(with_cpu[start], with_cpu[i])
            if w is not None:
                peaks.append(w)
            start = i
    peak = max(peaks, key=lambda w: w["others_pct"]) if peaks else whole
    loads = [s["cpu"].get("load1") for s in with_cpu if isinstance(s["cpu"].get("load1"), (int, float))]
    return {"cores": with_cpu[-1]["cpu"].get("cores"), "engine_known": bool(whole["engine_known"]),
            "others_pct": whole["others_pct"], "others_peak_pct": max(peak["others_pct"], whole["others_pct"]),
            "steal_pct": whole["steal_pct"], "steal_peak_pct": max((w["steal_pct"] for w in peaks), default=0.0),
            "engine_pct": whole["engine_pct"], "client_pct": whole["client_pct"],
            "load1_max": max(loads) if loads else None, "seconds": whole["wall_core_s"] / whole["cores"],
            "window_s": window_s, "windows": len(peaks)}


def busy_now(pid: int | None, seconds: float = 1.0) -> dict[str, Any]:
    """One contention reading over ``seconds`` now (a bench's pre-flight): ``contention``'s figures
    and ``top``, the other processes that used the most CPU in that time (name, pid, % of one core)."""
    import psutil

    cores = watched_cores(pid)
    engine = set((process_tree_memory(pid) or {}).get("pids") or []) if pid is not None else set()
    mine = {os.getpid()}

    def cpu_of_all() -> dict[int, tuple[str, float]]:
        out: dict[int, tuple[str, float]] = {}
        for proc in psutil.process_iter(["name", "cpu_times"]):
            times = proc.info.get("cpu_times")
            if times is not None and proc.pid not in engine and proc.pid not in mine:
                out[proc.pid] = (str(proc.info.get("name") or "?"), times.user + times.system)
        return out

    t0 = time.perf_counter()
    first = {"t": t0, "cpu": cpu_reading(cores), "engine": process_tree_memory(pid) if pid is not None else None}
    procs0 = cpu_of_all()
    time.sleep(seconds)
    t1 = time.perf_counter()
    last = {"t": t1, "cpu": cpu_reading(cores), "engine": process_tree_memory(pid) if pid is not None else None}
    procs1 = cpu_of_all()
    wall = max(t1 - t0, 1e-6)
    top = sorted(((name, p, (c - procs0[p][1]) / wall * 100.0) for p, (name, c) in procs1.items()
                  if p in procs0 and c > procs0[p][1]), key=lambda x: -x[2])[:3]
    found = contention([first, last], window_s=seconds) or {}
    return {**found, "top": [{"name": n, "pid": p, "cpu_pct": round(c, 1)} for n, p, c in top if c >= 1.0]}


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
        self._cores: list[int] | None = None

    def sample(self) -> dict[str, Any]:
        """One reading now (also appended to ``samples``)."""
        out: dict[str, Any] = {"t": self.clock(), "host": _host()}
        if self.pid is not None:
            out["engine"] = process_tree_memory(self.pid)
        if self._cores is None:
            self._cores = watched_cores(self.pid)
        out["cpu"] = cpu_reading(self._cores)
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
                "summary": summarize_samples(self.samples), "contention": contention(self.samples)}


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
