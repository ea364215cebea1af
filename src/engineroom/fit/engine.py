"""The engine facts fit reads from the catalog: the entry itself, its KV types and their
bytes per element, and the slots it runs with when launched without slot flags.
"""

from __future__ import annotations

from ..catalog import Catalog, Engine, KvDtype, find_engine, load_catalog
from ..errors import BadInput

# (id(catalog), engine name) -> (the catalog, its entry): fit looks an engine up for every
# request it sizes; the catalog is kept beside its id so the id cannot be reused while cached
_SPECS: dict[tuple[int, str], tuple[Catalog, Engine]] = {}
# (id(engine entry), KV name as asked) -> (the entry, its KV type), kept the same way
_KVS: dict[tuple[int, str], tuple[Engine, KvDtype]] = {}


def engine_spec(engine: str, catalog: Catalog | None = None) -> Engine:
    """The catalog entry of ``engine`` (id, name or alias: the catalog's one resolver, ``find_engine``,
    which plan, recipe and up use too); BadInput names the known ids."""
    cat = catalog or load_catalog()
    hit = _SPECS.get((id(cat), engine))
    if hit is not None and hit[0] is cat:
        return hit[1]
    e = find_engine(cat, engine)
    if len(_SPECS) > 512:     # catalogs made by tests come and go
        _SPECS.clear()
    _SPECS[(id(cat), engine)] = (cat, e)
    return e


def kv_dtype_spec(engine: str, kv_dtype: str, catalog: Catalog | None = None) -> KvDtype:
    """The catalog KV type ``kv_dtype`` (id or alias) of ``engine``; BadInput names the valid ones."""
    e = engine_spec(engine, catalog)
    hit = _KVS.get((id(e), kv_dtype))
    if hit is not None and hit[0] is e:
        return hit[1]
    k = e.kv(kv_dtype)
    if k is None:
        raise BadInput(f"KV type {kv_dtype!r} is not valid for {e.id}; valid: {e.kv_names()}.")
    if len(_KVS) > 2048:
        _KVS.clear()
    _KVS[(id(e), kv_dtype)] = (e, k)
    return k


def kv_bytes_per_elem(engine: str, kv_dtype: str, catalog: Catalog | None = None) -> float:
    """Bytes per cached element for ``kv_dtype`` on ``engine`` (the catalog's number)."""
    return kv_dtype_spec(engine, kv_dtype, catalog).bytes_per_elem


def engine_defaults(engine: str, catalog: Catalog | None = None) -> tuple[int, bool]:
    """(slots, unified KV) the engine runs with when launched without slot flags (catalog:
    default_parallel / default_kv_unified; llama.cpp: 4 slots, unified). Pass them as
    FitRequest(parallel=..., kv_unified=...) to size a default launch."""
    e = engine_spec(engine, catalog)
    return e.default_parallel, e.default_kv_unified
