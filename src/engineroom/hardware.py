"""What a machine has (this one, through NVML and psutil) or what a rig spec describes.

CONTRACT: ``Rig`` / ``GpuSpec`` are the hardware input of fit and plan. Detection of this
machine and parsing of rig spec strings ("2x3090", "1xH200", "cpu:64GB") live here;
hardware classes (VRAM, bandwidth, compute capability) come from the catalog.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import BadInput
from .units import MiB

if TYPE_CHECKING:
    import numpy as np

    from .catalog import Catalog, HardwareClass

GB = 1_000_000_000
MAX_GPUS_PER_CLASS = 16


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: memory, bandwidth, compute capability (from a rig spec, the catalog or NVML)."""

    name: str                         # "RTX 3090", "H200"
    vram_bytes: int                   # total memory of the device
    bandwidth_gbs: float | None       # datasheet memory bandwidth, GB/s
    compute_capability: str | None    # "8.6"; None for non-NVIDIA
    vendor: str = "nvidia"            # nvidia | amd | apple | intel
    free_bytes: int | None = None     # detected free memory (None for a rig spec)
    hw_class: str | None = None       # catalog hardware class id ("3090"), when known
    unified: bool = False             # shares memory with the CPU (Apple M-series)
    uuid: str | None = None           # detected devices only


@dataclass(frozen=True)
class Rig:
    """The machine a plan is for: its GPUs (one node's), CPU, RAM and nodes."""

    gpus: tuple[GpuSpec, ...]         # empty = CPU only
    cpu_ram_bytes: int | None = None
    cpu_cores: int | None = None
    cpu_bandwidth_gbs: float | None = None   # what plan assumes for decode on the CPU (at cpu_threads)
    p2p: bool | None = None           # NVLink/P2P between GPUs when known
    label: str = ""                   # the spec string or "this machine"
    driver: str | None = None         # NVIDIA driver version (detected rigs)
    nvlink: bool | None = None        # any active NVLink between the GPUs (detected rigs)
    notes: tuple[str, ...] = ()       # e.g. "no NVIDIA GPU detected (...)"
    source: str = "spec"              # "spec" | "detected"
    # ---- added (defaulted) -------------------------------------------------------------
    cpu_model: str | None = None      # /proc/cpuinfo "model name" (detected rigs)
    cpu_threads: int | None = None    # threads a CPU decode runs with (llama-server's default)
    cpu_bandwidth_source: str = ""    # where cpu_bandwidth_gbs comes from (probe or catalog default)
    cpu_bandwidth_by_threads: tuple[tuple[int, float], ...] = ()   # measured copy GB/s per thread count
    # identical nodes of ``gpus`` each (a spec like 2x(8xH100)); ``gpus`` are ONE node's GPUs,
    # so tensor parallelism stays within a node and only pipeline stages cross nodes
    nodes: int = 1
    # RAM the OS says a new process can have now (MemAvailable; detected rigs): what a CPU
    # engine may use, where cpu_ram_bytes is the machine's total
    cpu_ram_available_bytes: int | None = None

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def vendor(self) -> str:
        """The accelerator vendor, or "cpu" for a CPU-only rig."""
        return self.gpus[0].vendor if self.gpus else "cpu"


# ---- rig spec strings -----------------------------------------------------------------

_ITEM = re.compile(
    r"^(?:(?P<count>\d+)\s*[x×*]\s*)?(?P<cls>[a-z][a-z0-9._-]*|\d{4}[a-z0-9._-]*)"
    r"(?::(?P<size>\d+(?:\.\d+)?)\s*(?P<unit>gb|gib|g|tb)?)?$"
)


def _known(cat: Catalog) -> str:
    return ", ".join(h.id for h in cat.hardware)


def _bad(spec: str, why: str, cat: Catalog) -> BadInput:
    return BadInput(
        f"rig spec '{spec}' {why}; write e.g. 2x3090, 1xH200, 3090+4090, cpu:64GB, "
        f"m3max:128GB or 2x(8xH100) (two nodes) with a known class: {_known(cat)}."
    )


MAX_NODES = 64
_NODES = re.compile(r"^(?P<nodes>\d+)\s*[x×*]\s*\((?P<node>.+)\)$")


def parse_rig(spec: str, catalog: Catalog | None = None) -> Rig:
    """Turn "2x3090", "3090+4090", "cpu:64GB", "m3max:128GB" into a Rig from catalog classes;
    "2x(8xH100)" is two identical nodes of eight H100 each."""
    from .catalog import load_catalog

    cat = catalog or load_catalog()
    text = (spec or "").strip().lower().replace(" ", "")
    if not text:
        raise _bad(spec, "is empty", cat)
    many = _NODES.match(text)
    if many:
        nodes = int(many["nodes"])
        if not 1 <= nodes <= MAX_NODES:
            raise _bad(spec, f"asks for {nodes} nodes (1 to {MAX_NODES} allowed)", cat)
        node = parse_rig(many["node"], cat)
        if node.nodes != 1:
            raise _bad(spec, "nests nodes inside a node", cat)
        if not node.gpus or node.gpus[0].unified:
            raise _bad(spec, "repeats a node without discrete GPUs (several nodes are for GPU clusters)", cat)
        return replace(node, nodes=nodes, label=spec.strip())
    gpus: list[GpuSpec] = []
    cpu_ram = cpu_bw = None
    cpu_src = ""
    for item in text.split("+"):
        m = _ITEM.match(item)
        if not m:
            raise _bad(spec, f"has an item '{item}' that is not COUNTxCLASS or CLASS:SIZE", cat)
        hw = cat.hardware_class(m["cls"])
        if hw is None:
            raise _bad(spec, f"names an unknown hardware class '{m['cls']}'", cat)
        count = int(m["count"]) if m["count"] is not None else 1
        if count < 1 or count > MAX_GPUS_PER_CLASS:
            raise _bad(spec, f"asks for {count} x {hw.id} (1 to {MAX_GPUS_PER_CLASS} allowed)", cat)
        size_gb = None
        if m["size"] is not None:
            size_gb = float(m["size"]) * (1.073741824 if m["unit"] == "gib" else 1000.0 if m["unit"] == "tb" else 1.0)
            if size_gb <= 0:
                raise _bad(spec, "gives a memory size that is not positive", cat)
        if hw.kind == "gpu":
            if size_gb is not None:
                raise _bad(spec, f"gives a memory size for {hw.id}, whose VRAM is fixed at {hw.vram_mib:,} MiB", cat)
            assert hw.vram_mib is not None     # the catalog schema requires it of a gpu class
            gpus.extend(
                GpuSpec(name=hw.name, vram_bytes=hw.vram_mib * MiB, bandwidth_gbs=hw.bandwidth_gbs,
                        compute_capability=hw.compute_capability, vendor=hw.vendor, hw_class=hw.id)
                for _ in range(count)
            )
            continue
        if count != 1 or cpu_ram is not None:
            raise _bad(spec, f"repeats {hw.id}; a rig has one system memory", cat)
        mem = size_gb if size_gb is not None else hw.default_memory_gb
        if not mem:
            raise _bad(spec, f"needs a memory size for {hw.id} (e.g. {hw.id}:64GB)", cat)
        cpu_ram = int(mem * GB)
        if hw.kind == "unified":
            gpus.append(GpuSpec(name=hw.name, vram_bytes=int(mem * GB * hw.gpu_memory_fraction),
                                bandwidth_gbs=hw.bandwidth_gbs, compute_capability=None,
                                vendor=hw.vendor, hw_class=hw.id, unified=True))
        else:
            cpu_bw = hw.bandwidth_gbs
            cpu_src = f"catalog default for '{hw.id}' (not measured): {hw.source}"
    vendors = {g.vendor for g in gpus}
    if len(vendors) > 1:
        raise _bad(spec, f"mixes accelerator vendors ({', '.join(sorted(vendors))})", cat)
    if cpu_bw is None:
        cpu = cat.hardware_class("cpu")
        cpu_bw = cpu.bandwidth_gbs if cpu else None
        cpu_src = f"catalog default for 'cpu' (not measured): {cpu.source}" if cpu else ""
    return Rig(gpus=tuple(gpus), cpu_ram_bytes=cpu_ram, cpu_bandwidth_gbs=cpu_bw, label=spec.strip(),
               cpu_bandwidth_source=cpu_src)


# ---- this machine: the CPU ----------------------------------------------------------

BW_PROBE_MIB = 128                 # per thread: source and destination each this big (>> any L3)
BW_PROBE_REPS = 5
ENV_NO_PROBE = "ENGINEROOM_NO_BW_PROBE"   # "1": never run the bandwidth probe (use the catalog default)


def cpu_model_name(cpuinfo: str | None = None) -> str | None:
    """The CPU's name as /proc/cpuinfo gives it ("model name" on x86, "Model"/"Hardware" on ARM)."""
    import platform

    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        if m and m.group(1).strip():
            return re.sub(r"\s+", " ", m.group(1).strip())
    return platform.processor() or None


def physical_cores(sys_cpu: str = "/sys/devices/system/cpu") -> int | None:
    """Physical cores the way llama-server counts them for its default ``-t``: one per set of
    thread siblings (common_cpu_get_num_physical_cores in llama.cpp's common/common.cpp);
    None where the topology files are missing."""
    import glob

    sets = set()
    for f in glob.glob(f"{sys_cpu}/cpu[0-9]*/topology/thread_siblings"):
        try:
            with open(f, encoding="ascii", errors="replace") as fh:
                sets.add(fh.read().strip())
        except OSError:
            continue
    return len(sets) or None


def _probe_key(model: str | None, logical: int, ram: int) -> str:
    return f"{model or 'unknown cpu'}|{logical} cpus|{round(ram / GB)} GB"


def probe_copy_bandwidth(threads: int, mib: int = BW_PROBE_MIB, reps: int = BW_PROBE_REPS) -> float:
    """Memory copy bandwidth in GB/s with ``threads`` threads, each copying its own ``mib`` MiB
    buffer (numpy releases the GIL for the copy); bytes read + bytes written per second (the
    STREAM "copy" convention), best of ``reps`` after a warm-up."""
    import threading
    import time

    import numpy as np

    if threads < 1:
        raise BadInput(f"the bandwidth probe needs at least 1 thread, not {threads}.")
    n = mib * 1024 * 1024 // 8
    pairs = [(np.ones(n), np.empty(n)) for _ in range(threads)]
    for src, dst in pairs:
        np.copyto(dst, src)                        # warm-up: fault the pages in
    best = 0.0
    for _ in range(reps):
        barrier = threading.Barrier(threads + 1)

        def work(src: np.ndarray, dst: np.ndarray) -> None:
            barrier.wait()  # noqa: B023 - the threads are joined within this iteration
            np.copyto(dst, src)

        pool = [threading.Thread(target=work, args=p) for p in pairs]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        dt = time.perf_counter() - t0
        best = max(best, 2 * n * 8 * threads / dt / GB)
    return round(best, 2)


def cpu_bandwidth(threads: int, *, refresh: bool = False, model: str | None = None, logical: int | None = None,
                  ram: int | None = None) -> dict[str, Any] | None:
    """This machine's measured copy bandwidth per thread count (1 and ``threads``), from the
    per-machine cache or a fresh probe (about a second); None when probing is switched off
    (``$ENGINEROOM_NO_BW_PROBE=1``) or fails. The record says when and under what load."""
    import json
    import os
    import time

    from . import paths

    if os.environ.get(ENV_NO_PROBE, "").strip() in ("1", "true", "yes") and not refresh:
        return None
    logical = logical or os.cpu_count() or 1
    key = _probe_key(model, logical, ram or 0)
    cache = paths.cache_dir() / "hardware" / "cpu_bandwidth.json"
    try:
        stored: dict[str, Any] = json.loads(cache.read_text()) if cache.is_file() else {}
    except (OSError, ValueError):
        stored = {}
    want = sorted({1, max(1, threads)})
    rec: dict[str, Any] | None = stored.get(key)
    load = os.getloadavg()
    # other programs only ever lower a copy probe: a record taken under load is probed
    # again once the machine is quieter, and each thread count keeps its best figure
    busy = bool(rec and rec.get("loadavg", [0])[0] > 1.0 and load[0] < rec["loadavg"][0] - 1.0)
    if rec and not refresh and not busy and all(str(t) in rec.get("gbs", {}) for t in want):
        return rec
    try:
        gbs = {str(t): probe_copy_bandwidth(t) for t in want}
    except (ImportError, MemoryError, OSError):
        return None
    if rec:
        gbs = {t: max(v, rec.get("gbs", {}).get(t, 0.0)) for t, v in gbs.items()}
    rec = {"gbs": gbs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "loadavg": [round(x, 2) for x in load], "method": (
               f"numpy copy, {BW_PROBE_MIB} MiB per thread, best of {BW_PROBE_REPS} (best of every probe "
               "since), bytes read + written")}
    stored[key] = rec
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(stored, indent=1))
    except OSError:
        pass
    return rec


# ---- this machine ---------------------------------------------------------------------


def _match_class(name: str, cat: Catalog) -> HardwareClass | None:
    norm = re.sub(r"[^a-z0-9]", "", name.lower())
    best: tuple[int, HardwareClass] | None = None
    for h in cat.hardware:
        if h.kind != "gpu":
            continue
        for cand in (h.name, h.id, *h.aliases):
            key = re.sub(r"[^a-z0-9]", "", cand.lower())
            if key and key in norm and (best is None or len(key) > best[0]):
                best = (len(key), h)
    return best[1] if best else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_gpus(cat: Catalog) -> tuple[list[GpuSpec], str | None, bool | None, bool | None, list[str]]:
    """GPUs through NVML; raises on any NVML failure (the caller turns it into a note)."""
    import pynvml

    pynvml.nvmlInit()
    notes: list[str] = []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        gpus = []
        for h in handles:
            name = _text(pynvml.nvmlDeviceGetName(h))
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{major}.{minor}"
            except pynvml.NVMLError:
                cc = None
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            except pynvml.NVMLError:
                uuid = None
            hw = _match_class(name, cat)
            if hw is None:
                notes.append(f"{name}: not in the hardware catalog, memory bandwidth unknown")
            gpus.append(GpuSpec(name=name, vram_bytes=int(mem.total), free_bytes=int(mem.free),
                                bandwidth_gbs=hw.bandwidth_gbs if hw else None,
                                compute_capability=cc or (hw.compute_capability if hw else None),
                                vendor="nvidia", hw_class=hw.id if hw else None, uuid=uuid))
        p2p = nvlink = None
        if n > 1:
            p2p = True
            for i in range(n):
                for j in range(n):
                    if i == j:
                        continue
                    try:
                        st = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_READ)
                        p2p = p2p and st == pynvml.NVML_P2P_STATUS_OK
                    except (pynvml.NVMLError, AttributeError):
                        p2p = None
                        break
                if p2p is None:
                    break
            nvlink = False
            for h in handles:
                for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                    try:
                        if pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED:
                            nvlink = True
                    except pynvml.NVMLError:
                        break
        return gpus, driver, p2p, nvlink, notes
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting NVML down is best effort; the result is already made
            pass


def detect_rig(catalog: Catalog | None = None, probe: bool | None = None) -> Rig:
    """This machine: NVIDIA GPUs through NVML, cores and RAM through psutil, the CPU's name
    (/proc/cpuinfo) and its memory bandwidth; never raises.

    Without an NVIDIA GPU or driver the Rig is CPU-only and ``notes`` says why, so nothing
    downstream silently plans a GPU that is not there. ``probe``: None = the cached copy
    bandwidth of this machine, probed once if missing; True = probe again; False = the
    catalog's default bandwidth (``cpu_bandwidth_source`` says which it is).
    """
    import os

    import psutil

    from .catalog import load_catalog

    cat = catalog or load_catalog()
    cpu = cat.hardware_class("cpu")
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or os.cpu_count()
    vm = psutil.virtual_memory()
    ram, available = int(vm.total), int(vm.available)
    model = cpu_model_name()
    threads = physical_cores() or cores
    bw = cpu.bandwidth_gbs if cpu else None
    bw_src = f"catalog default for 'cpu' (not measured): {cpu.source}" if cpu else ""
    by_threads: tuple[tuple[int, float], ...] = ()
    notes: list[str] = []
    gpus: list[GpuSpec] = []
    driver = p2p = nvlink = None
    try:
        gpus, driver, p2p, nvlink, more = _nvml_gpus(cat)
        notes.extend(more)
        if not gpus:
            notes.append("no NVIDIA GPU detected (NVML found 0 devices); planning for the CPU")
    except ImportError:
        notes.append("no NVIDIA GPU detected (the pynvml module is not installed); planning for the CPU")
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...: never raises
        reason = _text(exc) or type(exc).__name__
        notes.append(f"no NVIDIA GPU detected (NVML: {reason}); planning for the CPU")
    # the CPU's bandwidth sets decode speed only without GPUs: probe then (or when asked)
    rec = None
    if probe or (probe is None and not gpus):
        rec = cpu_bandwidth(threads or 1, refresh=bool(probe), model=model, logical=os.cpu_count(), ram=ram)
    if rec:
        by_threads = tuple(sorted((int(t), float(v)) for t, v in rec["gbs"].items()))
        bw = dict(by_threads).get(threads or 1, bw)
        bw_src = (f"measured on this machine, last probed {rec['date']} ({rec['method']}; at {threads} thread(s), "
                  f"llama-server's default -t; load average at that probe {rec['loadavg'][0]:g})")
    return Rig(gpus=tuple(gpus), cpu_ram_bytes=ram, cpu_cores=cores,
               cpu_bandwidth_gbs=bw, p2p=p2p, label="this machine",
               driver=driver, nvlink=nvlink, notes=tuple(notes), source="detected",
               cpu_model=model, cpu_threads=threads, cpu_bandwidth_source=bw_src,
               cpu_bandwidth_by_threads=by_threads, cpu_ram_available_bytes=available)


def resolve_rig(spec: str | None, catalog: Catalog | None = None) -> Rig:
    """A rig spec string, or this machine when ``spec`` is None / "auto" / "this"."""
    if spec is None or spec.strip().lower() in ("", "auto", "this", "local", "this-machine"):
        return detect_rig(catalog)
    return parse_rig(spec, catalog)


def with_free_memory_ignored(rig: Rig) -> Rig:
    """The same rig with detected free memory dropped (plan for an idle machine)."""
    return replace(rig, gpus=tuple(replace(g, free_bytes=None) for g in rig.gpus), cpu_ram_available_bytes=None)


# --------------------------------------------------------------------------- a run's conditions
def host_summary(rig: Rig | None = None) -> dict[str, object]:
    """CPU / RAM / GPU of this machine for a run's conditions (hardware names, no identities);
    ``rig``: this machine as already detected (``detect_rig``), else detected here."""
    import psutil

    summary: dict[str, object] = {
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": cpu_model_name() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
    }
    try:
        rig = rig or detect_rig()
        summary["gpus"] = [{"name": g.name, "vram_bytes": g.vram_bytes} for g in rig.gpus]
    except Exception as exc:  # noqa: BLE001 - hardware detection must never break a run
        summary["gpus"] = []
        summary["gpu_note"] = f"GPU detection failed: {type(exc).__name__}"
    return summary


__all__ = ["GpuSpec", "Rig", "cpu_bandwidth", "cpu_model_name", "detect_rig", "host_summary", "physical_cores",
           "probe_copy_bandwidth", "parse_rig", "resolve_rig", "with_free_memory_ignored"]
