"""The planner: filters candidates by a priority's constraints, sizes each with fit (context,
sequences), and computes the speed and metrics the ranking reads.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .. import units
from ..arch import ModelArch
from ..catalog import Catalog, Drafter, Engine, Model, Priority, Quant, find_engine
from ..catalog.schema import RankKey
from ..errors import BadInput
from ..fit import Fit, FitMemo, FitRequest, check_ctx, kv_refusal
from ..hardware import Rig
from ..units import GB
from .calibration import NO_POINT_HERE, UNCALIBRATED, Calibration, SpeedFactor, shape_class, weight_family
from .candidates import (
    MAX_PARALLEL,
    Candidate,
    engine_runs_on,
    held_on_cpu,
    quality_cmp,
    quality_value,
    quant_runs_on,
    rig_bandwidth,
    rig_capacity,
    rig_groups,
    rule_cpu_flags,
)
from .memo import PlanMemo, Speed
from .ranking import STATIC_METRICS, rank_candidates
from .request import drafter_miss, launch_miss
from .speed import (
    SPEED_DEPTH,
    DecodeShape,
    SpeedBand,
    decode_rates,
    kv_bytes_per_token,
    mixed_per_thread,
    weight_type_mix,
    weights_read_per_token,
)

# engine maturity, then less memory: the keys that break exact ties. Built without validation
# (constants): validating would build RankKey's pydantic validator at the first ranking
_TIE_BREAKERS = (RankKey.model_construct(metric="engine_status", goal="max"),
                 RankKey.model_construct(metric="gpu_bytes", goal="min"))


class Planner:
    def __init__(self, cat: Catalog, model: Model, arch: ModelArch, rig: Rig, prio: Priority,
                 ctx: int | None, engine: str | None, source: str = "catalog", parallel: int | None = None,
                 rope_scaling: str | None = None, memo: FitMemo | None = None, launchable: bool = True,
                 calibration: Calibration | None = None, quant: str | None = None):
        cat = cat.for_vendor(rig.vendor)   # each engine as its build for this rig runs it (catalog backends)
        self.cat, self.model, self.arch, self.rig, self.prio = cat, model, arch, rig, prio
        # every fit of this model goes through one memo (how_to_choose shares it over the priorities)
        self.memo = memo if memo is not None and memo.arch is arch and memo.catalog is cat else PlanMemo(arch, cat)
        # each candidate's speed, shared with the other priorities of a how-to-choose table (PlanMemo)
        self.speeds: dict[tuple, Speed] = (self.memo.speeds(calibration, model.id) if isinstance(self.memo, PlanMemo)
                                           else {})
        self.layouts = self.memo.layouts if isinstance(self.memo, PlanMemo) else {}
        self.source = source          # "catalog", or where a model outside it was read from
        self.user_ctx = ctx
        self.user_parallel = parallel         # --parallel: every candidate serves exactly this many sequences
        self.parallel_rule = prio.parallel if parallel is None else None   # the priority's rule, unless --parallel
        self.engines = [find_engine(cat, engine)] if engine else list(cat.engines)
        self.quants = list(model.quants)
        if quant is not None:             # --quant: only this one of the model's quants
            only = model.quant(quant)
            if only is None:
                raise BadInput(f"{model.name} has no quant {quant!r}; known: {', '.join(q.id for q in model.quants)}.")
            self.quants = [only]
        self.explicit_engine = engine is not None   # a named engine is planned whatever its status
        self.launchable = launchable  # False: the sizing model alone (configurations engineroom cannot launch too)
        self.calibration = calibration   # this machine's measured speed points (None: a rig by spec, or none)
        self.shape = shape_class(arch)
        self._factors: dict[tuple[str, str], SpeedFactor | None] = {}
        self.rejected: list[str] = []
        self.layout_misses: dict[tuple, str] = {}   # (engine, quant, kv, tp, instances) -> why not
        self.pool: list[Candidate] = []
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
        # this machine's CPU flags where a CPU build's compute dtype depends on them (None: a rig by spec)
        self.cpu_flags: frozenset[str] | None = None
        if any(e.compute_dtype for e in self.engines):
            self.cpu_flags = rule_cpu_flags(rig)

    # -- static filters ------------------------------------------------------------------
    def _engine_ok(self, e: Engine) -> str | None:
        why = engine_runs_on(e, self.rig)
        if why:
            return why
        c = self.prio.constraints
        if c.engine_status and e.status not in c.engine_status and not self.explicit_engine:
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
            parsers = e.parsers.get(self.model.family or "")
            if feat in ("tools", "reasoning") and e.parsers and not (parsers and getattr(
                    parsers, "tool" if feat == "tools" else "reasoning")):
                return (f"{e.id}'s catalog entry names no {'tool-call' if feat == 'tools' else 'reasoning'} parser "
                        f"for {self.model.name} (family {self.model.family or 'not set'}); add it under `parsers:`")
        return None

    def _quant_ok(self, q: Quant, e: Engine) -> str | None:
        why = quant_runs_on(q, e, self.rig)
        if why:
            return why
        if self.ref_quant is not None and quality_cmp(q, self.ref_quant) < 0:
            kld = f", KLD {q.quality.kld}" if q.quality.kld is not None else ""
            return f"{q.id} quality (tier {q.quality.tier}{kld}) is below {self.ref_quant.id}'s"
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
                why = drafter_miss(d, e) if self.launchable else None
                if why:            # not a pick: engineroom could not launch that drafter
                    self.rejected.append(f"{e.id} + {q.id} + {d.id}: not launchable: {why}")
                    continue
                out.append(d)
        if not c.spec_method:
            out.insert(0, None)
        return out

    def candidates(self) -> list[Candidate]:
        out = []
        for e in self.engines:
            why = self._engine_ok(e)
            if why:
                self.rejected.append(why)
                continue
            layouts = self.layouts.get((self.memo.rig_key(self.rig), e.id))
            if layouts is None:
                layouts = self.layouts[(self.memo.rig_key(self.rig), e.id)] = rig_groups(self.rig, e, self.arch)
            # the engine refuses a KV type for this model or it does not (no quant or layout changes that)
            refusals = [(kv, kv_refusal(self.arch, FitRequest(engine=e.id, ctx=1, kv_dtype=kv.id), self.cat))
                        for kv in e.plan_kv_dtypes]
            for q in self.quants:
                why = self._quant_ok(q, e)
                if why:
                    self.rejected.append(why)
                    continue
                why = launch_miss(self.model, q, e, source=self.source, vision=self.vision) if self.launchable else None
                if why:            # a pick is launchable or it is not a pick
                    self.rejected.append(f"{e.id} + {q.id}: not launchable: {why}")
                    continue
                drafters = self._drafters(q, e)
                if not drafters:
                    self.rejected.append(f"{e.id} + {q.id}: no drafter for {self.prio.constraints.spec_method}")
                    continue
                for tp, pp, inst, groups in layouts:
                    if q.weight_bytes > min(rig_capacity(g) for g in groups) * 1.0:
                        self.rejected.append(f"{e.id} + {q.id}: {q.size_gb:g} GB of weights exceed "
                                             f"{units.capacity(min(rig_capacity(g) for g in groups))} per instance")
                        continue
                    for kv, refused in refusals:
                        if refused:   # the engine would not start: never a candidate
                            self.rejected.append(f"{e.id} + KV {kv.id}: {e.id} refuses it ({refused})")
                            continue
                        held = held_on_cpu(e, q, kv, self.rig, self.cat.tables.bits_per_weight, self.cpu_flags)
                        for d in drafters:
                            out.append(Candidate(e, q, kv, d, tp, inst, groups, rope_scaling=self.rope_scaling, pp=pp,
                                             held=held))
        return out

    # -- sizing --------------------------------------------------------------------------
    def _fit_all(self, c: Candidate, ctx: int, parallel: int) -> tuple[Fit, ...]:
        req = c.request(self.arch, ctx, parallel, self.vision)
        first = self.memo.fit(req, c.groups[0])
        if all(g.gpus == c.groups[0].gpus for g in c.groups[1:]):
            return (first,) + tuple(self.memo.relabeled(first, g.label) for g in c.groups[1:])
        return (first,) + tuple(self.memo.fit(req, g) for g in c.groups[1:])

    def _groups(self, c: Candidate) -> tuple[Rig, ...]:
        """Distinct sub-rigs (identical instances need one fit)."""
        if all(g.gpus == c.groups[0].gpus for g in c.groups[1:]):
            return c.groups[:1]
        return c.groups

    def _servable(self, c: Candidate, fits: tuple[Fit, ...]) -> bool:
        """Every instance fits and serves all its sequences (``Fit.servable``)."""
        return all(f.servable for f in fits)

    def _max_ctx(self, c: Candidate, parallel: int = 1) -> int:
        if c.max_ctx is None:
            max_pos = self.arch.max_position or 0
            if c.fits and c.ctx == max_pos and parallel == 1 and c.parallel == 1:
                c.max_ctx = max_pos        # already served at the model's full context
            else:
                req = c.request(self.arch, self.min_ctx, parallel, self.vision)
                c.max_ctx = min(self.memo.max_context(req, g) for g in self._groups(c))
        return c.max_ctx

    def size(self, c: Candidate) -> bool:
        """Choose ctx and sequences for ``c``; False (with a reason) when it cannot serve."""
        label = f"{c.engine.id} + {c.quant.id} + {c.kv.id}" + (f" + {c.drafter.id}" if c.drafter else "")
        needs_max = self.prio.ctx == "max" or any(k.metric == "max_ctx" for k in self.prio.rank[:1])
        base = self.user_parallel or 1      # context is sized for this many sequences
        fits = self._fit_all(c, self.target_ctx, base)
        if self._servable(c, fits):
            ctx = self.target_ctx
            if needs_max:
                c.ctx, c.fits, c.parallel = ctx, fits, base
                self._max_ctx(c, base)
        else:
            lay = (f"{c.instances} independent instance(s)" if c.instances > 1
                   else f"TP={c.tp}" if c.tp > 1 else "one device")
            if self.user_ctx is not None:
                self.rejected.append(f"{label}: does not fit at {self.user_ctx} tokens x {base} sequence(s) "
                                     f"({fits[0].binding})")
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
                                          f"({lay}) does not fit {self.target_ctx:,} tokens ({fits[0].binding}); "
                                          f"it fills {mc:,}")
            ctx = mc
            fits = self._fit_all(c, ctx, base)
        parallel = base
        if self.parallel_rule == "max":
            req = c.request(self.arch, ctx, 1, self.vision)
            parallel = max(1, min(self.memo.max_concurrency(req, g, limit=MAX_PARALLEL) for g in self._groups(c)))
            if parallel > 1:
                fits = self._fit_all(c, ctx, parallel)
        elif isinstance(self.parallel_rule, int) and self.parallel_rule > 1:
            parallel = self.parallel_rule
            fits = self._fit_all(c, ctx, parallel)
            if not self._servable(c, fits):
                self.rejected.append(f"{label}: cannot hold {parallel} sequences")
                return False
        if parallel < self.prio.constraints.min_parallel:
            self.rejected.append(f"{label}: holds {parallel} sequence(s), "
                                 f"priority wants {self.prio.constraints.min_parallel}")
            return False
        c.ctx, c.parallel, c.fits = ctx, parallel, fits
        return True

    # -- speed ---------------------------------------------------------------------------
    def speed(self, c: Candidate) -> None:
        """``c.decode`` and ``c.aggregate`` at ``c.ctx`` x ``c.parallel`` (computed once per distinct candidate)."""
        key = (c.engine.id, c.quant.id, c.kv.id, c.drafter.id if c.drafter else None, c.held, c.tp, c.instances,
               c.pp, self.memo.rig_key(c.groups[0]), min(SPEED_DEPTH, c.ctx), c.parallel)
        known = self.speeds.get(key)
        if known is None:
            self._speed(c)
            self.speeds[key] = (c.decode, c.aggregate)
        else:
            c.decode, c.aggregate = known

    def _speed(self, c: Candidate) -> None:
        bw = rig_bandwidth(c.groups[0])
        if not bw:
            c.decode = None
            c.aggregate = None
            return
        e, dm, layers = c.engine, c.engine.decode, DecodeShape.of(self.arch)
        w = weights_read_per_token(self.model, self.arch, c.quant)
        if c.held is not None:     # the weights as the CPU build holds them (float32: twice a 16-bit file)
            w = int(w * c.held.weight_bytes / max(1, c.quant.weight_bytes))
        kv = kv_bytes_per_token(self.arch, c.held_kv, min(SPEED_DEPTH, c.ctx))
        scale = 1.0 + (c.tp - 1) * e.multi_gpu.scaling      # the seed's measured per-stream TP ratio
        roof = bw * GB * scale / (w + kv)
        threads = c.groups[0].cpu_threads if not c.groups[0].gpus else None   # CPU: llama-server's default -t
        mix: tuple[tuple[str, float], ...] = ()
        if threads:   # CPU: the weights stream at their types' rates, the KV at its own ("kv_f16", ...)
            threads = max(1, threads - dm.reserved_cpus)    # less the cores the engine keeps (vLLM's frontend)
            types = ((c.held.quant, 1.0),) if c.held else weight_type_mix(self.arch, c.quant.id)
            mix = tuple((t, share * w / (w + kv)) for t, share in types)
            mix += ((f"kv_{c.held_kv.id.lower()}", kv / (w + kv)),) if kv else ()
        slow, _middle, fast = decode_rates(dm, w + kv, layers, bw, threads, mix)
        m_lo = m_hi = 1.0
        src = ""
        if c.drafter is not None:
            d = c.drafter
            m_lo = d.acceptance_length.low / (1 + d.overhead.value)
            m_hi = d.acceptance_length.high / (1 + d.overhead.value)
            src = (f"{d.id}: acceptance {d.acceptance_length.low:g}-{d.acceptance_length.high:g} "
                   f"({d.acceptance_length.source}); overhead {d.overhead.value:g} ({d.overhead.source})")
        c.decode = SpeedBand(low=slow * scale * m_lo, high=fast * scale * m_hi, roofline_tps=roof,
                             bytes_per_token=w + kv, bandwidth_gbs=bw,
                             efficiency=(dm.bandwidth_efficiency.low, dm.bandwidth_efficiency.high),
                             efficiency_source=dm.source,
                             overhead_ms=(layers.fixed_ms(dm, dm.per_layer_ms.low),
                                          layers.fixed_ms(dm, dm.per_layer_ms.high)),
                             tp_scale=scale, spec_multiplier=(m_lo, m_hi), spec_source=src,
                             threads=threads,
                             per_thread_gbs=mixed_per_thread(dm, threads, mix))
        # batched decode: one weight read serves every sequence in the step; each reads its KV
        n = c.parallel
        if n > 1:
            batched_mid = decode_rates(dm, w + n * kv, layers, bw, threads, mix)[1]
            per_inst = n * scale * batched_mid * e.concurrency.batch_efficiency
        else:
            per_inst = c.decode.mid
        c.aggregate = per_inst * c.instances
        found = self._speed_factor(e.id, c.quant.format)
        if found is None:      # a rig by spec is never calibrated by this machine's runs
            c.decode = replace(c.decode, basis=UNCALIBRATED if self.calibration is None else NO_POINT_HERE,
                               shape=self.shape)
        else:        # this machine's measurements correct the catalog's model (both estimates)
            k = found.factor
            c.decode = replace(c.decode, low=c.decode.low * k, high=c.decode.high * k, basis=found.text,
                               uncalibrated=(c.decode.low, c.decode.high), shape=self.shape)
            c.aggregate *= k

    def _speed_factor(self, engine: str, quant_format: str) -> SpeedFactor | None:
        """This machine's correction for ``engine`` with weights in ``quant_format`` (one per engine and weight
        family: every such candidate shares it)."""
        if self.calibration is None:
            return None
        key = (engine, weight_family(quant_format))
        if key not in self._factors:
            self._factors[key] = self.calibration.factor(engine, self.shape, key[1])
        return self._factors[key]

    # -- metrics and ranking -------------------------------------------------------------
    def static_metrics(self, c: Candidate) -> None:
        e = c.engine
        c.metrics = {
            "decode_tps": c.decode.mid if c.decode else 0.0,
            "quality": quality_value(c.quant),
            "quant_portability": float(len(c.quant.engines)),
            "engine_status": float(self.cat.tables.status_rank(e.status)),
            "engine_non_nvidia_vendors": float(sum(1 for v in e.vendors if v != "nvidia")),
            "cold_start_s": e.cold_start_s.value if e.cold_start_s else math.inf,
            # as held (vLLM CPU's auto at float32: 4 B), but a 16-bit cache is already lossless:
            # a wider one ranks no higher
            "kv_precision": min(c.held_kv.bytes_per_elem, 2.0),
        }

    def metrics(self, c: Candidate) -> dict[str, float]:
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
            "engine_status": float(self.cat.tables.status_rank(e.status)),
            "engine_non_nvidia_vendors": float(sum(1 for v in e.vendors if v != "nvidia")),
            "cold_start_s": e.cold_start_s.value if e.cold_start_s else math.inf,
            # as held (vLLM CPU's auto at float32: 4 B), but a 16-bit cache is already lossless:
            # a wider one ranks no higher
            "kv_precision": min(c.held_kv.bytes_per_elem, 2.0),
            "ctx": float(c.ctx),
        }
        c.metrics = m
        return m

    def rank(self, cands: list[Candidate]) -> list[Candidate]:
        # the catalog's rank keys decide; engine maturity, then less memory, break exact ties
        keys = list(self.prio.rank)
        used = {k.metric for k in keys}
        keys += [k for k in _TIE_BREAKERS if k.metric not in used]
        if not all(k.metric in (c.metrics or {}) for c in cands for k in keys):
            keys = [k for k in keys if k.metric in STATIC_METRICS]
        return rank_candidates(cands, keys)
