"""The try table (``engineroom try``): the plan's pick on a random-weight file, predicted beside measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..units import gib

__all__ = ["try_text"]


def try_text(result: Mapping[str, Any]) -> str:
    """``result``: TryOutcome as a mapping (``dataclasses.asdict``)."""
    pick = result.get("pick") or {}
    size = result.get("file_bytes") or 0
    kept = result.get("kept")
    lines = [f"# engineroom try {result.get('model', '')} (random weights)", "",
             f"pick: {pick.get('engine')} {pick.get('quant')} KV {pick.get('kv')}, {pick.get('ctx') or 0:,} tokens x "
             f"{pick.get('parallel') or 1} ({pick.get('source')})",
             f"file: {gib(size, 2)} of random weights, " + (f"kept at {kept}" if kept else "deleted"), "",
             "| component | predicted | measured | error |", "|---|---:|---:|---:|"]
    for row in result.get("memory_rows") or []:
        err = row.get("error_pct")
        lines.append(f"| {row.get('component')} | {gib(row.get('predicted_bytes'), 3, 'n/a')} | "
                     f"{gib(row.get('measured_bytes'), 3, 'n/a')} | {'n/a' if err is None else f'{err:+.2f}%'} |")
    if not result.get("memory_rows"):
        lines.append("| (the engine reported no memory figures) | | | |")
    placement = result.get("placement") or {}
    lines += ["", f"placement: {placement.get('detail') or placement.get('status', 'unknown')}"]
    band, tps = result.get("decode_band"), result.get("decode_tps")
    if tps is None:
        lines.append("decode: not measured")
    elif band:
        low, high = band
        where = "inside" if low <= tps <= high else ("below" if tps < low else "above")
        lines.append(f"decode: {tps:.1f} tok/s measured, {where} the plan's band {low:.1f}-{high:.1f} tok/s")
    else:
        lines.append(f"decode: {tps:.1f} tok/s measured (the plan has no band: the machine's bandwidth is unknown)")
    if band and result.get("speed_basis"):
        lines.append(f"the plan's band: {result['speed_basis']}")
    point = result.get("calibrated_by")
    if point:
        ratio = point["measured_tps"] / point["planned_mid_tps"]
        family = f", {point['family']} weights" if point.get("family") else ""
        lines.append(f"calibration: this run is a speed point for {point.get('engine')} ({point.get('shape')} shapes"
                     f"{family}) "
                     f"on this machine: measured / planned middle = {ratio:.2f}; `engineroom plan` here uses it "
                     "from now on")
    failed = "; ".join(result.get("bench_failed") or [])
    lines.append(f"bench: {result.get('bench_status')}" + (f" ({failed})" if failed else "")
                 + f"; run {result.get('run_id')}: engineroom report {result.get('run_id')}")
    lines += [f"left out: {x}" for x in result.get("left_out") or []]
    lines += ["", "Not meaningful with random weights (not measured):"]
    lines += [f"- {x}" for x in result.get("not_meaningful") or []]
    return "\n".join(lines) + "\n"
