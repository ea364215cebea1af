"""The A/B table (``engineroom ab``): each metric's arms, boots, delta, noise band and verdict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ab_text"]


def _arm(arm: Any) -> str:
    if not isinstance(arm, Mapping):
        return "?"
    return ", ".join(f"{k}={' '.join(v) if isinstance(v, list) else v}" for k, v in arm.items())


def ab_text(result: Mapping[str, Any]) -> str:
    order = " ".join(result.get("order") or [])
    lines = [f"# engineroom ab {result.get('model', '')}", "",
             f"A: {_arm(result.get('arm_a'))} (runs {', '.join(map(str, result.get('runs_a') or []))}); "
             f"B: {_arm(result.get('arm_b'))} (runs {', '.join(map(str, result.get('runs_b') or []))}); "
             f"boot order {order}.", "",
             "| group | metric | A mean (n) | B mean (n) | A boots | B boots | delta | noise band (95%) "
             "| boot band (99%) | verdict |", "|---|---|---:|---:|---|---|---:|---:|---:|---|"]
    for r in result.get("rows") or []:
        delta = f"{r['delta']:+.3f}" + (f" ({r['delta_pct']:+.1f}%)" if r.get("delta_pct") is not None else "")
        band = "n/a" if r.get("band") is None else f"±{r['band']:.3f}" + (
            f" (±{r['band_pct']:.1f}%)" if r.get("band_pct") is not None else "")
        spread = "n/a" if r.get("boot_band") is None else f"±{r['boot_band']:.3f}"
        boots_a = " / ".join(f"{x:.3f}" for x in r["boots_a"])
        boots_b = " / ".join(f"{x:.3f}" for x in r["boots_b"])
        lines.append(f"| {r['group']} | {r['metric']} | {r['a_mean']:.3f} ({r['n_a']}) | {r['b_mean']:.3f} "
                     f"({r['n_b']}) | {boots_a} | {boots_b} | {delta} | {band} | {spread} | "
                     f"**{r['verdict']}**: {r['why']} |")
    if not result.get("rows"):
        lines.append("| (no metric measured in every boot of both arms) | | | | | | | | | |")
    bad = result.get("invalid_boots") or []
    if bad:
        lines += ["", "Not compared (the bench said INVALID; the arm was booted again):"]
        lines += [f"- run {b.get('run')}, arm {b.get('arm')} at boot position {b.get('position')}: {b.get('why')}"
                  for b in bad]
    lines += ["", "_Real means: beyond the pooled 95% band of the requests, the same direction in every "
                  "A-boot / B-boot pairing, and beyond a 99% band over the boot means._"]
    return "\n".join(lines) + "\n"
