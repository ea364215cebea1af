"""(model, rig, priority) -> ranked Plans, each with its reasons, computed from data.

Nothing here knows an answer in advance. ``plan`` enumerates every candidate config
(engine x compatible quant x KV dtype x speculative-decoding drafter x TP group or
independent instances), sizes each with ``fit`` (``fit.max_context`` / ``fit.max_concurrency``
where the priority needs them), drops those that break the priority's constraints (from
catalog/priorities.yaml), and ranks the rest by the priority's rank keys. Speeds come from
the bandwidth roofline (bytes read per token / memory bandwidth) times the engine's measured
efficiency band and the drafter's acceptance length. Every reason line names the catalog
field or fit number it rests on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from .arch import LayerKind, ModelArch, load_arch
from .catalog import (Catalog, Drafter, Engine, Model, Priority, Quant, arch_from_catalog,
                      find_engine, find_model, find_priority, load_catalog)
from .catalog.load import closest_model
from .catalog.schema import (GB, ArchBlock, DecodeModel, KvDtype, LinearBlock, MoEBlock, Quality,
                             RankKey, VisionBlock)
from .errors import BadInput, EngineroomError, NotFound
from .fit import (BITS_PER_WEIGHT, Fit, FitRequest, check_ctx, fit, kv_dtype_spec, kv_refusal,
                  max_concurrency, max_context)
from .hardware import Rig
from . import units

COMPUTE_CAVEAT_SEQS = 8      # from this many sequences on, say the aggregate ignores compute
SPEED_DEPTH = 4096          # decode speed is quoted at this KV depth (tokens already in context)
STATUS_ORDER = {"validated": 3, "mainline": 2, "fork": 1, "retest-pending": 0}
# rank metrics known before any fit: planning can size candidates lazily in rank order
STATIC_METRICS = {"decode_tps", "quality", "quant_portability", "engine_status",
                  "engine_non_nvidia_vendors", "cold_start_s"}


@dataclass(frozen=True)
class SpeedBand:
    """Expected single-stream decode speed: the engine's decode model (bytes over a share of
    the bandwidth, plus fixed per-layer and per-token costs) x TP scaling x spec multiplier."""

    low: float
    high: float
    roofline_tps: float                    # bandwidth / bytes, no overheads (the upper bound)
    bytes_per_token: int
    bandwidth_gbs: float                   # one GPU's datasheet bandwidth
    efficiency: tuple[float, float]        # share of that bandwidth the byte stream reaches
    efficiency_source: str
    overhead_ms: tuple[float, float] = (0.0, 0.0)   # fixed cost per token (layers x per-layer + per-token)
    tp_scale: float = 1.0
    spec_multiplier: tuple[float, float] = (1.0, 1.0)
    spec_source: str = ""
    threads: int | None = None                         # CPU decode threads (None: a GPU, or an unknown CPU)
    per_thread_gbs: tuple[float, float] | None = None  # CPU compute roof per thread, when it applies

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Plan:
    rank: int
    priority: str
    model: str
    engine: str
    quant: str
    quant_format: str
    kv_dtype: str
    ctx: int
    max_ctx: int | None
    n_seqs: int
    spec: str | None                 # drafter id ("mtp", "dflash-qwen3.6-27b") or None
    spec_tokens: int
    tp: int                          # GPUs per instance (tensor parallel or layer split)
    instances: int                   # independent copies on the rig
    multi_gpu_mode: str
    per_gpu_bytes: tuple[int, ...]   # predicted use on each GPU (device) of the rig
    capacity_bytes: tuple[int, ...]
    breakdown: tuple[tuple[str, int, str], ...]   # (component, bytes, how) on the busiest device
    verdict: str
    binding: str
    decode: SpeedBand | None
    aggregate_tps: float | None
    metrics: dict[str, float]
    reasons: tuple[str, ...]
    tradeoffs: tuple[str, ...] = ()
    fit: Fit | None = field(default=None, repr=False, compare=False)
    # llama.cpp slots as sized: -np n_seqs with --no-kv-unified unless True (the launcher passes both)
    kv_unified: bool = False

    @property
    def layout(self) -> str:
        if self.instances > 1:
            return f"{self.instances} instances" + (f" x TP={self.tp}" if self.tp > 1 else "")
        if self.tp > 1:
            return f"TP={self.tp}" if self.multi_gpu_mode == "tensor_parallel" else f"split x{self.tp}"
        return "1 device"


# ---------------------------------------------------------------------------------------
# helpers over catalog data
# ---------------------------------------------------------------------------------------


def _gb(b: float) -> str:
    from .units import gib   # memory in GiB, the one convention (units.py)

    return gib(b, 1)


def _cc(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")) if v else (0,)


def kv_bytes_per_token(arch: ModelArch, kv: KvDtype, depth: int) -> int:
    """KV bytes read per decoded token at ``depth`` (full layers read all, sliding their window)."""
    total = 0.0
    for kind in arch.layer_kinds:
        if kind in (LayerKind.FULL, LayerKind.SLIDING):
            toks = min(depth, arch.sliding_window) if kind == LayerKind.SLIDING and arch.sliding_window else depth
            total += arch.n_kv_heads * arch.head_dim * 2 * kv.bytes_per_elem * toks
    return int(total)


_GGML_TYPE = re.compile(r"(iq\d_[a-z]+|q\d_k|q\d_\d|bf16|f16|f32)")


def weight_type_mix(arch: ModelArch | None, quant_id: str) -> tuple[tuple[str, float], ...]:
    """The share of streamed weight bytes per ggml type: from the GGUF's tensors when known
    (the token-embedding lookup left out unless it doubles as the head), else the type the
    quant id names ("Q4_K_M" -> q4_k) for all of it."""
    if arch is not None and arch.tensor_bytes and arch.tensor_types:
        by: dict[str, int] = {}
        for name, b in arch.tensor_bytes.items():
            if name.startswith("token_embd") and not arch.tie_embeddings:
                continue
            t = arch.tensor_types[name].lower()
            by[t] = by.get(t, 0) + b
        total = sum(by.values())
        if total:
            return tuple(sorted(((t, b / total) for t, b in by.items()), key=lambda x: -x[1]))
    m = _GGML_TYPE.search(quant_id.lower())
    return ((m.group(1) if m else quant_id.lower(), 1.0),)


def decode_rates(dm: DecodeModel, bytes_per_token: float, n_layers: int, bandwidth_gbs: float,
                 threads: int | None = None, mix: tuple[tuple[str, float], ...] = ()) -> tuple[float, float, float]:
    """(slow, middle, fast) single-stream tokens/s on one device by the engine's decode model:
    time per token = bytes / stream rate + per_token_ms + layers x per_layer_ms. Each ggml
    weight type's share of the bytes (``mix``) streams at min(threads x its per-thread rate,
    its efficiency x bandwidth) (per_thread_for / efficiency_for: a CPU kernel's compute roof
    and how it reads memory), and the shares' times add (a harmonic mean of the rates). None
    threads, or no per-thread rates (GPUs): memory-bound, efficiency x bandwidth."""
    parts = []
    for t, share in (mix or (("", 1.0),)):
        pt = dm.per_thread_for(t) if threads and (dm.per_thread_gbs or dm.per_thread_by_type) else None
        parts.append((share, pt, dm.efficiency_for(t)))
    tot = sum(share for share, _, _ in parts) or 1.0

    def rate(pick, per_layer_ms: float) -> float:
        s_per_gb = 0.0
        for share, pt, ef in parts:
            stream = pick(ef) * bandwidth_gbs
            if pt is not None:
                stream = min(stream, threads * pick(pt))
            s_per_gb += share / tot / stream
        return 1.0 / (bytes_per_token * s_per_gb / GB + dm.fixed_ms(n_layers, per_layer_ms) / 1000)
    lay = dm.per_layer_ms
    return (rate(lambda r: r[0], lay.high),
            rate(lambda r: (r[0] + r[1]) / 2, (lay.low + lay.high) / 2),
            rate(lambda r: r[1], lay.low))


def _mixed_per_thread(dm: DecodeModel, threads: int | None, mix) -> tuple[float, float] | None:
    """The (low, high) per-thread GB/s for this weight mix: each type's bytes stream at that
    type's rate, so the mix's rate is the share-weighted harmonic mean (None: no compute roof)."""
    if not threads or not (dm.per_thread_gbs or dm.per_thread_by_type):
        return None
    parts = [(share, dm.per_thread_for(t)) for t, share in (mix or (("", 1.0),))]
    parts = [(share, r) for share, r in parts if r]
    if not parts:
        return None
    tot = sum(share for share, _ in parts)
    return tuple(tot / sum(share / r[i] for share, r in parts) for i in (0, 1))  # type: ignore[return-value]


def weights_read_per_token(model: Model, arch: ModelArch, quant: Quant) -> int:
    """Weight bytes a decode step reads: the file minus the input-embedding lookup (the
    output head is read every token; tied, it is the embedding matrix); MoE: the trunk's
    bytes x its active share, where both counts leave the embedding and head out:
    (active - emb - head) / (params - emb - head), from the same parameter counter as
    ``param_count`` (``_active_param_count`` / the catalog's active_param_count)."""
    w = quant.weight_bytes
    params = (model.architecture.param_count if model.architecture else None) or arch.param_count
    if not params:
        return w
    emb_p = arch.vocab_size * arch.hidden_size              # one vocab x n_embd matrix
    n_mats = 1 if arch.tie_embeddings else 2                # embedding (+ untied head)
    emb = int(emb_p * w / params)                           # its bytes at the file's mean bits/weight
    trunk = max(0, w - n_mats * emb)
    active = model.architecture.active_param_count if model.architecture else None
    if active and active < params and params > n_mats * emb_p:
        share = max(0.0, (active - n_mats * emb_p) / (params - n_mats * emb_p))
        trunk = int(trunk * share)
    return max(trunk + emb, 1)      # + the head (tied: the embedding matrix read as the head)


def quality_cmp(a: Quant, b: Quant) -> int:
    """>0 if ``a`` is better than ``b``, 0 equal, <0 worse (kld when both have one, else tier)."""
    if a.quality.kld is not None and b.quality.kld is not None:
        return (a.quality.kld < b.quality.kld) - (a.quality.kld > b.quality.kld)
    return (a.quality.tier > b.quality.tier) - (a.quality.tier < b.quality.tier)


def quality_value(q: Quant) -> float:
    """A sortable quality: tier first, lower KLD breaks ties within a tier."""
    return q.quality.tier - (q.quality.kld or 0.0)


# ---------------------------------------------------------------------------------------
# candidates
# ---------------------------------------------------------------------------------------


@dataclass
class _Cand:
    engine: Engine
    quant: Quant
    kv: KvDtype
    drafter: Drafter | None
    tp: int
    instances: int
    groups: tuple[Rig, ...]          # one sub-rig per instance
    ctx: int = 0
    n_seqs: int = 1
    max_ctx: int | None = None
    rope_scaling: str | None = None  # the planner's --rope-scaling (ctx may exceed max positions)
    fits: tuple[Fit, ...] = ()
    decode: SpeedBand | None = None
    aggregate: float | None = None
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def request(self, arch: ModelArch, ctx: int, n_seqs: int, vision: bool) -> FitRequest:
        d = self.drafter
        return FitRequest(
            engine=self.engine.id, ctx=ctx, quant=self.quant.id, weight_bytes=self.quant.weight_bytes,
            kv_dtype=self.kv.id, n_seqs=n_seqs, tp=self.tp,
            spec_method=d.method if d else None, spec_tokens=d.spec_tokens if d else 0,
            draft_bytes=int(d.size_gb * GB) if d else 0, vision=vision,
            mem_fraction=self.engine.default_mem_fraction, rope_scaling=self.rope_scaling,
        )


def _max_seqs(arch: ModelArch, req: FitRequest, rig: Rig, cat: Catalog, cap: int = 256) -> int:
    """fit.max_concurrency, capped (a plan never proposes more than ``cap`` sequences)."""
    return max_concurrency(arch, req, rig, limit=cap, catalog=cat)


def _rig_groups(rig: Rig, engine: Engine, arch: ModelArch) -> list[tuple[int, int, tuple[Rig, ...]]]:
    """(tp, instances, sub-rigs): every way to use all of the rig's devices."""
    if not rig.gpus:
        return [(1, 1, (rig,))]
    n = rig.n_gpus
    out = []
    for tp in range(1, n + 1):
        if n % tp:
            continue
        if engine.multi_gpu.mode == "tensor_parallel" and arch.n_heads % tp:
            continue
        groups = tuple(replace(rig, gpus=rig.gpus[i:i + tp], label=f"{rig.label}[{i}:{i + tp}]" if n > 1 else rig.label)
                       for i in range(0, n, tp))
        if tp > 1 and engine.multi_gpu.mode == "tensor_parallel" and len({g.vram_bytes for g in rig.gpus}) > 1:
            continue  # mixed VRAM: TP shards evenly, the smallest card binds (spec: use TP=1 x instances)
        out.append((tp, n // tp, groups))
    return out


def _engine_runs_on(engine: Engine, rig: Rig) -> str | None:
    """None when the engine can run on the rig, else why not (``engine``: the catalog
    entry or its build for the rig's vendor, ``Engine.for_vendor``)."""
    if rig.vendor not in engine.vendors:
        builds = "; ".join(f"{b.id}: {', '.join(b.vendors)}" for b in engine.backends)
        return (f"{engine.id} does not run on {rig.vendor} "
                + (f"(its builds: {builds})" if builds else f"(vendors: {', '.join(engine.vendors)})"))
    if rig.gpus and rig.vendor == "nvidia" and engine.min_compute_capability:
        low = min((_cc(g.compute_capability) for g in rig.gpus), default=(0,))
        if low < _cc(engine.min_compute_capability):
            return f"{engine.id} needs compute capability >= {engine.min_compute_capability}"
    return None


def _quant_runs_on(quant: Quant, engine: Engine, rig: Rig) -> str | None:
    if engine.id not in quant.engines:
        return f"{quant.id} does not load in {engine.id} (loads in: {', '.join(quant.engines)})"
    if quant.format not in engine.quant_formats:
        if engine.backend:
            return (f"{engine.id}'s {engine.backend} build does not run {quant.format} weights "
                    f"(it runs: {', '.join(engine.quant_formats)})")
        return f"{engine.id} does not read {quant.format}"
    if quant.min_compute_capability:
        if not rig.gpus or rig.vendor != "nvidia":
            return f"{quant.id} needs NVIDIA compute capability >= {quant.min_compute_capability}"
        low = min(_cc(g.compute_capability) for g in rig.gpus)
        if low < _cc(quant.min_compute_capability):
            return f"{quant.id} needs compute capability >= {quant.min_compute_capability}"
    return None


def _capacity(rig: Rig) -> int:
    return sum(g.free_bytes if g.free_bytes is not None else g.vram_bytes for g in rig.gpus) if rig.gpus else (rig.cpu_ram_bytes or 0)


def _bandwidth(rig: Rig) -> float | None:
    """The bandwidth a decode model's efficiency applies to: the slowest GPU's datasheet
    figure; on a CPU-only rig the CPU's bandwidth at the thread count decode runs with
    (measured on this machine by ``hardware``'s copy probe, else the catalog default)."""
    if rig.gpus:
        vals = [g.bandwidth_gbs for g in rig.gpus]
        return None if any(v is None for v in vals) else min(vals)  # type: ignore[type-var]
    return rig.cpu_bandwidth_gbs


# ---------------------------------------------------------------------------------------
# the planner
# ---------------------------------------------------------------------------------------


class _Planner:
    def __init__(self, cat: Catalog, model: Model, arch: ModelArch, rig: Rig, prio: Priority,
                 ctx: int | None, engine: str | None, source: str = "catalog", seqs: int | None = None,
                 rope_scaling: str | None = None):
        cat = cat.for_vendor(rig.vendor)   # each engine as its build for this rig runs it (catalog backends)
        self.cat, self.model, self.arch, self.rig, self.prio = cat, model, arch, rig, prio
        self.source = source          # "catalog", or where a model outside it was read from
        self.user_ctx = ctx
        self.user_seqs = seqs         # --seqs: every candidate serves exactly this many sequences
        self.seqs_rule = prio.seqs if seqs is None else None   # the priority's rule, unless --seqs
        self.engines = [find_engine(cat, engine)] if engine else list(cat.engines)
        self.rejected: list[str] = []
        self.layout_misses: dict[tuple, str] = {}   # (engine, quant, kv, tp, instances) -> why not
        self.pool: list[_Cand] = []
        c = prio.constraints
        self.vision = "vision" in c.features
        self.ref_quant = model.quant(c.quality_at_least_quant) if c.quality_at_least_quant else None
        max_pos = arch.max_position or (1 << 20)
        self.rope_scaling = rope_scaling
        if ctx is not None:
            check_ctx(replace(arch, name=model.name), ctx, rope_scaling)   # BadInput names the maximum
            self.target_ctx = ctx
        else:
            self.target_ctx = max_pos if prio.ctx == "max" else min(int(prio.ctx), max_pos)
        self.min_ctx = ctx if ctx is not None else min(c.min_ctx or 1, self.target_ctx)

    # -- static filters ------------------------------------------------------------------
    def _engine_ok(self, e: Engine) -> str | None:
        why = _engine_runs_on(e, self.rig)
        if why:
            return why
        c = self.prio.constraints
        if c.engine_status and e.status not in c.engine_status:
            return f"{e.id} status is {e.status} (priority wants {'/'.join(c.engine_status)})"
        if c.api_parity == "full" and e.api_parity != "full":
            return f"{e.id} API parity is {e.api_parity} ({e.api_parity_source})"
        if c.non_nvidia_vendor and not any(v != "nvidia" for v in e.vendors):
            return f"{e.id} runs on NVIDIA only"
        for feat in c.features:
            if feat not in self.model.features:
                if self.source != "catalog":
                    return f"{self.model.name} is not in the catalog and its {feat} support is not known"
                return f"{self.model.name} lacks {feat}"
            if feat == "vision" and not e.vision:
                return f"{e.id} has no vision support"
            if feat == "tools" and not e.tools:
                return f"{e.id} has no tool calling"
            if feat == "reasoning" and not e.reasoning_parsers:
                return f"{e.id} has no reasoning parser"
        return None

    def _quant_ok(self, q: Quant, e: Engine) -> str | None:
        why = _quant_runs_on(q, e, self.rig)
        if why:
            return why
        if self.ref_quant is not None and quality_cmp(q, self.ref_quant) < 0:
            return (f"{q.id} quality (tier {q.quality.tier}{f', KLD {q.quality.kld}' if q.quality.kld is not None else ''})"
                    f" is below {self.ref_quant.id}'s")
        return None

    def _drafters(self, q: Quant, e: Engine) -> list[Drafter | None]:
        c = self.prio.constraints
        out: list[Drafter | None] = []
        if self.prio.spec == "any" or c.spec_method:
            for d in self.cat.drafters_for(self.model, e.id):
                if d.method not in e.spec_methods:
                    continue
                if d.builtin and not q.mtp:
                    continue
                if c.spec_method and d.method != c.spec_method:
                    continue
                out.append(d)
        if not c.spec_method:
            out.insert(0, None)
        return out

    def candidates(self) -> list[_Cand]:
        out = []
        for e in self.engines:
            why = self._engine_ok(e)
            if why:
                self.rejected.append(why)
                continue
            layouts = _rig_groups(self.rig, e, self.arch)
            for q in self.model.quants:
                why = self._quant_ok(q, e)
                if why:
                    self.rejected.append(why)
                    continue
                drafters = self._drafters(q, e)
                if not drafters:
                    self.rejected.append(f"{e.id} + {q.id}: no drafter for {self.prio.constraints.spec_method}")
                    continue
                for tp, inst, groups in layouts:
                    if q.weight_bytes > min(_capacity(g) for g in groups) * 1.0:
                        self.rejected.append(f"{e.id} + {q.id}: {q.size_gb:g} GB of weights exceed "
                                             f"{units.capacity(min(_capacity(g) for g in groups))} per instance")
                        continue
                    for kv in e.plan_kv_dtypes:
                        refused = kv_refusal(self.arch, FitRequest(engine=e.id, ctx=1, kv_dtype=kv.id), self.cat)
                        if refused:   # the engine would not start: never a candidate
                            self.rejected.append(f"{e.id} + KV {kv.id}: {e.id} refuses it ({refused})")
                            continue
                        for d in drafters:
                            out.append(_Cand(e, q, kv, d, tp, inst, groups, rope_scaling=self.rope_scaling))
        return out

    # -- sizing --------------------------------------------------------------------------
    def _fit_all(self, c: _Cand, ctx: int, n_seqs: int) -> tuple[Fit, ...]:
        req = c.request(self.arch, ctx, n_seqs, self.vision)
        first = fit(self.arch, req, c.groups[0], catalog=self.cat)
        if all(g.gpus == c.groups[0].gpus for g in c.groups[1:]):
            return (first,) + tuple(replace(first, rig_label=g.label) for g in c.groups[1:])
        return (first,) + tuple(fit(self.arch, req, g, catalog=self.cat) for g in c.groups[1:])

    def _groups(self, c: _Cand) -> tuple[Rig, ...]:
        """Distinct sub-rigs (identical instances need one fit)."""
        if all(g.gpus == c.groups[0].gpus for g in c.groups[1:]):
            return c.groups[:1]
        return c.groups

    def _servable(self, c: _Cand, fits: tuple[Fit, ...]) -> bool:
        for f in fits:
            if f.verdict == "does_not_fit":
                return False
            if c.engine.concurrency.model == "continuous_batching" and "caps" in f.binding:
                return False
        return True

    def _max_ctx(self, c: _Cand, n_seqs: int = 1) -> int:
        if c.max_ctx is None:
            max_pos = self.arch.max_position or 0
            if c.fits and c.ctx == max_pos and n_seqs == 1 and c.n_seqs == 1:
                c.max_ctx = max_pos        # already served at the model's full context
            else:
                req = c.request(self.arch, self.min_ctx, n_seqs, self.vision)
                c.max_ctx = min(max_context(self.arch, req, g, catalog=self.cat) for g in self._groups(c))
        return c.max_ctx

    def size(self, c: _Cand) -> bool:
        """Choose ctx and sequences for ``c``; False (with a reason) when it cannot serve."""
        label = f"{c.engine.id} + {c.quant.id} + {c.kv.id}" + (f" + {c.drafter.id}" if c.drafter else "")
        needs_max = self.prio.ctx == "max" or any(k.metric == "max_ctx" for k in self.prio.rank[:1])
        base = self.user_seqs or 1      # context is sized for this many sequences
        fits = self._fit_all(c, self.target_ctx, base)
        if self._servable(c, fits):
            ctx = self.target_ctx
            if needs_max:
                c.ctx, c.fits, c.n_seqs = ctx, fits, base
                self._max_ctx(c, base)
        else:
            lay = (f"{c.instances} independent instance(s)" if c.instances > 1 else f"TP={c.tp}" if c.tp > 1 else "one device")
            if self.user_ctx is not None:
                self.rejected.append(f"{label}: does not fit at {self.user_ctx} tokens x {base} sequence(s) ({fits[0].binding})")
                self.layout_misses[(c.engine.id, c.quant.id, c.kv.id, c.tp, c.instances)] = \
                    f"({lay}) does not fit at {self.user_ctx:,} tokens: {fits[0].binding}"
                return False
            low = self._fit_all(c, self.min_ctx, base) if self.min_ctx < self.target_ctx else fits
            mc = self._max_ctx(c, base) if self._servable(c, low) else 0
            if mc < self.min_ctx or mc <= 0:
                self.rejected.append(f"{label}: fills only {mc} tokens, below {self.min_ctx} ({fits[0].binding})")
                self.layout_misses[(c.engine.id, c.quant.id, c.kv.id, c.tp, c.instances)] = \
                    f"({lay}) fills only {mc:,} tokens: {fits[0].binding}"
                return False
            self.layout_misses.setdefault((c.engine.id, c.quant.id, c.kv.id, c.tp, c.instances),
                                          f"({lay}) does not fit {self.target_ctx:,} tokens ({fits[0].binding}); it fills {mc:,}")
            ctx = mc
            fits = self._fit_all(c, ctx, base)
        n_seqs = base
        if self.seqs_rule == "max":
            req = c.request(self.arch, ctx, 1, self.vision)
            n_seqs = max(1, min(_max_seqs(self.arch, req, g, self.cat) for g in self._groups(c)))
            if n_seqs > 1:
                fits = self._fit_all(c, ctx, n_seqs)
        elif isinstance(self.seqs_rule, int) and self.seqs_rule > 1:
            n_seqs = self.seqs_rule
            fits = self._fit_all(c, ctx, n_seqs)
            if not self._servable(c, fits):
                self.rejected.append(f"{label}: cannot hold {n_seqs} sequences")
                return False
        if n_seqs < self.prio.constraints.min_seqs:
            self.rejected.append(f"{label}: holds {n_seqs} sequence(s), priority wants {self.prio.constraints.min_seqs}")
            return False
        c.ctx, c.n_seqs, c.fits = ctx, n_seqs, fits
        return True

    # -- speed ---------------------------------------------------------------------------
    def speed(self, c: _Cand) -> None:
        bw = _bandwidth(c.groups[0])
        if not bw:
            c.decode = None
            c.aggregate = None
            return
        e, dm, layers = c.engine, c.engine.decode, self.arch.n_layers
        w = weights_read_per_token(self.model, self.arch, c.quant)
        kv = kv_bytes_per_token(self.arch, c.kv, min(SPEED_DEPTH, c.ctx))
        scale = 1.0 + (c.tp - 1) * e.multi_gpu.scaling      # the seed's measured per-stream TP ratio
        roof = bw * GB * scale / (w + kv)
        threads = c.groups[0].cpu_threads if not c.groups[0].gpus else None   # CPU: llama-server's default -t
        mix = ()
        if threads:   # CPU: the weights stream at their types' rates, the KV at its own ("kv_f16", ...)
            mix = tuple((t, share * w / (w + kv)) for t, share in weight_type_mix(self.arch, c.quant.id))
            mix += ((f"kv_{c.kv.id.lower()}", kv / (w + kv)),) if kv else ()
        slow, _middle, fast = decode_rates(dm, w + kv, layers, bw, threads, mix)
        m_lo = m_hi = 1.0
        src = ""
        if c.drafter is not None:
            d = c.drafter
            m_lo = d.acceptance_length.low / (1 + d.overhead.value)
            m_hi = d.acceptance_length.high / (1 + d.overhead.value)
            src = f"{d.id}: acceptance {d.acceptance_length.low:g}-{d.acceptance_length.high:g} ({d.acceptance_length.source}); overhead {d.overhead.value:g} ({d.overhead.source})"
        c.decode = SpeedBand(low=slow * scale * m_lo, high=fast * scale * m_hi, roofline_tps=roof,
                             bytes_per_token=w + kv, bandwidth_gbs=bw,
                             efficiency=(dm.bandwidth_efficiency.low, dm.bandwidth_efficiency.high),
                             efficiency_source=dm.source,
                             overhead_ms=(dm.fixed_ms(layers, dm.per_layer_ms.low), dm.fixed_ms(layers, dm.per_layer_ms.high)),
                             tp_scale=scale, spec_multiplier=(m_lo, m_hi), spec_source=src,
                             threads=threads,
                             per_thread_gbs=_mixed_per_thread(dm, threads, mix))
        # batched decode: one weight read serves every sequence in the step; each reads its KV
        n = c.n_seqs
        if n > 1:
            per_inst = n * scale * decode_rates(dm, w + n * kv, layers, bw, threads, mix)[1] * e.concurrency.batch_efficiency
        else:
            per_inst = c.decode.mid
        c.aggregate = per_inst * c.instances

    # -- metrics and ranking -------------------------------------------------------------
    def static_metrics(self, c: _Cand) -> None:
        e = c.engine
        c.metrics = {
            "decode_tps": c.decode.mid if c.decode else 0.0,
            "quality": quality_value(c.quant),
            "quant_portability": float(len(c.quant.engines)),
            "engine_status": float(STATUS_ORDER[e.status]),
            "engine_non_nvidia_vendors": float(sum(1 for v in e.vendors if v != "nvidia")),
            "cold_start_s": e.cold_start_s.value if e.cold_start_s else math.inf,
        }

    def metrics(self, c: _Cand) -> dict[str, float]:
        used = [g.used_bytes for f in c.fits for g in f.per_gpu]
        head = [g.headroom_bytes for f in c.fits for g in f.per_gpu]
        e = c.engine
        m = {
            "decode_tps": c.decode.mid if c.decode else 0.0,
            "aggregate_tps": c.aggregate or 0.0,
            "shared_prefix_tps": (c.aggregate or 0.0) * e.concurrency.multi_tenant_factor,
            "max_ctx": float(c.max_ctx if c.max_ctx is not None else c.ctx),
            "gpu_bytes": float(max(used)),
            "headroom_bytes": float(min(head)),
            "quality": quality_value(c.quant),
            "quant_portability": float(len(c.quant.engines)),
            "engine_status": float(STATUS_ORDER[e.status]),
            "engine_non_nvidia_vendors": float(sum(1 for v in e.vendors if v != "nvidia")),
            "cold_start_s": e.cold_start_s.value if e.cold_start_s else math.inf,
        }
        c.metrics = m
        return m

    def rank(self, cands: list[_Cand]) -> list[_Cand]:
        # the catalog's rank keys decide; engine maturity, then less memory, break exact ties
        keys = list(self.prio.rank)
        used = {k.metric for k in keys}
        keys += [k for k in (RankKey(metric="engine_status", goal="max"), RankKey(metric="gpu_bytes", goal="min"))
                 if k.metric not in used]
        if not all(k.metric in (c.metrics or {}) for c in cands for k in keys):
            keys = [k for k in keys if k.metric in STATIC_METRICS]
        return _rank(cands, keys)


def _rank(cands: list[_Cand], keys: list) -> list[_Cand]:
    """Candidates in rank order: the tie groups of ``_groups``, one after another."""
    return [c for group in _groups(cands, keys) for c in group]


def _groups(cands: list[_Cand], keys: list) -> list[list[_Cand]]:
    """Candidates in rank order, as groups that tie on every key in ``keys``."""
    if not cands:
        return []
    if not keys:
        return [cands]
    key, rest = keys[0], keys[1:]
    sign = -1.0 if key.goal == "max" else 1.0
    ordered = sorted(cands, key=lambda c: sign * c.metrics[key.metric])
    out: list[list[_Cand]] = []
    while ordered:
        best = ordered[0].metrics[key.metric]
        group = [c for c in ordered if _close(c.metrics[key.metric], best, key.tolerance)]
        ordered = [c for c in ordered if not _close(c.metrics[key.metric], best, key.tolerance)]
        out.extend(_groups(group, rest))
    return out


def _close(a: float, b: float, tol: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol


# ---------------------------------------------------------------------------------------
# reasons
# ---------------------------------------------------------------------------------------

_METRIC_TEXT = {
    "decode_tps": lambda c: f"{c.metrics['decode_tps']:.0f} t/s single-stream (band middle)",
    "aggregate_tps": lambda c: f"{c.metrics['aggregate_tps']:.0f} t/s aggregate over {c.n_seqs * c.instances} sequence(s)",
    "shared_prefix_tps": lambda c: f"{c.metrics['shared_prefix_tps']:.0f} t/s shared-prefix aggregate (x{c.engine.concurrency.multi_tenant_factor:g} {c.engine.concurrency.prefix_cache} prefix cache)",
    "max_ctx": lambda c: f"{int(c.metrics['max_ctx']):,} tokens fillable",
    "gpu_bytes": lambda c: f"{_gb(c.metrics['gpu_bytes'])} on the busiest device",
    "headroom_bytes": lambda c: f"{_gb(c.metrics['headroom_bytes'])} spare",
    "quality": lambda c: f"quality tier {c.quant.quality.tier}" + (f", KLD {c.quant.quality.kld:g}" if c.quant.quality.kld is not None else ""),
    "quant_portability": lambda c: f"{c.quant.id} loads in {len(c.quant.engines)} engine(s)",
    "engine_status": lambda c: f"engine status {c.engine.status}",
    "engine_non_nvidia_vendors": lambda c: f"{c.engine.id} runs on {', '.join(v for v in c.engine.vendors if v != 'nvidia')} besides NVIDIA",
    "cold_start_s": lambda c: (f"cold start {c.engine.cold_start_s.value:g} s ({c.engine.cold_start_s.source})"
                               if c.engine.cold_start_s else "cold start not published"),
}


def _label(c: _Cand) -> str:
    lay = f"{c.instances}x" if c.instances > 1 else ""
    tp = f" TP={c.tp}" if c.tp > 1 else ""
    return f"{lay}{c.engine.id} {c.quant.id} {c.kv.id}{tp}" + (f" +{c.drafter.id}" if c.drafter else "")


def _reasons(p: _Planner, c: _Cand, ranked: list[_Cand], idx: int) -> tuple[list[str], list[str]]:
    e, q, kv = c.engine, c.quant, c.kv
    f = c.fits[0]
    busiest = max(f.per_gpu, key=lambda g: g.used_bytes)
    comps = sorted(busiest.components, key=lambda x: -x.bytes)[:4]
    reasons = [
        f"priority {p.prio.id}: {p.prio.maximise}; here " +
        "; ".join(_METRIC_TEXT[k.metric](c) for k in p.prio.rank[:2]) + ".",
        f"quant {q.id} ({q.format}): {q.size_gb:g} GB on disk ({q.size_source or 'catalog'}); quality tier {q.quality.tier}"
        + (f", mean KLD {q.quality.kld:g}" if q.quality.kld is not None else "") + f" — {q.quality.source}.",
        f"fit: {_gb(busiest.used_bytes)} of {_gb(busiest.capacity_bytes)} on the busiest device ({f.verdict}); "
        + ", ".join(f"{x.name} {_gb(x.bytes)}" for x in comps) + ".",
        f"context {c.ctx:,} tokens" + (f" (max fillable {c.max_ctx:,}, fit.max_context)" if c.max_ctx else "")
        + f", KV {kv.id} at {kv.bytes_per_elem:g} B/elem"
        + (f", {c.n_seqs} sequences (--seqs)" if p.user_seqs and c.n_seqs > 1
           else f", {c.n_seqs} sequences (fit.max_concurrency)" if c.n_seqs > 1 else "") + ".",
    ]
    if c.decode:
        d = c.decode
        line = (f"decode {d.low:.0f}-{d.high:.0f} t/s: {_gb(d.bytes_per_token)} read per token at "
                + (f"min({d.threads} thread(s) x {d.per_thread_gbs[0]:.3g}-{d.per_thread_gbs[1]:.3g} GB/s per thread, "
                   if d.per_thread_gbs and d.threads else "")
                + f"{d.efficiency[0]:g}-{d.efficiency[1]:g} x {d.bandwidth_gbs:.0f} GB/s"
                + (")" if d.per_thread_gbs and d.threads else "") + ", plus "
                + f"{d.overhead_ms[0]:.1f}-{d.overhead_ms[1]:.1f} ms fixed per token ({p.arch.n_layers} layers)"
                + (f", x {d.tp_scale:g} for TP={c.tp}" if c.tp > 1 else "")
                + (f"; CPU bandwidth {d.bandwidth_gbs:g} GB/s"
                   + (f" at {p.rig.cpu_threads} thread(s)" if p.rig.cpu_threads else "")
                   + f": {p.rig.cpu_bandwidth_source or 'catalog default'}" if not p.rig.gpus else "")
                + f"; roofline {d.roofline_tps:.0f} t/s ({d.efficiency_source})")
        if c.drafter:
            line += f" x spec {d.spec_multiplier[0]:.2f}-{d.spec_multiplier[1]:.2f} ({c.drafter.id}, acceptance length {c.drafter.acceptance_length.low:g}-{c.drafter.acceptance_length.high:g}: {c.drafter.acceptance_length.source})"
        reasons.append(line + ".")
    else:
        reasons.append("decode speed unknown: the rig's memory bandwidth is not in the catalog.")
    if c.n_seqs > 1 or c.instances > 1:
        reasons.append(f"aggregate {c.aggregate or 0:.0f} t/s = {c.instances} instance(s) x {c.n_seqs} sequence(s), "
                       f"batch efficiency {e.concurrency.batch_efficiency:g} ({e.concurrency.source}).")
    if c.tp > 1:
        reasons.append(f"{c.tp} GPUs per instance by {e.multi_gpu.mode} (per-stream scaling {e.multi_gpu.scaling:g}: {e.multi_gpu.source}).")
    reasons.append(f"engine {e.id}: status {e.status}, API parity {e.api_parity}, cold start "
                   + (f"{e.cold_start_s.value:g} s ({e.cold_start_s.source})" if e.cold_start_s else "not published") + ".")
    # compare with the best alternative of a different layout / engine, with numbers
    if idx == 0 and len(ranked) > 1:
        alt = next((r for r in ranked[1:] if (r.engine.id, r.quant.id) != (e.id, q.id)), ranked[1])
        keys = [k for k in p.prio.rank if not _close(c.metrics.get(k.metric, 0), alt.metrics.get(k.metric, 0), k.tolerance)]
        if keys:
            k = keys[0]
            tied = [t.metric for t in p.prio.rank[:p.prio.rank.index(k)]]
            reasons.append(f"beats {_label(alt)} on {k.metric}: {_METRIC_TEXT[k.metric](c)} vs {_METRIC_TEXT[k.metric](alt)}"
                           + (f" (tied on {', '.join(tied)})" if tied else "") + ".")
        else:
            reasons.append(f"ties {_label(alt)} on every rank key; engine maturity and memory break the tie.")
        if p.rig.n_gpus > 1:
            other = next((r for r in ranked if r.engine.id == e.id and r.quant.id == q.id
                          and (r.tp, r.instances) != (c.tp, c.instances)), None)
            if other is None:  # size the same config in its other layout(s) to show the numbers
                for r in p.pool:
                    if (r.engine, r.quant, r.kv, r.drafter) == (e, q, kv, c.drafter) and (r.tp, r.instances) != (c.tp, c.instances):
                        if r.fits or p.size(r):
                            p.speed(r)
                            p.metrics(r)
                            other = r
                            break
            if other is None:
                miss = next((why for key, why in p.layout_misses.items()
                             if key[:3] == (e.id, q.id, kv.id) and key[3:] != (c.tp, c.instances)), None)
                if miss:
                    reasons.append(f"layout: {_label(c)} gives {c.metrics['aggregate_tps']:.0f} t/s aggregate at "
                                   f"{c.ctx:,} ctx x {c.n_seqs} seq; the other layout {miss}.")
            if other is not None:
                reasons.append(
                    f"layout: {_label(c)} gives {c.metrics['aggregate_tps']:.0f} t/s aggregate, {c.metrics['decode_tps']:.0f} t/s per stream at "
                    f"{c.ctx:,} ctx x {c.n_seqs} seq; {_label(other)} gives {other.metrics['aggregate_tps']:.0f} t/s aggregate, "
                    f"{other.metrics['decode_tps']:.0f} t/s per stream at {other.ctx:,} ctx x {other.n_seqs} seq."
                )
    trade = []
    if len(q.engines) == 1:
        trade.append(f"{q.id} loads only in {q.engines[0]}.")
    if e.status in ("fork", "retest-pending"):
        trade.append(f"{e.id} is {e.status}: {e.status_note}.")
    if e.api_parity != "full":
        trade.append(f"API parity partial: {e.api_parity_source}.")
    if f.verdict == "tight":
        trade.append(f"tight fit: {f.binding}.")
    if q.quality.tier < 4:
        trade.append(f"quality below 4-bit class (tier {q.quality.tier}).")
    if c.n_seqs >= COMPUTE_CAVEAT_SEQS:
        trade.append(f"aggregate {c.aggregate or 0:.0f} t/s is a memory-bandwidth estimate: at {c.n_seqs} sequences a "
                     "decode step may be compute-bound, which the plan does not model (no FLOPS figures in the catalog).")
    if p.source != "catalog":
        trade.append(f"not in the catalog: read from the {p.source}; "
                     + ("its size is the file's exact bytes" if q.size_bytes else "its size is an estimate")
                     + ", its quality a class tier.")
    return reasons, trade


# ---------------------------------------------------------------------------------------
# models outside the catalog: a Model built from a GGUF header or a config.json
# ---------------------------------------------------------------------------------------

# The quality tier of a quant the catalog has no entry (and no KLD) for, by its class: the
# tiers the catalog gives these classes. (tier, class, pattern searched in the lower-case
# quant id); the first match wins.
QUANT_CLASS_TIERS: tuple[tuple[int, str, str], ...] = (
    (6, "16-bit", r"^(bf16|f16|fp16|f32|fp32)$"),
    (5, "8-bit", r"q8_|fp8|int8"),
    (5, "6/5-bit", r"q6_|q5_"),
    (4, "4-bit", r"q4_|awq|gptq|autoround|int4|nvfp4|mxfp4"),
    (3, "3-bit", r"q3_"),
    (2, "2-bit or below", r"q2_|iq1_|tq1_"),
)
# the quants people usually make of a published model: (id, format); the engines that load
# each are the catalog engines listing the format in quant_formats
_USUAL_QUANTS = (("Q8_0", "gguf"), ("Q4_K_M", "gguf"), ("fp8", "fp8"), ("awq-int4", "awq"))


def _engines_loading(cat: Catalog, fmt: str) -> tuple[str, ...]:
    return tuple(e.id for e in cat.engines if fmt in e.quant_formats)


def class_quality(quant_id: str) -> Quality | None:
    """The class tier of ``quant_id`` (``QUANT_CLASS_TIERS``), or None for an unknown class."""
    key = quant_id.lower()
    for tier, label, pattern in QUANT_CLASS_TIERS:
        if re.search(pattern, key):
            return Quality(tier=tier, source=f"{label} class tier for {quant_id} (no KLD known for this file)")
    return None


@dataclass(frozen=True)
class ResolvedModel:
    """The model a plan or fit is about: a catalog entry (``source`` "catalog", ``arch`` None:
    the catalog's inline block), or one built from a file or repo by ``model_from_arch``."""

    model: Model
    arch: ModelArch | None = None
    source: str = "catalog"               # else e.g. "GGUF header of x.gguf"
    estimates: tuple[str, ...] = ()       # what the output must call a guess

    @property
    def in_catalog(self) -> bool:
        return self.source == "catalog"


def _names_file_or_repo(ref: str) -> bool:
    """A path, URL, hf:/org/repo reference, a .gguf/.json name, or anything on disk."""
    ref = ref.strip()
    return bool(ref) and ("/" in ref or ref.endswith((".gguf", ".json")) or Path(ref).expanduser().exists())


def resolve_model(ref: str | ResolvedModel, catalog: Catalog | None = None) -> ResolvedModel:
    """A catalog model (id, alias, name or HF repo); else, when ``ref`` names a file or repo,
    the model ``arch.load_arch`` reads from it. One BadInput/NotFound sentence says why
    neither worked; a plain name that is not in the catalog gets the catalog's error."""
    if isinstance(ref, ResolvedModel):
        return ref
    cat = catalog or load_catalog()
    if cat.model(ref) is not None or not _names_file_or_repo(ref):
        return ResolvedModel(find_model(cat, ref))
    try:
        arch = load_arch(ref)
    except (EngineroomError, OSError) as err:
        close = closest_model(cat, ref)
        hint = f" (did you mean '{close}'?)" if close else ""
        cls = NotFound if isinstance(err, NotFound) else BadInput
        raise cls(f"model '{ref}' is not in the catalog{hint} and cannot be read as a model file or repo: {err}") from None
    return model_from_arch(ref.strip(), arch, cat)


def _sized(qid: str, fmt: str, engines: tuple[str, ...], params: int, hf_repo: str | None = None) -> Quant:
    bits = BITS_PER_WEIGHT[qid.lower()]
    size = params * bits / 8
    return Quant(id=qid, format=fmt, size_gb=float(f"{size / GB:.3g}"), engines=engines, hf_repo=hf_repo,
                 size_source=f"estimate: {params:,} params x {bits:g} bits/weight; no such file checked",
                 quality=class_quality(qid))


def _gguf_quant(arch: ModelArch, ref: str, cat: Catalog) -> tuple[Quant, list[str]]:
    """The file itself: its type (general.file_type, else the tensor type holding most bytes)
    and its exact tensor bytes."""
    if not arch.tensor_bytes:
        raise BadInput(f"{ref} holds no weight tensors (a vocab-only GGUF?), so there is nothing to plan.")
    notes = []
    qid = (arch.file_type or "").removesuffix(" (guessed)")
    if arch.file_type and qid != arch.file_type:
        notes.append(f"quant id: the header's general.file_type is '{arch.file_type}'")
    if not qid or class_quality(qid) is None:
        by_type: dict[str, int] = {}
        for name, b in arch.tensor_bytes.items():
            by_type[arch.tensor_types[name]] = by_type.get(arch.tensor_types[name], 0) + b
        qid = max(by_type, key=lambda t: by_type[t])
        notes.append(f"quant id: no usable general.file_type; named after its largest tensor type, {qid}")
    quality = class_quality(qid) or Quality(tier=2, source=f"unknown quant class {qid}: lowest tier assumed (no KLD known)")
    exact = arch.weight_bytes_exact or 0
    notes.append(f"quality: {quality.source}")
    return Quant(id=qid, format="gguf", size_gb=float(f"{exact / GB:.3g}"), size_bytes=exact,
                 size_source=f"exact: {exact:,} bytes of tensors in the GGUF header", engines=_engines_loading(cat, "gguf"),
                 file=Path(ref).name, quality=quality), notes


# a float32 checkpoint is served at 16 bits: what the engines load it at by default
# (vLLM --dtype auto: "FP16 precision for FP32 and FP16 models", docs.vllm.ai engine args;
# llama.cpp's convert_hf_to_gguf --outtype auto: f16 unless the tensors are bf16)
_LOADED_AS = {"f32": "f16", "fp32": "f16", "float32": "f16"}
# published checkpoint dtype (ModelArch.torch_dtype) -> catalog quant format
_PUBLISHED_FORMAT = {"fp8": "fp8", "awq-int4": "awq", "gptq-int4": "gptq", "autoround-int4": "autoround"}


def _published_and_usual_quants(arch: ModelArch, hf_repo: str | None, cat: Catalog) -> tuple[list[Quant], list[str]]:
    """The published checkpoint (bf16, fp8, AWQ/GPTQ/AutoRound int4) for the engines that
    load its format, then the usual GGUF and vLLM/SGLang quants, each sized as parameters x
    bits per weight. Safetensors checkpoints carry the vision tower; a GGUF does not (it
    ships in a separate mmproj file, which fit adds when vision is on)."""
    params = arch.total_param_count
    if not params:
        raise BadInput(f"{arch.name} has no parameter count, so its weights cannot be sized.")
    vision = arch.vision.param_count if arch.vision and arch.vision.param_count else 0
    sizes = f"quant sizes: {params:,} parameters counted from the config's shapes x bits/weight per quant"
    if vision:
        sizes += f" (GGUF: {params - vision:,}, without the {vision:,}-parameter vision tower)"
    notes = [f"{sizes}; no such file was checked", "quality tiers: class tiers by quant type (no KLD known)"]
    dtype = (arch.torch_dtype or "").lower()
    if dtype not in BITS_PER_WEIGHT:
        notes.append(f"published dtype: {arch.torch_dtype or 'not stated'} in the config; bf16 assumed")
        dtype = "bf16"
    elif dtype in _LOADED_AS:
        notes.append(f"published dtype: {arch.torch_dtype} in the config; offered at {_LOADED_AS[dtype]}, "
                     "the 16-bit type the engines load a float32 checkpoint at by default (vLLM --dtype auto, "
                     "llama.cpp's converter --outtype auto)")
        dtype = _LOADED_AS[dtype]
    published = _PUBLISHED_FORMAT.get(dtype, "bf16")
    quants = [_sized(dtype, published, _engines_loading(cat, published), params, hf_repo)]
    quants += [_sized(qid, fmt, _engines_loading(cat, fmt), params - vision if fmt == "gguf" else params)
               for qid, fmt in _USUAL_QUANTS if qid != dtype]
    return quants, notes


def _active_param_count(arch: ModelArch) -> int | None:
    """MoE: the parameters one token reads, i.e. all but the idle experts' three matrices in
    each sparse layer (the shapes ``arch`` counted ``param_count`` from); None for dense."""
    m = arch.moe
    if m is None or not arch.param_count or not m.n_experts_active:
        return None
    layers = m.n_moe_layers if m.n_moe_layers is not None else arch.n_layers - m.first_dense_layers
    idle = layers * (m.n_experts - m.n_experts_active) * 3 * arch.hidden_size * m.expert_intermediate_size
    return arch.param_count - idle if 0 < idle < arch.param_count else None


def _arch_block(arch: ModelArch, source: str, active_param_count: int | None) -> ArchBlock:
    """``arch`` as the catalog's inline block (plan and fit use ``arch`` itself: this keeps
    the ad-hoc Model valid and self-describing)."""
    return ArchBlock(
        architecture=arch.architecture, n_layers=arch.n_layers, hidden_size=arch.hidden_size,
        vocab_size=arch.vocab_size, n_heads=arch.n_heads, n_kv_heads=arch.n_kv_heads, head_dim=arch.head_dim,
        layer_pattern=tuple(k.value for k in arch.layer_kinds), intermediate_size=arch.intermediate_size,
        sliding_window=arch.sliding_window, max_position=arch.max_position, rope_dim=arch.rope_dim,
        tie_embeddings=arch.tie_embeddings, mtp_layers=arch.mtp_layers, param_count=arch.param_count,
        active_param_count=active_param_count, torch_dtype=arch.torch_dtype, source=source,
        linear=LinearBlock(n_key_heads=arch.linear.n_key_heads, n_value_heads=arch.linear.n_value_heads,
                           key_head_dim=arch.linear.key_head_dim, value_head_dim=arch.linear.value_head_dim,
                           conv_kernel=arch.linear.conv_kernel) if arch.linear else None,
        moe=MoEBlock(n_experts=arch.moe.n_experts, n_experts_active=arch.moe.n_experts_active,
                     expert_intermediate_size=arch.moe.expert_intermediate_size,
                     n_shared_experts=arch.moe.n_shared_experts,
                     shared_intermediate_size=arch.moe.shared_intermediate_size) if arch.moe else None,
        vision=VisionBlock(depth=arch.vision.depth, hidden_size=arch.vision.hidden_size, n_heads=arch.vision.n_heads,
                           patch_size=arch.vision.patch_size, param_count=arch.vision.param_count)
        if arch.vision else None,
    )


def model_from_arch(ref: str, arch: ModelArch, catalog: Catalog | None = None) -> ResolvedModel:
    """A catalog-shaped Model for a model that is not in the catalog, validated like one.

    From a GGUF (``arch.source == "gguf"``): one quant, the file itself, at its exact tensor
    bytes, for the catalog engines that load GGUF. From a config.json: the published dtype
    plus the usual quants (GGUF Q8_0 / Q4_K_M, fp8, AWQ int4), each an estimate, each for
    the catalog engines whose quant_formats list its format.
    Quality is the quant's class tier; features are only what the arch proves (vision)."""
    cat = catalog or load_catalog()
    on_hub = arch.source == "config.json" and not Path(ref).expanduser().exists()
    gguf = arch.source == "gguf"
    source = (f"GGUF header of {ref}" if gguf else f"config.json of {ref} on Hugging Face" if on_hub
              else f"config.json at {ref}")
    try:
        if gguf:
            quant, notes = _gguf_quant(arch, ref, cat)
            quants = [quant]
        else:
            quants, notes = _published_and_usual_quants(arch, ref if on_hub else None, cat)
        notes.append("features: tool calling and reasoning cannot be read from "
                     f"{'a GGUF header' if gguf else 'a config.json'}, so none is assumed")
        notes += [f"architecture: {e}" for e in arch.estimated]
        active = _active_param_count(arch)
        if active and arch.moe:
            notes.append(f"decode speed: {active:,} of {arch.param_count:,} parameters read per token "
                         f"({arch.moe.n_experts_active} of {arch.moe.n_experts} experts), counted from the expert shapes")
        model = Model(id=ref, name=arch.name or ref, hf_repo=ref if on_hub else None,
                      architecture=_arch_block(arch, source, active), features=("vision",) if arch.vision else (),
                      quants=tuple(quants), notes=f"not in the catalog: read from the {source}")
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "model"
        raise BadInput(f"the {source} does not describe a model engineroom can plan "
                       f"({where}: {err.get('msg', 'invalid').rstrip('.')}).") from None
    return ResolvedModel(model=model, arch=arch, source=source, estimates=tuple(notes))


# ---------------------------------------------------------------------------------------
# public entry point
# ---------------------------------------------------------------------------------------


def plan(model_ref: str | ResolvedModel, rig: Rig, priority: str | None = None, ctx: int | None = None,
         engine: str | None = None, *, catalog: Catalog | None = None, limit: int | None = None,
         arch: ModelArch | None = None, detail: int = 1, seqs: int | None = None,
         rope_scaling: str | None = None) -> list[Plan]:
    """Ranked configs for serving ``model_ref`` on ``rig`` under ``priority`` (default: the
    catalog's default priority). Raises NotFound with the closest miss when nothing fits.
    ``model_ref``: anything ``resolve_model`` accepts (a catalog model, or a file or repo).

    ``limit`` caps how many plans come back (None: all that fit); ``detail`` is how many of
    the top plans get their largest fillable context (fit.max_context) when the priority did
    not need it for every candidate; the others keep ``max_ctx=None``. ``seqs``: every
    config serves exactly this many concurrent sequences, each at the full context (the
    context, and "max fillable", are sized for all of them); None: the priority decides."""
    if seqs is not None and seqs < 1:
        raise BadInput(f"--seqs must be at least 1, not {seqs}.")
    cat = catalog or load_catalog()
    subject = resolve_model(model_ref, cat)
    model = subject.model
    arch = arch or subject.arch or arch_from_catalog(model)
    prio = find_priority(cat, priority) if priority else cat.default_priority()
    p = _Planner(cat, model, arch, rig, prio, ctx, engine, source=subject.source, seqs=seqs,
                 rope_scaling=rope_scaling)   # ctx beyond the model's maximum only with rope_scaling
    pool = p.pool = p.candidates()
    prefix = []
    for k in prio.rank:
        if k.metric not in STATIC_METRICS:
            break
        prefix.append(k)
    if prefix and limit is not None and p.seqs_rule != "max":
        # The leading rank keys need no fit (speed at the target context, catalog fields):
        # group candidates by them, then size whole groups in rank order until ``limit``
        # can serve; the remaining keys (memory, context) order within those groups.
        for c in pool:
            c.ctx, c.n_seqs = p.target_ctx, seqs or 1
            p.speed(c)
            p.static_metrics(c)
        cands = []
        for group in _groups(pool, prefix):
            cands.extend(c for c in group if p.size(c))
            if len(cands) >= limit + 1:
                break
    else:
        cands = [c for c in pool if p.size(c)]
    if not cands:
        why = p.rejected[-1] if p.rejected else "no engine in the catalog can load it"
        raise NotFound(f"no configuration of {model.name} fits {rig.label or 'this rig'} for priority "
                       f"{prio.id}; closest miss: {why}.")
    for c in cands:
        p.speed(c)
        p.metrics(c)
    ranked = p.rank(cands)
    shown = ranked if limit is None else ranked[:limit]
    # fill in fillable context for shown plans when the priority did not need it
    for c in shown[:max(0, detail)]:
        if c.max_ctx is None:
            p._max_ctx(c, seqs or 1)
            c.metrics["max_ctx"] = float(c.max_ctx or c.ctx)
    out = []
    for i, c in enumerate(shown):
        reasons, trade = _reasons(p, c, ranked, i)
        f = c.fits[0]
        busiest = max(f.per_gpu, key=lambda g: g.used_bytes)
        out.append(Plan(
            rank=i + 1, priority=prio.id, model=model.id, engine=c.engine.id, quant=c.quant.id,
            quant_format=c.quant.format, kv_dtype=c.kv.id, ctx=c.ctx, max_ctx=c.max_ctx, n_seqs=c.n_seqs,
            spec=c.drafter.id if c.drafter else None, spec_tokens=c.drafter.spec_tokens if c.drafter else 0,
            tp=c.tp, instances=c.instances, multi_gpu_mode=c.engine.multi_gpu.mode,
            per_gpu_bytes=tuple(g.used_bytes for ff in c.fits for g in ff.per_gpu),
            capacity_bytes=tuple(g.capacity_bytes for ff in c.fits for g in ff.per_gpu),
            breakdown=tuple((x.name, x.bytes, x.note) for x in busiest.components),
            verdict=max((ff.verdict for ff in c.fits), key=["fits", "tight", "does_not_fit"].index),
            binding=f.binding, decode=c.decode, aggregate_tps=c.aggregate, metrics=dict(c.metrics),
            reasons=tuple(reasons), tradeoffs=tuple(trade), fit=f, kv_unified=f.request.kv_unified,
        ))
    return out


@dataclass(frozen=True)
class Choice:
    """One row of a "how to choose" table: a priority and its top plan (or why none fits)."""

    priority: str
    label: str
    plan: Plan | None
    why_none: str = ""


def how_to_choose(model_ref: str | ResolvedModel, rig: Rig, ctx: int | None = None, engine: str | None = None,
                  *, catalog: Catalog | None = None, seqs: int | None = None) -> list[Choice]:
    """The top pick for every priority in the catalog: the seed's "how to choose" table, computed."""
    cat = catalog or load_catalog()
    subject = resolve_model(model_ref, cat)     # once: a remote GGUF header is read once
    rows: list[Choice] = []
    for prio in cat.priorities:
        try:
            top = plan(subject, rig, prio.id, ctx=ctx, engine=engine, catalog=cat, limit=1, detail=1, seqs=seqs)
            rows.append(Choice(prio.id, prio.label, top[0]))
        except NotFound as err:
            if "no configuration of" not in str(err):
                raise          # an unknown model is the user's error, not a row
            rows.append(Choice(prio.id, prio.label, None, str(err)))
    return rows


def fit_one(model_ref: str | ResolvedModel, rig: Rig, engine: str, quant: str, kv_dtype: str, ctx: int,
            n_seqs: int | None = 1, tp: int = 1, *, catalog: Catalog | None = None,
            kv_unified: bool | None = None, rope_scaling: str | None = None,
            cpu_features: frozenset[str] | None = None, repack: bool = True) -> tuple[Model, Fit]:
    """One fit from catalog ids (the `engineroom fit` command): the quant's catalog size is the
    weight bytes. ``model_ref``: anything ``resolve_model`` accepts. ``n_seqs`` None: the
    engine's default launch (catalog default_slots / default_kv_unified: llama.cpp 4 slots,
    unified KV); an explicit slot count runs without a unified cache unless ``kv_unified``.
    A KV type the engine refuses for this model's head size is a BadInput with its reason."""
    cat = catalog or load_catalog()
    subject = resolve_model(model_ref, cat)
    model = subject.model
    cat = cat.for_vendor(rig.vendor)   # the engine's build for this rig (catalog backends)
    e = find_engine(cat, engine)
    q = model.quant(quant)
    if q is None:
        where = " in the catalog" if subject.in_catalog else f" (read from the {subject.source})"
        raise BadInput(f"{model.name} has no quant '{quant}'{where}; known: {', '.join(x.id for x in model.quants)}.")
    why = _quant_runs_on(q, e, rig) if rig.gpus else (
        f"{q.id} does not load in {e.id}" if e.id not in q.engines else
        f"{e.id}'s {e.backend} build does not run {q.format} weights (it runs: {', '.join(e.quant_formats)})"
        if e.backend and q.format not in e.quant_formats else None)
    if why:
        raise BadInput(f"cannot fit {model.name} {q.id} on {e.id}: {why}.")
    kv_dtype_spec(e.id, kv_dtype, catalog=cat)   # BadInput names the catalog's KV types
    if n_seqs is None:
        n_seqs, default_unified = e.default_slots, e.default_kv_unified
        kv_unified = default_unified if kv_unified is None else kv_unified
    if ctx <= 0 or n_seqs <= 0 or tp <= 0:
        raise BadInput("--ctx, --seqs and --tp must be positive.")
    if rig.gpus and tp > rig.n_gpus:
        raise BadInput(f"--tp {tp} needs {tp} GPUs but the rig {rig.label} has {rig.n_gpus}.")
    arch = subject.arch or arch_from_catalog(model)
    req = FitRequest(engine=e.id, ctx=ctx, quant=q.id, weight_bytes=q.weight_bytes, kv_dtype=kv_dtype,
                     n_seqs=n_seqs, tp=tp, mem_fraction=e.default_mem_fraction, kv_unified=bool(kv_unified),
                     rope_scaling=rope_scaling, cpu_features=cpu_features, repack=repack)
    refused = kv_refusal(arch, req, cat)
    if refused:
        raise BadInput(f"{e.id} refuses KV type {kv_dtype} for {model.name}: {refused}.")
    f = fit(arch, req, rig, catalog=cat)
    mc = max_context(arch, req, rig, catalog=cat)
    ms = max_concurrency(arch, req, rig, catalog=cat) if f.verdict != "does_not_fit" else 0
    return model, replace(f, max_ctx=mc, max_seqs=ms)


def plans_as_rows(plans: Iterable[Plan]) -> list[dict[str, Any]]:
    """Flat rows for tables and JSON (the Fit object is summarised, not nested)."""
    rows = []
    for p in plans:
        rows.append({
            "rank": p.rank, "engine": p.engine, "quant": p.quant, "kv": p.kv_dtype, "ctx": p.ctx,
            "max_ctx": p.max_ctx, "seqs": p.n_seqs, "spec": p.spec, "layout": p.layout,
            "per_gpu_gb": [round(b / GB, 2) for b in p.per_gpu_bytes],
            "decode_tps": [round(p.decode.low, 1), round(p.decode.high, 1)] if p.decode else None,
            "aggregate_tps": round(p.aggregate_tps, 1) if p.aggregate_tps else None,
            "verdict": p.verdict, "reasons": list(p.reasons), "tradeoffs": list(p.tradeoffs),
        })
    return rows
