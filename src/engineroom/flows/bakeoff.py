"""``engineroom bakeoff MODEL``: every engine here, one model, the same suites, one stored comparison.

A bakeoff is a grid of cells, one per engine x priority: each cell is the plan's pick for that
engine and priority, run through launch -> the suites (verify and bench, each a stored run of its
own) -> down, one engine at a time, all in one stored run of kind ``bakeoff``. Each cell that ends
is a ``bakeoff_cell`` record of that run, written the moment it ends, so a bakeoff stopped by
Ctrl-C, ``kill -9`` or a power cut keeps every cell that finished: ``--resume ID`` runs the rest.
The cell that was under way is launched again (its engine, left running by a ``kill -9``, is
stopped first) and runs only the suites it had not finished: each suite that ends is a
``bakeoff_suite`` record, kept when the new launch is the same pick. A cell that cannot run here
(engine not installed, no build for this machine, no plan for it) is a result too: one sentence
why, and the command that would make it run. An engine that crashes is that cell's result; the next engine still runs.

``report --bakeoff ID`` (``report.bakeoff``) turns the stored cells into the comparison page.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .. import engines, launch, models
from ..errors import BadInput, EngineroomError, NotFound
from ..launchargs import LaunchArgs, check_timeout
from ..report.bakeoff import BAKEOFF_KIND, CELL_KIND
from ..store import Store
from .picks import Pick, pick_from_plan
from .runs import HostGuard, bench, bench_suite, verify
from .stages import StageLog, served
from .trying import GGUF_FORMAT, random_weights, random_weights_pick

__all__ = ["BAKEOFF_KIND", "CELL_KIND", "DEFAULT_SUITES", "SERVER_KIND", "SUITES", "BakeoffOutcome", "bakeoff",
           "cell_key"]

SERVER_KIND = "bakeoff_server"      # the engine's pid as a cell's launch spawns it (a resume stops a leftover)
SUITE_KIND = "bakeoff_suite"        # a suite that ended in a cell not ended yet (a resume keeps it)

# suite name -> (verify | bench, the suite's own name there)
SUITES: dict[str, tuple[str, str]] = {
    "verify-smoke": ("verify", "smoke"), "verify-full": ("verify", "full"), "stress": ("verify", "stress"),
    "soak": ("verify", "soak"), "bench-quick": ("bench", "quick"), "bench-standard": ("bench", "standard"),
    "depth": ("bench", "depth"), "concurrency": ("bench", "concurrency"), "sweep": ("bench", "sweep"),
    "spec": ("bench", "spec"),
}
DEFAULT_SUITES = ("verify-full", "bench-standard", "depth", "concurrency", "stress")

# --short: each bench suite at its smallest sizes that still measure (a look, not a verdict to publish)
_SHORT_BENCH: dict[str, dict[str, Any]] = {
    "standard": {"warmup": 1, "measured": 2, "max_tokens": 64},
    "depth": {"warmup": 1, "measured": 2, "depths": (256, 1024)},
    "concurrency": {"warmup": 1, "measured": 2, "prompt_tokens": 256, "max_tokens": 32},
    "sweep": {"warmup": 1, "measured": 1, "depths": (256,), "max_tokens": 32, "budget_s": 60.0},
    "spec": {"warmup": 1, "measured": 2},
}

DONE, FAILED, NOT_RUN = "done", "failed", "not run here"


def cell_key(engine: str, priority: str) -> str:
    return f"{engine} / {priority}"


@dataclass
class BakeoffOutcome:
    run_id: int
    model: str
    cells: list[dict[str, Any]]                   # every cell that ended, in grid order
    left: list[str] = field(default_factory=list)  # cells not started (the budget), by key
    status: str = "OK"


def check_suites(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise BadInput(f"no bakeoff suite named {', '.join(unknown)} (the suites: {', '.join(SUITES)}).")
    if not names:
        raise BadInput("--suites names no suite.")
    return tuple(dict.fromkeys(names))


def _engine(name: str) -> str:
    """The engine id for ``name`` (an id or alias); BadInput in one sentence for a name no adapter serves."""
    engine = engines.resolve(name)
    if engine not in engines.names():
        raise BadInput(f"no engine named {name!r} (the engines: {', '.join(engines.names())}).")
    return engine


def _engine_args(given: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    return {_engine(name): tuple(words) for name, words in given.items()}


def _runnable(engine: str) -> tuple[str, str] | None:
    """(why, the command that would make it run) when ``engine`` cannot run here, else None."""
    from .installs import serve_refusal

    refused = serve_refusal(engine)
    if refused:
        return refused, f"engineroom bakeoff MODEL --engines {engine}, on a machine with the GPU it names"
    try:
        engines.adapter(engine).find_binary(None)
    except NotFound:
        return f"{engine} is not installed here.", f"engineroom engines install {engine}"
    return None


class _Grid:
    """The bakeoff's stored run and its cells: what is done (read back on resume) and what is written."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self.done: dict[str, dict[str, Any]] = {}   # a cell not run here is tried again: its reason may be gone
        for rec in store.records(run_id, CELL_KIND):
            key = cell_key(rec["payload"]["engine"], rec["payload"]["priority"])
            if rec["payload"]["status"] == NOT_RUN:
                self.done.pop(key, None)
            else:
                self.done[key] = rec["payload"]
        self.pids = {int(r["payload"]["pid"]) for r in store.records(run_id, SERVER_KIND)}
        # per cell not ended: the suites that did end, with the pick they measured
        self.kept: dict[str, dict[str, dict[str, Any]]] = {}
        for rec in store.records(run_id, SUITE_KIND):
            p = rec["payload"]
            key = cell_key(p["engine"], p["priority"])
            if key not in self.done:
                self.kept.setdefault(key, {})[p["suite"]] = p

    def ended(self, cell: dict[str, Any]) -> None:
        self.store.add_record(self.run_id, CELL_KIND, cell)
        self.done[cell_key(cell["engine"], cell["priority"])] = cell

    def suite_ended(self, engine: str, priority: str, suite: str, run_id: int, status: str,
                    pick: Mapping[str, Any]) -> None:
        self.store.add_record(self.run_id, SUITE_KIND, {"engine": engine, "priority": priority, "suite": suite,
                                                        "run": run_id, "status": status, "pick": _as_stored(pick)})

    def kept_suites(self, engine: str, priority: str, pick: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The suites an interrupted launch of this cell finished, when they measured this same pick."""
        same = _as_stored(pick)
        return {name: p for name, p in self.kept.get(cell_key(engine, priority), {}).items() if p.get("pick") == same}


class _RandomFile:
    """``--random``: one random-weight GGUF of the model for every engine of the bakeoff, written when the first
    cell needs it (at that pick's quant) and deleted when the bakeoff ends, however it ends."""

    def __init__(self, stack: ExitStack, folder: Path | None) -> None:
        self.stack, self.folder = stack, folder
        self.path: Path | None = None
        self.quant: str | None = None       # the file's quant, once written: every later pick is planned at it
        self.shape: Path | None = None      # the shape-and-tokenizer file, for engines that make the weights

    def get(self, model: str, pick: Pick, log: StageLog) -> Path:
        path = self.path
        if path is None:
            path, _size = self.stack.enter_context(random_weights(model, pick, log, folder=self.folder,
                                                                  command="bakeoff"))
            self.path, self.quant = path, pick.request.weights.quant
        return path

    def shape_only(self, model: str, pick: Pick, log: StageLog) -> Path:
        """The model's shape and tokenizer alone (written once), for an engine that makes its random weights
        itself (``engines.Engine.random_weights_loading``): the same shape as the GGUF every other engine
        serves, weights of that engine's own making at its pick's format."""
        if self.shape is None:
            self.shape, _size = self.stack.enter_context(random_weights(model, pick, log, folder=self.folder,
                                                                        command="bakeoff", tensors=False))
        return self.shape


def _stop_leftover(grid: _Grid, say: Callable[[str], None]) -> None:
    """A resumed bakeoff's engine left running by a ``kill -9``: stopped, said."""
    state = launch.read_state()
    if state is not None and state.pid in grid.pids:
        say(f"stopping the {state.engine} server (pid {state.pid}) the interrupted bakeoff left running")
        from .serving import stop

        stop()


def machine_key() -> str:
    """This machine in this boot (host name and boot time, hashed: no name is stored): the cells of a bakeoff
    resumed on another machine, even one of the same description, are told apart on its page."""
    return hashlib.sha256(f"{socket.gethostname()} {psutil.boot_time():.0f}".encode()).hexdigest()[:12]


def _start_or_resume(store: Store, resume: int | None, conditions: dict[str, Any], label: str,
                     engines_given: Sequence[str] = ()) -> tuple[int, dict[str, Any], list[str]]:
    """A new bakeoff's run, or the stopped ``resume`` open again with the engines given that it lacks added to
    its grid (their cells as the bakeoff asked: its other settings stay); and the engines added."""
    if resume is None:
        return store.start_run(BAKEOFF_KIND, conditions, label=label), conditions, []
    run = store.get_run(resume)
    if run["kind"] != BAKEOFF_KIND:
        raise BadInput(f"run {resume} is a {run['kind']} run, not a bakeoff.")
    if run["status"] == "running":
        raise BadInput(f"bakeoff {resume} is still running (pid {run['owner_pid']}); stop it first.")
    had = list(run["conditions"].get("engines") or [])
    added = [e for e in dict.fromkeys(engines_given) if e not in had]
    conditions = {**run["conditions"], "engines": had + added}
    store.reopen_run(resume, conditions)
    return resume, conditions, added


def bakeoff(store: Store, model: str, *, engine_names: Sequence[str] = (), priorities: Sequence[str] = (),
            suites: Sequence[str] = DEFAULT_SUITES, short: bool = False, ctx: int | None = None,
            budget_s: float | None = None, resume: int | None = None,
            engine_args: Mapping[str, Sequence[str]] | None = None, random: bool = False, folder: Path | None = None,
            quant: str | None = None, quiet_wait: float = 60.0, busy_ok: bool = False, timeout: float | None = None,
            say: Callable[[str], None] | None = None) -> BakeoffOutcome:
    """Run (or ``resume``) the bakeoff of ``model``: every engine (default: every adapter) x priority (default:
    balanced), each through ``suites``. ``budget_s``: no cell is started past it (the rest: ``left``). ``random``:
    every engine serves one random-weight file of the model's exact shape (``try``'s), written in ``folder`` at
    the first pick's quant, and every later pick is planned at that quant (one file, one contract). ``quant``:
    every engine's pick at this quant (an engine that cannot load it gets a row that says so). ``timeout``: seconds
    each launch may take to become healthy (None: each engine's own wait)."""
    say = say or (lambda _m: None)
    check_timeout(timeout)
    if budget_s is not None and budget_s <= 0:
        raise BadInput(f"--budget-min must be above 0, not {budget_s / 60:g}.")
    wanted = [_engine(e) for e in engine_names] or list(engines.names())
    conditions: dict[str, Any] = {"model": model, "engines": wanted, "priorities": list(priorities) or ["balanced"],
                                  "suites": list(check_suites(suites)), "short": short, "ctx": ctx, "random": random,
                                  "quant": quant,
                                  "engine_args": {k: list(v) for k, v in _engine_args(engine_args or {}).items()}}
    run_id, conditions, added = _start_or_resume(store, resume, conditions, f"bakeoff {model}",
                                                 [_engine(e) for e in engine_names])
    grid = _Grid(store, run_id)
    if resume is not None:
        say(f"resuming bakeoff {run_id}: {len(grid.done)} cell(s) done are kept"
            + (f"; engines added: {', '.join(added)}" if added else ""))
        _stop_leftover(grid, say)
    todo = [(str(e), str(p)) for e in conditions["engines"] for p in conditions["priorities"]]
    t0, spent, left = time.monotonic(), list[float](), list[str]()
    stack = ExitStack()
    files = _RandomFile(stack, folder) if conditions.get("random") else None
    if files is not None:        # a resumed bakeoff's file is written again at the quant its GGUF cells ran
        files.quant = next((str(c["pick"]["quant"]) for c in grid.done.values()
                            if (c.get("pick") or {}).get("quant_format") == GGUF_FORMAT), None)
    try:
        for i, (engine, priority) in enumerate(todo, 1):
            key = cell_key(engine, priority)
            if key in grid.done:
                continue
            elapsed = time.monotonic() - t0
            if budget_s is not None and elapsed >= budget_s:
                left.append(key)
                continue
            eta = (f", about {sum(spent) / len(spent) * (len(todo) - i + 1) / 60:.0f} min left" if spent else "")
            say(f"cell {i}/{len(todo)}: {key}{eta}")
            started = time.monotonic()
            grid.ended(_cell(store, grid, model, engine, priority, conditions, files, quiet_wait, busy_ok, say,
                             timeout))
            spent.append(time.monotonic() - started)
    except KeyboardInterrupt:
        store.finish_run(run_id, "INTERRUPTED", {"cells": len(grid.done), "left": len(todo) - len(grid.done)})
        say(f"bakeoff {run_id} interrupted; the cells done are kept: `engineroom bakeoff --resume {run_id}`")
        raise
    finally:
        stack.close()                   # the random-weight file, if one was written
    cells = [grid.done[cell_key(e, p)] for e, p in todo if cell_key(e, p) in grid.done]
    status = "PARTIAL" if left else "OK"
    store.finish_run(run_id, status, {"cells": len(cells), "done": sum(c["status"] == DONE for c in cells),
                                      "left": left})
    return BakeoffOutcome(run_id, model, cells, left, status)


def _cell(store: Store, grid: _Grid, model: str, engine: str, priority: str, conditions: Mapping[str, Any],
          files: _RandomFile | None, quiet_wait: float, busy_ok: bool, say: Callable[[str], None],
          timeout: float | None = None) -> dict[str, Any]:
    """One cell, run to its end: its record (done, failed at a stage, or not run here and why)."""
    cell: dict[str, Any] = {"engine": engine, "priority": priority, "runs": {}, "suites": {},
                            "machine_key": machine_key()}
    refused = _runnable(engine)
    if refused is not None:
        return {**cell, "status": NOT_RUN, "why": refused[0], "fix": refused[1]}
    try:
        pick = pick_from_plan(model, priority=priority, engine=engine, ctx=conditions.get("ctx"),
                              quant=conditions.get("quant"))
    except EngineroomError as exc:
        return {**cell, "status": NOT_RUN, "why": str(exc),
                "fix": f"engineroom plan {model} --engine {engine} --priority {priority} (the plan's closest miss)"}
    log = StageLog(lambda line: say(f"{engine}: {line}"))
    served_model, notes = model, list[str]()
    if files is not None:
        fmt = str(pick.plan.get("quant_format") or "")
        own = engines.adapter(engine).random_weights_loading(fmt) if fmt != GGUF_FORMAT else None
        if fmt != GGUF_FORMAT and own is None:
            return {**cell, "status": NOT_RUN,
                    "why": f"random weights are a GGUF file and {engine}'s pick is {pick.plan.get('quant')} "
                           f"({fmt} weights), which {engine} makes no random weights of itself.",
                    "fix": f"engineroom bakeoff {model} --engines {engine} (the real weights)"}
        if own is None and files.quant is not None and pick.request.weights.quant != files.quant:  # one file, one quant
            try:
                pick = pick_from_plan(model, priority=priority, engine=engine, ctx=conditions.get("ctx"),
                                      quant=files.quant)
            except EngineroomError as exc:
                return {**cell, "status": NOT_RUN, "why": f"the random-weight file is {files.quant}: {exc}",
                        "fix": f"engineroom bakeoff {model} --random --quant QUANT (one every engine loads)"}
        pick, notes = random_weights_pick(pick)
        if own is not None:          # the engine makes the weights: a file of the same shape, the engine's format
            served_model = str(files.shape_only(model, pick, log))
            notes.append(f"random weights: {own} ({Path(served_model).name}: the shape the other engines' file has)")
        else:
            served_model = str(files.get(model, pick, log))
            notes.append(f"random weights: {Path(served_model).name}, the same file for every engine")
    elif pick.model_ref != model:
        notes.append(f"served {model} (the same file for every engine that loads it), not the pick's own "
                     f"weights {pick.model_ref}")
    summary = _pick_summary(pick)
    kept = grid.kept_suites(engine, priority, summary)
    if kept:
        notes.append(f"{', '.join(kept)}: measured by the launch an interruption stopped (the same pick; "
                     f"runs {', '.join(str(k['run']) for k in kept.values())}), kept by the resume")
    cell["pick"] = {**summary, "notes": [*pick.notes, *notes]}
    try:                  # engineroom's tool-capable template where it has one (as demo does)
        tools = files is None and models.resolve(model).tool_template is not None
    except EngineroomError:
        tools = False
    args = LaunchArgs(port=0, tools_template=tools, timeout=timeout,
                      extra_args=tuple(conditions.get("engine_args", {}).get(engine, ())))
    host = HostGuard(wait_s=quiet_wait, busy_ok=busy_ok, say=say)

    def spawned(pid: int) -> None:
        store.add_record(grid.run_id, SERVER_KIND, {"engine": engine, "priority": priority, "pid": pid})

    try:
        with served(served_model, args, log, pick=pick, what=f"launch ({priority} pick)", on_spawn=spawned) as s:
            cell["launch_run"] = s.state.launch_run_id
            cell["argv"] = list(s.state.argv)
            for name in conditions["suites"]:
                if name in kept:
                    cell["runs"][name], cell["suites"][name] = kept[name]["run"], kept[name]["status"]
                    say(f"{engine}: {name}: kept from the interrupted launch (run {kept[name]['run']})")
                    continue
                with log.stage(name):
                    try:
                        cell["runs"][name], cell["suites"][name] = _suite(
                            store, s, name, bool(conditions.get("short")), host, pick.request.parallel)
                        grid.suite_ended(engine, priority, name, cell["runs"][name], cell["suites"][name], summary)
                    except EngineroomError as exc:          # this suite's refusal: the others still run
                        cell["suites"][name] = f"ERROR: {exc}"
                if not _alive(s.state.pid):
                    raise EngineroomError(f"the engine exited during the {name} suite (log: {s.state.log_path})")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - an engine that dies mid-suite surfaces as the client's error
        why = str(exc) if isinstance(exc, EngineroomError) else f"{type(exc).__name__}: {str(exc)[:300]}"
        cell.update(status=FAILED, why=why, stages=log.so_far())
        return cell
    return {**cell, "status": DONE, "stages": log.so_far()}


def _as_stored(data: Mapping[str, Any]) -> Any:
    """``data`` as the store gives it back (JSON: tuples are lists), so a stored pick compares equal."""
    import json

    return json.loads(json.dumps(data, default=str))


def _alive(pid: int) -> bool:
    """The engine still runs (a killed one stays a zombie until its parent reaps it: not running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pick_summary(pick: Pick) -> dict[str, Any]:
    r = pick.request
    return {"quant": pick.plan.get("quant"), "quant_format": pick.plan.get("quant_format"), "kv": r.kv_dtype,
            "ctx": r.ctx, "parallel": r.parallel, "weights": r.weights.ref, "source": pick.source,
            "decode_tps": pick.plan.get("decode_tps"), "notes": list(pick.notes)}


def _suite(store: Store, s: Any, name: str, short: bool, host: HostGuard, slots: int | None) -> tuple[int, str]:
    """Run one suite on the served engine: (its stored run, its status)."""
    what, suite = SUITES[name]
    if what == "verify":
        minutes = 1.0 if suite == "soak" and short else None
        v = verify(s.info, store, suite=suite, api_key=s.key, fast=short, minutes=minutes)
        return v.run_id, "OK" if v.failed == 0 else "FAILED"
    if suite == "quick":
        from ..bench import BenchPlan, default_workloads

        plan = BenchPlan(workloads=default_workloads(64 if short else 256), warmup=1 if short else 3,
                         measured=2 if short else 5, full_length=True)
        b = bench(s.info, store, plan, api_key=s.key, host=host)
    else:
        sizes = _SHORT_BENCH.get(suite, {}) if short else {}
        streams = slots if suite in ("concurrency", "sweep") and not s.info.total_slots else None   # the pick's
        b = bench_suite(s.info, store, suite, host=host, api_key=s.key, streams=streams, **sizes)
    return b.run_id, str(b.summary.get("status", "?"))
