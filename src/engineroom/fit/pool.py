"""memory_model ``kv_pool`` (vLLM, SGLang): reserve mem_fraction x VRAM and hand what the
weights, activations and CUDA graphs leave over to a paged KV pool; the question is whether
that pool holds ctx x parallel.
"""

from __future__ import annotations

import math

from ..arch import LayerKind, ModelArch, VisionSpec
from ..catalog import Catalog, Engine
from ..catalog.pool_schema import PoolProfile, StaticShare
from ..errors import BadInput
from ..hardware import GpuSpec, Rig
from ..units import GB
from .engine import engine_spec, kv_bytes_per_elem
from .kv import pool_kv_grow_per_card, recurrent_state_bytes
from .request import Component, FitRequest, GpuFit
from .space import fit_space
from .weights import WeightSplit, weight_split

TOWER_BYTES_PER_PARAM = 2      # a vision tower's weights: 16 bits in every checkpoint format fit sizes


def valid_tp(arch: ModelArch, max_tp: int = 8) -> list[int]:
    """TP sizes that divide the attention heads (and the linear-attention key/value heads,
    which vLLM shards the same way: 24 q heads but 16 GDN key heads make TP 3 and 6 fail
    for Qwen3.6-27B). KV heads may be fewer than TP: they replicate."""
    return [t for t in range(1, max_tp + 1) if _tp_divides(arch, t)]


def _tp_divides(arch: ModelArch, tp: int) -> bool:
    """``tp`` is one of ``valid_tp``'s sizes (asked of every fit: one size checked, not all)."""
    if arch.n_heads % tp:
        return False
    if arch.linear is not None and arch.count(LayerKind.LINEAR):
        return not (arch.linear.n_key_heads % tp or arch.linear.n_value_heads % tp)
    return True


def static_share(rule: StaticShare, vram_bytes: int, *, tp: int = 1, pp: int = 1, vision: VisionSpec | None = None,
                 mla: bool = False) -> float:
    """The share of a GPU of ``vram_bytes`` the engine's weights and pool take by its own ``rule``
    (``StaticShare``); ``vision``: the tower the launch builds."""
    c = rule.gpu_class(vram_bytes)
    mib = vram_bytes / (1 << 20)
    reserve = (rule.base_mib + rule.mib_per_prefill_token * max(c.prefill_tokens, rule.min_prefill_tokens)
               + rule.mib_per_decode_graph * (c.decode_graphs if tp < 4 else c.decode_graphs_tp4)
               + (rule.mla_prefill_graphs_mib if mla else rule.mib_per_prefill_graph * c.prefill_graphs)
               + rule.gib_per_eight_ranks * 1024 * tp * pp / 8)
    if mib > rule.floor_above_gib * 1024:
        reserve = max(reserve, rule.floor_gib * 1024)
    share = round((mib - reserve) / mib, rule.round_to)
    if vision is not None:
        ratio = (vision.depth * vision.hidden_size ** 2
                 / (rule.vision_baseline_layers * rule.vision_baseline_hidden ** 2))
        size = min(rule.vision_high, max(rule.vision_low, 1 - rule.vision_per_doubling * (ratio - 1)))
        share = round(share * rule.vision_factor * size, rule.round_to)
    return share


def pool_fraction(engine: Engine, gpu: GpuSpec | None, arch: ModelArch, *, tp: int = 1, pp: int = 1,
                  vision: bool = False) -> float | None:
    """The share of ``gpu`` a kv_pool ``engine`` is sized and launched at: its own rule for that GPU where the
    catalog gives one (``static_share``; ``vision``: the launch builds the model's tower), else its default."""
    rule = engine.static_share
    if rule is None or gpu is None:
        return engine.default_mem_fraction
    return static_share(rule, gpu.vram_bytes, tp=tp, pp=pp, vision=arch.vision if vision else None,
                        mla=arch.mla is not None)


def fit_pool(arch: ModelArch, req: FitRequest, rig: Rig,
             catalog: Catalog | None) -> tuple[list[GpuFit], list[Component], list[str], dict]:
    eng = engine_spec(req.engine, catalog)
    tp = max(1, req.tp)
    if not _tp_divides(arch, tp):
        raise BadInput(f"TP={tp} does not divide the {arch.n_heads} attention heads of {arch.name}; "
                       f"valid TP: {', '.join(map(str, valid_tp(arch)))}.")
    pp = max(1, req.pp)
    if rig.gpus and tp > len(rig.gpus):
        raise BadInput(f"TP={tp} needs {tp} GPUs but the rig {rig.label or ''} has {len(rig.gpus)}"
                       + (" per node (tensor parallelism stays within a node)." if rig.nodes > 1 else "."))
    if pp > 1 and rig.gpus and tp * pp > len(rig.gpus) * rig.nodes:
        raise BadInput(f"TP={tp} x PP={pp} needs {tp * pp} GPUs but the rig {rig.label or ''} has "
                       f"{len(rig.gpus) * rig.nodes}.")
    if pp > arch.n_layers:
        raise BadInput(f"PP={pp} is more pipeline stages than {arch.name} has layers.")
    frac = req.mem_fraction if req.mem_fraction is not None else pool_fraction(
        eng, rig.gpus[0] if rig.gpus else None, arch, tp=tp, pp=pp, vision=req.vision)
    assert frac is not None      # the catalog schema requires it of every kv_pool engine and build
    split = weight_split(arch, req, catalog)
    total, source = with_vision_tower(arch, req, split)
    w = total // tp
    kv_need, kv_note = pool_kv_grow_per_card(arch, req, catalog=catalog)
    r, s = recurrent_state_bytes(arch, req.parallel)
    kv_fixed = (r + s) // tp
    bpe = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    assert eng.pool_activation is not None   # the catalog schema requires it of every kv_pool engine
    coef = eng.pool_activation.coef(bpe)
    act = int(coef * 48 * req.ctx / tp)
    b = int(req.extra.get("max_num_batched_tokens", 0))
    scratch = gdn_prefill_scratch(arch, b, tp)
    overhead = int((0.5 + frac + 0.3 * (tp - 1)) * GB)
    draft = req.draft_bytes // tp
    gpus = rig.gpus[:tp] if rig.gpus else ()
    ks = eng.kv_cache_space if not gpus else None   # a fixed-space build (vLLM CPU): catalog data
    if pp > 1:
        if not rig.gpus:
            raise BadInput(f"pipeline stages (PP={pp}) need GPUs; the rig {rig.label or ''} has none.")
        return _fit_stages(arch, req, rig, frac, split, act + scratch, coef, b, scratch, overhead, kv_need, kv_note,
                           r + s, draft)
    if ks is not None:
        return fit_space(arch, req, rig, eng, ks, frac, w, source, act + scratch, coef, kv_need, kv_note,
                         kv_fixed, draft, catalog)
    if eng.pool_profile is not None and gpus:
        return _fit_profiled(arch, req, eng.pool_profile, gpus, frac, split, kv_need, kv_note, kv_fixed, draft, eng.id,
                             (act, f"{coef:g} x 48 x ctx / TP"), (overhead, f"(0.5 + {frac} + 0.3 x (TP-1)) GB"))
    out: list[GpuFit] = []
    info = {}
    for gi in range(tp):
        cap = (gpus[gi].free_bytes or gpus[gi].vram_bytes) if gpus else (rig.cpu_ram_bytes or 0)
        fixed = [Component("weights", w, source + (f" / TP {tp}" if tp > 1 else "")),
                 Component("activations", act + scratch,
                           f"{coef:g} x 48 x ctx / TP" + (f" + GDN prefill scratch (b={b})" if scratch else "")),
                 Component("cuda_graphs", overhead, f"(0.5 + {frac} + 0.3 x (TP-1)) GB")]
        if kv_fixed:
            fixed.append(Component("recurrent_state", kv_fixed,
                                   f"{req.parallel} sequence(s) of linear-attention state / TP"))
        if draft:
            fixed.append(Component("draft", draft, "draft model / TP"))
        budget = int(frac * cap)
        pool = budget - sum(c.bytes for c in fixed)
        comps = list(fixed) + [Component("kv_cache", kv_need, kv_note)]
        # the engine grabs the rest of its fraction for the KV pool
        if pool > kv_need:
            comps.append(Component("kv_pool_spare", pool - kv_need, f"pool sized from {frac} x VRAM"))
        out.append(GpuFit(gi, cap, tuple(comps)))
        info[gi] = (pool, kv_need, budget)
    notes = [f"{eng.id} sizes its KV pool from {frac} x VRAM"]
    if req.vision and arch.vision is not None:
        # a safetensors checkpoint carries its vision tower: it is already in the weights
        # (a language-model-only launch would leave it out)
        notes.append("the vision tower is part of the checkpoint's weights")
    return out, [], notes, info


def stage_layers(n_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage: contiguous, as even as can be, the remainder on the
    first stages (vLLM's get_pp_indices and SGLang split the same way by default)."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for stage in range(pp):
        size = base + (1 if stage < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def _fit_stages(arch: ModelArch, req: FitRequest, rig: Rig, frac: float, split: WeightSplit, act: int,
                coef: float, b: int, scratch: int, overhead: int, kv_need: int, kv_note: str, state: int, draft: int
                ) -> tuple[list[GpuFit], list[Component], list[str], dict]:
    """TP x PP: every stage holds its layers (the first also the embedding, the last the output
    head) split over its TP ranks, and the KV cache and recurrent state of its layers; the
    activations and the runtime reserve are per GPU. GPU index = stage x TP + rank, a stage
    never straddling nodes when TP = GPUs per node."""
    tp, pp = max(1, req.tp), req.pp
    layers = stage_layers(len(split.per_layer), pp)
    n = max(1, len(split.per_layer))
    out: list[GpuFit] = []
    info = {}
    for stage, rng in enumerate(layers):
        w_stage = sum(split.per_layer[i] for i in rng)
        parts = [f"layers {rng.start}-{rng.stop - 1}"]
        if stage == 0:
            w_stage += split.embedding
            parts.append("embedding")
        if stage == pp - 1:
            w_stage += split.head
            parts.append("output head")
        share = len(rng) / n
        for rank in range(tp):
            gi = stage * tp + rank
            gpu = rig.gpus[gi % len(rig.gpus)]
            cap = gpu.free_bytes or gpu.vram_bytes
            where = f"{split.source}: stage {stage} ({', '.join(parts)}) / TP {tp}"
            comps = [Component("weights", w_stage // tp, where),
                     Component("activations", act, f"{coef:g} x 48 x ctx / TP"
                               + (f" + GDN prefill scratch (b={b})" if scratch else "")),
                     Component("cuda_graphs", overhead, f"(0.5 + {frac} + 0.3 x (TP-1)) GB")]
            if state:
                comps.append(Component("recurrent_state", int(state * share) // tp,
                                       f"{req.parallel} seq(s) of linear-attention state of the stage's layers / TP"))
            if draft and stage == pp - 1:
                comps.append(Component("draft", draft, "draft model / TP, on the last stage"))
            budget = int(frac * cap)
            kv = int(kv_need * share)
            pool = budget - sum(c.bytes for c in comps)
            comps.append(Component("kv_cache", kv, f"{kv_note}, x {len(rng)}/{n} layers of stage {stage}"))
            if pool > kv:
                comps.append(Component("kv_pool_spare", pool - kv, f"pool sized from {frac} x VRAM"))
            out.append(GpuFit(gi, cap, tuple(comps)))
            info[gi] = (pool, kv, budget)
    nodes = -(-tp * pp // len(rig.gpus))
    notes = [f"{req.engine} sizes its KV pool from {frac} x VRAM",
             f"TP {tp} x PP {pp} = {tp * pp} GPUs on {nodes} node(s): layers split "
             f"{'/'.join(str(len(r)) for r in layers)} by stage; KV per stage in proportion to its layers"]
    return out, [], notes, info


def gdn_prefill_scratch(arch: ModelArch, tokens: int, tp: int = 1) -> int:
    """Bytes the chunked Gated-DeltaNet prefill holds for ``tokens`` tokens (per card): one
    state per 64-token chunk and the gated value projections, at 2 bytes."""
    if not (tokens and arch.count(LayerKind.LINEAR) and arch.linear):
        return 0
    vh = arch.linear.n_value_heads / max(1, tp)
    kd, vd = arch.linear.key_head_dim, arch.linear.value_head_dim
    return int(math.ceil(tokens / 64) * vh * kd * vd * 2 + 2 * tokens * vh * vd * 2)


def moe_workspace(arch: ModelArch, tokens: int, tp: int = 1) -> int:
    """The fused-MoE kernel's three caches for ``tokens`` tokens (per card, 2 bytes): each
    token's active experts' gate-up output, activation and down-projection output."""
    if arch.moe is None or not tokens:
        return 0
    m = arch.moe
    inter = m.expert_intermediate_size / max(1, tp)
    return int(tokens * m.n_experts_active * (3 * inter + arch.hidden_size) * 2)


def with_vision_tower(arch: ModelArch, req: FitRequest, split: WeightSplit) -> tuple[int, str]:
    """The weights counted from the parameters (``split``: the text model's alone), with the vision tower when the
    launch builds it, at 16 bits whatever the text model's quant: published checkpoints leave the tower so (and a
    random-weight folder's quantization_config does: ``engines.hffolder``). A checkpoint's own size, or a GGUF's
    tensors, as they are."""
    vision = arch.vision.param_count if arch.vision and arch.vision.param_count else 0
    if not (vision and req.vision) or req.weight_bytes is not None or split.source == "GGUF tensor bytes":
        return split.total, split.source
    return split.total + vision * TOWER_BYTES_PER_PARAM, split.source + ", with the vision tower (16-bit)"


def profiled_weights(arch: ModelArch, req: FitRequest, split: WeightSplit) -> tuple[int, str]:
    """The weights a profiling engine loads: the text model, with the vision tower only when the
    launch serves images and the MTP layers only when MTP drafts. A given checkpoint size holds
    both; a size counted from the parameters holds neither."""
    total, how = split.total, split.source
    params = arch.total_param_count or 0
    per_param = total / params if params and req.weight_bytes is not None else 0.0
    vision = arch.vision.param_count if arch.vision and arch.vision.param_count else 0
    mtp = arch.mtp_param_count or 0
    mtp_loaded = req.spec_method == "mtp"
    if req.weight_bytes is not None and per_param:
        if vision and not req.vision:
            total -= int(vision * per_param)
            how += ", less the vision tower (text only)"
        if mtp and not mtp_loaded:
            total -= int(mtp * per_param)
            how += ", less the MTP layers (not drafting with MTP)"
    elif split.source != "GGUF tensor bytes":
        per_param = total / max(arch.param_count or params or 1, 1)
        total, how = with_vision_tower(arch, req, split)
        if mtp and mtp_loaded:
            total += int(mtp * per_param)
            how += ", with the MTP layers"
    return total, how


def _fit_profiled(arch: ModelArch, req: FitRequest, prof: PoolProfile, gpus: tuple[GpuSpec, ...], frac: float,
                  split: WeightSplit, kv_need: int, kv_note: str, state: int, draft: int, engine: str,
                  long_ctx: tuple[int, str], reserve: tuple[int, str]
                  ) -> tuple[list[GpuFit], list[Component], list[str], dict]:
    """vLLM's CUDA build (catalog ``pool_profile``): it asks for ``frac`` x the device's total as
    CUDA reports it, and its KV pool (which also holds the hybrid layers' recurrent state) is
    what the weights, the profiling pass's peak, the memory outside torch and the CUDA graphs
    leave of that. Sized on the device's total, not its free memory: vLLM refuses to start when
    less than the request is free, and fit says so. The activation reserve is the larger of the
    profiled peak and ``long_ctx`` (the catalog's ``pool_activation``: what a long context held at
    run time in the recipes' 3090 measurements, growing with ctx; the profiling pass alone does not
    see a long prefix). Likewise the memory outside the weights, activations and KV is at least
    ``reserve`` (the recipes' runtime overhead on 3090s, CUDA graphs at their capture sizes
    included): what it holds beyond vLLM's own non-torch and CUDA-graph figures is a row of its
    own, ``runtime_reserve``, which vLLM logs nowhere (so fit's pool is the smaller by it)."""
    tp = max(1, req.tp)
    b = int(req.extra.get("max_num_batched_tokens", 0)) or prof.default_batched_tokens(gpus[0].vram_bytes, gpus[0].name)
    weights, how = profiled_weights(arch, req, split)
    peak = int(b * prof.activation_per_hidden * arch.hidden_size / tp)
    scratch, moe = gdn_prefill_scratch(arch, b, tp), moe_workspace(arch, b, tp)
    act_how = f"profiling pass of {b} tokens: {prof.activation_per_hidden:g} B x hidden {arch.hidden_size} / TP"
    act_how += " + GDN prefill scratch" if scratch else ""
    act_how += " + fused-MoE workspace" if moe else ""
    act = peak + scratch + moe
    if long_ctx[0] > act:
        act, act_how = long_ctx[0], f"{long_ctx[1]} (a long context; the profiling pass: {act / GB:.2f} GB)"
    largest = min(512, 2 * max(1, req.parallel))
    graphs = (prof.cuda_graphs_gib + (prof.cuda_graphs_full_gib - prof.cuda_graphs_gib)
              * max(0, largest - 8) / (512 - 8)) * (1 << 30)
    out: list[GpuFit] = []
    info: dict = {}
    notes = [f"{engine} sizes its KV pool from {frac} x the GPU's total as CUDA reports it "
             f"({100 * prof.device_reserved:.2f}% under the device's)"]
    if req.vision and arch.vision is not None:
        notes.append("the vision tower is part of the checkpoint's weights")
    non_torch = int(prof.non_torch_gib * (1 << 30))
    extra = reserve[0] - non_torch - int(graphs)      # the recipes' overhead beyond vLLM's own two figures
    for gi in range(tp):
        gpu = gpus[gi]
        cuda_total = gpu.vram_bytes - int(prof.device_reserved * gpu.vram_bytes)
        budget = int(frac * cuda_total)
        fixed = [Component("weights", weights // tp, how + (f" / TP {tp}" if tp > 1 else "")),
                 Component("activations", act, act_how),
                 Component("non_torch", non_torch, "memory outside torch (CUDA context)"),
                 Component("cuda_graphs", int(graphs), f"graphs captured up to {largest} tokens")]
        if extra > 0:
            fixed.append(Component("runtime_reserve", extra, f"the recipes' runtime overhead {reserve[1]} less "
                                                             "non_torch and cuda_graphs"))
        if draft:
            fixed.append(Component("draft", draft, "draft model / TP"))
        pool = budget - sum(c.bytes for c in fixed)
        comps = list(fixed)
        if state:
            comps.append(Component("recurrent_state", state, f"{req.parallel} sequence(s) of linear-attention "
                                                             "state / TP, in the KV pool"))
        comps.append(Component("kv_cache", kv_need, kv_note))
        if pool - state > kv_need:
            comps.append(Component("kv_pool_spare", pool - state - kv_need, f"pool sized from {frac} x CUDA's total"))
        out.append(GpuFit(gi, gpu.vram_bytes, tuple(comps)))
        info[gi] = (pool, kv_need + state, budget)    # each sequence takes its KV and its state from the pool
        if gpu.free_bytes is not None and gpu.free_bytes < budget:
            info["refused"] = (f"GPU{gi}: {engine} asks for {frac} x {cuda_total / (1 << 30):.2f} GiB = "
                               f"{budget / (1 << 30):.2f} GiB but {gpu.free_bytes / (1 << 30):.2f} GiB is free; "
                               "it refuses to start (free memory first, or lower its memory fraction)")
    return out, [], notes, info
