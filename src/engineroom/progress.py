"""Progress of long waits, for a terminal and for a pipe or CI log: an engine install
(``BuildProgress``: download, configure, compile, each package pip / uv installs) and a launch
(``WaitProgress``: pulling, converting, the engine loading). A terminal gets a bar or a
spinner redrawn in place; a pipe, where that would print nothing, gets lines — each new step,
and a heartbeat while nothing changes, so a long silent phase (vLLM's cold start, pip
unpacking torch) still says it is alive.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from rich.progress import TaskID


class BuildProgress:
    """The progress of an engine install, as a bar on a terminal and as lines in a pipe or CI log
    (where a bar redrawn in place would be lost): every step line the installer reports without a
    fraction (pip / uv: each package collected, downloaded, installed), the first step of each
    phase (the download, ``configuring``, the first file compiled), then a line per 10% and at
    least one every ``HEARTBEAT_S`` with the latest step. Call it as the ``progress`` callback of
    ``install``; ``clock`` is the time source (tests give their own)."""

    HEARTBEAT_S = 15.0

    def __init__(self, name: str, expected: str, console: Console, clock: Callable[[], float] | None = None) -> None:
        self.name, self.expected, self.console = name, expected, console
        self.clock = clock or time.monotonic
        # imported here: a bar is drawn by an install only, and every command imports this module
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                            console=console, transient=not console.is_terminal)
        self.task: TaskID | None = None
        self.decile = -1
        self.last_frac: float | None = None
        self.last_line = 0.0

    def __enter__(self) -> Self:
        self.console.print(f"installing {self.name} for this machine ({self.expected}); the full log is kept beside "
                           "the install.", markup=False)
        self.bar.__enter__()
        self.task = self.bar.add_task(f"{self.name}: starting", total=1.0)
        self.last_line = self.clock()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.bar.__exit__(kind, exc, tb)

    def _line(self, text: str) -> None:
        self.console.print(f"{self.name}: {text[:120]}", markup=False, highlight=False, soft_wrap=True)
        self.last_line = self.clock()

    def __call__(self, frac: float | None, msg: str) -> None:
        assert self.task is not None, "BuildProgress is a context manager"
        self.bar.update(self.task, completed=frac if frac is not None else None, description=escape(msg[:80]))
        if self.console.is_terminal:
            return
        if frac is None:                     # a step the installer names (a package, a phase)
            self._line(msg)
            return
        new_phase = self.last_frac is None or frac < self.last_frac   # download, then configure, then build
        first_step = self.last_frac == 0.0 and frac > 0.0              # the first file compiled
        if new_phase:
            self.decile = -1
        decile = int(frac * 10)
        if new_phase or first_step or decile > self.decile or self.clock() - self.last_line >= self.HEARTBEAT_S:
            self.decile = max(self.decile, decile)
            self._line(f"{frac:4.0%} {msg}")
        self.last_frac = frac


class WaitProgress:
    """A long wait (`up` pulling, converting, then waiting for the engine to load) as a spinner on
    a terminal and as lines in a pipe or CI log, where a spinner prints nothing: "starting" with the
    first step (a refusal before any step is its own one line), then each new step
    (``say``) or phase (``wait``: the engine's own hint, e.g. vLLM's last log line) at most every
    ``MIN_GAP_S``, and at least one line every ``HEARTBEAT_S`` while nothing changes."""

    MIN_GAP_S = 2.0
    HEARTBEAT_S = 15.0

    def __init__(self, what: str, console: Console, clock: Callable[[], float] | None = None) -> None:
        self.what, self.console = what, console
        self.clock = clock or time.monotonic
        self.spin: Any = None
        self.last_text = ""
        self.last_at = float("-inf")
        self.last_step = ""

    def __enter__(self) -> Self:
        if self.console.is_terminal:
            self.spin = self.console.status(f"starting {self.what}")
            self.spin.__enter__()
        return self                  # in a pipe "starting" waits for the first step: a refusal is one line

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.spin is not None:
            self.spin.__exit__(kind, exc, tb)

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.last_text, self.last_at = text, self.clock()

    def _show(self, text: str, key: str, *, new_step: bool = False) -> None:
        if self.spin is not None:
            self.spin.update(escape(text))
            return
        if self.last_at == float("-inf"):
            self._line(f"starting {self.what}")
        now = self.clock()
        changed = key != self.last_text
        if new_step or (changed and now - self.last_at >= self.MIN_GAP_S) or now - self.last_at >= self.HEARTBEAT_S:
            self._line(text)
            self.last_text = key

    def say(self, msg: str) -> None:
        """A step of the launch (pulling, converting, ...): a new kind of step is always printed, the
        same step's updates (a download's bytes) at most every ``MIN_GAP_S``."""
        kind = " ".join(msg.split()[:2])
        self._show(msg, msg, new_step=kind != self.last_step)
        self.last_step = kind

    def wait(self, phase: str, elapsed: float) -> None:
        """The engine's state while it loads (``launch.up``'s ``on_wait``)."""
        self._show(f"{self.what}: {phase} ({elapsed:.0f} s)", phase)


__all__ = ["BuildProgress", "WaitProgress"]
