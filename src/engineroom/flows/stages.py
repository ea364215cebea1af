"""The stage runner: what ``demo``, ``try``, each ``ab`` and ``tune`` boot and each ``bakeoff`` cell
chain — launch, connect, measure into one stored run, down — with one progress line per stage, one
interruption rule and one record of what ran.

``StageLog.stage(name)`` says the stage as it starts (the command's progress line, in a pipe
too; a stage that reports its own progress says nothing more) and records it when it ends: its
seconds and its outcome (done, interrupted by Ctrl-C, or failed and why). ``served`` launches and
connects, and stops the server on the way out however the block ends (done, an error, Ctrl-C),
unless asked to keep it. ``open_run`` starts the stored run with the conditions every measurement
records. A composition's stored summary carries ``stages``: the log up to the measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .runs import client_key, connect, run_conditions
from .serving import start, stop

if TYPE_CHECKING:
    from ..bench import BenchPlan
    from ..engines.base import ServerInfo
    from ..launch import ServerState
    from ..launchargs import LaunchArgs
    from ..refs import ModelRef
    from ..store import Store
    from .picks import Pick

__all__ = ["STAGES_KEY", "Served", "StageLog", "open_run", "served"]

STAGES_KEY = "stages"        # in a run's summary: the stages that ran, in order


@dataclass
class StageLog:
    say: Callable[[str], None] | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str, what: str | None = None) -> Iterator[None]:
        """``what``: the progress line (default: the stage's name; "" says nothing: the stage reports itself)."""
        line = name if what is None else what
        if self.say is not None and line:
            self.say(line)
        t0 = time.monotonic()
        outcome = "done"
        try:
            yield
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        except BaseException as exc:
            outcome = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            raise
        finally:
            self.entries.append({"stage": name, "seconds": round(time.monotonic() - t0, 3), "outcome": outcome})

    def so_far(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.entries]


@dataclass
class Served:
    state: ServerState
    info: ServerInfo
    key: str | None          # what verify and bench send (a key after `--` was moved to a file: read back)


@contextmanager
def served(model: str | ModelRef, args: LaunchArgs, log: StageLog, *, pick: Pick | None = None, keep: bool = False,
           what: str = "", on_wait: Callable[[str, float], None] | None = None,
           on_spawn: Callable[[int], None] | None = None) -> Iterator[Served]:
    """Launch ``model`` and connect to it; the server is stopped when the block ends, however it ends,
    unless ``keep``."""
    with log.stage("launch", what):
        state = start(model, args, pick=pick, say=log.say, on_wait=on_wait, on_spawn=on_spawn)
    try:
        key = client_key(state.url)
        yield Served(state, connect(state.url, api_key=key), key)
    finally:
        if not keep:
            with log.stage("down"):
                stop()


def open_run(store: Store, kind: str, s: Served, plan: BenchPlan, label: str,
             extra: Mapping[str, Any] | None = None) -> int:
    """The stored run of a measurement on ``s``: the bench's and the server's conditions, and ``extra``."""
    from ..bench import bench_conditions

    return store.start_run(kind, {**bench_conditions(s.info, plan), **run_conditions(s.info), **(extra or {})},
                           label=label)
