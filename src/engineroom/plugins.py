"""Entry-point discovery for engine adapters (group ``engineroom.engines``), done once.

Low in the layers on purpose: ``engines`` wraps what is found into ``Engine`` objects, and
``catalog`` reads each adapter's catalog folder (``catalog_dirs``: engineroom's own adapters' by
their path, a plugin's from its ``catalog_dir()``), so neither has to import the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

GROUP = "engineroom.engines"
BUILTIN = "engineroom.engines.llamacpp"     # pyproject.toml registers it under this group
REQUIRED = ("ENGINE", "find_binary", "render", "health_state", "classify_failure", "probe")


@dataclass(frozen=True)
class Found:
    """An engine adapter found through an entry point, and where it came from."""

    impl: Any
    origin: str          # "entry point llama.cpp = engineroom.engines.llamacpp (engineroom 0.1.0)"


@dataclass(frozen=True)
class Problem:
    """An entry point that is not a usable engine adapter, and why."""

    entry_point: str
    why: str


def _builtin_first(ep: metadata.EntryPoint) -> tuple[bool, str]:
    return (ep.dist is None or ep.dist.name != "engineroom", ep.name)


@lru_cache(maxsize=1)
def adapters() -> tuple[tuple[Found, ...], tuple[Problem, ...]]:
    """Every adapter registered in the group (engineroom's own first), and those that failed."""
    found: dict[str, Found] = {}
    problems: list[Problem] = []
    for ep in sorted(metadata.entry_points(group=GROUP), key=_builtin_first):
        where = f"{ep.name} = {ep.value}" + (f" ({ep.dist.name} {ep.dist.version})" if ep.dist else "")
        try:
            impl = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break engineroom
            problems.append(Problem(where, f"does not import ({type(exc).__name__}: {exc})"))
            continue
        missing = [m for m in REQUIRED if not hasattr(impl, m)]
        if missing:
            problems.append(Problem(where, f"is not an engine adapter (no {', '.join(missing)})"))
            continue
        if impl.ENGINE in found:
            problems.append(Problem(where, f"registers engine {impl.ENGINE!r} again; the first one is kept"))
            continue
        found[impl.ENGINE] = Found(impl, f"entry point {where}")
    if not found:   # a bare source tree (not installed): load the built-in entry by its name, as pip would
        import importlib

        impl = importlib.import_module(BUILTIN)
        found[impl.ENGINE] = Found(impl, "built-in (engineroom's entry points are not installed)")
    return tuple(found.values()), tuple(problems)


# engineroom's own adapter packages: each keeps its catalog entry where a plugin's ``catalog_dir()``
# does, in ``catalog/engines/<id>.yaml`` inside the package (engines/llamacpp/catalog/engines/llama.cpp.yaml)
ADAPTERS_DIR = Path(__file__).resolve().parent / "engines"


def builtin_catalog_dirs() -> tuple[Path, ...]:
    """The catalog folders of engineroom's own adapters, found by their path in the package, not by
    importing the adapters: the catalog is read before every command, `plan` included."""
    return tuple(sorted(d for d in ADAPTERS_DIR.glob("*/catalog") if d.is_dir()))


@lru_cache(maxsize=1)
def catalog_dirs() -> tuple[Path, ...]:
    """Every adapter's catalog folder, laid out alike (``engines/<id>.yaml``, and ``models/``,
    ``hardware/`` where it ships any): engineroom's own adapters' by path (``builtin_catalog_dirs``),
    then each other package's adapter's ``catalog_dir()``; only those are imported to ask, and only
    when such a package is installed."""
    own = builtin_catalog_dirs()
    if all(ep.dist is not None and ep.dist.name == "engineroom" for ep in metadata.entry_points(group=GROUP)):
        return own
    out = list(own)
    for f in adapters()[0]:
        fn = getattr(f.impl, "catalog_dir", None)
        if callable(fn):
            try:
                d = fn()
            except Exception:  # noqa: BLE001 - a plugin's bug must not break the catalog
                continue
            if d and Path(d).is_dir() and Path(d).resolve() not in own:
                out.append(Path(d))
    return tuple(out)


def reload() -> None:
    adapters.cache_clear()
    catalog_dirs.cache_clear()
