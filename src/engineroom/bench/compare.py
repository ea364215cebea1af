"""A/B: two stored bench runs, each delta with a noise band and whether it is real.

Samples are recomputed from each run's raw records (``samples``): per group (workload, depth
or stream count) the per-request decode rate, TTFT and prefill rate of the kept measured
requests (concurrency: each round's aggregate rate). For each metric both runs have:

- ``delta`` = mean(B) - mean(A), ``delta_pct`` relative to A;
- ``band`` = the 95% confidence half-width of that difference from the two samples' own
  spread (Welch: t(0.975, Welch–Satterthwaite df) x sqrt(s_A²/n_A + s_B²/n_B));
- ``verdict``: ``real`` when |delta| exceeds the band, ``not real`` when it does not,
  ``cannot tell`` with fewer than 2 values in either run.

The band is the variation *within* each run. Engines also vary boot to boot (about 20% in the
spec's experience); a verdict about a launch setting holds only when each arm spans at least
2 boots, interleaved (``boots_note`` says so when the runs do not show it).
"""

from __future__ import annotations

import math
import statistics as _st
from collections.abc import Mapping, Sequence
from typing import Any

from engineroom.bench.stats import group_label, kept
from engineroom.bench.suites.summary import is_suite_run, round_figures
from engineroom.records import statistics as st
from engineroom.records.encoding import ttft_s

__all__ = ["Arm", "compare_arms", "compare_boot_samples", "compare_runs", "samples", "t_975", "welch"]

# two-sided 95% t quantiles by degrees of freedom (1..30); above 30 the normal 1.96 (within 2%)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


# two-sided 99% t quantiles (1..30); above 30 the normal 2.576
_T995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012, 2.977,
         2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763,
         2.756, 2.750)


def _interp(table: tuple[float, ...], df: float, beyond: float) -> float:
    if df >= len(table):
        return beyond
    lo = max(1, math.floor(df))
    hi = min(len(table), lo + 1)
    a, b = table[lo - 1], table[hi - 1]
    return a + (b - a) * (df - lo)


def t_995(df: float) -> float:
    return _interp(_T995, df, 2.576)


def t_975(df: float) -> float:
    if df >= len(_T975):
        return 1.96
    lo = max(1, math.floor(df))
    hi = min(len(_T975), lo + 1)
    a, b = _T975[lo - 1], _T975[hi - 1]
    return a + (b - a) * (df - lo)


def welch(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    if len(a) < 2 or len(b) < 2:
        return {"delta": (_st.fmean(b) - _st.fmean(a)) if a and b else None, "band": None, "df": None}
    ma, mb = _st.fmean(a), _st.fmean(b)
    va, vb = _st.variance(a) / len(a), _st.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if va or vb:
        df = (va + vb) ** 2 / ((va * va / (len(a) - 1)) + (vb * vb / (len(b) - 1)))
    else:
        df = float(len(a) + len(b) - 2)
    return {"delta": mb - ma, "band": t_975(df) * se, "df": df}


def samples(run: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    cond = run.get("conditions") if isinstance(run.get("conditions"), Mapping) else {}
    assert isinstance(cond, Mapping)
    reqs = st.payloads(records)
    out: dict[str, dict[str, list[float]]] = {}
    if is_suite_run(cond):
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in reqs:
            groups.setdefault(group_label(r), []).append(r)
        for name, rs in groups.items():
            keep = kept(rs)
            usable = [r for r in keep if st.is_usable(r)]
            m: dict[str, list[float]] = {
                "decode_tps": [x for x in (st.decode_tps(r) for r in usable) if x is not None],
                "ttft_s": [x for x in (ttft_s(r) for r in keep if st.is_ok(r)) if x is not None],
            }
            if any(isinstance(r.get("round"), int) for r in keep):
                m["aggregate_tps"] = [x["aggregate_tps"] for x in round_figures(keep) if x["aggregate_tps"] is not None]
            out[name] = m
        return out
    by: dict[str, list[dict[str, Any]]] = {}
    for r in reqs:
        if not r.get("warmup"):
            by.setdefault(str(r.get("workload")), []).append(r)
    for name, rs in by.items():
        usable = [r for r in rs if st.is_usable(r)]
        out[name] = {"decode_tps": [x for x in (st.decode_tps(r) for r in usable) if x is not None],
                     "ttft_s": [x for x in (ttft_s(r) for r in rs if st.is_ok(r)) if x is not None]}
    return out


def compare_runs(run_a: Mapping[str, Any], records_a: Sequence[Mapping[str, Any]],
                 run_b: Mapping[str, Any], records_b: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    sa, sb = samples(run_a, records_a), samples(run_b, records_b)
    rows: list[dict[str, Any]] = []
    for group in [g for g in sa if g in sb]:
        for metric in [m for m in sa[group] if m in sb[group]]:
            a, b = sa[group][metric], sb[group][metric]
            if not a or not b:
                continue
            w = welch(a, b)
            mean_a, mean_b = _st.fmean(a), _st.fmean(b)
            if w["band"] is None:
                verdict = "cannot tell"
            else:
                verdict = "real" if abs(w["delta"]) > w["band"] else "not real"
            band = w["band"]
            rows.append({"group": group, "metric": metric, "a_mean": mean_a, "b_mean": mean_b, "n_a": len(a),
                         "n_b": len(b), "delta": w["delta"],
                         "delta_pct": (w["delta"] / mean_a * 100.0) if mean_a else None, "band": band,
                         "band_pct": (band / mean_a * 100.0) if (mean_a and band is not None) else None,
                         "verdict": verdict})
    only = sorted(set(sa) ^ set(sb))
    return {"run_a": run_a.get("id"), "run_b": run_b.get("id"), "rows": rows, "unmatched_groups": only,
            "boots_note": ("the band is each run's own variation; engines vary boot to boot (about 20% in the spec's "
                           "experience), so a launch setting's effect is settled only with each arm over at least 2 "
                           "boots, interleaved")}


Arm = Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]    # [(run, records)] per boot


def compare_arms(arm_a: Arm, arm_b: Arm) -> dict[str, Any]:
    """A/B over boots: each arm is one stored run per boot (interleaved by the caller).

    Per group and metric: the pooled per-request samples give ``delta`` and the Welch band, as
    ``compare_runs``; besides, each boot's mean. The verdict is ``real`` only when all three hold:
    |delta| exceeds the pooled band; every A boot against every B boot differs in the same
    direction; and |delta| exceeds the 99% band of the boot means (a pooled t over boots: an engine
    that varies 10% boot to boot cannot show a 5% effect in two boots). ``not real`` when any fails and
    each arm has at least 2 boots of at least 2 samples; else ``cannot tell``.
    """
    result = compare_boot_samples([samples(run, recs) for run, recs in arm_a],
                                  [samples(run, recs) for run, recs in arm_b])
    return {"runs_a": [run.get("id") for run, _ in arm_a], "runs_b": [run.get("id") for run, _ in arm_b], **result}


BootSamples = Sequence[Mapping[str, Mapping[str, Sequence[float]]]]    # per boot: group -> metric -> values


def _boot_band(means_a: Sequence[float], means_b: Sequence[float]) -> float:
    """The 99% half-width of the difference of the arms' boot means (a pooled-variance t over
    boots, df = boots - 2): what the boot-to-boot variation alone could produce. Pooled rather than
    Welch because with 2 boots an arm's own variance is one number's worth of evidence (Welch's df
    would fall toward 1, t toward 64); 99%, not 95%, so a verdict of "real" is rarely wrong."""
    na, nb = len(means_a), len(means_b)
    pooled = ((na - 1) * _st.variance(means_a) + (nb - 1) * _st.variance(means_b)) / (na + nb - 2)
    return t_995(na + nb - 2) * math.sqrt(pooled * (1 / na + 1 / nb))


def _boots_needed(means_a: Sequence[float], means_b: Sequence[float], delta: float, most: int = 12) -> int | None:
    """Boots per arm at which this |delta| would clear the 99% boot band, if the boot-to-boot
    spread stayed as measured (the same pooled variance, df = 2n - 2); None beyond ``most``."""
    na, nb = len(means_a), len(means_b)
    pooled = ((na - 1) * _st.variance(means_a) + (nb - 1) * _st.variance(means_b)) / (na + nb - 2)
    for n in range(2, most + 1):
        if t_995(2 * n - 2) * math.sqrt(pooled * 2 / n) < abs(delta):
            return n
    return None


def compare_boot_samples(per_a: BootSamples, per_b: BootSamples) -> dict[str, Any]:
    """``compare_arms`` on samples already taken from the records (one mapping per boot)."""
    every = [*per_a, *per_b]
    groups = [g for g in (per_a[0] if per_a else {}) if all(g in s for s in every)]
    rows: list[dict[str, Any]] = []
    for group in groups:
        metrics = [m for m in per_a[0][group] if all(m in s[group] for s in every)]
        for metric in metrics:
            boots_a = [list(s[group][metric]) for s in per_a]
            boots_b = [list(s[group][metric]) for s in per_b]
            if not boots_a or not boots_b or not all(boots_a) or not all(boots_b):   # an arm with no valid boot
                continue
            a = [x for boot in boots_a for x in boot]
            b = [x for boot in boots_b for x in boot]
            w = welch(a, b)
            mean_a, mean_b = _st.fmean(a), _st.fmean(b)
            means_a = [_st.fmean(x) for x in boots_a]
            means_b = [_st.fmean(x) for x in boots_b]
            spread = max(max(means_a) - min(means_a), max(means_b) - min(means_b))
            signs = {math.copysign(1.0, mb - ma) for ma in means_a for mb in means_b if mb != ma}
            enough = len(boots_a) >= 2 and len(boots_b) >= 2 and min(len(x) for x in boots_a + boots_b) >= 2
            boot_band = _boot_band(means_a, means_b) if enough else None
            needed: int | None = None
            if w["band"] is None or boot_band is None:
                verdict, why = "cannot tell", "each arm needs at least 2 boots of at least 2 measured requests"
            elif abs(w["delta"]) <= w["band"]:
                verdict, why = "not real", "within the noise band"
            elif len(signs) > 1:
                verdict, why = "not real", "the boots disagree on the direction"
            elif abs(w["delta"]) <= boot_band:
                verdict, why = "not real", "within the boot-to-boot variation"
                needed = _boots_needed(means_a, means_b, w["delta"])
                if needed is not None and needed > min(len(means_a), len(means_b)):
                    why += f" (at this spread, about {needed} boots an arm would tell)"
                else:
                    needed = None
            else:
                verdict, why = "real", "beyond the noise band and the boot-to-boot variation, in every boot pairing"
            rows.append({"group": group, "metric": metric, "a_mean": mean_a, "b_mean": mean_b, "n_a": len(a),
                         "n_b": len(b), "boots_a": means_a, "boots_b": means_b, "boot_spread": spread,
                         "boot_spread_pct": spread / mean_a * 100.0 if mean_a else None, "boot_band": boot_band,
                         "delta": w["delta"], "delta_pct": (w["delta"] / mean_a * 100.0) if mean_a else None,
                         "band": w["band"],
                         "band_pct": (w["band"] / mean_a * 100.0) if (mean_a and w["band"] is not None) else None,
                         "verdict": verdict, "why": why, "boots_needed": needed})
    return {"rows": rows}
