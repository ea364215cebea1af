"""Shared console and JSON output, so every command renders the same way."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from rich.console import Console

# Rich assumes 80 columns when stdout is not a terminal, which squeezes the plan tables
# into unreadable stubs in a log or a pipe; there, lay tables out up to 200 columns
# (COLUMNS still wins when it is set).
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
console = Console(highlight=False, width=_PIPE_WIDTH)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, pydantic models, enums and paths -> plain JSON types."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.metadata.get("json", True)}   # a field marked json=False stays out
    if hasattr(obj, "model_dump"):
        return to_jsonable(obj.model_dump())
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    return obj


def print_text(text: str) -> None:
    """Markdown (a run card) exactly as rendered: no Rich wrapping, so `> card.md` keeps
    every table row on one line."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
