"""Predicted vs measured memory: fit's components beside what the engine itself reported.

Both sides are plain ``{component: bytes}`` maps keyed by fit's component names
("weights", "kv_cache", "compute", ...); the engine's adapter names what it read the same
way (``Engine.memory_report``). ``total`` sums the components both sides report (fit's
runtime allowance, which the engine does not log, stays a row of its own). Per-device totals
the engine prints (llama.cpp's memory breakdown table, ``total:<device>``) are kept in the
record but not compared: that table
truncates to whole MiB, and the one printed at start comes from a dry run, before the real
allocation. A GPU's whole use (``GPU<i>``: NVML per process vs fit's per-GPU total) is a row of
its own. Every row says which side is missing rather than inventing a zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MemoryRow:
    component: str
    predicted_bytes: int | None
    measured_bytes: int | None

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) / measured, in percent; None when a side is missing or zero."""
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def measured_total(measured: dict[str, int]) -> int | None:
    """The sum of the components the engine reported (its buffer lines)."""
    parts = [b for name, b in measured.items() if not name.startswith(("total", "GPU"))]
    return sum(parts) if parts else None


def compare(predicted: dict[str, int], measured: dict[str, int]) -> list[MemoryRow]:
    """One row per component either side names (fit's order first), then ``total``."""
    names = [n for n in predicted if n != "total"]
    names += [n for n in measured if n not in predicted and not n.startswith("total")]
    rows = []
    for name in names:
        p, m = predicted.get(name), measured.get(name)
        if not p and not m:
            continue                 # both sides say nothing of it (e.g. no recurrent state)
        rows.append(MemoryRow(name, p if p is not None else None, m if name in measured else None))
    if predicted or measured:
        # like with like: fit's components that the engine also reported (a CUDA runtime the
        # engine does not log is a row of its own, and inside the GPU<i> row)
        both = [r.predicted_bytes for r in rows if r.predicted_bytes is not None and r.measured_bytes is not None
                and not r.component.startswith("GPU")]
        rows.append(MemoryRow("total", sum(both) if both else predicted.get("total"), measured_total(measured)))
    return rows


def rows_as_dicts(rows: list[MemoryRow]) -> list[dict]:
    return [{**asdict(r), "error_pct": None if r.error_pct is None else round(r.error_pct, 3)} for r in rows]
