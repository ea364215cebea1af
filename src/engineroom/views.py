"""Rendering of command results for the terminal (rich tables); commands live in cli.py.

Views take plain data (dicts as stored, dataclasses) and return a renderable; they never
compute a figure that the data does not hold, and never talk to an engine or the store.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from .units import mem


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}%"


def memory_table(memory: dict[str, Any], title: str = "memory: fit's prediction vs the engine's report") -> Table | None:
    """Predicted vs measured per component (rows as ``memory.rows_as_dicts`` stores them)."""
    rows = memory.get("rows") or []
    if not rows:
        return None
    table = Table("component", "predicted", "measured", "error", title=title)
    for r in rows:
        table.add_row(r["component"],
                      "—" if r.get("predicted_bytes") is None else mem(r["predicted_bytes"], 2),
                      "—" if r.get("measured_bytes") is None else mem(r["measured_bytes"], 2),
                      _pct(r.get("error_pct")))
    src = memory.get("measured_source")
    if src or memory.get("predicted_for"):
        table.caption = f"predicted by fit for {memory.get('predicted_for') or '?'}; measured: {src or 'nothing reported'}"
    return table
