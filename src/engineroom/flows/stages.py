"""The stage runner: what ``up`` (plan, launch), ``switch`` (check, down, launch, restore), ``demo``,
``try``, each ``ab`` and ``tune`` boot and each ``bakeoff`` cell chain — plan, launch, connect,
measure into one stored run, down — with one progress line per stage, one interruption rule and
one record of what ran.

``StageLog.stage(name)`` says the stage as it starts (the command's progress line, in a pipe
too; a stage that reports its own progress says nothing more) and records it when it ends: its
seconds and its outcome (done, interrupted by Ctrl-C, or failed and why). ``planned`` is the plan
stage (the plan's pick, or a saved plan's). ``served`` launches and connects, and stops the server
on the way out however the block ends (done, an error, Ctrl-C), unless asked to keep it; ``up``
launches and keeps it. ``open_run`` starts the stored run with the conditions every measurement
records. A composition's stored summary carries ``stages``: the log up to the measurement (for
``up`` and ``switch``, their launch's run: the log up to the launch, ``record_stages``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInput, EngineroomError
from ..store import Store
from .picks import pick_from_file, pick_from_plan
from .runs import client_key, connect, run_conditions
from .serving import start, stop

if TYPE_CHECKING:
    from ..bench import BenchPlan
    from ..engines.base import ServerInfo
    from ..launch import ServerState
    from ..launchargs import LaunchArgs
    from ..refs import ModelRef
    from .picks import Pick

__all__ = ["STAGES_KEY", "Served", "StageLog", "open_run", "planned", "record_stages", "served", "up"]

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


def planned(model: str | None, log: StageLog, *, priority: str | None = None, rig: str | None = None,
            from_plan: Path | None = None, pick: int = 1, engine: str | None = None) -> Pick | None:
    """The plan stage of ``up`` and ``recipe``: the plan's pick when --priority, --rig or --from-plan
    asks for one (a typed --engine plans for that engine only, so the quant and KV type are ones it
    runs), else None and no stage."""
    if from_plan is not None:
        if priority or rig:
            raise BadInput("--from-plan already holds the plan; give it without --priority or --rig.")
        with log.stage("plan", ""):
            return pick_from_file(from_plan, pick)
    if priority is None and rig is None:
        if pick != 1:
            raise BadInput("--pick chooses among a plan's configurations; add --priority P or --from-plan FILE.")
        return None
    if model is None:
        raise BadInput("name the model to plan, e.g. `engineroom up smollm2-135m --priority balanced`.")
    with log.stage("plan", ""):
        return pick_from_plan(model, priority=priority, rig=rig, pick=pick, engine=engine)


def up(model: str | ModelRef, args: LaunchArgs, *, log: StageLog | None = None, pick: Pick | None = None,
       say: Callable[[str], None] | None = None, on_wait: Callable[[str, float], None] | None = None,
       accept_placement: bool = False, api_key: str | None = None) -> ServerState:
    """``engineroom up``: after the plan stage (``planned``, in ``log``) the launch stage, the server
    kept running; the launch's stored run holds the stages (``record_stages``)."""
    log = log if log is not None else StageLog(say)
    with log.stage("launch", ""):             # the launch reports its own steps (``say``, ``on_wait``)
        state = start(model, args, say=say, on_wait=on_wait, pick=pick, accept_placement=accept_placement,
                      api_key=api_key)
    return record_stages(state, log)


def record_stages(state: ServerState, log: StageLog) -> ServerState:
    """``log`` (what ran to launch ``state``) kept in the summary of its stored launch run, beside
    the prediction and the placement (``record_launch``); a store that cannot be written loses only this."""
    if state.launch_run_id is None:
        return state
    try:
        with Store() as store:
            run = store.get_run(state.launch_run_id)
            store.finish_run(run["id"], run["status"], {**(run["summary"] or {}), STAGES_KEY: log.so_far()})
    except (sqlite3.Error, OSError, EngineroomError):
        pass      # the server is up; a results store that cannot be written must not take it down
    return state
