"""Read the catalog YAML files and validate them, with one-sentence errors.

Layout of this package's folder (the packaged catalog):

    models/*.yaml       one model per file (its quants inside)
    hardware/*.yaml     a list of hardware classes per file (grouped by vendor)
    drafters.yaml       speculative-decoding drafters (built-in MTP, DFlash, ...)
    priorities.yaml     "how to choose": each priority as an objective plus constraints
    tables.yaml         the planner's tables of no one entry (engine status order, quant
                        class tiers, usual quants, published formats)

and each engine adapter's package ships a catalog folder of its own (``plugins.catalog_dirs``):

    engines/<id>.yaml   its engine, one per file (engineroom's own adapters:
                        engineroom/engines/<package>/catalog/engines/<id>.yaml)
    models/, hardware/  models and hardware it adds, as above (optional)

engineroom's own adapters' folders are found by their path in the package, a plugin's from its
``catalog_dir()``; no built-in adapter is imported to read the catalog.

A pydantic error becomes a ``BadInput`` naming the file and the key, and for an unknown key
the closest allowed key ("did you mean ...").
"""

from __future__ import annotations

import difflib
import pickle
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import BadInput
from .engine_schema import Engine
from .schema import Catalog, Drafter, HardwareClass, Model, Priority, Tables

CATALOG_DIR = Path(__file__).resolve().parent
ENTRY_FOLDERS = ("models", "engines", "hardware")      # one entry (or a list of them) per file


def _read_yaml(path: Path) -> Any:
    import yaml  # here: a catalog read back from its cache (every run but the first) reads no YAML

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's safe loader where PyYAML has it
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"catalog file {path.name} is not valid YAML{where}.") from None


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Walk the pydantic model along ``loc`` to the model that owns the last key."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _inner_model(fields[part].annotation)
        if current is None:
            return []
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _explain(exc: ValidationError, model: type[BaseModel], file: str, data: Any) -> BadInput:
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    key = ".".join(str(p) for p in loc) or "(top level)"
    owner = _owner_label(data, loc)
    if err.get("type") == "extra_forbidden":
        bad = str(loc[-1])
        allowed = _allowed_keys(model, loc)
        close = difflib.get_close_matches(bad, allowed, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else f"; allowed keys: {', '.join(allowed)}."
        return BadInput(f"catalog file {file}{owner}: unknown key '{key}'{hint}")
    msg = err.get("msg", "invalid value").rstrip(".")
    return BadInput(f"catalog file {file}{owner}: key '{key}': {msg}.")


def _owner_label(data: Any, loc: tuple[Any, ...]) -> str:
    """Name the list entry an error sits in (" (quant IQ4_KS)") so the key is findable."""
    node, label = data, ""
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            break
        if isinstance(part, int) and isinstance(node, dict) and "id" in node:
            label = f" (entry '{node['id']}')"
    return label


def _validate(model: type[BaseModel], data: Any, file: str) -> Any:
    if not isinstance(data, dict):
        raise BadInput(f"catalog file {file} must hold a mapping, not {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, model, file, data) from None


def _validate_list(model: type[BaseModel], data: Any, file: str, key: str) -> list[Any]:
    if not isinstance(data, dict) or key not in data or not isinstance(data[key], list):
        raise BadInput(f"catalog file {file} must hold a list under the key '{key}'.")
    extra = [k for k in data if k != key]
    if extra:
        close = difflib.get_close_matches(extra[0], [key], n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else f"; the only key allowed is '{key}'."
        raise BadInput(f"catalog file {file}: unknown key '{extra[0]}'{hint}")
    out = []
    for i, item in enumerate(data[key]):
        if not isinstance(item, dict):
            raise BadInput(f"catalog file {file}: entry {i} of '{key}' must be a mapping.")
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            bad = _explain(exc, model, file, item)
            label = f" (entry '{item.get('id', i)}')"
            raise BadInput(str(bad).replace(f"catalog file {file}", f"catalog file {file}{label}", 1)) from None
    return out


def read_raw(root: Path | None = None) -> dict[str, Any]:
    """The catalog as plain data (file name -> parsed YAML), for tools and mutation tests: the
    packaged catalog and engineroom's own adapters' entries (``file_name`` names each file), or
    the catalog folder ``root`` alone."""
    if root is None:
        from .. import plugins

        raw = read_raw(CATALOG_DIR)
        for folder in plugins.builtin_catalog_dirs():
            add_adapter_entries(raw, folder)
        return raw
    raw = {}
    for sub in ENTRY_FOLDERS:
        for path in sorted((root / sub).glob("*.yaml")):
            raw[f"{sub}/{path.name}"] = _read_yaml(path)
    for name in ("drafters.yaml", "priorities.yaml", "tables.yaml"):
        path = root / name
        if not path.exists():
            raise BadInput(f"catalog file {name} is missing from {root}.")
        raw[name] = _read_yaml(path)
    return raw


def catalog_from_raw(raw: dict[str, Any]) -> Catalog:
    """Validate plain data (as returned by ``read_raw``) into a Catalog, with cross checks."""
    models: list[Model] = []
    engines: list[Engine] = []
    hardware: list[HardwareClass] = []
    files: dict[tuple[str, str], str] = {}      # ("models" | "engines", id) -> its file, for the cross checks
    for name, data in raw.items():
        folder = Path(name).parent.name
        if folder == "models":
            models.append(_validate(Model, data, name))
            files["models", models[-1].id] = name
        elif folder == "engines":
            engines.append(_validate(Engine, data, name))
            files["engines", engines[-1].id] = name
        elif folder == "hardware":
            hardware.extend(_validate_list(HardwareClass, data, name, "hardware"))
    drafters = _validate_list(Drafter, raw.get("drafters.yaml"), "drafters.yaml", "drafters")
    priorities = _validate_list(Priority, raw.get("priorities.yaml"), "priorities.yaml", "priorities")
    tables = _validate(Tables, raw.get("tables.yaml"), "tables.yaml")
    models.sort(key=lambda m: (m.order, m.id))
    cat = Catalog(models=tuple(models), engines=tuple(engines), hardware=tuple(hardware),
                  drafters=tuple(drafters), priorities=tuple(priorities), tables=tables)
    _cross_check(cat, files)
    return cat


def _cross_check(cat: Catalog, files: dict[tuple[str, str], str]) -> None:
    engine_ids = [e.id for e in cat.engines]
    for m in cat.models:
        for q in m.quants:
            for e in q.engines:
                if e not in engine_ids:
                    close = difflib.get_close_matches(e, engine_ids, n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else "."
                    raise BadInput(f"catalog file {files['models', m.id]}: quant {q.id} names unknown engine "
                                   f"'{e}'{hint}")
                eng = cat.engine(e)
                if eng is not None and q.format not in eng.quant_formats:
                    raise BadInput(f"catalog file {files['models', m.id]}: quant {q.id} ({q.format}) lists engine {e}, "
                                   f"whose quant_formats do not include {q.format}.")
    for d in cat.drafters:
        for e in d.engines:
            if e not in engine_ids:
                raise BadInput(f"catalog file drafters.yaml: drafter {d.id} names unknown engine '{e}'.")
        for t in d.target_models:
            if cat.model(t) is None:
                raise BadInput(f"catalog file drafters.yaml: drafter {d.id} targets unknown model '{t}'.")
    order = cat.tables.engine_status_order
    for engine in cat.engines:
        if engine.status not in order:
            raise BadInput(f"catalog file {files['engines', engine.id]}: status '{engine.status}' is not in "
                           f"tables.yaml engine_status_order ({', '.join(order)}).")
    for p in cat.priorities:
        bad = [s for s in p.constraints.engine_status if s not in order]
        if bad:
            raise BadInput(f"catalog file priorities.yaml: priority {p.id} allows engine status '{bad[0]}', "
                           f"which is not in tables.yaml engine_status_order ({', '.join(order)}).")
        ref_quant = p.constraints.quality_at_least_quant
        if ref_quant and not any(m.quant(ref_quant) for m in cat.models):
            raise BadInput(f"catalog file priorities.yaml: priority {p.id} refers to unknown quant '{ref_quant}'.")
    for kind, ids in (("model", [m.id for m in cat.models]), ("engine", engine_ids),
                      ("hardware class", [h.id for h in cat.hardware]),
                      ("priority", [p.id for p in cat.priorities])):
        dupes = {i for i in ids if ids.count(i) > 1}
        if dupes:
            raise BadInput(f"the catalog defines {kind} '{sorted(dupes)[0]}' more than once.")
    names = [n for e in cat.engines for n in {x.lower() for x in (e.id, e.name, *e.aliases)}]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise BadInput(f"the catalog uses engine name or alias '{clash[0]}' for more than one engine.")


def file_name(path: Path) -> str:
    """How the catalog names a file of an adapter's catalog folder (its errors say it): one of
    engineroom's own by its path from the package's parent folder
    (``engineroom/engines/vllm/catalog/engines/vllm.yaml``), another package's in full."""
    try:
        return path.relative_to(CATALOG_DIR.parent.parent).as_posix()
    except ValueError:
        return str(path)


def add_adapter_entries(raw: dict[str, Any], folder: Path) -> None:
    """Merge the engines/, models/ and hardware/ YAML an engine adapter's package ships in its
    catalog folder (engineroom's own adapters' and a plugin's ``catalog_dir()`` alike): a plugin's
    engine is sized by fit like a built-in one, with no code."""
    for sub in ENTRY_FOLDERS:
        for path in sorted((folder / sub).glob("*.yaml")):
            raw[file_name(path)] = _read_yaml(path)


@lru_cache(maxsize=4)
def _load_cached(root: str, adapter_dirs: tuple[str, ...] = ()) -> Catalog:
    stored = _stored_path(root, adapter_dirs)
    if stored is not None:
        try:
            with stored.open("rb") as fh:
                cat = pickle.load(fh)
            if isinstance(cat, Catalog):
                return cat
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
            pass    # absent, half-written by another process or from another schema: validate again
    raw = read_raw(Path(root))
    for folder in adapter_dirs:
        add_adapter_entries(raw, Path(folder))
    cat = catalog_from_raw(raw)
    if stored is not None:
        _store(cat, stored)
    return cat


# The validated catalog is kept between processes (a pickle in the cache folder), keyed by every
# input of the validation: each YAML file's path, size and modification time (the packaged
# catalog's and every adapter catalog folder's, engineroom's own adapters' included), the schema's own
# source files, and the engineroom and pydantic versions. A CLI command then skips reading the
# YAML and building pydantic's validators (most of `engineroom plan`'s start-up otherwise).
_SCHEMA_FILES = ("base.py", "schema.py", "engine_schema.py", "load.py", "convert.py")


def _stored_path(root: str, adapter_dirs: tuple[str, ...]) -> Path | None:
    import hashlib

    import pydantic

    from .. import __version__, paths

    h = hashlib.sha256(f"{__version__} {pydantic.VERSION} {root}".encode())
    try:
        files = [Path(__file__).with_name(n) for n in _SCHEMA_FILES]
        for d in (root, *adapter_dirs):
            files += sorted(Path(d).rglob("*.yaml"))
        for f in files:
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return paths.cache_dir() / "catalog" / f"{h.hexdigest()[:32]}.pickle"
    except OSError:
        return None


def _store(cat: Catalog, path: Path) -> None:
    import os
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("*.pickle"):     # one catalog kept: the others are stale
            if old != path:
                old.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return    # a read-only cache folder: the catalog is validated again next time
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(cat, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except (OSError, pickle.PicklingError):
        Path(tmp).unlink(missing_ok=True)


def load_catalog(root: Path | None = None) -> Catalog:
    """The validated catalog (cached per folder; the Catalog is immutable). The packaged catalog
    includes what every installed engine adapter ships (``plugins.catalog_dirs``: engineroom's own
    adapters' engine entries, a plugin's ``catalog_dir()``); an explicit ``root`` is read alone."""
    if root is not None:
        return _load_cached(str(root.resolve()))
    from .. import plugins

    return _load_cached(str(CATALOG_DIR), tuple(str(d) for d in plugins.catalog_dirs()))


def model_names(cat: Catalog) -> str:
    return ", ".join(m.id for m in cat.models)


def closest_model(cat: Catalog, ref: str) -> str | None:
    """The catalog model id or alias closest to ``ref`` (a "did you mean"), or None."""
    ids = [x.id for x in cat.models] + [a for x in cat.models for a in x.aliases]
    close = difflib.get_close_matches(ref.lower(), [i.lower() for i in ids], n=1, cutoff=0.5)
    return close[0] if close else None


def find_model(cat: Catalog, ref: str) -> Model:
    m = cat.model(ref)
    if m is None:
        close = closest_model(cat, ref)
        hint = f"did you mean '{close}'? " if close else ""
        raise BadInput(f"model '{ref}' is not in the catalog; {hint}known models: {model_names(cat)}.")
    return m


def find_priority(cat: Catalog, ref: str) -> Priority:
    p = cat.priority(ref)
    if p is None:
        raise BadInput(f"unknown priority '{ref}'; choose one of: {', '.join(x.id for x in cat.priorities)}.")
    return p


def find_engine(cat: Catalog, ref: str) -> Engine:
    e = cat.engine(ref)
    if e is None:
        raise BadInput(f"unknown engine '{ref}'; choose one of: {', '.join(x.id for x in cat.engines)}.")
    return e
