"""Ranking: order candidates by a priority's rank keys, with tolerances that make near-equal
values a tie decided by the next key.
"""

from __future__ import annotations

import math

from .candidates import Candidate

# rank metrics known before any fit: planning can size candidates lazily in rank order
STATIC_METRICS = {"decode_tps", "quality", "quant_portability", "engine_status",
                  "engine_non_nvidia_vendors", "cold_start_s", "kv_precision"}


def rank_candidates(cands: list[Candidate], keys: list) -> list[Candidate]:
    """Candidates in rank order: the tie groups of ``tie_groups``, one after another."""
    return [c for group in tie_groups(cands, keys) for c in group]


def tie_groups(cands: list[Candidate], keys: list) -> list[list[Candidate]]:
    """Candidates in rank order, as groups that tie on every key in ``keys``."""
    if not cands:
        return []
    if not keys:
        return [cands]
    key, rest = keys[0], keys[1:]
    sign = -1.0 if key.goal == "max" else 1.0
    ordered = sorted(cands, key=lambda c: sign * c.metrics[key.metric])
    out: list[list[Candidate]] = []
    start, n = 0, len(ordered)
    while start < n:
        # sorted from the best, so the values close to the best one are a prefix of the rest
        best = ordered[start].metrics[key.metric]
        end = start + 1
        while end < n and within_tolerance(ordered[end].metrics[key.metric], best, key.tolerance):
            end += 1
        out.extend(tie_groups(ordered[start:end], rest))
        start = end
    return out


def within_tolerance(a: float, b: float, tol: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol
