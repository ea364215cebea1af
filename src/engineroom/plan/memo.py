"""What the planner remembers across the priorities of one how-to-choose table.

``how_to_choose`` plans one model on one rig eight times, once per priority; every priority
considers most of the same candidates, sized at the same requests (``fit.FitMemo``: each
distinct fit and search once), on the same layouts, and decoding at the same speed.
``PlanMemo`` is that FitMemo with the layouts and each candidate's decode speed kept beside
the fits.
"""

from __future__ import annotations

from ..arch import ModelArch
from ..catalog import Catalog
from ..fit import FitMemo
from ..hardware import Rig
from .calibration import Calibration
from .speed import SpeedBand

# one candidate's speed: (decode band, aggregate tok/s), each None where the rig's bandwidth is unknown
Speed = tuple[SpeedBand | None, float | None]


class PlanMemo(FitMemo):
    """A ``FitMemo`` that also keeps the speeds the planner computed, by calibration and model
    (a candidate's speed is a pure function of the model, the candidate, its context and
    sequences, and this machine's calibration), and each engine's ways to lay the model out
    on a rig (``layouts``: (rig_key, engine id) -> the planner's layouts, one set of sub-rigs
    for every priority)."""

    def __init__(self, arch: ModelArch, catalog: Catalog | None = None):
        super().__init__(arch, catalog)
        self._speeds: dict[tuple[Calibration | None, str], dict[tuple, Speed]] = {}
        self.layouts: dict[tuple[int, str], list[tuple[int, int, int, tuple[Rig, ...]]]] = {}

    def speeds(self, calibration: Calibration | None, model: str) -> dict[tuple, Speed]:
        """The speeds computed so far for ``model`` under ``calibration`` (the planner adds to it)."""
        return self._speeds.setdefault((calibration, model), {})
