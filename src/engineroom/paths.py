"""Where engineroom keeps models, state and results: each platform's own place, overridable by environment.

The platform's place comes from ``platformdirs`` rather than a hand-rolled XDG lookup, because
XDG is a Linux convention: on macOS the right places are ``~/Library/Caches`` and
``~/Library/Application Support``, on Windows ``%LOCALAPPDATA%``. On Linux platformdirs gives
exactly the XDG paths (``$XDG_CACHE_HOME/engineroom`` or ``~/.cache/engineroom``, and the same
for ``XDG_STATE_HOME`` / ``XDG_DATA_HOME``), so nothing already there moves.

ENGINEROOM_HOME moves everything under one folder (tests and CI use it); the finer
ENGINEROOM_CACHE_DIR / ENGINEROOM_STATE_DIR / ENGINEROOM_DATA_DIR win over it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import platformdirs

APP = "engineroom"


def _base(env_name: str, platform_dir: Callable[..., str], sub: str) -> Path:
    explicit = os.environ.get(env_name)
    if explicit:
        path = Path(explicit).expanduser()
    elif os.environ.get("ENGINEROOM_HOME"):
        path = Path(os.environ["ENGINEROOM_HOME"]).expanduser() / sub
    else:
        # appauthor=False: no "<author>\" level on Windows; no version level anywhere
        path = Path(platform_dir(APP, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Downloaded models and other re-creatable files."""
    return _base("ENGINEROOM_CACHE_DIR", platformdirs.user_cache_dir, "cache")


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir() -> Path:
    """The managed server's state file, logs and the API-key file engineroom writes (0600)."""
    return _base("ENGINEROOM_STATE_DIR", platformdirs.user_state_dir, "state")


def data_dir() -> Path:
    """The results database."""
    return _base("ENGINEROOM_DATA_DIR", platformdirs.user_data_dir, "data")


def db_path() -> Path:
    return data_dir() / "results.sqlite"
