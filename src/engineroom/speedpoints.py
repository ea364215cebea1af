"""This machine's speed points, read back from the store for the plan (``plan.calibration``).

A valid bench (single stream, one request at a time) of a server launched from a plan's pick
(``up --priority``, ``up --from-plan``, ``try``) stores one point in its summary (``speed_point``:
the engine, the model's shape class, the measured decode and the middle of the plan's
uncalibrated band). A point counts for the machine it was measured on: the run's ``host``
conditions name the same device (GPUs by name and count, else the CPU by name and cores) as
this machine does now. Kept out of ``flows`` so that ``plan`` reads the points without importing
the launcher.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import EngineroomError
from .hardware import Rig, host_summary
from .plan import Calibration, SpeedPoint, weight_family

if TYPE_CHECKING:
    from .store import Store

__all__ = ["POINT_KEY", "RUNS_READ", "calibration_here", "decode_mean", "device_of", "point_from",
           "workload_decode_means"]

POINT_KEY = "speed_point"      # in a run's summary
RUNS_READ = 500                # the newest bench runs looked at


def device_of(host: Mapping[str, Any]) -> str:
    """What a speed was measured on, from a run's ``host`` conditions (``host_summary``)."""
    gpus = [g.get("name") for g in host.get("gpus") or () if isinstance(g, Mapping)]
    if gpus:
        names = sorted({str(n) for n in gpus})
        return " + ".join(f"{sum(1 for g in gpus if g == n)} x {n}" for n in names)
    return f"CPU {host.get('cpu', '?')} ({host.get('cpu_cores', '?')} cores)"


def workload_decode_means(summary: Mapping[str, Any]) -> list[float]:
    """Each workload's mean decode rate (tok/s) in a stored bench summary (those it has)."""
    workloads = summary.get("workloads") or {}
    rates = [(w.get("decode_tps") or {}).get("mean") for w in workloads.values() if isinstance(w, Mapping)]
    return [float(r) for r in rates if isinstance(r, (int, float))]


def decode_mean(summary: Mapping[str, Any]) -> float | None:
    """The measured requests' mean decode rate (tok/s) over a bench summary's workloads."""
    means = [r for r in workload_decode_means(summary) if r]
    return sum(means) / len(means) if means else None


def point_from(row: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The speed point a single-stream bench of a plan's pick makes (``row``: the pick's plan row as
    the launch kept it): its measured decode beside the middle of the row's uncalibrated band; None
    for an invalid run or a row without a band."""
    measured, planned = decode_mean(summary), row.get("decode_tps_uncalibrated") or []
    if summary.get("status") != "OK" or not measured or len(planned) != 2 or not row.get("shape_class"):
        return None
    point = SpeedPoint(run_id=0, engine=str(row.get("engine")), shape=str(row["shape_class"]),
                       model=str(row.get("model") or ""), measured_tps=measured,
                       planned_mid_tps=(float(planned[0]) + float(planned[1])) / 2,
                       family=weight_family(row.get("quant_format")))
    return point.to_dict() if point.planned_mid_tps > 0 else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def calibration_here(store: Store | None = None, rig: Rig | None = None) -> Calibration:
    """The speed points this machine's store holds for this machine (none: an empty calibration);
    ``rig``: this machine as the caller already detected it."""
    from . import paths

    device = device_of(host_summary(rig))
    if store is None:
        if not paths.db_path().is_file():        # nothing measured here yet (and planning creates no store)
            return Calibration.of(device, ())
        try:
            # imported here: `plan --rig` (a rig by spec, no calibration) never opens the store
            from .store import Store

            with Store() as own:
                return calibration_here(own, rig)
        except (sqlite3.Error, OSError, EngineroomError):
            return Calibration.of(device, ())    # a store that cannot be read never stops a plan
    points = []
    for run in store.runs(RUNS_READ, kind="bench"):
        if run.get("status") != "OK":
            continue
        summary, conditions = _mapping(run.get("summary")), _mapping(run.get("conditions"))
        raw = summary.get(POINT_KEY)
        if not isinstance(raw, Mapping) or device_of(_mapping(conditions.get("host"))) != device:
            continue
        point = SpeedPoint.from_dict({**raw, "run_id": run["id"]})
        if point is not None:
            points.append(point)
    return Calibration.of(device, points)
