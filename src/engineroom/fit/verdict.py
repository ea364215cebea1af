"""``fit``: run the engine's memory model and decide the verdict and its binding constraint."""

from __future__ import annotations

from ..arch import ModelArch
from ..catalog import Catalog, load_catalog
from ..errors import BadInput
from ..hardware import Rig
from ..units import gib, mib  # memory in GiB, the one convention (units.py)
from .engine import engine_spec, kv_dtype_spec
from .kv import kv_refusal
from .llama import fit_llama
from .llama_compute import CUDA_LAUNCH_RESERVE
from .pool import fit_pool
from .request import Fit, FitRequest, Verdict
from .space import space_verdict


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


_ROPE_TYPES = ("yarn", "linear")


def rope_factor(rope_scaling: str | None) -> float | None:
    """The scale factor of a RoPE scaling as plan and fit take it (``yarn:4``, ``linear:2``);
    None for a bare type (``yarn``), which extends nothing by itself."""
    if not rope_scaling:
        return None
    kind, sep, factor = rope_scaling.replace("=", ":").partition(":")
    if not sep:
        return None
    try:
        value = float(factor)
    except ValueError:
        raise BadInput(f"RoPE scaling {rope_scaling!r}: the factor after ':' must be a number "
                       "(e.g. yarn:4).") from None
    if value <= 1:
        raise BadInput(f"RoPE scaling {rope_scaling!r}: a factor of {factor} does not extend the context; "
                       "give one above 1 (e.g. yarn:4).")
    return value


def check_ctx(arch: ModelArch, ctx: int, rope_scaling: str | None = None) -> None:
    """BadInput when ``ctx`` (tokens per sequence) is beyond the model's maximum positions
    (config.json max_position_embeddings / GGUF context_length) unless the RoPE scaling given
    extends it that far. plan and fit take ``yarn:FACTOR`` / ``linear:FACTOR`` (up to maximum x
    FACTOR); a bare ``yarn`` or ``linear`` extends nothing: the engine keeps the trained scale and
    llama-server caps each slot at the trained length (server-context.cpp n_ctx_slot). `up`
    passes the engine's own RoPE argument found by its adapter, which is taken as given."""
    if ctx <= 0:
        raise BadInput(f"context {ctx} must be a positive number of tokens.")
    if not arch.max_position or ctx <= arch.max_position:
        return
    beyond = (f"context {ctx:,} is beyond {arch.name}'s maximum of {arch.max_position:,} positions "
              "(max_position_embeddings / GGUF context_length)")
    need = -(-ctx // arch.max_position)
    if not rope_scaling:
        raise BadInput(f"{beyond}; use at most that, or pass a RoPE scaling that extends it "
                       f"(--rope-scaling yarn:{need}).")
    kind = rope_scaling.replace("=", ":").partition(":")[0].lower()
    if kind not in _ROPE_TYPES:
        return      # an engine's own argument (`up -- ...`): its adapter found it, the engine applies it
    factor = rope_factor(rope_scaling)
    if factor is None:
        raise BadInput(f"{beyond}; RoPE scaling {rope_scaling} without a scale factor does not extend it (the "
                       f"engine keeps the trained scale and llama-server caps each slot at "
                       f"{arch.max_position:,}); give the factor: --rope-scaling {kind}:{need}.")
    if ctx > arch.max_position * factor:
        raise BadInput(f"{beyond}; RoPE scaling {rope_scaling} extends it to "
                       f"{int(arch.max_position * factor):,}; use a factor of at least {need}.")


def fit(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> Fit:
    """Per-device memory breakdown and a verdict for serving ``arch`` with ``req`` on ``rig``
    (engine facts from ``catalog``, default: the packaged catalog)."""
    if req.ctx <= 0 or req.parallel <= 0:
        raise BadInput("Context and number of sequences must be positive.")
    check_ctx(arch, req.ctx, req.rope_scaling)
    eng = engine_spec(req.engine, catalog)
    kv_dtype_spec(req.engine, req.kv_dtype, catalog)  # validates the dtype first
    if req.pp < 1:
        raise BadInput("Pipeline stages (pp) must be at least 1.")
    if eng.memory_model == "llama_buffers":
        if req.pp > 1:
            how = ", ".join(filter(None, ("tp", eng.multi_gpu.split_args)))   # the catalog's split arguments
            staged = [e.name for e in (catalog or load_catalog()).engines if e.memory_model != "llama_buffers"]
            others = f" {_and(staged)} run pipeline stages." if staged else ""
            raise BadInput(f"{eng.id} does not run pipeline-parallel stages (pp={req.pp}); it splits layers across "
                           f"the GPUs of one machine instead ({how}).{others}")
        gpus, host, notes = fit_llama(arch, req, rig, catalog)
        if req.rope_scaling and arch.max_position and req.ctx > arch.max_position:
            notes.append(f"ctx {req.ctx:,} is beyond the model's {arch.max_position:,} positions: RoPE scaling "
                         f"{req.rope_scaling} assumed")
        refused = kv_refusal(arch, req, catalog)
        if refused:
            return Fit(req, rig.label, tuple(gpus), tuple(host), Verdict.DOES_NOT_FIT, f"{eng.id} refuses: {refused}",
                       notes=tuple(notes))
        verdict, binding = Verdict.FITS, ""
        worst = None
        for g in gpus:
            dev = f"GPU{g.index}" if rig.gpus else "RAM"
            if g.used_bytes > g.capacity_bytes:
                big = max(g.components, key=lambda c: c.bytes)
                verdict = Verdict.DOES_NOT_FIT
                binding = (f"{dev}: needs {gib(g.used_bytes, 2)} > {gib(g.capacity_bytes, 2)} "
                           f"(largest: {big.name} {gib(big.bytes, 2)})")
                break
            if rig.vendor == "nvidia" and g.headroom_bytes < CUDA_LAUNCH_RESERVE:   # measured on CUDA only
                verdict = Verdict.DOES_NOT_FIT
                binding = (f"{dev}: {gib(g.used_bytes, 2)} of {gib(g.capacity_bytes, 2)} leaves "
                           f"{mib(max(g.headroom_bytes, 0), 0)} free, under the "
                           f"{mib(CUDA_LAUNCH_RESERVE, 0)} a GPU launch needs beyond its buffers "
                           f"(CUDA loads kernel code at first use)")
                break
            frac = g.headroom_bytes / g.capacity_bytes if g.capacity_bytes else 0
            if worst is None or frac < worst[0]:
                worst = (frac, dev, g)
        if verdict != Verdict.DOES_NOT_FIT and worst is not None:
            frac, dev, g = worst
            binding = f"{dev}: {gib(g.used_bytes, 2)} of {gib(g.capacity_bytes, 2)} ({frac * 100:.1f}% headroom)"
            if frac < 0.05:
                verdict = Verdict.TIGHT
        return Fit(req, rig.label, tuple(gpus), tuple(host), verdict, binding, notes=tuple(notes))
    gpus, host, notes, info = fit_pool(arch, req, rig, catalog)
    if "space" in info:                       # a fixed KV space (catalog kv_cache_space)
        verdict, binding = space_verdict(info, req)
        return Fit(req, rig.label, tuple(gpus), tuple(host), verdict, binding, notes=tuple(notes))
    if "refused" in info:                     # the engine would not start on this machine's free memory
        return Fit(req, rig.label, tuple(gpus), tuple(host), Verdict.DOES_NOT_FIT, info.pop("refused"),
                   notes=tuple(notes))
    verdict, binding, capped = Verdict.FITS, "", None
    for gi, (pool, need, budget) in info.items():
        per_seq = need // req.parallel
        if pool < per_seq:
            return Fit(req, rig.label, tuple(gpus), tuple(host), Verdict.DOES_NOT_FIT,
                       f"GPU{gi}: KV pool {gib(max(pool, 0), 2)} < one sequence's KV {gib(per_seq, 2)} "
                       f"(budget {gib(budget, 2)})", notes=tuple(notes))
        if need > pool:
            verdict, capped = Verdict.TIGHT, int(pool // max(per_seq, 1))
            binding = (f"GPU{gi}: KV need {gib(need, 2)} > pool {gib(pool, 2)}; the engine caps "
                       f"concurrency at {capped} seq(s)")
        elif need > pool / 1.05 and verdict == Verdict.FITS:
            verdict = Verdict.TIGHT
            binding = f"GPU{gi}: KV need {gib(need, 2)} within 5% of pool {gib(pool, 2)}"
        elif verdict == Verdict.FITS:
            binding = f"GPU{gi}: KV need {gib(need, 2)} of pool {gib(pool, 2)}"
    return Fit(req, rig.label, tuple(gpus), tuple(host), verdict, binding, notes=tuple(notes), capped_parallel=capped)


def need_bytes(f: Fit) -> int:
    """What the request needs at most on one device (without a vLLM pool's spare)."""
    return max(sum(c.bytes for c in g.components if c.name != "kv_pool_spare") for g in f.per_gpu)
