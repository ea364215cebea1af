"""What `engineroom engines install` leaves, and the program a user names instead, as every adapter's
discovery reads them: one folder per install under the engine's data folder, each holding its
manifest (``install.json``); ``--engine-bin``, then the engine's environment variable.

Engine-neutral: what a manifest must show for its install to count (a built binary, a Python that
runs) and what the program is (a server binary, an interpreter) stay in the adapter (or in ``build``
and ``pyenv``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import paths
from ..errors import NotFound

MANIFEST = "install.json"


def engine_root(engine: str) -> Path:
    """The folder under which `engines install` puts ``engine``'s installs, one folder each."""
    return paths.data_dir() / "engines" / engine


def manifests(root: Path) -> list:
    """The manifests of the installs under ``root``, newest first, as their JSON reads (an unreadable one
    left out)."""
    out = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            out.append(json.loads(manifest.read_text()))
        except (OSError, ValueError):
            continue
    return out


def read_manifest(path: Path) -> dict:
    """One manifest ({} when it is missing, unreadable or not an object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def given_program(explicit: str | os.PathLike[str] | None, env_var: str, what: str) -> tuple[Path, str] | None:
    """The program the user named, ``explicit`` (``--engine-bin``) first, then ``$env_var``: its path
    (user's home expanded) and where it came from; None when neither is set. NotFound, naming it as
    ``what``, when it is not an executable file."""
    for value, origin in ((explicit, "--engine-bin"), (os.environ.get(env_var), f"${env_var}")):
        if value:
            path = Path(value).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise NotFound(f"{what} given by {origin} ({path}) is not an executable file.")
            return path, origin
    return None


__all__ = ["MANIFEST", "engine_root", "given_program", "manifests", "read_manifest"]
