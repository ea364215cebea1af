"""Candidate configs: which engine x quant x layout can run on a rig, before any fit.

Static filters only (vendor, compute capability, quant format, the rig's GPU groups); a
candidate that passes is sized by ``planner``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..arch import ModelArch
from ..catalog import Drafter, Engine, Quant
from ..catalog.engine_schema import KvDtype
from ..fit import Fit, FitRequest, usable_ram
from ..fit.pool import pool_fraction
from ..hardware import Rig
from ..units import GB
from .speed import SpeedBand


def _cc(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")) if v else (0,)


def quality_cmp(a: Quant, b: Quant) -> int:
    """>0 if ``a`` is better than ``b``, 0 equal, <0 worse (kld when both have one, else tier)."""
    if a.quality.kld is not None and b.quality.kld is not None:
        return (a.quality.kld < b.quality.kld) - (a.quality.kld > b.quality.kld)
    return (a.quality.tier > b.quality.tier) - (a.quality.tier < b.quality.tier)


def quality_value(q: Quant) -> float:
    """A sortable quality: tier first, lower KLD breaks ties within a tier."""
    return q.quality.tier - (q.quality.kld or 0.0)


@dataclass
class Candidate:
    """A candidate config while the planner sizes it: what it runs, then its ctx, fits, speed, metrics."""

    engine: Engine
    quant: Quant
    kv: KvDtype
    drafter: Drafter | None
    tp: int
    instances: int
    groups: tuple[Rig, ...]          # one sub-rig per instance (a pipeline: the whole cluster)
    ctx: int = 0
    parallel: int = 1
    max_ctx: int | None = None
    rope_scaling: str | None = None  # the planner's --rope-scaling (ctx may exceed max positions)
    fits: tuple[Fit, ...] = ()
    decode: SpeedBand | None = None
    aggregate: float | None = None
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    pp: int = 1                      # pipeline stages (one per node on a cluster rig)
    held: HeldAs | None = None       # how the launch holds it on this CPU, where not as the catalog says
    # the candidate's first request, by vision: later ones differ from it in ctx and parallel only
    base_requests: dict[bool, FitRequest] = field(default_factory=dict, repr=False, compare=False)

    @property
    def held_kv(self) -> KvDtype:
        """The KV type the launch holds (``auto`` at the CPU build's compute dtype: its own size)."""
        return self.held.kv if self.held else self.kv

    def request(self, arch: ModelArch, ctx: int, parallel: int, vision: bool) -> FitRequest:
        """fit's request at ``ctx`` x ``parallel``; ``vision``: the priority promises images (an engine without a
        text-only launch builds a checkpoint's tower anyway, and it is sized so)."""
        vision = vision or (arch.vision is not None and not self.engine.text_only_launch)
        base = self.base_requests.get(vision)
        if base is None:
            d, held = self.drafter, self.held
            base = self.base_requests[vision] = FitRequest(
                engine=self.engine.id, ctx=ctx, quant=held.quant if held else self.quant.id,
                weight_bytes=held.weight_bytes if held else self.quant.weight_bytes,
                kv_dtype=self.held_kv.id, parallel=parallel, tp=self.tp, pp=self.pp,
                spec_method=d.method if d else None, spec_tokens=d.spec_tokens if d else 0,
                draft_bytes=int(d.size_gb * GB) if d else 0, vision=vision,
                mem_fraction=pool_fraction(self.engine, gpus[0] if (gpus := self.groups[0].gpus) else None, arch,
                                           tp=self.tp, pp=self.pp, vision=vision),
                rope_scaling=self.rope_scaling,
            )
        return base if (base.ctx, base.parallel) == (ctx, parallel) else base.evolve(ctx=ctx, parallel=parallel)


@dataclass(frozen=True)
class HeldAs:
    """A pick as a CPU build's launch holds it (``Engine.compute_dtype``): the weights of a 16-bit
    checkpoint at the build's compute dtype, the KV type ``auto`` at that dtype's size."""

    dtype: str                       # the engine's dtype name the launch asks for (vLLM: float32)
    quant: str                       # fit's quant for the weights as held
    weight_bytes: int
    kv: KvDtype
    why: str                         # why this CPU runs that dtype, one phrase

    def text(self, quant: Quant, kv: KvDtype) -> str:
        weights = (f"{quant.id} weights held as {self.quant} ({self.weight_bytes / GB:.3g} GB)"
                   if self.quant != quant.id else f"{quant.id} weights as they are")
        kv_text = f"KV {kv.id} at {self.kv.bytes_per_elem:g} B/elem"
        kv_text += f" ({self.kv.id})" if self.kv.id != kv.id else ""
        return f"launched at {self.dtype} ({self.why}): {weights}, {kv_text}"


def rule_cpu_flags(rig: Rig, given: frozenset[str] | None = None) -> frozenset[str] | None:
    """The CPU flags a build's ``compute_dtype`` is decided by: ``given`` (a caller's probe), else this
    machine's usable flags for a detected CPU rig; None for a rig by spec or with GPUs."""
    if given is not None or rig.gpus or rig.source != "detected":
        return given
    from ..cpuprobe import probe_cpu

    return probe_cpu().usable


def held_on_cpu(engine: Engine, quant: Quant, kv: KvDtype, rig: Rig, bits: Mapping[str, float],
                usable_flags: frozenset[str] | None) -> HeldAs | None:
    """How ``engine``'s CPU build holds ``quant`` + ``kv`` on ``rig`` when that is not what the
    catalog sizes (its ``compute_dtype``, where the CPU lacks every one of its native flags;
    ``usable_flags`` None: a CPU named by a spec, whose flags are not known: assumed without
    them); None on a GPU rig, or where the launch holds the pick as it is."""
    cd = engine.compute_dtype
    if cd is None or rig.gpus:
        return None
    if usable_flags is not None:
        if any(f in usable_flags for f in cd.native_flags):
            return None
        why = f"this CPU has neither {' nor '.join(cd.native_flags)}"
    else:
        why = f"a CPU by spec, assumed without {' / '.join(cd.native_flags)}"
    held_quant, weight_bytes = quant.id, quant.weight_bytes
    source_bits = bits.get(quant.id.lower())
    if quant.format in cd.formats and source_bits:
        held_quant = cd.weights_quant
        weight_bytes = int(quant.weight_bytes * bits[cd.weights_quant.lower()] / source_bits)
    held_kv = engine.kv(cd.kv_auto) if kv.id == "auto" else kv
    if held_kv is None or (held_quant == quant.id and held_kv.id == kv.id):
        return None
    return HeldAs(cd.value, held_quant, weight_bytes, held_kv, why)


MAX_PARALLEL = 256       # a plan never proposes more sequences than this (fit.max_concurrency's limit)


def rig_groups(rig: Rig, engine: Engine, arch: ModelArch) -> list[tuple[int, int, int, tuple[Rig, ...]]]:
    """(tp, pp, instances, sub-rigs): every way to use all of the rig's devices. A cluster
    (``rig.nodes`` > 1) runs each one-node layout on every node, and, for an engine that runs
    pipeline stages across nodes, one instance of TP = GPUs per node x PP = nodes."""
    if not rig.gpus:
        return [(1, 1, 1, (rig,))]
    if rig.nodes > 1:
        node = replace(rig, nodes=1)
        out = [(tp, 1, inst * rig.nodes,
                tuple(replace(g, label=f"node{k}:{g.label}") for k in range(rig.nodes) for g in groups))
               for tp, _, inst, groups in rig_groups(node, engine, arch)]
        if engine.multi_gpu.multi_node and not arch.n_heads % rig.n_gpus and arch.n_layers >= rig.nodes:
            out.append((rig.n_gpus, rig.nodes, 1, (rig,)))
        return out
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
        out.append((tp, 1, n // tp, groups))
    return out


def engine_runs_on(engine: Engine, rig: Rig) -> str | None:
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


def quant_runs_on(quant: Quant, engine: Engine, rig: Rig) -> str | None:
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


def rig_capacity(rig: Rig) -> int:
    if not rig.gpus:
        return usable_ram(rig)[0]
    return rig.nodes * sum(g.free_bytes if g.free_bytes is not None else g.vram_bytes for g in rig.gpus)


def rig_bandwidth(rig: Rig) -> float | None:
    """The bandwidth a decode model's efficiency applies to: the slowest GPU's datasheet
    figure; on a CPU-only rig the CPU's bandwidth at the thread count decode runs with
    (measured on this machine by ``hardware``'s copy probe, else the catalog default)."""
    if rig.gpus:
        known = [g.bandwidth_gbs for g in rig.gpus if g.bandwidth_gbs is not None]
        return min(known) if len(known) == len(rig.gpus) else None     # one unknown GPU: unknown
    return rig.cpu_bandwidth_gbs
