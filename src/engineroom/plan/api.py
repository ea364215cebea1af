"""The public entry points: ``plan`` (ranked configs for one priority), ``how_to_choose``
(the top pick for every priority), ``fit_one`` (one fit from catalog ids) and
``plans_as_rows`` (flat rows for tables and JSON).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..arch import ModelArch
from ..catalog import Catalog, Model, arch_from_catalog, find_engine, find_priority, load_catalog
from ..errors import BadInput, NotFound
from ..fit import Fit, FitMemo, FitRequest, Verdict, fit, kv_dtype_spec, kv_refusal, max_concurrency, max_context
from ..hardware import Rig
from ..units import GB
from .adhoc import ResolvedModel, resolve_model
from .calibration import Calibration
from .candidates import Candidate, held_on_cpu, quant_runs_on, rule_cpu_flags
from .memo import PlanMemo
from .planner import Planner
from .ranking import STATIC_METRICS, tie_groups
from .reasons import reason_lines
from .request import LaunchRequest, request_for
from .speed import SpeedBand


class NothingFits(NotFound):
    """No candidate config of the model serves the rig under a priority: a finding (a row
    of ``how_to_choose`` says so), where every other NotFound is the user's error."""


@dataclass(frozen=True)
class Plan:
    """One ranked config: engine, quant, KV type, context x sequences, layout, its fit, speed and reasons."""

    rank: int
    priority: str
    model: str
    engine: str
    quant: str
    quant_format: str
    kv_dtype: str
    ctx: int
    max_ctx: int | None
    parallel: int
    spec: str | None                 # drafter id ("mtp", "dflash-qwen3.6-27b") or None
    spec_tokens: int
    tp: int                          # GPUs per instance (tensor parallel or layer split)
    instances: int                   # independent copies on the rig
    multi_gpu_mode: str
    per_gpu_bytes: tuple[int, ...]   # predicted use on each GPU (device) of the rig
    capacity_bytes: tuple[int, ...]
    breakdown: tuple[tuple[str, int, str], ...]   # (component, bytes, how) on the busiest device
    verdict: Verdict
    binding: str
    decode: SpeedBand | None
    aggregate_tps: float | None
    metrics: dict[str, float]
    reasons: tuple[str, ...]
    tradeoffs: tuple[str, ...] = ()
    fit: Fit | None = field(default=None, repr=False, compare=False)
    request: LaunchRequest | None = None   # the pick as what to launch: weights, parsers, spec-decode, vision
    # llama.cpp slots as sized: -np parallel with --no-kv-unified unless True (the launcher passes both)
    kv_unified: bool = False
    pp: int = 1                      # pipeline stages (one per node of a cluster rig)
    nodes: int = 1                   # machines one instance spans
    gpus_per_node: int = 0           # GPUs of each of those machines (0: a CPU rig)

    @property
    def layout(self) -> str:
        if self.pp > 1:
            return f"TP={self.tp} x PP={self.pp}"
        if self.instances > 1:
            return f"{self.instances} instances" + (f" x TP={self.tp}" if self.tp > 1 else "")
        if self.tp > 1:
            return f"TP={self.tp}" if self.multi_gpu_mode == "tensor_parallel" else f"split x{self.tp}"
        return "1 device"


def plan(model_ref: str | ResolvedModel, rig: Rig, priority: str | None = None, ctx: int | None = None,
         engine: str | None = None, *, catalog: Catalog | None = None, limit: int | None = None,
         arch: ModelArch | None = None, detail: int = 1, parallel: int | None = None,
         rope_scaling: str | None = None, memo: FitMemo | None = None, launchable: bool = True,
         calibration: Calibration | None = None, quant: str | None = None) -> list[Plan]:
    """Ranked configs for serving ``model_ref`` on ``rig`` under ``priority`` (default: the
    catalog's default priority). Raises NothingFits (a NotFound) with the closest miss when nothing fits.
    ``model_ref``: anything ``resolve_model`` accepts (a catalog model, or a file or repo).

    ``limit`` caps how many plans come back (None: all that fit); ``detail`` is how many of
    the top plans get their largest fillable context (fit.max_context) when the priority did
    not need it for every candidate; the others keep ``max_ctx=None``. ``parallel``: every
    config serves exactly this many concurrent sequences, each at the full context (the
    context, and "max fillable", are sized for all of them); None: the priority decides.
    ``launchable`` False: the sizing and ranking model alone, configurations whose weights or
    drafter the catalog cannot name included (never a pick: ``flows`` launches launchable plans only).
    ``calibration``: speed points measured on the machine ``rig`` is (calibration.py); give it only
    when planning for that machine. ``quant``: only this quant of the model (id or alias)."""
    if parallel is not None and parallel < 1:
        raise BadInput(f"--parallel must be at least 1, not {parallel}.")
    cat = catalog or load_catalog()
    subject = resolve_model(model_ref, cat)
    model = subject.model
    arch = arch or subject.arch or arch_from_catalog(model)
    prio = find_priority(cat, priority) if priority else cat.default_priority()
    p = Planner(cat, model, arch, rig, prio, ctx, engine, source=subject.source, parallel=parallel,
                 rope_scaling=rope_scaling, memo=memo,   # ctx beyond the model's maximum only with rope_scaling
                 launchable=launchable, calibration=calibration, quant=quant)
    pool = p.pool = p.candidates()
    # a leading ctx key is bounded by the target context: configs serving all of it come first
    bounded = bool(prio.rank) and prio.rank[0].metric == "ctx"
    prefix = []
    for k in prio.rank[1:] if bounded else prio.rank:
        if k.metric not in STATIC_METRICS:
            break
        prefix.append(k)
    if prefix and limit is not None and p.parallel_rule != "max":
        # The leading rank keys need no fit (speed at the target context, catalog fields):
        # group candidates by them, then size whole groups in rank order until ``limit``
        # can serve; the remaining keys (memory, context) order within those groups.
        for c in pool:
            c.ctx, c.parallel = p.target_ctx, parallel or 1
            p.speed(c)
            p.static_metrics(c)
        cands: list[Candidate] = []
        for group in tie_groups(pool, prefix):
            cands.extend(c for c in group if p.size(c))
            if sum(1 for c in cands if not bounded or c.ctx >= p.target_ctx) >= limit + 1:
                break
    else:
        cands = [c for c in pool if p.size(c)]
    if not cands:
        # a configuration that would fit but is not launchable is the closest miss: its fix is named
        why = next((r for r in reversed(p.rejected) if ": not launchable: " in r),
                   p.rejected[-1] if p.rejected else "no engine in the catalog can load it")
        status = [f"{e.id} is marked {e.status} ({e.status_note})" for e in p.engines
                  if engine and prio.constraints.engine_status and e.status not in prio.constraints.engine_status]
        raise NothingFits(f"no configuration of {model.name} fits {rig.label or 'this rig'} for priority "
                          f"{prio.id}; closest miss: {why.rstrip('.')}" + (f"; {status[0]}" if status else "") + ".")
    for c in cands:
        p.speed(c)
        p.metrics(c)
    ranked = p.rank(cands)
    shown = ranked if limit is None else ranked[:limit]
    # fill in fillable context for shown plans when the priority did not need it
    for c in shown[:max(0, detail)]:
        if c.max_ctx is None:
            p._max_ctx(c, parallel or 1)
            c.metrics["max_ctx"] = float(c.max_ctx or c.ctx)
    out = []
    for i, c in enumerate(shown):
        reasons, trade = reason_lines(p, c, ranked, i)
        f = c.fits[0]
        busiest = max(f.per_gpu, key=lambda g: g.used_bytes)
        out.append(Plan(
            rank=i + 1, priority=prio.id, model=model.id, engine=c.engine.id, quant=c.quant.id,
            quant_format=c.quant.format, kv_dtype=c.kv.id, ctx=c.ctx, max_ctx=c.max_ctx, parallel=c.parallel,
            spec=c.drafter.id if c.drafter else None, spec_tokens=c.drafter.spec_tokens if c.drafter else 0,
            tp=c.tp, instances=c.instances, multi_gpu_mode=c.engine.multi_gpu.mode, pp=c.pp,
            nodes=c.groups[0].nodes if c.pp > 1 else 1, gpus_per_node=c.groups[0].n_gpus,
            per_gpu_bytes=tuple(g.used_bytes for ff in c.fits for g in ff.per_gpu),
            capacity_bytes=tuple(g.capacity_bytes for ff in c.fits for g in ff.per_gpu),
            breakdown=tuple((x.name, x.bytes, x.note) for x in busiest.components),
            verdict=max((ff.verdict for ff in c.fits), key=lambda v: v.severity),
            binding=f.binding, decode=c.decode, aggregate_tps=c.aggregate, metrics=dict(c.metrics),
            reasons=tuple(reasons), tradeoffs=tuple(trade), fit=f, kv_unified=f.request.kv_unified,
            request=request_for(model, c.engine, c.quant, c.kv.id, c.drafter, ctx=c.ctx, parallel=c.parallel,
                                kv_unified=f.request.kv_unified, tp=c.tp, pp=c.pp,
                                nodes=c.groups[0].nodes if c.pp > 1 else 1, gpus_per_node=c.groups[0].n_gpus,
                                features=prio.constraints.features, priority=prio.id, source=subject.source,
                                mem_fraction=f.request.mem_fraction),
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
                  *, catalog: Catalog | None = None, parallel: int | None = None,
                  calibration: Calibration | None = None) -> list[Choice]:
    """The top pick for every priority in the catalog: the seed's "how to choose" table, computed."""
    cat = catalog or load_catalog()
    subject = resolve_model(model_ref, cat)     # once: a remote GGUF header is read once
    arch = subject.arch or arch_from_catalog(subject.model)
    memo = PlanMemo(arch, cat.for_vendor(rig.vendor))   # each distinct fit, search and speed once over the priorities
    rows: list[Choice] = []
    for prio in cat.priorities:
        try:
            top = plan(subject, rig, prio.id, ctx=ctx, engine=engine, catalog=cat, limit=1, detail=1, parallel=parallel,
                       arch=arch, memo=memo, calibration=calibration)
            rows.append(Choice(prio.id, prio.label, top[0]))
        except NothingFits as err:   # any other error (an unknown model...) is the user's, not a row
            rows.append(Choice(prio.id, prio.label, None, str(err)))
    return rows


def fit_one(model_ref: str | ResolvedModel, rig: Rig, engine: str, quant: str, kv_dtype: str, ctx: int,
            parallel: int | None = 1, tp: int = 1, *, pp: int = 1, catalog: Catalog | None = None,
            kv_unified: bool | None = None, rope_scaling: str | None = None,
            cpu_features: frozenset[str] | None = None, repack: bool = True, swa_full: bool = False,
            ubatch: int | None = None, mem_fraction: float | None = None) -> tuple[Model, Fit]:
    """One fit from catalog ids (the `engineroom fit` command): the quant's catalog size is the
    weight bytes. ``model_ref``: anything ``resolve_model`` accepts. ``parallel`` None: the
    engine's default launch (catalog default_parallel / default_kv_unified: llama.cpp 4 slots,
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
    why = quant_runs_on(q, e, rig) if rig.gpus else (
        f"{q.id} does not load in {e.id}" if e.id not in q.engines else
        f"{e.id}'s {e.backend} build does not run {q.format} weights (it runs: {', '.join(e.quant_formats)})"
        if e.backend and q.format not in e.quant_formats else None)
    if why:
        raise BadInput(f"cannot fit {model.name} {q.id} on {e.id}: {why}.")
    kv = kv_dtype_spec(e.id, kv_dtype, catalog=cat)   # BadInput names the catalog's KV types
    held = None
    if not rig.gpus and e.compute_dtype is not None:   # a CPU build that computes at another dtype here
        held = held_on_cpu(e, q, kv, rig, cat.tables.bits_per_weight, rule_cpu_flags(rig, cpu_features))
    if parallel is None:
        parallel, default_unified = e.default_parallel, e.default_kv_unified
        kv_unified = default_unified if kv_unified is None else kv_unified
    if ctx <= 0 or parallel <= 0 or tp <= 0 or pp <= 0 or (ubatch is not None and ubatch <= 0):
        raise BadInput("--ctx, --parallel, --tp, --pp and --ubatch must be positive.")
    if rig.gpus and tp > rig.n_gpus:
        raise BadInput(f"--tp {tp} needs {tp} GPUs but the rig {rig.label} has {rig.n_gpus}.")
    arch = subject.arch or arch_from_catalog(model)
    req = FitRequest(engine=e.id, ctx=ctx, quant=held.quant if held else q.id,
                     weight_bytes=held.weight_bytes if held else q.weight_bytes,
                     kv_dtype=held.kv.id if held else kv_dtype,
                     parallel=parallel, tp=tp, pp=pp, mem_fraction=mem_fraction,
                     kv_unified=bool(kv_unified),
                     rope_scaling=rope_scaling, cpu_features=cpu_features, repack=repack, swa_full=swa_full)
    if ubatch is not None:
        req = replace(req, ubatch=ubatch)
    refused = kv_refusal(arch, req, cat)
    if refused:
        raise BadInput(f"{e.id} refuses KV type {kv_dtype} for {model.name}: {refused}.")
    f = fit(arch, req, rig, catalog=cat)
    mc = max_context(arch, req, rig, catalog=cat)
    ms = max_concurrency(arch, req, rig, catalog=cat) if f.verdict != Verdict.DOES_NOT_FIT else 0
    notes = (f"{e.id}'s {e.backend} build is {held.text(q, kv)}: sized as launched",) if held else ()
    return model, replace(f, max_ctx=mc, max_parallel=ms, notes=notes + f.notes)


def plans_as_rows(plans: Iterable[Plan]) -> list[dict[str, Any]]:
    """Flat rows for tables and JSON (the Fit object is summarised, not nested)."""
    rows = []
    for p in plans:
        rows.append({
            "rank": p.rank, "engine": p.engine, "quant": p.quant, "quant_format": p.quant_format, "kv": p.kv_dtype,
            "ctx": p.ctx, "max_ctx": p.max_ctx, "parallel": p.parallel, "kv_unified": p.kv_unified, "spec": p.spec,
            "tp": p.tp, "pp": p.pp, "nodes": p.nodes, "gpus_per_node": p.gpus_per_node, "instances": p.instances,
            "layout": p.layout,
            "per_gpu_gb": [round(b / GB, 2) for b in p.per_gpu_bytes],
            "decode_tps": [round(p.decode.low, 1), round(p.decode.high, 1)] if p.decode else None,
            "decode_tps_uncalibrated": [round(x, 1) for x in (p.decode.uncalibrated or (p.decode.low, p.decode.high))]
            if p.decode else None,
            "spec_speedup": [round(x, 3) for x in p.decode.spec_multiplier] if p.decode else None,
            "speed_basis": p.decode.basis if p.decode else None,
            "shape_class": p.decode.shape if p.decode else None,
            "aggregate_tps": round(p.aggregate_tps, 1) if p.aggregate_tps else None,
            "verdict": p.verdict, "reasons": list(p.reasons), "tradeoffs": list(p.tradeoffs),
            "request": p.request.to_dict() if p.request else None,
        })
    return rows
