"""``verify --baseline RUN``: which checks regressed since a stored run (after an engine update, say).

Pure functions over ``check`` record payloads (``CheckResult`` as stored), so the store and the
card can use them without an engine. A regression is PASS then, not PASS now; a check that
passed fewer of its K runs than before (flakier) is listed too; a check newly SKIPped is noted,
because a SKIP hides what it used to show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _rate(p: Mapping[str, Any]) -> float | None:
    details = p.get("details") or {}
    ran, passes = details.get("ran"), details.get("passes")
    if isinstance(ran, int) and isinstance(passes, int) and ran > 0:
        return passes / ran
    status = str(p.get("status") or "").upper()
    return {"PASS": 1.0, "FAIL": 0.0}.get(status)


def compare(baseline: Iterable[Mapping[str, Any]], current: Iterable[Mapping[str, Any]],
            baseline_run: int) -> dict[str, Any]:
    """``{baseline_run, regressed, improved, newly_skipped, missing, new}``, each a list of rows."""
    before = {str(p.get("name")): p for p in baseline}
    now = {str(p.get("name")): p for p in current}
    regressed, improved, newly_skipped = [], [], []
    for name, p in now.items():
        old = before.get(name)
        if old is None:
            continue
        was, is_ = str(old.get("status")).upper(), str(p.get("status")).upper()
        row = {"name": name, "was": was, "now": is_, "reason": p.get("reason") or "",
               "was_reason": old.get("reason") or ""}
        r_old, r_new = _rate(old), _rate(p)
        if was == "PASS" and is_ == "FAIL" or (r_old is not None and r_new is not None and r_new < r_old):
            regressed.append({**row, "was_rate": r_old, "now_rate": r_new})
        elif was == "FAIL" and is_ == "PASS":
            improved.append(row)
        elif is_ == "SKIP" and was != "SKIP":
            newly_skipped.append(row)
    return {"baseline_run": baseline_run, "regressed": regressed, "improved": improved,
            "newly_skipped": newly_skipped, "missing": sorted(set(before) - set(now)),
            "new": sorted(set(now) - set(before))}
