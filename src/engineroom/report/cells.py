"""The run card's cell formatting (``report.card`` and its sections): counts, sizes, escaped text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engineroom import units


def figure_cell(value: Any, digits: int = 2) -> str:
    """A card cell for a count or rate (not a size: sizes go through units): "n/a" rather than
    blank, because a markdown cell left empty reads as a rendering fault."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def size_cell(n: Any) -> str:
    """A size through units.mem, empty when unknown so the caller leaves it out; 0 or less is left
    out too, since no RAM, VRAM or model file has that size: it is a bad record, not a size."""
    return units.mem(n, missing="") if not isinstance(n, (int, float)) or n > 0 else ""


def text_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def integrity_lines(checks: Sequence[Mapping[str, Any]], failed: Sequence[Mapping[str, Any]]) -> list[str]:
    """The integrity checklist (each check PASS / FAIL / SKIP with its reason) and the errors
    behind failed requests (one line per distinct error, with its count and first occurrence)."""
    lines: list[str] = []
    if checks:
        lines += ["Integrity checklist:", ""]
        for c in checks:
            mark = {"PASS": "PASS", "FAIL": "⚠ FAIL", "SKIP": "SKIP"}.get(str(c.get("status")), str(c.get("status")))
            lines.append(f"- {mark} {c.get('name')}: {c.get('detail')}.")
        lines.append("")
    if failed:
        lines += ["Failed requests, by error:", ""]
        for f in failed:
            lines.append(f"- {f.get('count')} x {f.get('error')} (first: {f.get('first')})")
        lines.append("")
    return lines
