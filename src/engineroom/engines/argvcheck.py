"""A rendered command line put to the engine's own argument parser, where that engine is installed.

``recipe``, ``recipe --compose`` and ``up`` all ask ``check(engine, argvs)``: the engine's
program on this machine is found the way ``up`` finds it (``--engine-bin``, the adapter's
environment variable, the newest ``engineroom engines install``), even when the command was
rendered for another rig or a container image (their argv names a stand-in program: the flags
are what is checked, not the program). The answer is an ``ArgvCheck``: ``accepted`` (the
parser and its version named), ``rejected`` (the parser's own sentence), or ``not validated``
with why (the engine is not installed here, its adapter has no parser to ask, or the parser
could not be loaded).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from ..errors import EngineroomError

if TYPE_CHECKING:
    from .base import EngineBinary

_DETAIL = re.compile(r"\s*\[.*\]$")     # a version's bracketed build detail: "b11434 [0.6.0-dev ...]"
CheckStatus = Literal["accepted", "rejected", "not validated"]
ACCEPTED: CheckStatus = "accepted"
REJECTED: CheckStatus = "rejected"
NOT_VALIDATED: CheckStatus = "not validated"


@dataclass(frozen=True)
class ArgvCheck:
    """What the engine's own parser said of a rendered command line (or why it was not asked)."""

    engine: str
    status: CheckStatus
    reason: str = ""              # rejected: the parser's sentence; not validated: why not
    version: str = ""             # the engine release whose parser answered
    binary: str = ""              # the program (or interpreter) that was asked
    commands: int = 1             # how many command lines were checked (a cluster's nodes)
    installed: bool = True        # False: the engine is not installed here (nothing to ask)

    @property
    def ok(self) -> bool:
        """False only when the parser rejected the command line."""
        return self.status != REJECTED

    def line(self) -> str:
        """One sentence for the recipe's comments and `up`'s output."""
        what = f"{self.engine} {_DETAIL.sub('', self.version)}".strip()
        many = f" ({self.commands} command lines)" if self.commands > 1 else ""
        if self.status == ACCEPTED:
            return f"validated: {what}'s own argument parser (installed here, {self.binary}) accepts the flags{many}"
        if self.status == REJECTED:
            return f"REJECTED by {what}'s own argument parser{many}: {self.reason}"
        return f"not validated: {self.reason}"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "line": self.line()}


class CheckedEngine(Protocol):
    """What ``check`` asks of an engine: ``engines.Engine`` (the facade over an adapter) has it all, and
    this module needs nothing else of it (so it does not import the package that imports it)."""

    name: str

    @property
    def can_install(self) -> bool: ...

    @property
    def can_validate(self) -> bool: ...

    def find_binary(self, explicit: str | os.PathLike[str] | None = None) -> EngineBinary: ...

    def binary_version(self, binary: EngineBinary) -> str: ...

    def validate_argv(self, binary: EngineBinary, argv: Sequence[str]) -> str | None: ...


def _version(adapter: CheckedEngine, binary: EngineBinary) -> str:
    try:
        return adapter.binary_version(binary)
    except (EngineroomError, OSError, ValueError):
        return ""


def check(adapter: CheckedEngine, argvs: Sequence[Sequence[str]], engine_bin: str | os.PathLike[str] | None = None
          ) -> ArgvCheck:
    """Each of ``argvs`` (one command, or a cluster's engine commands) put to ``adapter``'s own
    parser in the engine installed here; the first rejection is the answer."""
    from ..errors import NotFound

    name = adapter.name
    try:
        binary = adapter.find_binary(engine_bin)
    except NotFound:
        how = f" (`engineroom engines install {name}`)" if adapter.can_install else ""
        return ArgvCheck(name, NOT_VALIDATED, f"{name} is not installed here{how}", commands=len(argvs),
                         installed=False)
    version = _version(adapter, binary)
    where = str(binary.path)
    if not adapter.can_validate:
        return ArgvCheck(name, NOT_VALIDATED, f"engineroom has no way to ask {name}'s own parser",
                         version=version, binary=where, commands=len(argvs))
    for argv in argvs:
        try:
            problem = adapter.validate_argv(binary, argv)
        except EngineroomError as exc:      # the parser could not be loaded from that install
            return ArgvCheck(name, NOT_VALIDATED, f"{name}'s parser could not be asked: {str(exc).rstrip('.')}",
                             version=version, binary=where, commands=len(argvs))
        if problem:
            return ArgvCheck(name, REJECTED, problem.rstrip(".") + ".", version=version, binary=where,
                             commands=len(argvs))
    return ArgvCheck(name, ACCEPTED, version=version, binary=where, commands=len(argvs))


__all__ = ["ACCEPTED", "NOT_VALIDATED", "REJECTED", "ArgvCheck", "CheckStatus", "CheckedEngine", "check"]
