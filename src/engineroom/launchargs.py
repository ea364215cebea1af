"""The launch's arguments as given: one typed record from the command line to the state file.

``up``, ``recipe``, ``switch``, ``demo`` and ``ab`` build a ``LaunchArgs`` from what was typed;
``flows.prepare`` lays the request fields of it (engine, context, parallel sequences, KV, TP, chat
template) over the plan's ``LaunchRequest`` and renders the rest (port, host, threads, the engine's
binary and extra arguments, the API key's reference); the managed server's state keeps it
(``ServerState.args``), so ``switch`` and a restart read back exactly what was given. A raw API key
is never part of it: only the variable's name or the private file's path.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .errors import BadInput

DEFAULT_HOST = "127.0.0.1"


# an argument's name in a server's state written by an earlier engineroom -> its name now
OLD_NAMES = {"chat_template_file": "chat_template"}


@dataclass(frozen=True)
class LaunchArgs:
    """``None`` leaves a field to the plan's pick, else to the engine's default."""

    engine: str | None = None
    ctx: int | None = None                 # tokens per sequence
    parallel: int | None = None            # concurrent sequences (the engine's slots)
    kv_unified: bool | None = None
    kv_dtype: str | None = None
    tp: int | None = None
    port: int | None = None                # None: the default port; 0: a free one
    host: str = DEFAULT_HOST
    threads: int | None = None
    engine_bin: str | None = None
    chat_template: str | None = None
    tools_template: bool = False
    extra_args: tuple[str, ...] = ()       # the engine's own arguments, after `--`
    timeout: float | None = None           # seconds to wait for health
    api_key_env: str | None = None         # the key by reference: a variable's name ...
    api_key_file: str | None = None        # ... or a 0600 file's path

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["extra_args"] = list(self.extra_args)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchArgs:
        """What ``to_dict`` wrote (a raw ``api_key`` is dropped: engineroom never keeps one);
        BadInput in one sentence for anything else."""
        if not isinstance(data, dict):
            raise BadInput("the stored launch arguments are not a mapping.")
        data = {OLD_NAMES.get(k, k): v for k, v in data.items()}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"api_key"})
        if unknown:
            raise BadInput(f"the stored launch arguments have unknown fields {', '.join(unknown)}.")
        values = {k: v for k, v in data.items() if k in names}
        values["extra_args"] = tuple(str(a) for a in values.get("extra_args") or ())
        try:
            return cls(**values)
        except TypeError as exc:
            raise BadInput(f"the stored launch arguments are not ones engineroom wrote ({exc}).") from None

    def with_fields(self, **given: Any) -> LaunchArgs:
        """These arguments with ``given`` (field -> value) replacing theirs; BadInput for a name
        that is not a launch argument."""
        unknown = sorted(set(given) - {f.name for f in fields(self)})
        if unknown:
            raise BadInput(f"not a launch argument: {', '.join(unknown)}.")
        if "extra_args" in given:
            given = {**given, "extra_args": tuple(given["extra_args"] or ())}
        return replace(self, **given)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LaunchArgs))


def check_timeout(timeout: float | None) -> None:
    """A ``--timeout`` the user gave: a positive, finite number of seconds, or one sentence (checked before any
    work: a command that writes a file or plans first would otherwise refuse only at the launch)."""
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise BadInput(f"--timeout must be a positive number of seconds, not {timeout}.")
