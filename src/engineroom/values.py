"""Small readers for values that arrive as JSON (configs, server answers)."""

from __future__ import annotations

import math
from typing import Any


def int_or_none(value: Any) -> int | None:
    """An int from a JSON value, or None: bools and non-integral floats are not counts or sizes."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def float_or_none(value: Any) -> float | None:
    """A finite number from a JSON value, or None: a bool, NaN or infinity is not a measurement."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
