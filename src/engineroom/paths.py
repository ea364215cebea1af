"""Where engineroom keeps models, state and results (XDG, overridable by environment).

ENGINEROOM_HOME moves everything under one folder (tests and CI use it); the finer
ENGINEROOM_CACHE_DIR / ENGINEROOM_STATE_DIR / ENGINEROOM_DATA_DIR win over it.
"""

from __future__ import annotations

import os
from pathlib import Path


def _base(env_name: str, xdg_name: str, xdg_default: str, sub: str) -> Path:
    explicit = os.environ.get(env_name)
    if explicit:
        path = Path(explicit).expanduser()
    elif os.environ.get("ENGINEROOM_HOME"):
        path = Path(os.environ["ENGINEROOM_HOME"]).expanduser() / sub
    else:
        root = os.environ.get(xdg_name) or str(Path.home() / xdg_default)
        path = Path(root) / "engineroom"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Downloaded models and other re-creatable files."""
    return _base("ENGINEROOM_CACHE_DIR", "XDG_CACHE_HOME", ".cache", "cache")


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir() -> Path:
    """The managed server's state file and logs."""
    return _base("ENGINEROOM_STATE_DIR", "XDG_STATE_HOME", ".local/state", "state")


def data_dir() -> Path:
    """The results database."""
    return _base("ENGINEROOM_DATA_DIR", "XDG_DATA_HOME", ".local/share", "data")


def db_path() -> Path:
    return data_dir() / "results.sqlite"
