"""fit's prediction for exactly what is launched (the flow makes it; launch never imports fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import EngineroomError

if TYPE_CHECKING:
    from ..arch import ModelArch
    from ..cpuprobe import CpuProbe
    from ..engines.base import Settled
    from ..launch import ServerState
    from ..placement import Check



# --------------------------------------------------------------------------- predicted memory
@dataclass(frozen=True)
class Prediction:
    """fit's per-component prediction for exactly what is launched (or why there is none)."""

    components: dict                 # name -> bytes (devices and host summed), plus "total"
    request: dict                    # the FitRequest it was made for
    rig: str
    why_none: str = ""
    # what the launch leaves of the host's usable memory (fit.usable_ram less the host-side
    # components; a CPU rig: less everything), for a cache the engine grows there; None: unknown
    host_spare_bytes: int | None = None


def predict_memory(engine: str, arch: ModelArch | None, settled: Settled, probe: CpuProbe, *, model_id: str = "",
                   quant: str = "") -> Prediction:
    """fit for the launched configuration on this machine (its probed CPU features), from the
    model file's header; without the file (a recipe), from the catalog's entry for ``model_id``
    ``quant`` (its inline architecture and the quant's catalog size)."""
    from dataclasses import asdict

    from ..catalog import load_catalog
    from ..fit import FitRequest, fit, usable_ram
    from ..hardware import detect_rig

    features = frozenset(probe.usable) if probe.flags else None
    s = settled
    if s.ctx is None:
        return Prediction({}, {}, "", "the engine picks its context at start and nothing says which")
    try:
        rig = detect_rig()
        cat = load_catalog().for_vendor(rig.vendor)   # the engine's build for this machine
        if arch is None:
            if not (model_id and quant):
                return Prediction({}, {}, "", "the model file is not here and the catalog does not describe it")
            from ..plan import fit_one

            _, f = fit_one(model_id, rig, engine, quant, s.kv_dtype or "f16", s.ctx, parallel=s.parallel, tp=s.tp,
                           kv_unified=s.kv_unified, rope_scaling=s.rope_scaling, cpu_features=features,
                           repack=s.repack, mem_fraction=s.mem_fraction, ubatch=s.ubatch)
            req, basis = f.request, f"the catalog's {model_id} {quant} (the file is not downloaded)"
        else:
            req = FitRequest(engine=engine, ctx=s.ctx, quant=s.quant or arch.file_type or None,
                             kv_dtype=s.kv_dtype or "f16", parallel=s.parallel, kv_unified=s.kv_unified,
                             repack=s.repack, cpu_features=features, rope_scaling=s.rope_scaling, tp=s.tp,
                             kv_space_bytes=s.kv_space_bytes, mem_fraction=s.mem_fraction, vision=s.vision,
                             spec_method=s.spec_method, ubatch=s.ubatch, batch=s.batch, flash_attn=s.flash_attn)
            f, basis = fit(arch, req, rig, catalog=cat), "the model file's header"
    except (EngineroomError, KeyError, TypeError, ValueError) as exc:
        return Prediction({}, {}, "", f"fit cannot size this launch ({str(exc).rstrip('.')})")
    comps = f.bytes_by_component(per_gpu=bool(rig.gpus))
    if "kv_pool_spare" in comps:   # a paged pool: the whole of it, as a pool engine reports it (beside its parts)
        comps["kv_pool"] = comps.get("kv_cache", 0) + comps["kv_pool_spare"]
        spec = cat.engine(engine)
        if rig.gpus and spec is not None and spec.pool_profile is not None:   # a profiled pool holds the state
            comps["kv_pool"] += comps.get("recurrent_state", 0)
    comps["total"] = f.total_bytes
    request = {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in asdict(req).items()}
    request.pop("cpu_features", None)
    request["basis"] = basis
    spare = None
    if rig.cpu_ram_bytes:
        host = f.total_bytes if not rig.gpus else sum(c.bytes for c in f.host)
        spare = usable_ram(rig)[0] - host
    return Prediction(comps, request, rig.label or "this machine", host_spare_bytes=spare)


def process_memory(state: ServerState) -> tuple[dict, str, dict]:
    """What the engine reported (``state.memory``'s ``measured``) with, where it runs in host memory,
    its processes' own memory (``memory.PROCESS``: the process tree's USS, which holds the runtime no
    log line names), the sources said, and each component's own (for its row); a GPU's whole use is
    NVML's ``GPU<i>`` rows instead."""
    from ..memory import PROCESS
    from ..resources import process_tree_memory

    measured = dict(state.memory.get("measured") or {})
    source = str(state.memory.get("measured_source", ""))
    sources = dict(state.memory.get("measured_sources") or {})
    if state.memory.get("measured_device") == "cpu":
        tree = process_tree_memory(state.pid) or {}
        if tree.get("uss_bytes"):
            measured[PROCESS] = int(tree["uss_bytes"])
            sources[PROCESS] = f"USS of the engine's {len(tree.get('pids') or [])} process(es) once ready (psutil)"
            source = (source + "; " if source else "") + f"{PROCESS}: {sources[PROCESS]}"
    return measured, source, sources


def placement_check(engine: str, log_path: str, pred: Prediction | None, accept: bool = False) -> Check:
    """The engine's placement (its adapter reads the launch's log) against the plan's (fit's prediction)."""
    from pathlib import Path

    from .. import engines
    from ..placement import check, planned

    plan = planned(pred.components, pred.request) if pred and not pred.why_none else None
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        text = ""
    actual = engines.adapter(engine).placement_report(text) if engines.has_adapter(engine) else None
    return check(engine, plan, actual, accept=accept)
