"""Recompute the recorded soaks' verdicts from their raw per-turn records (benchmarks/verify_soak.md).

``checks.soak.judge`` is pure: the verdict of a stored soak can be recomputed with the rules in
this tree from the turn records alone, no engine needed. For each ``verify --json`` file under
benchmarks/data/verify_soak/ (and gpu/) this prints the verdict stored then and the one the rules
give now, the memory at each session's end, and the decode medians per session.

    .venv/bin/python benchmarks/verify_soak.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from engineroom.checks.soak import judge

DATA = Path(__file__).parent / "data" / "verify_soak"
MiB = 1024 * 1024


def main() -> int:
    files = sorted(DATA.glob("*.json")) + sorted((DATA / "gpu").glob("soak-*.json"))
    for path in files:
        out = json.loads(path.read_text())
        [res] = out["results"]
        d = res["details"]
        turns = d["turn_records"]
        now = judge(turns, d.get("memory_source"))
        print(f"## {path.relative_to(DATA)}: {d['mode']}, {len(turns)} turns, {d['sessions']} sessions")
        print(f"- stored: {d['verdict']}: {res['reason'].split(': ', 1)[1][:200]}")
        print(f"- recomputed with this tree's rules: {now['verdict']}: {now['reason'][:200]}")
        ends: dict[int, list[dict]] = {}
        for t in turns:
            ends.setdefault(t["session"], []).append(t)
        rows = []
        for s, ts in ends.items():
            mem = ts[-1]["memory"].get("bytes")
            dec = [t["decode_tps"] for t in ts if isinstance(t.get("decode_tps"), (int, float))]
            rows.append(f"{s}: {mem / MiB:.1f} MiB" + (f", decode median {statistics.median(dec):.1f} tok/s"
                                                        if dec else ""))
        shown = rows if len(rows) <= 8 else [*rows[:4], "...", *rows[-3:]]
        print("- session ends: " + "; ".join(shown))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
