"""Reason lines: why a plan ranks where it does, each naming the catalog field or fit number
it rests on, and the trade-offs a user should know before launching it.
"""

from __future__ import annotations

from ..fit import Verdict
from ..units import gib  # memory in GiB, the one convention (units.py)
from .candidates import Candidate
from .planner import Planner
from .ranking import within_tolerance

COMPUTE_CAVEAT_SEQS = 8      # from this many sequences on, say the aggregate ignores compute

_METRIC_TEXT = {
    "decode_tps": lambda c: f"{c.metrics['decode_tps']:.0f} t/s single-stream (band middle)",
    "aggregate_tps": lambda c: (f"{c.metrics['aggregate_tps']:.0f} t/s aggregate over "
                                f"{c.parallel * c.instances} sequence(s)"),
    "shared_prefix_tps": lambda c: (f"{c.metrics['shared_prefix_tps']:.0f} t/s shared-prefix aggregate "
                                    f"(x{c.engine.concurrency.multi_tenant_factor:g} "
                                    f"{c.engine.concurrency.prefix_cache} prefix cache)"),
    "max_ctx": lambda c: f"{int(c.metrics['max_ctx']):,} tokens fillable",
    "gpu_bytes": lambda c: f"{gib(c.metrics['gpu_bytes'], 1)} on the busiest device",
    "headroom_bytes": lambda c: f"{gib(c.metrics['headroom_bytes'], 1)} spare",
    "quality": lambda c: (f"quality tier {c.quant.quality.tier}"
                          + (f", KLD {c.quant.quality.kld:g}" if c.quant.quality.kld is not None else "")),
    "quant_portability": lambda c: f"{c.quant.id} loads in {len(c.quant.engines)} engine(s)",
    "engine_status": lambda c: f"engine status {c.engine.status}",
    "engine_non_nvidia_vendors": lambda c: (f"{c.engine.id} runs on "
                                            + ", ".join(v for v in c.engine.vendors if v != "nvidia")
                                            + " besides NVIDIA"),
    "cold_start_s": lambda c: (f"cold start {c.engine.cold_start_s.value:g} s ({c.engine.cold_start_s.source})"
                               if c.engine.cold_start_s else "cold start not published"),
    "kv_precision": lambda c: f"KV {c.kv.id} at {c.held_kv.bytes_per_elem:g} B/elem",
    "ctx": lambda c: f"{c.ctx:,} tokens per sequence",
}


def _kv_trade(p: Planner, c: Candidate, ranked: list[Candidate]) -> str | None:
    """What a priority that ranks KV precision traded for what: the speed a less precise KV
    would have given (kept precision), or why a more precise one was not kept (memory binds)."""
    keys = [k.metric for k in p.prio.rank]
    if "kv_precision" not in keys:
        return None
    precise = [r for r in ranked if r.held_kv.bytes_per_elem > c.held_kv.bytes_per_elem + 0.1]
    if precise:   # ranked lower: they serve less context, memory binds
        r = max(precise, key=lambda r: (r.ctx, r.held_kv.bytes_per_elem))
        return (f"KV {c.kv.id} instead of {r.kv.id}: memory binds; {_label(r)} serves only {r.ctx:,} of the "
                f"{p.target_ctx:,} tokens ({r.fits[0].binding}).")
    others = [kv for kv in c.engine.plan_kv_dtypes if kv.bytes_per_elem > c.held_kv.bytes_per_elem + 0.1]
    if others:
        why = next((m for k, m in p.layout_misses.items() if k[:2] == (c.engine.id, c.quant.id)
                    and any(k[2] == kv.id for kv in others)), None)
        return (f"KV {c.kv.id}: memory binds, no more precise KV type of {c.engine.id} serves "
                f"{p.target_ctx:,} tokens" + (f" {why}" if why else "") + ".")
    tol = next((k.tolerance for k in p.prio.rank if k.metric == "decode_tps"), 0.0)
    faster = [r for r in ranked if r.held_kv.bytes_per_elem < c.held_kv.bytes_per_elem - 0.1 and r.ctx >= c.ctx
              and r.metrics.get("decode_tps", 0.0) > c.metrics.get("decode_tps", 0.0) + tol]
    if faster:
        r = max(faster, key=lambda r: r.metrics["decode_tps"])
        a, b = c.metrics["decode_tps"], r.metrics["decode_tps"]
        saved = c.metrics["gpu_bytes"] - r.metrics["gpu_bytes"]
        return (f"KV precision kept: {c.kv.id} ({c.held_kv.bytes_per_elem:g} B/elem) at {a:.0f} t/s, where "
                f"{_label(r)} ({r.kv.id}, {r.held_kv.bytes_per_elem:g} B/elem) would decode {b:.0f} t/s "
                f"(+{(b / a - 1) * 100 if a else 0:.0f}%) with {gib(abs(saved), 1)} "
                f"{'less' if saved >= 0 else 'more'} memory; memory does not bind here, so the cache stays precise.")
    return (f"KV {c.kv.id} ({c.held_kv.bytes_per_elem:g} B/elem): the most precise KV type, "
            "and no less precise one decodes faster.")


def _label(c: Candidate) -> str:
    lay = f"{c.instances}x" if c.instances > 1 else ""
    tp = f" TP={c.tp}" if c.tp > 1 else ""
    return f"{lay}{c.engine.id} {c.quant.id} {c.kv.id}{tp}" + (f" +{c.drafter.id}" if c.drafter else "")


def reason_lines(p: Planner, c: Candidate, ranked: list[Candidate], idx: int) -> tuple[list[str], list[str]]:
    e, q, kv = c.engine, c.quant, c.kv
    f = c.fits[0]
    busiest = max(f.per_gpu, key=lambda g: g.used_bytes)
    comps = sorted(busiest.components, key=lambda x: -x.bytes)[:4]
    reasons = [
        f"priority {p.prio.id}: {p.prio.maximise}; here " +
        "; ".join(_METRIC_TEXT[k.metric](c) for k in [k for k in p.prio.rank if k.metric != "ctx"][:2]) + ".",
        f"quant {q.id} ({q.format}): {q.size_gb:g} GB on disk ({q.size_source or 'catalog'}); "
        f"quality tier {q.quality.tier}"
        + (f", mean KLD {q.quality.kld:g}" if q.quality.kld is not None else "") + f" — {q.quality.source}.",
        f"fit: {gib(busiest.used_bytes, 1)} of {gib(busiest.capacity_bytes, 1)} on the busiest device ({f.verdict}); "
        + ", ".join(f"{x.name} {gib(x.bytes, 1)}" for x in comps) + ".",
        f"context {c.ctx:,} tokens" + (f" (max fillable {c.max_ctx:,}, fit.max_context)" if c.max_ctx else "")
        + f", KV {kv.id} at {c.held_kv.bytes_per_elem:g} B/elem"
        + (f", {c.parallel} sequences (--parallel)" if p.user_parallel and c.parallel > 1
           else f", {c.parallel} sequences (fit.max_concurrency)" if c.parallel > 1 else "") + ".",
    ]
    if c.held is not None:
        reasons.append(f"{e.id}'s {e.backend or 'CPU'} build is {c.held.text(q, kv)}; fit and the decode "
                       "speed are for that (catalog compute_dtype).")
    if c.decode:
        d = c.decode
        line = (f"decode {d.low:.0f}-{d.high:.0f} t/s: {gib(d.bytes_per_token, 1)} read per token at "
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
            acc = c.drafter.acceptance_length
            line += (f" x spec {d.spec_multiplier[0]:.2f}-{d.spec_multiplier[1]:.2f} ({c.drafter.id}, "
                     f"acceptance length {acc.low:g}-{acc.high:g}: {acc.source})")
        reasons.append(line + ".")
    else:
        reasons.append("decode speed unknown: the rig's memory bandwidth is not in the catalog.")
    if c.parallel > 1 or c.instances > 1:
        reasons.append(f"aggregate {c.aggregate or 0:.0f} t/s = {c.instances} instance(s) x {c.parallel} sequence(s), "
                       f"batch efficiency {e.concurrency.batch_efficiency:g} ({e.concurrency.source}).")
    if c.tp > 1:
        reasons.append(f"{c.tp} GPUs per instance by {e.multi_gpu.mode} "
                       f"(per-stream scaling {e.multi_gpu.scaling:g}: {e.multi_gpu.source}).")
    cold = f"{e.cold_start_s.value:g} s ({e.cold_start_s.source})" if e.cold_start_s else "not published"
    reasons.append(f"engine {e.id}: status {e.status}, API parity {e.api_parity}, cold start {cold}.")
    kv_trade = _kv_trade(p, c, ranked) if idx == 0 else None
    if kv_trade:
        reasons.append(kv_trade)
    # compare with the best alternative of a different layout / engine, with numbers
    if idx == 0 and len(ranked) > 1:
        alt = next((r for r in ranked[1:] if (r.engine.id, r.quant.id) != (e.id, q.id)), ranked[1])
        keys = [k for k in p.prio.rank
                if not within_tolerance(c.metrics.get(k.metric, 0), alt.metrics.get(k.metric, 0), k.tolerance)]
        if keys:
            k = keys[0]
            tied = [t.metric for t in p.prio.rank[:p.prio.rank.index(k)]]
            text = _METRIC_TEXT[k.metric]
            reasons.append(f"beats {_label(alt)} on {k.metric}: {text(c)} vs {text(alt)}"
                           + (f" (tied on {', '.join(tied)})" if tied else "") + ".")
        else:
            reasons.append(f"ties {_label(alt)} on every rank key; engine maturity and memory break the tie.")
        if p.rig.n_gpus > 1:
            other = next((r for r in ranked if r.engine.id == e.id and r.quant.id == q.id
                          and (r.tp, r.instances) != (c.tp, c.instances)), None)
            if other is None:  # size the same config in its other layout(s) to show the numbers
                for r in p.pool:
                    if ((r.engine, r.quant, r.kv, r.drafter) == (e, q, kv, c.drafter)
                            and (r.tp, r.instances) != (c.tp, c.instances)):
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
                                   f"{c.ctx:,} ctx x {c.parallel} seq; the other layout {miss}.")
            if other is not None:
                reasons.append(
                    f"layout: {_label(c)} gives {c.metrics['aggregate_tps']:.0f} t/s aggregate, "
                    f"{c.metrics['decode_tps']:.0f} t/s per stream at {c.ctx:,} ctx x {c.parallel} seq; "
                    f"{_label(other)} gives {other.metrics['aggregate_tps']:.0f} t/s aggregate, "
                    f"{other.metrics['decode_tps']:.0f} t/s per stream at {other.ctx:,} ctx x {other.parallel} seq."
                )
    trade = []
    if len(q.engines) == 1:
        trade.append(f"{q.id} loads only in {q.engines[0]}.")
    if e.status in p.cat.tables.engine_status_caveats:
        trade.append(f"{e.id} is {e.status}: {e.status_note}.")
    if e.api_parity != "full":
        trade.append(f"API parity partial: {e.api_parity_source}.")
    if f.verdict == Verdict.TIGHT:
        trade.append(f"tight fit: {f.binding}.")
    if q.quality.tier < 4:
        trade.append(f"quality below 4-bit class (tier {q.quality.tier}).")
    if c.parallel >= COMPUTE_CAVEAT_SEQS:
        trade.append(f"aggregate {c.aggregate or 0:.0f} t/s is a memory-bandwidth estimate: at {c.parallel} sequences "
                     "a decode step may be compute-bound, which the plan does not model "
                     "(no FLOPS figures in the catalog).")
    if p.source != "catalog":
        trade.append(f"not in the catalog: read from the {p.source}; "
                     + ("its size is the file's exact bytes" if q.size_bytes else "its size is an estimate")
                     + ", its quality a class tier.")
    return reasons, trade
