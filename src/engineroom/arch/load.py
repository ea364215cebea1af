"""``load_arch``: one entry point for every way a user names a model file or repo.

Dispatches to the config.json reader or the GGUF reader, and fetches a hub repo's
config.json alone (no weights) so a model can be planned before it is pulled.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import BadInput, EngineroomError, NotFound, first_sentence
from ..refs import ModelRef, SourceKind, parse
from .config import arch_from_config, read_config
from .gguf_arch import arch_from_gguf
from .model import ModelArch


def _hub_unreachable(repo_id: str, revision: str | None) -> str | None:
    """One HEAD request for config.json, no retries: why the hub cannot be reached, or None.

    ``hf_hub_download`` retries a failed connection with backoff for ~20 s before it gives
    up; this probe answers at once when there is no network (HTTP errors such as a missing
    repo are left for ``hf_hub_download`` to raise)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if constants.is_offline_mode():
        return "offline mode is on (HF_HUB_OFFLINE)"
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision),
                             timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - httpx or httpx2 transport errors, by name
        if any(c.__name__ in ("TransportError", "OSError") for c in type(exc).__mro__):
            return f"cannot reach Hugging Face at {constants.ENDPOINT}: {first_sentence(exc)}"
    return None


def fetch_hf_config(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    """Download config.json alone from the Hugging Face hub (cached by huggingface_hub),
    so a model can be planned before any weight is pulled. When the hub cannot be reached,
    a cached copy is used, else the error says so at once."""
    unreachable = None
    try:
        from huggingface_hub import hf_hub_download
        unreachable = _hub_unreachable(repo_id, revision)
        local = hf_hub_download(repo_id=repo_id, filename="config.json", revision=revision,
                                local_files_only=unreachable is not None)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types; the user needs one sentence
        kind = exc.__class__.__name__
        if "RepositoryNotFound" in kind:
            raise NotFound(f"Hugging Face has no repository {repo_id} (or it is private).") from None
        if "GatedRepo" in kind:
            raise BadInput(f"{repo_id} is gated on Hugging Face; accept its licence and log in with a token.") from None
        if "RevisionNotFound" in kind:
            raise NotFound(f"{repo_id} has no revision {revision!r} on Hugging Face.") from None
        if "EntryNotFound" in kind and "Local" not in kind:
            raise NotFound(f"{repo_id} on Hugging Face has no config.json.") from None
        if unreachable is not None:
            reason = f"{unreachable}, and no cached copy exists"
        elif "LocalEntryNotFound" in kind or "Offline" in kind:
            reason = "the hub is unreachable or offline mode is on, and no cached copy exists"
        else:
            reason = f"{kind}: {first_sentence(exc)}"
        raise EngineroomError(f"Could not download config.json for {repo_id} from Hugging Face ({reason}).") from None
    data, _ = read_config(local)
    return data


def load_arch(ref: str | ModelRef) -> ModelArch:
    """The architecture of whatever ``ref`` names, read where ``refs.ModelRef.arch_source``
    says: the same file ``up`` serves (a folder's one GGUF, an ``hf:`` file's cached copy
    at that revision, else its header on the hub), a config.json, a GGUF URL's header, or a
    hub repo's config.json alone. A string is parsed once by ``refs.parse`` (the one grammar);
    catalog and packaged names are the later stages' to resolve, so they are refused here."""
    mref = ref if isinstance(ref, ModelRef) else parse(ref)
    src = mref.arch_source()
    if src.kind is SourceKind.CATALOG:
        raise BadInput(f"{mref.raw} is a catalog model: its architecture is the catalog's, not a file's.")
    if src.kind is SourceKind.HUB_CONFIG:
        return arch_from_config(fetch_hf_config(src.location, src.revision), name=src.name)
    if src.kind is SourceKind.CONFIG:
        return arch_from_config(src.location, name=src.name)
    arch = arch_from_gguf(src.location)
    return replace(arch, name=src.name) if src.name else arch
