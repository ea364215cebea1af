"""Roofline share of a measured decode rate: how close it came to the memory-bandwidth limit.

bytes read per token = the weights a decode step streams (``plan.weights_read_per_token``:
the file minus the embedding lookup, MoE by its active share) + the KV cache read at the
measured depth (``plan.kv_bytes_per_token``: fit's one KV formula) — the formula ``plan``
quotes its speeds with. Limit = bandwidth / bytes per token; share = measured / limit.
With N sequences decoding together one weight read serves all of them and each reads its own
KV: limit = N x bandwidth / (weights + N x KV).

``roofline_basis`` (called once per run, by flows, where the model file and the device are
known) stores what the share needs as plain numbers in the run's conditions: the weight bytes,
the KV bytes at a ladder of depths (interpolated linearly between them; exact at each point),
the bandwidth and where it came from. ``roofline`` then recomputes the share from any stored
record set, so a better bandwidth figure later re-reads old runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["roofline", "roofline_basis"]

_GB = 1e9


def _ladder(n_ctx: int | None, extra: Sequence[int]) -> list[int]:
    top = max([n_ctx or 0, *extra, 1024])
    points, d = {0}, 256
    while d < top:
        points.add(d)
        d *= 2
    points.update(int(x) for x in extra)
    points.add(top)
    return sorted(points)


def roofline_basis(model_path: str | Path | None, engine: str, kv_dtype: str | None, n_ctx: int | None,
                   bandwidth_gbs: float | None, bandwidth_source: str,
                   depths: Sequence[int] = ()) -> dict[str, Any]:
    """What ``roofline`` needs, as plain data (``not_available`` says why when it cannot be had)."""
    if not model_path:
        return {"not_available": "the model file is not known (the server was not started by engineroom "
                                 "and does not name its file)"}
    if not bandwidth_gbs:
        return {"not_available": "the device's memory bandwidth is not known"}
    from engineroom.catalog import load_catalog
    from engineroom.errors import EngineroomError
    from engineroom.plan import kv_bytes_per_token, resolve_model, weights_read_per_token

    try:
        resolved = resolve_model(str(model_path))
    except (EngineroomError, OSError) as exc:
        return {"not_available": f"the model file could not be read ({exc})"}
    arch, quants = resolved.arch, resolved.model.quants
    if arch is None or not quants:
        return {"not_available": "the model's architecture or quant could not be read from its file"}
    cat = load_catalog()
    entry = cat.engine(engine)
    kv_id = kv_dtype or "f16"
    kv = entry.kv(kv_id) if entry is not None else None
    if kv is None:
        return {"not_available": f"the catalog has no KV type {kv_id!r} for engine {engine!r}"}
    weights = weights_read_per_token(resolved.model, arch, quants[0])
    points = [[d, kv_bytes_per_token(arch, kv, d)] for d in _ladder(n_ctx, depths)]
    return {"weights_bytes": int(weights), "kv_bytes_at": points, "kv_dtype": kv.id, "quant": quants[0].id,
            "bandwidth_gbs": float(bandwidth_gbs), "bandwidth_source": bandwidth_source,
            "formula": "bytes/token = plan.weights_read_per_token + plan.kv_bytes_per_token(depth); "
                       "limit = N x bandwidth / (weights + N x KV)", "not_available": None}


def kv_at(basis: Mapping[str, Any], depth: float) -> float:
    points = basis.get("kv_bytes_at") or [[0, 0]]
    if depth <= points[0][0]:
        return float(points[0][1])
    for (d0, b0), (d1, b1) in zip(points, points[1:], strict=False):
        if d0 <= depth <= d1:
            return b0 + (b1 - b0) * (depth - d0) / (d1 - d0) if d1 > d0 else float(b1)
    (d0, b0), (d1, b1) = points[-2] if len(points) > 1 else points[0], points[-1]
    slope = (b1 - b0) / (d1 - d0) if d1 > d0 else 0.0
    return b1 + slope * (depth - d1)


def roofline(basis: Mapping[str, Any] | None, depth: float | None, decode_tps: float | None,
             streams: int = 1) -> dict[str, Any]:
    """The share of the bandwidth limit ``decode_tps`` reached at ``depth`` (aggregate over
    ``streams`` sequences when more than one)."""
    if not basis or basis.get("not_available") or "weights_bytes" not in basis:
        why = (basis or {}).get("not_available") or "no roofline basis was stored with the run"
        return {"pct": None, "not_available": why}
    if depth is None or decode_tps is None:
        return {"pct": None, "not_available": "no decode rate was measured"}
    kv = kv_at(basis, depth)
    per_step = float(basis["weights_bytes"]) + streams * kv
    limit = streams * float(basis["bandwidth_gbs"]) * _GB / per_step
    return {"pct": decode_tps / limit * 100.0, "limit_tps": limit, "bytes_per_token": per_step / streams,
            "depth": depth, "streams": streams, "not_available": None}
