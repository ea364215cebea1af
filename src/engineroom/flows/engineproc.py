"""The engine's process and its memory, for a run.

Which pid a run reads: the managed server's (``managed_pid``), or, for a ``--url`` server on
this machine (a loopback URL), the process listening on the URL's port (``listening_engine``,
through psutil; where the OS will not say, the run goes on without it and says why). How the soak
reads memory each turn (``soak_memory``: NVML, the process tree's USS, the engine's /metrics),
and the ``resources`` record a run's sampler leaves (``recording_resources``, ``sampling_resources``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import launch
from ..engines.base import ServerInfo
from ..store import Store

if TYPE_CHECKING:
    from ..checks.soak import MemoryProbe
    from ..resources import ResourceSampler


@dataclass(frozen=True)
class EnginePid:
    """Whose processes a run reads: ``pid`` (None: none is known, ``why`` says why when there is a
    reason beyond "a --url server"), and the phrases the card and the ``resources`` record use."""

    pid: int | None
    tree: str = "the managed engine's process tree"
    record: str = "the managed server's process tree"
    why: str = ""

    @property
    def managed(self) -> bool:
        return self.tree == EnginePid.tree


def listening_engine(url: str) -> EnginePid:
    """The process listening on a loopback ``url``'s port (a server engineroom did not launch).

    psutil lists this machine's TCP sockets (``net_connections``); the LISTEN one on the port
    names the pid. Where it cannot (access denied: some OSes need root; another user's process,
    whose pid Linux hides), or the listener is engineroom itself or the process that started it
    (a test's in-process stand-in), no pid, and ``why`` says so. Not loopback: no pid, no why."""
    import os
    from urllib.parse import urlsplit

    import psutil

    if not _loopback(url):
        return EnginePid(None)
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return EnginePid(None)
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return EnginePid(None, why=f"the process listening on port {port} could not be looked up (psutil: access "
                                   "denied listing this machine's sockets; it needs root here)")
    except OSError as exc:
        return EnginePid(None, why=f"the process listening on port {port} could not be looked up "
                                   f"({type(exc).__name__}: {exc})")
    listening = [c for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    pids = {c.pid for c in listening if c.pid is not None}
    if not listening:
        return EnginePid(None, why=f"no process of this machine is seen listening on port {port}")
    if not pids:
        return EnginePid(None, why=f"the process listening on port {port} is another user's: its pid needs root")
    try:
        ours = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    except psutil.Error:
        ours = {os.getpid()}
    if pids <= ours:
        return EnginePid(None, why=f"the process listening on port {port} is engineroom itself or the one that "
                                   f"started it (pid {', '.join(map(str, sorted(pids)))}), not an engine")
    pids -= ours

    def parent(pid: int) -> int | None:
        try:
            return psutil.Process(pid).ppid()
        except psutil.Error:
            return None

    roots = sorted(p for p in pids if parent(p) not in pids)     # workers sharing one socket: their tree's root
    if len(roots) != 1:
        return EnginePid(None, why=f"{len(roots)} processes listen on port {port} (pids "
                                   f"{', '.join(map(str, roots))}): which one serves is not known")
    return EnginePid(roots[0], tree=f"the process tree listening on port {port} (found by its port: a server "
                                    "engineroom did not launch)",
                     record=f"the process tree listening on port {port}")


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


def _reported_memory(url: str, api_key: str | None) -> dict | None:
    """What the engine's own /metrics says of its memory, engine-neutrally: the standard Prometheus
    ``process_resident_memory_bytes`` (summed over the processes that report it); None without it."""
    from prometheus_client.parser import text_string_to_metric_families

    from .. import net

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = net.get(f"{url.rstrip('/')}/metrics", timeout=5.0, headers=headers)
    except Exception:  # noqa: BLE001 - a server without /metrics has nothing to report
        return None
    if resp.status_code != 200:
        return None
    total, series = 0.0, 0
    try:
        for family in text_string_to_metric_families(resp.text):
            for sample in family.samples:
                if sample.name == "process_resident_memory_bytes":
                    total += float(sample.value)
                    series += 1
    except ValueError:
        return None
    return {"bytes": int(total), "series": series} if series else None


def soak_memory(info: ServerInfo, pid: int | None, api_key: str | None,
                engine: EnginePid | None = None) -> tuple[MemoryProbe | None, str, ResourceSampler]:
    """How the soak reads memory each turn, and a background sampler (peaks within a turn, the
    ``resources`` record): NVML when the server runs on this machine and it has GPUs, else the
    engine's process-tree USS (``pid``: the managed engine's, or the listener ``engine`` names),
    else the engine's /metrics; (None, why) when none applies."""
    engine = engine or EnginePid(pid)
    import time

    from ..checks.soak import MemoryProbe
    from ..resources import ResourceSampler, gpu_memory, process_tree_memory

    local = pid is not None or _loopback(info.url)
    gpus = gpu_memory() if local else None
    sampler = ResourceSampler(pid, interval_s=1.0, gpus=bool(gpus), clock=time.perf_counter)

    def peak_of(key: Callable[[dict], int | None]) -> Callable[[float, float], int | None]:
        def peak(t0: float, t1: float) -> int | None:
            values = [v for s in list(sampler.samples) if t0 <= s.get("t", 0) <= t1 and (v := key(s)) is not None]
            return max(values) if values else None
        return peak

    if gpus:
        names = ", ".join(sorted({str(g.get("name")) for g in gpus}))

        def vram() -> dict | None:
            found = gpu_memory()
            if not found:
                return None
            out: dict = {"bytes": sum(int(g["used_bytes"]) for g in found),
                         "gpus": [{k: g.get(k) for k in ("index", "used_bytes", "total_bytes")} for g in found]}
            tree = process_tree_memory(pid) if pid is not None else None
            if tree is not None and isinstance(tree.get("uss_bytes"), int):
                out["host_bytes"] = int(tree["uss_bytes"])     # judged too: host RAM never shows in VRAM
            return out

        def sampled_vram(s: dict) -> int | None:
            found = s.get("gpus")
            return sum(int(g["used_bytes"]) for g in found) if found else None

        owner = "the managed engine's" if engine.managed else f"the engine's ({engine.record})"
        host = (f"; {owner} host memory (USS of pid {pid} and its children) is judged beside it"
                if pid is not None else "")
        return (MemoryProbe("nvml", f"total VRAM used on this machine's {len(gpus)} GPU(s) ({names}), through "
                                    f"NVML (every process on them counts){host}", vram, peak_of(sampled_vram)), "",
                sampler)
    if pid is not None:
        first = process_tree_memory(pid)
        if first is not None and first.get("uss_bytes") is not None:
            def uss() -> dict | None:
                found = process_tree_memory(pid)
                if found is None or found.get("uss_bytes") is None:
                    return None
                return {"bytes": int(found["uss_bytes"]), "rss_bytes": found.get("rss_bytes"),
                        "pids": len(found.get("pids") or [])}

            def sampled_uss(s: dict) -> int | None:
                value = (s.get("engine") or {}).get("uss_bytes")
                return int(value) if isinstance(value, int) else None

            return (MemoryProbe("uss", f"unique memory (USS) of {engine.tree} (pid {pid} and "
                                       "its children; RSS would count the mapped model file)", uss,
                                peak_of(sampled_uss)), "", sampler)
    reported = _reported_memory(info.url, api_key)
    if reported is not None:
        return (MemoryProbe("engine_report", "the engine's own /metrics: process_resident_memory_bytes (RSS as the "
                                             "engine reports it; it counts the mapped model, so only its growth "
                                             "means anything)",
                            lambda: _reported_memory(info.url, api_key)), "", sampler)
    gpu_part = "this machine has no NVML GPU" if local else "the server is not on this machine (NVML would not see it)"
    pid_part = (("the managed engine's USS cannot be read" if engine.managed
                 else f"the USS of {engine.record} (pid {pid}) cannot be read") if pid is not None
                else "no engine pid is known (a --url server" + (f": {engine.why}" if engine.why else "") + ")")
    note = (f"no memory source: {gpu_part}, {pid_part}, and {info.engine}'s /metrics reports no process memory; run "
            "the soak on the managed server (`engineroom up`) to read its process tree")
    return None, note, sampler


RESOURCES_KIND = "resources"      # the record kind of a run's resource samples (resources.ResourceSampler)


def managed_pid(info: ServerInfo) -> int | None:
    """The managed server's pid when ``info`` is that server and it is still running, else None
    (a ``--url`` server: this machine cannot see its processes)."""
    state = launch.read_state()
    if state is None or state.url != info.url.rstrip("/") or not launch.is_alive(state.pid, state.proc_created):
        return None
    return state.pid


@contextlib.contextmanager
def recording_resources(sampler: ResourceSampler, pid: int | None, store: Store, run_id: int,
                        engine: EnginePid | None = None) -> Iterator[None]:
    """Run ``sampler`` while the block runs; its raw series is stored as one ``resources`` record,
    also when the run is interrupted."""
    engine = engine or EnginePid(pid)
    try:
        with sampler:
            yield
    finally:
        payload = sampler.record()
        payload["engine_source"] = (f"{engine.record} (pid {pid})" if pid is not None
                                    else "not visible from this machine (a --url server"
                                    + (f": {engine.why}" if engine.why else "") + ")")
        store.add_record(run_id, RESOURCES_KIND, payload)


def engine_process(info: ServerInfo) -> EnginePid:
    """The managed engine's pid, else the process listening on a loopback URL's port."""
    pid = managed_pid(info)
    return EnginePid(pid) if pid is not None else listening_engine(info.url)


def sampling_resources(info: ServerInfo, store: Store, run_id: int,
                       engine: EnginePid | None = None) -> contextlib.AbstractContextManager[None]:
    """Sample GPU memory (NVML), the engine's process tree (USS, RSS and CPU: the managed server's,
    or the one listening on a loopback URL's port), the host and its cores' contention while the
    block runs, into the run's ``resources`` record."""
    from ..resources import ResourceSampler

    engine = engine or engine_process(info)
    return recording_resources(ResourceSampler(engine.pid), engine.pid, store, run_id, engine)


def quiet_host(engine: EnginePid, *, wait_s: float, busy_ok: bool,
               say: Callable[[str], None] | None = None) -> dict:
    """A bench's pre-flight: what other processes take of the cores the engine and the client run
    on (``resources.busy_now``). While it is over ``bench.guards.CONTENTION_MEAN_PCT``, wait up to
    ``wait_s`` seconds (saying so every reading), then refuse in one sentence; ``busy_ok``: one reading,
    no wait, no refusal (the run is judged on what it sees).
    Returns the ``preflight`` record (the last reading, how long it waited)."""
    import time

    from ..bench.guards import CONTENTION_MEAN_PCT
    from ..errors import BadInput
    from ..resources import busy_now

    def busy(r: dict) -> bool:
        return float(r.get("others_pct") or 0.0) > CONTENTION_MEAN_PCT or \
            float(r.get("steal_pct") or 0.0) > CONTENTION_MEAN_PCT

    def who(r: dict) -> str:
        top = ", ".join(f"{t['name']} (pid {t['pid']}) {t['cpu_pct']:.0f}%" for t in r.get("top") or [])
        return f"other processes take {float(r.get('others_pct') or 0):.0f}% of the engine's and the client's " \
               f"cores, steal {float(r.get('steal_pct') or 0):.0f}%" + (f"; the busiest: {top}" if top else "")

    t0 = time.monotonic()
    reading = busy_now(engine.pid, 1.0)
    while busy(reading) and not busy_ok and time.monotonic() - t0 < wait_s:
        if say:
            say(f"the machine is busy: {who(reading)}; waiting for it to quiet down "
                f"({time.monotonic() - t0:.0f} of {wait_s:g} s)")
        reading = busy_now(engine.pid, 2.0)
    waited = time.monotonic() - t0
    if busy(reading) and not busy_ok:
        raise BadInput(f"the machine is busy: {who(reading)} (limit {CONTENTION_MEAN_PCT:g}%, still after "
                       f"{waited:.0f} s); a benchmark here would measure the contention, not the engine. Stop "
                       "that work, give it longer with --quiet-wait S, or pass --busy-ok to measure anyway (the "
                       "run is then judged on the contention it saw).")
    if busy(reading) and say:
        say(f"the machine is busy ({who(reading)}); measuring anyway (--busy-ok): the run is judged on it")
    return {"reading": reading, "waited_s": round(waited, 1), "wait_s": wait_s, "busy_ok": busy_ok,
            "limit_pct": CONTENTION_MEAN_PCT, "engine": engine.record if engine.pid is not None else None}

