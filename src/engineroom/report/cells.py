"""The run card's cell formatting (``report.card`` and its sections): counts, sizes, escaped text."""

from __future__ import annotations

from typing import Any

from engineroom import units


def _fmt(value: Any, digits: int = 2) -> str:
    """A card cell for a count or rate (not a size: sizes go through units): "n/a" rather than
    blank, because a markdown cell left empty reads as a rendering fault."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _bytes(n: Any) -> str:
    """A size through units.mem, empty when unknown so the caller leaves it out; 0 or less is left
    out too, since no RAM, VRAM or model file has that size: it is a bad record, not a size."""
    return units.mem(n, missing="") if not isinstance(n, (int, float)) or n > 0 else ""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
