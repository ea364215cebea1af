"""The soak's bounds, verdict thresholds (``RULES``), options and memory-probe type (``checks.soak``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engineroom.errors import BadInput

MODES = ("fresh", "continuous")
STEPS = 5                                     # turns per session
SESSIONS = {"fresh": 20, "continuous": 5}     # the spec's plan
FAST_SESSIONS = {"fresh": 3, "continuous": 3}
DEFAULT_MINUTES = 30.0                        # the spec's 1,800 s limit
REQUEST_SECONDS = 600.0                       # per request, before timeout_scale
MIN_CTX = 2048
BUDGETS = {"fresh": (220, 320, 700, 900, 2000), "continuous": (350, 350, 400, 500, 1500)}
FAST_BUDGETS = {"fresh": (48, 64, 96, 128, 128), "continuous": (64, 64, 64, 96, 128)}
FRESH_GREP_CHARS = 12_000
CONTINUOUS_CHARS = (20_000, 24_000, 24_000, 32_000)    # code, code, grep, pytest log: ~22-25K tokens by turn 5
FAST_DIVISOR = 4                              # --fast: attachments a quarter of the spec's (then scaled to the context)
MiB = 1024 * 1024

# The verdict's thresholds (the card prints them from here, so the docs cannot drift from the code).
RULES: dict[str, dict[str, Any]] = {
    "errors": {"fail": "any turn with a non-200 answer or a stream error"},
    "silent_empty": {"fail_share": 0.5, "warn_share": 0.0, "min_wall_s": 1.0},
    "memory_growth": {"fail_bytes": 200 * MiB},
    "memory_slope": {"warn_bytes_per_session": 16 * MiB, "min_sessions_after_baseline": 3},
    "memory_oscillation": {"warn_bytes": 500 * MiB},
    # on a GPU with the engine's pid known, its host memory too: a prompt cache kept in RAM never shows in VRAM
    "host_memory_growth": {"fail_bytes": 200 * MiB},
    "decode_drift": {"fail_ratio": 0.8, "window_sessions": 5, "min_window_s": 0.1},   # a turn's decode window
    "ttft_growth": {"warn_ratio": 1.5, "min_delta_s": 0.05, "window_sessions": 5},   # ms-scale TTFTs are noise
    "slow_turn": {"warn_wall_s": 30.0},
    "markup_in_content": {"warn": "any turn with tool-call markup left in content"},
    "quality_drift": {"warn_points": 0.4, "min_sessions": 4, "window_sessions": 5},
}
VERDICTS = ("PASS", "WARN", "FAIL", "INCONCLUSIVE")


@dataclass(frozen=True)
class SoakOptions:
    """What ``--mode``, ``--minutes`` and ``--turns`` asked for (validated by ``soak_options``)."""

    mode: str = "fresh"
    minutes: float | None = None
    turns: int | None = None


def soak_options(mode: str | None, minutes: float | None, turns: int | None) -> SoakOptions:
    """``SoakOptions`` from the command's values; ``BadInput`` with one sentence for a bad one."""
    chosen = (mode or "fresh").strip().lower()
    if chosen not in MODES:
        raise BadInput(f"--mode must be one of {', '.join(MODES)}, not {mode!r}.")
    if minutes is not None and not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
        raise BadInput(f"--minutes must be a positive number of minutes, not {minutes}.")
    if turns is not None and turns < 1:
        raise BadInput(f"--turns must be at least 1, not {turns}.")
    return SoakOptions(chosen, None if minutes is None else float(minutes), turns)


@dataclass
class MemoryProbe:
    """How the caller reads the engine's memory: ``read()`` -> ``{"bytes": int, ...}`` or None.

    ``source``: ``nvml`` (total VRAM used, per GPU too), ``uss`` (the managed engine's process
    tree), ``engine_report`` (what the engine's /metrics says); ``description`` is the card's
    sentence. ``peak(t0, t1)``, when given, is the highest reading a background sampler took
    between two ``time.perf_counter()`` values (a prefill's peak)."""

    source: str
    description: str
    read: Callable[[], dict[str, Any] | None]
    peak: Callable[[float, float], int | None] | None = None

