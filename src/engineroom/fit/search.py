"""The searches over fit: the largest fillable context and the most concurrent sequences."""

from __future__ import annotations

from collections.abc import Callable

from ..arch import ModelArch
from ..catalog import Catalog
from ..hardware import Rig
from .engine import engine_spec
from .llama_compute import CUDA_LAUNCH_RESERVE
from .request import Fit, FitRequest
from .verdict import fit

# what the searches call to size one request: ``fit`` itself, or a memo of it (``memo.FitMemo``)
Fitter = Callable[..., Fit]


def _ok(arch: ModelArch, req: FitRequest, rig: Rig, catalog: Catalog | None, fitter: Fitter | None = None) -> bool:
    """Servable (``Fit.servable``): it fits, and a paged pool holds all of ctx x parallel."""
    return (fitter or fit)(arch, req, rig, catalog=catalog).servable


def max_context(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None,
                fitter: Fitter | None = None) -> int:
    """Largest ctx that can be *filled* by req.parallel sequences (compute scratch at that fill
    included); 0 when even the smallest context does not fit. Searched in the engine's
    max_context_step (catalog: 256 tokens for llama.cpp, 1024 for vLLM/SGLang) up to the
    model's max positions (``_largest``)."""
    step = engine_spec(req.engine, catalog).max_context_step
    hi = (arch.max_position or (1 << 21)) // step
    size = lambda n: (fitter or fit)(arch, req.evolve(ctx=n * step), rig, catalog=catalog)  # noqa: E731
    first = size(1)
    if not first.servable:
        return 0
    last = size(hi) if hi > 1 else first
    if last.servable:
        return max(hi, 1) * step
    return _largest(size, 1, hi, first, last, _floor(req, rig, catalog)) * step


def max_concurrency(arch: ModelArch, req: FitRequest, rig: Rig, limit: int = 4096, *,
                    catalog: Catalog | None = None, fitter: Fitter | None = None) -> int:
    """Most sequences that fit at req.ctx each, at most ``limit`` (0 when one does not)."""
    size = lambda n: (fitter or fit)(arch, req.evolve(parallel=n), rig, catalog=catalog)  # noqa: E731
    first = size(1)
    if not first.servable:
        return 0
    last = size(limit) if limit > 1 else first
    if last.servable:
        return max(limit, 1)
    return _largest(size, 1, limit, first, last, _floor(req, rig, catalog))


def _floor(req: FitRequest, rig: Rig, catalog: Catalog | None) -> int:
    """The headroom a device keeps in every servable fit: llama.cpp's buffers on a CUDA rig leave
    ``CUDA_LAUNCH_RESERVE`` free (``verdict.fit``), other fits nothing. Only the searches' first
    guess reads it (it aims at this headroom, not at a full device)."""
    if rig.gpus and rig.vendor == "nvidia" and engine_spec(req.engine, catalog).memory_model == "llama_buffers":
        return CUDA_LAUNCH_RESERVE
    return 0


def _pooled(f: Fit) -> bool:
    return any(c.name == "kv_pool_spare" for g in f.per_gpu for c in g.components)


def _margin(f: Fit, floor: int = 0) -> int:
    """Bytes to spare on the tightest device: a paged pool's unused KV (kv_pool_spare), else
    what the device has left beyond ``floor`` (negative: over). Only the searches' first guess
    reads it."""
    if _pooled(f):
        return min(sum(c.bytes for c in g.components if c.name == "kv_pool_spare") for g in f.per_gpu)
    return min(g.headroom_bytes for g in f.per_gpu) - floor


def _largest(size: Callable[[int], Fit], lo: int, hi: int, at_lo: Fit, at_hi: Fit, floor: int = 0) -> int:
    """Largest n in [lo, hi) whose fit is servable, given that lo's is (``at_lo``) and hi's is
    not (``at_hi``); memory grows with n. Memory is close to linear in context and in
    sequences, so the margins extrapolate to a first guess (between lo and hi where both
    margins are a device's headroom beyond the ``floor`` a servable fit keeps; from lo and
    lo + 1 for a paged pool, whose margin past the pool is not in the fit); the search then
    gallops from the guess to a bracket and bisects it, so a wrong guess costs evaluations,
    never the answer."""
    if hi - lo <= 1:
        return lo
    good, bad = lo, hi
    m0 = _margin(at_lo, floor)
    if not _pooled(at_lo) and not _pooled(at_hi) and m0 > _margin(at_hi, floor):
        guess = lo + int((hi - lo) * m0 / (m0 - _margin(at_hi, floor)))
    else:
        nxt = size(lo + 1)
        if not nxt.servable:
            return lo
        good, m1 = lo + 1, _margin(nxt, floor)
        guess = good + m1 // (m0 - m1) if m0 > m1 else (good + bad) // 2
    guess = min(max(guess, good + 1), bad - 1)
    step = 1
    if guess > good and size(guess).servable:
        good = guess
        while good + step < bad:               # gallop up
            if size(good + step).servable:
                good += step
                step *= 2
            else:
                bad = good + step
                break
    elif guess > good:
        bad = guess
        while bad - step > good:               # gallop down
            if size(bad - step).servable:
                good = bad - step
                break
            bad -= step
            step *= 2
    return _last_ok(lambda n: size(n).servable, good, bad)


def _last_ok(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi) with ok(n), given ok(lo) and not ok(hi) (memory grows with n)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
