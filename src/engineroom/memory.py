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

Like with like: an engine that reports one figure for what fit splits in parts (vLLM and SGLang
log the whole KV space they allocated, ``kv_pool``; fit has the sequences' ``kv_cache``, their
``recurrent_state`` and the ``kv_pool_spare`` around them) gets one row with fit's parts summed
(``GROUPS``). ``total`` sums the components both sides have; ``process`` sets fit's whole
prediction (runtime included) against the memory the engine's processes hold (``PROCESS``:
their USS, measured by ``up`` where the engine runs in host memory), so the runtime no log line
names is counted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MemoryRow:
    component: str
    predicted_bytes: int | None
    measured_bytes: int | None
    source: str = ""     # where the measured side was read, as the engine's adapter said (empty: not said)

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) / measured, in percent; None when a side is missing or zero."""
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


# a component an engine reports whole -> the parts of it fit predicts separately
GROUPS: dict[str, tuple[str, ...]] = {"kv_pool": ("kv_cache", "recurrent_state", "kv_pool_spare")}
PROCESS = "process"     # the engine's processes' own memory (USS), beside fit's whole prediction


def measured_total(measured: dict[str, int]) -> int | None:
    """The sum of the components the engine reported (its buffer lines)."""
    parts = [b for name, b in measured.items() if not name.startswith(("total", "GPU")) and name != PROCESS]
    return sum(parts) if parts else None


def _grouped(predicted: dict[str, int], measured: dict[str, int]) -> dict[str, int]:
    """``predicted`` with the parts of each component the engine reports whole summed under its name."""
    out = dict(predicted)
    for whole, parts in GROUPS.items():
        if whole in measured and whole not in predicted and any(p in predicted for p in parts):
            first = next(p for p in out if p in parts)
            summed = sum(out.get(p) or 0 for p in parts)
            out = {(whole if k == first else k): (summed if k == first else v) for k, v in out.items()
                   if k == first or k not in parts}
    return out


def compare(predicted: dict[str, int], measured: dict[str, int],
            sources: Mapping[str, str] | None = None) -> list[MemoryRow]:
    """One row per component either side names (fit's order first), then ``total`` (the components
    both sides have), then ``process`` (fit's whole prediction vs the processes' memory) when measured;
    ``sources`` names where each measured component was read (kept in its row)."""
    said = dict(sources or {})
    grouped = _grouped(predicted, measured)
    names = [n for n in grouped if n != "total"]
    names += [n for n in measured if n not in grouped and not n.startswith("total") and n != PROCESS]
    rows = []
    for name in names:
        p, m = grouped.get(name), measured.get(name)
        if not p and not m:
            continue                 # both sides say nothing of it (e.g. no recurrent state)
        rows.append(MemoryRow(name, p if p is not None else None, m if name in measured else None,
                              said.get(name, "") if name in measured else ""))
    if predicted or measured:
        # like with like: fit's components that the engine also reported (a CUDA runtime the
        # engine does not log is a row of its own, and inside the GPU<i> row)
        both = [r for r in rows if r.predicted_bytes is not None and r.measured_bytes is not None
                and not r.component.startswith("GPU")]
        if both:
            rows.append(MemoryRow("total", sum(r.predicted_bytes or 0 for r in both),
                                  sum(r.measured_bytes or 0 for r in both)))
        else:
            rows.append(MemoryRow("total", predicted.get("total"), measured_total(measured)))
    if measured.get(PROCESS):
        whole = predicted.get("total")
        if whole is None:
            whole = sum(b for n, b in predicted.items() if not n.startswith("GPU")) or None
        rows.append(MemoryRow(PROCESS, whole, measured[PROCESS], said.get(PROCESS, "")))
    return rows


def rows_as_dicts(rows: list[MemoryRow]) -> list[dict]:
    return [{**asdict(r), "error_pct": None if r.error_pct is None else round(r.error_pct, 3)} for r in rows]
