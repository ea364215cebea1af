"""Bench summaries, recomputed from raw request records only.

Input: the record dicts the runner emits (``BenchRequest.to_dict()``), or store records
(``{"kind": "bench_request", "payload": {...}}``) — both are accepted. Nothing here reads
an engine or a clock; the same records always give the same summary.

Where each figure comes from:

- ``decode_tps``, ``wall_tps``, ``ttft_s``: the client clock (``time.perf_counter``) and
  ``usage.completion_tokens``.
- ``engine_decode_tps`` / ``engine_prompt_tps``: the engine's own ``timings`` block
  (``predicted_per_second`` / ``prompt_per_second``), reported as the engine gave them.
- The agreement check compares the engine's figure with the client's inter-token rate
  ``(tokens - 1) / (last token - first token)`` over the *same* requests (the engine's own
  definition; see ``inter_token_tps``); the client figures are never replaced by or
  derived from the engine's.
"""

from __future__ import annotations

import math
import statistics as _st
from typing import Any, Iterable, Mapping

# Requests that stop before this fraction of max_tokens are not "usable": a few tokens
# are dominated by fixed per-request costs and would skew decode figures.
USABLE_FRACTION = 0.25
# Client decode and engine decode differing by more than this -> warning.
AGREEMENT_TOLERANCE_PCT = 5.0
# ...over requests whose first-to-last-token window is at least this long.
AGREEMENT_MIN_WINDOW_S = 0.25

STATUS_OK = "OK"
STATUS_NO_TOKENS = "NO_TOKENS"
STATUS_REQ_ERRORS = "REQ_ERRORS"

BENCH_RECORD_KIND = "bench_request"


def payloads(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Bench request payloads out of runner dicts or store records (other kinds dropped)."""
    out: list[dict[str, Any]] = []
    for rec in records:
        if "payload" in rec and isinstance(rec.get("payload"), Mapping):
            if rec.get("kind", BENCH_RECORD_KIND) != BENCH_RECORD_KIND:
                continue
            out.append(dict(rec["payload"]))
        elif "workload" in rec:
            out.append(dict(rec))
    return out


def describe(values: Iterable[float | None]) -> dict[str, Any]:
    """n, mean, sample std, CV%, min, max of the non-missing values (None where undefined)."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "cv_pct": None, "min": None, "max": None}
    mean = _st.fmean(xs)
    std = _st.stdev(xs) if n >= 2 else None
    cv = (std / mean * 100.0) if (std is not None and mean) else None
    return {"n": n, "mean": mean, "std": std, "cv_pct": cv, "min": min(xs), "max": max(xs)}


def is_ok(rec: Mapping[str, Any]) -> bool:
    return not rec.get("error") and rec.get("status") == 200


def is_usable(rec: Mapping[str, Any]) -> bool:
    """An error-free request that produced at least USABLE_FRACTION of its max_tokens."""
    if not is_ok(rec):
        return False
    tokens = rec.get("completion_tokens")
    if not tokens:
        return False
    max_tokens = rec.get("max_tokens")
    if not max_tokens:
        return True
    return tokens >= USABLE_FRACTION * max_tokens


def engine_timing(rec: Mapping[str, Any], key: str) -> float | None:
    timings = rec.get("engine_timings")
    if not isinstance(timings, Mapping):
        return None
    value = timings.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def inter_token_tps(rec: Mapping[str, Any]) -> float | None:
    """(tokens - 1) / (last token - first token) on the client clock, or None.

    This is the figure an engine's own decode rate measures: llama.cpp's
    ``predicted_per_second`` is ``(predicted_n - 1) / (t_last_token - t_prompt_done)``
    ("the first token is free, it comes from the logits of the last prompt batch",
    tools/server/server-common.h). Comparing it, not ``decode_tps``, keeps a definition
    gap of n/(n-1) (4.3% at 24 tokens) out of the cross-check.
    """
    tokens, window = rec.get("completion_tokens"), _inter_token_window(rec)
    if not isinstance(tokens, int) or tokens < 2 or window is None or window <= 0:
        return None
    return (tokens - 1) / window


def _inter_token_window(rec: Mapping[str, Any]) -> float | None:
    """Last token - first token on the client clock (seconds), or None."""
    ttft, last = rec.get("ttft_s"), rec.get("last_token_s")
    return None if ttft is None or last is None else float(last) - float(ttft)


def agreement(recs: list[Mapping[str, Any]], tolerance_pct: float = AGREEMENT_TOLERANCE_PCT,
              min_window_s: float = AGREEMENT_MIN_WINDOW_S) -> dict[str, Any]:
    """Client inter-token rate vs the engine's ``predicted_per_second``, same requests.

    ``diff_pct`` is the *median* over requests of (engine - client) / client x 100, so a
    minority of requests whose first chunk reached the client late does not decide it
    (benchmarks/bench_agreement.md: 5 of 40 requests on this VM saw the first chunk 32-42 ms
    late and read up to +33%; every other request agreed within 0.1%, even at 24 tokens).
    An engine whose timings are off is off in every request and moves the median.
    ``client_inter_token_tps`` / ``engine_decode_tps`` are the means, for display.
    ``warning`` is a sentence when |diff_pct| exceeds ``tolerance_pct``, else None.
    Requests whose client first-to-last token window is under ``min_window_s`` are left
    out (a few ms of delivery delay is a large share of a shorter window). ``n`` = 0 with
    ``not_checked`` saying why when nothing could be compared (the engine gave no timings,
    or every window was too short) -- not a warning, not a pass.
    """
    both = [(inter_token_tps(r), engine_timing(r, "predicted_per_second"), _inter_token_window(r))
            for r in recs]
    both = [b for b in both if b[0] is not None and b[1] is not None]
    pairs = [(c, e) for c, e, w in both if w is not None and w >= min_window_s]
    base = {"client_inter_token_tps": None, "engine_decode_tps": None, "diff_pct": None,
            "tolerance_pct": tolerance_pct, "min_window_s": min_window_s, "warning": None,
            "not_checked": None}
    if not pairs:
        if both:
            longest = max(w for _, _, w in both)
            reason = (f"decode windows too short to cross-check at {tolerance_pct:g}% "
                      f"(longest {longest:.2f} s, need {min_window_s:g} s; raise max_tokens)")
        else:
            reason = "the engine reported no decode timings"
        return {**base, "n": 0, "not_checked": reason}
    client = _st.fmean(p[0] for p in pairs)
    engine = _st.fmean(p[1] for p in pairs)
    diff = _st.median((e - c) / c * 100.0 for c, e in pairs)
    warning = None
    if abs(diff) > tolerance_pct:
        warning = (
            f"engine-reported decode {engine:.2f} tok/s differs from the client-measured "
            f"inter-token rate {client:.2f} tok/s by {diff:+.1f}% (median over {len(pairs)} requests; "
            f"more than {tolerance_pct:g}%); trust the client figure"
        )
    return {**base, "n": len(pairs), "client_inter_token_tps": client, "engine_decode_tps": engine,
            "diff_pct": diff, "warning": warning}


def summarize_workload(recs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Summary of the *measured* (non-warm-up) requests of one workload."""
    measured = [r for r in recs if not r.get("warmup")]
    ok = [r for r in measured if is_ok(r)]
    usable = [r for r in measured if is_usable(r)]
    max_tokens = next((r.get("max_tokens") for r in measured if r.get("max_tokens")), None)
    return {
        "n": len(measured),
        "n_ok": len(ok),
        "n_errors": len(measured) - len(ok),
        "n_usable": len(usable),
        "n_decode_na": sum(1 for r in usable if r.get("decode_tps") is None),
        "max_tokens": max_tokens,
        "decode_tps": describe(r.get("decode_tps") for r in usable),
        "wall_tps": describe(r.get("wall_tps") for r in usable),
        "ttft_s": describe(r.get("ttft_s") for r in ok),
        "wall_s": describe(r.get("wall_s") for r in ok),
        "completion_tokens": describe(r.get("completion_tokens") for r in ok),
        "prompt_tokens": describe(r.get("prompt_tokens") for r in ok),
        "engine_decode_tps": describe(engine_timing(r, "predicted_per_second") for r in usable),
        "engine_prompt_tps": describe(engine_timing(r, "prompt_per_second") for r in ok),
        "agreement": agreement(usable),
        "ignore_eos": any(r.get("ignore_eos") for r in measured),
    }


def run_status(recs: list[Mapping[str, Any]]) -> str:
    """REQ_ERRORS if any request (warm-up included) failed; NO_TOKENS if no measured
    request produced a token; else OK."""
    if any(not is_ok(r) for r in recs):
        return STATUS_REQ_ERRORS
    measured = [r for r in recs if not r.get("warmup")]
    if not any((r.get("completion_tokens") or 0) > 0 for r in measured):
        return STATUS_NO_TOKENS
    return STATUS_OK


def summarize(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"status", "workloads": {name: summary}, "warnings": [sentences]}`` from records."""
    recs = payloads(records)
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_workload.setdefault(str(r.get("workload")), []).append(r)
    workloads = {name: summarize_workload(rs) for name, rs in by_workload.items()}
    warnings: list[str] = []
    for name, s in workloads.items():
        if s["agreement"]["warning"]:
            warnings.append(f"{name}: {s['agreement']['warning']}")
        if s["n_errors"]:
            warnings.append(f"{name}: {s['n_errors']} of {s['n']} measured requests failed")
        if s["n"] and s["n_ok"] and not s["n_usable"]:
            warnings.append(
                f"{name}: no request reached {USABLE_FRACTION:.0%} of max_tokens; decode figures omitted"
            )
        if s["n_decode_na"]:
            warnings.append(
                f"{name}: decode TPS n/a for {s['n_decode_na']} request(s) (decode window under 5% of wall time)"
            )
    warmup_errors = sum(1 for r in recs if r.get("warmup") and not is_ok(r))
    if warmup_errors:
        warnings.append(f"{warmup_errors} warm-up request(s) failed")
    return {"status": run_status(recs) if recs else STATUS_NO_TOKENS, "workloads": workloads, "warnings": warnings}
