"""The searches over fit: the largest fillable context and the most concurrent sequences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..arch import ModelArch
from ..catalog import Catalog
from ..hardware import Rig
from .engine import engine_spec
from .request import FitRequest
from .verdict import fit


def _ok(arch: ModelArch, req: FitRequest, rig: Rig, catalog: Catalog | None) -> bool:
    """Servable (``Fit.servable``): it fits, and a paged pool holds all of ctx x seqs."""
    return fit(arch, req, rig, catalog=catalog).servable


def max_context(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> int:
    """Largest ctx that can be *filled* by req.n_seqs sequences (compute scratch at that fill
    included); 0 when even the smallest context does not fit. Binary search in the engine's
    max_context_step (catalog: 256 tokens for llama.cpp, 1024 for vLLM/SGLang) up to the
    model's max positions."""
    step = engine_spec(req.engine, catalog).max_context_step
    hi = (arch.max_position or (1 << 21)) // step
    ok = lambda n: _ok(arch, replace(req, ctx=n * step), rig, catalog)  # noqa: E731
    if not ok(1):
        return 0
    if ok(hi):
        return hi * step
    return _last_ok(ok, 1, hi) * step


def max_concurrency(arch: ModelArch, req: FitRequest, rig: Rig, limit: int = 4096, *,
                    catalog: Catalog | None = None) -> int:
    """Most sequences that fit at req.ctx each (0 when one does not)."""
    ok = lambda n: _ok(arch, replace(req, n_seqs=n), rig, catalog)  # noqa: E731
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    return _last_ok(ok, lo, hi)


def _last_ok(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi) with ok(n), given ok(lo) and not ok(hi) (memory grows with n)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
