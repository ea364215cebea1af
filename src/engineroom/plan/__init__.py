"""(model, rig, priority) -> ranked Plans, each with its reasons, computed from data.

Nothing here knows an answer in advance. ``plan`` enumerates every candidate config
(``candidates``: engine x compatible quant x KV dtype x speculative-decoding drafter x TP
group or independent instances), sizes each with ``fit`` (``planner``: fit.max_context /
fit.max_concurrency where the priority needs them), drops those that break the priority's
constraints (catalog/priorities.yaml), and ranks the rest by the priority's rank keys
(``ranking``). Speeds come from the bandwidth roofline (``speed``: bytes read per token /
memory bandwidth) times the engine's measured efficiency band and the drafter's acceptance
length, corrected by this machine's measurements where there are some (``calibration``).
Every reason line (``reasons``) names the catalog field or fit number it rests on.
Models outside the catalog become catalog-shaped models in ``adhoc``; the public entry
points live in ``api``.
"""

from __future__ import annotations

from .adhoc import ResolvedModel, class_quality, model_from_arch, resolve_model
from .api import Choice, NothingFits, Plan, fit_one, how_to_choose, plan, plans_as_rows
from .calibration import UNCALIBRATED, Calibration, SpeedPoint, shape_class, weight_family
from .candidates import quality_cmp, quality_value
from .ranking import STATIC_METRICS
from .reasons import COMPUTE_CAVEAT_SEQS
from .request import LaunchRequest, Weights, drafter_miss, launch_miss, request_for
from .speed import (
    SPEED_DEPTH,
    DecodeShape,
    SpeedBand,
    decode_rates,
    kv_bytes_per_token,
    weight_type_mix,
    weights_read_per_token,
)

__all__ = [
    "COMPUTE_CAVEAT_SEQS", "Choice", "LaunchRequest", "NothingFits", "Plan", "ResolvedModel", "SPEED_DEPTH",
    "STATIC_METRICS", "DecodeShape", "SpeedBand", "class_quality", "decode_rates", "fit_one",
    "how_to_choose", "kv_bytes_per_token", "model_from_arch", "plan", "plans_as_rows", "quality_cmp",
    "quality_value", "request_for", "resolve_model", "Weights", "drafter_miss", "launch_miss",
    "weight_type_mix", "weights_read_per_token", "Calibration", "SpeedPoint", "UNCALIBRATED", "shape_class",
    "weight_family",
]
