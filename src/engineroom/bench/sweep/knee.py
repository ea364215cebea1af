"""The concurrency sweep: N streams x prompt sizes within a time budget, the knee and a slot count.

``engineroom bench sweep`` runs cells of N simultaneous streams (N = 1, 2, 4, ... up to the
slot count the engine reports, or ``--streams``, which is then included) at one or more prompt
sizes (``--depths``; default ``SuiteSpec.prompt_tokens`` capped by the context), each cell a few
rounds of salted, uncacheable prompts like the concurrency suite's. Before each cell the run
estimates its cost from the cells already measured (``estimate_cell_s``: the last round time at
that size scaled *linearly* with N, pessimistic where batching helps) and skips it when it would
overrun ``--budget-s``; each decision is stored (a ``sweep_cell`` record) and the card lists the
cells skipped.

The knee (``knee``), per prompt size, from the cells' medians recomputed from raw records: walking
N upwards, the first step where the aggregate decode rate gains less than ``knee_gain_pct`` of the
single-stream rate per added stream, or where the bigger N breaks a latency SLO (TTFT p95 from the
scheduled send over ``slo_ttft_ms``, TPOT p95 over ``slo_itl_ms``) or had failed or empty streams,
ends the climb: the knee is the N before it. The recommended slot count is the smallest knee over
the prompt sizes measured (the largest size is usually the one that binds), with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_KNEE_GAIN_PCT", "SWEEP_CELL_KIND", "estimate_cell_s", "knee",
           "recommend", "stream_counts"]

DEFAULT_BUDGET_S = 300.0
DEFAULT_KNEE_GAIN_PCT = 15.0
SWEEP_CELL_KIND = "sweep_cell"


def stream_counts(max_n: int) -> list[int]:
    """1, 2, 4, ... below ``max_n``, then ``max_n`` itself."""
    out, n = [], 1
    while n < max_n:
        out.append(n)
        n *= 2
    return [*out, max_n]


def estimate_cell_s(ctx: int, streams: int, rounds: int, done: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds a cell of ``rounds`` rounds is expected to take, from the cells already run
    (``done``: ``{"ctx", "streams", "round_s"}``, ``round_s`` the slowest round's wall time).
    Linear in N (a pessimistic bound where batching helps), linear in the prompt size for a size
    not measured yet; None when nothing was measured (the first cell always runs)."""
    same = [c for c in done if c["ctx"] == ctx and c.get("round_s")]
    if same:
        ref = max(same, key=lambda c: c["streams"])
        return rounds * float(ref["round_s"]) * streams / ref["streams"]
    other = [c for c in done if c.get("round_s")]
    if not other:
        return None
    ref = max(other, key=lambda c: (c["ctx"], -c["streams"]))
    return rounds * float(ref["round_s"]) * streams / ref["streams"] * max(1.0, ctx / ref["ctx"])


def knee(points: Sequence[Mapping[str, Any]], *, gain_pct: float = DEFAULT_KNEE_GAIN_PCT,
         slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None) -> dict[str, Any]:
    """The knee of one prompt size's curve. ``points``: per N ``{"streams", "aggregate_tps",
    "per_stream_tps", "ttft_p95_ms", "tpot_p95_ms", "errors", "silent"}`` (medians over rounds).

    Returns ``{"knee": N or None, "reason": sentence, "steps": [per step gain]}``."""
    pts = sorted((p for p in points if p.get("aggregate_tps")), key=lambda p: p["streams"])
    if not pts:
        return {"knee": None, "reason": "no cell measured a decode rate", "steps": []}

    def breaks(p: Mapping[str, Any]) -> str | None:
        if p.get("errors") or p.get("silent"):
            return f"N={p['streams']} had {p.get('errors') or 0} failed and {p.get('silent') or 0} empty stream(s)"
        t, i = p.get("ttft_p95_ms"), p.get("tpot_p95_ms")
        if slo_ttft_ms is not None and t is not None and t > slo_ttft_ms:
            return f"N={p['streams']} breaks the TTFT SLO (p95 {t:,.0f} ms > {slo_ttft_ms:,.0f} ms)"
        if slo_itl_ms is not None and i is not None and i > slo_itl_ms:
            return f"N={p['streams']} breaks the inter-token SLO (TPOT p95 {i:,.1f} ms > {slo_itl_ms:,.1f} ms)"
        return None

    first = pts[0]
    why = breaks(first)
    if why:
        return {"knee": None, "reason": "even " + why, "steps": []}
    single = float(first["aggregate_tps"]) / first["streams"]
    steps: list[dict[str, Any]] = []
    for prev, cur in zip(pts, pts[1:], strict=False):
        gain = (float(cur["aggregate_tps"]) - float(prev["aggregate_tps"])) / (cur["streams"] - prev["streams"])
        share = gain / single * 100.0 if single else 0.0
        steps.append({"from": prev["streams"], "to": cur["streams"], "gain_per_stream_tps": gain, "gain_pct": share})
        why = breaks(cur)
        if why:
            return {"knee": prev["streams"], "reason": why, "steps": steps}
        if share < gain_pct:
            return {"knee": prev["streams"], "steps": steps,
                    "reason": (f"from N={prev['streams']} to N={cur['streams']} the aggregate "
                               f"{'rose' if gain >= 0 else 'fell'} by {abs(gain):,.1f} tok/s per added stream, "
                               f"{share:.0f}% of one stream's {single:,.1f} (under {gain_pct:g}%)")}
    last = pts[-1]
    tail = (f"; the last step still gained {steps[-1]['gain_pct']:.0f}% of a stream per added stream"
            if steps else "")
    return {"knee": last["streams"], "steps": steps,
            "reason": f"throughput still rose up to the largest N measured ({last['streams']}){tail}"}


def recommend(knees: Mapping[int, Mapping[str, Any]], max_n: int, max_source: str) -> dict[str, Any]:
    """The slot count to launch with: the smallest knee over the prompt sizes (``knees``: ctx ->
    ``knee()``), with the reason; None when no size gave one."""
    found = [(k["knee"], ctx, k) for ctx, k in knees.items() if k.get("knee")]
    if not found:
        reasons = "; ".join(f"at {ctx:,}-token prompts {k.get('reason')}" for ctx, k in knees.items())
        return {"slots": None, "reason": f"no slot count measured meets the SLOs: {reasons}" if reasons
                else "no cell was measured"}
    n, ctx, k = min(found, key=lambda x: (x[0], -x[1]))
    reason = f"at {ctx:,}-token prompts {k['reason']}"
    if n == max_n and k["reason"].startswith("throughput still rose"):
        reason += f"; {max_n} is {max_source}, so more slots may help (sweep further with more slots)"
    return {"slots": n, "ctx": ctx, "reason": reason}
