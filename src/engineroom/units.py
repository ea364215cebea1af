"""One way to print byte counts, used by every command and the run card.

The convention:

- **Memory and files: binary units** (KiB, MiB, GiB = 1024-based). RAM, VRAM, model
  files, weights, KV cache, compute buffers, every component of ``fit``. These are the
  units llama.cpp, vLLM and nvidia-smi print in their logs (``CUDA0 KV buffer size =
  4608.00 MiB``), so a figure engineroom shows can be compared with the engine's own line.
- **Vendor capacities: decimal GB** (1 GB = 10^9 bytes), and only where the number *is*
  a vendor's or the catalog's figure: the catalog's GPU classes ("RTX 3090: 24 GB"), a
  rig spec such as ``cpu:64GB``, a quant's published size on disk, bandwidth in GB/s.
  Those keep the unit they were given in, so they can be found in the datasheet.

Where both meet (``fit``'s "of <capacity>"), the capacity is printed in GiB with the
decimal GB figure beside it, so the comparison is in one unit and the vendor figure is
still recognisable.
"""

from __future__ import annotations

import math
from typing import Any

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
GB = 1_000_000_000

__all__ = ["GB", "GiB", "KiB", "MiB", "TiB", "capacity", "gb", "gib", "mem", "mib"]

_MISSING = "?"


def _number(n: Any) -> float | None:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
        return None
    return float(n)


def mem(n: Any, digits: int = 1, missing: str = _MISSING) -> str:
    """A memory or file size in binary units, the unit picked by size: ``85.8 MiB``, ``8.0 GiB``.

    Bytes below 1 KiB print whole (``512 B``); ``missing`` stands in for None / not a number.
    """
    x = _number(n)
    if x is None:
        return missing
    sign, x = ("-" if x < 0 else ""), abs(x)
    if x < KiB:
        return f"{sign}{x:.0f} B"
    for unit, size in (("KiB", KiB), ("MiB", MiB), ("GiB", GiB)):
        if x < size * 1024:
            return f"{sign}{x / size:.{digits}f} {unit}"
    return f"{sign}{x / TiB:.{digits}f} TiB"


def gib(n: Any, digits: int = 1, missing: str = _MISSING, *, unit: bool = True) -> str:
    """Always in GiB (a column of one unit): ``22.4 GiB``; ``unit=False`` gives the bare
    ``22.4``, for a column or list whose header already says GiB."""
    x = _number(n)
    return missing if x is None else f"{x / GiB:.{digits}f}" + (" GiB" if unit else "")


def mib(n: Any, digits: int = 2, missing: str = _MISSING) -> str:
    """Always in MiB, as llama.cpp prints its buffers: ``4608.00 MiB``."""
    x = _number(n)
    return missing if x is None else f"{x / MiB:.{digits}f} MiB"


def gb(n: Any, digits: int = 1, missing: str = _MISSING) -> str:
    """Decimal GB, for a vendor's or the catalog's figure only: ``24 GB``."""
    x = _number(n)
    if x is None:
        return missing
    return f"{x / GB:.{digits}f} GB"


def capacity(n: Any, digits: int = 1, missing: str = _MISSING) -> str:
    """A device capacity compared with memory figures: ``22.4 GiB (24.0 GB)``."""
    x = _number(n)
    return missing if x is None else f"{gib(x, digits)} ({gb(x, digits)})"
