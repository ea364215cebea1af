"""Run a LaunchSpec as a managed background process: start, wait until healthy, stop, switch.

State (pid, port, argv, model, log path, start time) lives in one JSON file under
``paths.state_dir()`` so ``status``, ``logs`` and ``down`` work from another shell. The
engine-specific parts (health semantics, failure classification) come from the adapter.

The state file is not the only record: every engine engineroom starts carries ``MARK_ENV`` in
its environment (the state folder, the engine, the model, the port: nothing secret), so when
the state file cannot be read it is kept aside (``server.json.damaged-<time>``, never deleted)
and the server is found again by its process and the port it listens on (``recover_state``);
``status`` and ``down`` go on working. ``status`` shows the addresses the engine's processes
really listen on (psutil), beside the one engineroom asked for.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from . import paths, serverproc
from .engines import Engine, adapter
from .engines.base import UNKNOWN_FAILURE, LaunchSpec
from .errors import BadInput, EngineFailed, NotFound
from .launchargs import LaunchArgs, check_timeout

STATE_FILE = "server.json"
DAMAGED_SUFFIX = ".damaged-"
LOG_FILE = "server.log"              # the default log: kept after a failed start for `engineroom logs`


@dataclass
class ServerState:
    pid: int
    port: int
    host: str
    engine: str
    argv: list[str]
    model: str
    model_path: str
    log_path: str
    started_at: float
    ready_at: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    engine_version: str = ""
    proc_created: float | None = None   # the process's own start time: a reused pid is not ours
    changes: list[dict] = field(default_factory=list)   # arguments engineroom added, and why
    args: LaunchArgs = field(default_factory=LaunchArgs)  # the launch's arguments as given (what `switch` keeps)
    memory: dict = field(default_factory=dict)          # measured (engine's report), predicted (fit), rows
    launch_run_id: int | None = None                    # the store's "launch" run holding the comparison
    model_sha256: str = ""                              # the served file's own digest (models.file_sha256)
    notes: list[str] = field(default_factory=list)     # what the user should know about this launch

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def state_path() -> Path:
    return paths.state_dir() / STATE_FILE


def last_log() -> Path:
    """The default log file: the running server's, or the last one's (kept after a failed start)."""
    return paths.state_dir() / LOG_FILE


def read_state() -> ServerState | None:
    """The managed server's state; a state file that cannot be read is kept aside and the server
    found again by its process (``recover_state``), so it is never forgotten while it runs."""
    path = state_path()
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        data["args"] = LaunchArgs.from_dict(data.get("args") or {})
        return ServerState(**data)
    except (OSError, ValueError, TypeError, BadInput):
        pass
    aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
    except OSError:
        return None                     # another process moved it first: it recovers the server
    return recover_state(f"the state file {path} could not be read; it was kept as {aside}")


def recover_state(why: str) -> ServerState | None:
    """The managed server found by its process (``serverproc.find_marked``: the mark in its
    environment names this state folder, and it listens on the mark's port); its state is written
    again with ``why`` among its notes. None when no such process runs."""
    found = serverproc.find_marked(paths.state_dir())
    if found is None:
        return None
    pid, mark, argv, created = found
    state = ServerState(
        pid=pid, port=int(mark["port"]), host=str(mark.get("host") or "127.0.0.1"), engine=str(mark["engine"]),
        argv=argv, model=str(mark.get("model") or ""), model_path=str(mark.get("model_path") or ""),
        log_path=str(mark.get("log_path") or last_log()), started_at=created, ready_at=created,
        health_path=str(mark.get("health_path") or "/health"), engine_version=str(mark.get("engine_version") or ""),
        proc_created=created,
        notes=[f"{why}; the server was found again by its process (pid {pid}) and port {mark['port']}; "
               "the arguments it was launched with are lost, so `switch` takes only what is given"],
    )
    _write_state(state)
    return state


def _write_state(state: ServerState) -> None:
    """Keys are kept by reference (apikey.py); redaction masks any secret that got in anyway
    (an engine flag such as --hf-token after `--`), since the file outlives the process."""
    from .redaction import redact_data

    path = state_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(redact_data(asdict(state)), indent=2))
    os.replace(tmp, path)


def _clear_state() -> None:
    state_path().unlink(missing_ok=True)


def is_alive(pid: int, created: float | None = None) -> bool:
    """Is ``pid`` running — and, when ``created`` is given, is it still the process we started?

    State files outlive reboots and pids are reused: comparing the process's start time
    keeps `down` from stopping a stranger that inherited the number.
    """
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 1.0:
            return False
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _ours(state: ServerState) -> bool:
    return is_alive(state.pid, state.proc_created)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def tail(path: Path | str, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as fh:
            return [line.rstrip("\n") for line in deque(fh, maxlen=n)]
    except OSError:
        return []


def kill_tree(pid: int, timeout: float = 10.0) -> None:
    """Stop a process and all its descendants: SIGTERM, wait, then SIGKILL what is left."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        try:
            proc.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    psutil.wait_procs(alive, timeout=5)


# What a signal that killed an engine usually means, for the one-sentence error.
SIGNAL_MEANINGS = {
    "SIGILL": "illegal instruction — usually a CPU feature the binary uses but this machine lacks",
    "SIGSEGV": "segmentation fault — a bug in the engine, or a CPU instruction this machine traps",
    "SIGBUS": "bus error — often a model file that was truncated or changed while mapped",
    "SIGFPE": "arithmetic exception in the engine",
    "SIGABRT": "aborted — the engine stopped on a failed assertion or an uncaught error",
    "SIGKILL": "killed — often the kernel's out-of-memory killer (see `dmesg`)",
    "SIGTERM": "terminated by another process",
}


def describe_exit(code: int) -> str:
    """``exited with code 1`` or ``crashed: SIGILL, illegal instruction — ...``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"crashed: signal {-code}"
    meaning = SIGNAL_MEANINGS.get(name)
    return f"crashed: {name}" + (f", {meaning}" if meaning else "")


class EngineCrashed(EngineFailed):
    """The engine died while loading; ``returncode`` is negative when a signal killed it."""

    def __init__(self, message: str, *, returncode: int, detail: str | None = None):
        super().__init__(message, detail=detail)
        self.returncode = returncode


def probe_health(url: str, health_path: str, timeout: float = 2.0) -> int | None:
    from . import net

    try:
        return net.get(f"{url}{health_path}", timeout=timeout).status_code   # loopback: no proxy
    except httpx.HTTPError:
        return None


# --------------------------------------------------------------------------- up / down
def up(
    spec: LaunchSpec,
    *,
    timeout: float | None = None,
    on_wait: Callable[[str, float], None] | None = None,
    poll: float = 0.25,
    on_spawn: Callable[[int], None] | None = None,
    args: LaunchArgs | None = None,
    hide_env: Sequence[str] = (),
) -> ServerState:
    """Start ``spec`` in the background and return once its health endpoint says ready.

    Refuses when a managed server is already running or the port is taken. If the engine
    exits while loading, the health wait times out, or the user presses Ctrl-C, the whole
    process tree is stopped and the state file removed before the error propagates. If a
    signal kills the engine while loading and its adapter knows what to change for that
    (``crash_fallback``), it is relaunched once with the change, which the state records.
    ``on_spawn(pid)`` is called as soon as each process exists. ``hide_env``: variables of this
    process's environment the engine must not inherit (the one ``--api-key-env`` names: the engine
    reads its key from a file, so the key never shows in ``/proc/PID/environ``).
    """
    check_timeout(timeout)
    current = read_state()
    if current and _ours(current):
        raise BadInput(
            f"a managed server is already running ({current.model} on port {current.port}, pid "
            f"{current.pid}); use `engineroom switch` or `engineroom down` first."
        )
    _clear_state()
    engine = adapter(spec.engine)
    if timeout is None:               # no --timeout: the engine's own (an adapter's START_TIMEOUT_S, else 300 s)
        timeout = engine.start_timeout
    try:
        return _up_once(spec, engine, timeout=timeout, on_wait=on_wait, poll=poll, on_spawn=on_spawn,
                        args=args or LaunchArgs(), hide_env=hide_env)
    except EngineCrashed as crash:
        fallback = getattr(engine, "crash_fallback", None)
        change = fallback(spec.argv, crash.returncode) if fallback else None
        if change is None:
            raise
        if on_wait:
            on_wait(f"relaunching: {change.why}", 0.0)
        log = Path(spec.log_path or last_log())
        if log.is_file():   # keep the crashed start's log beside the relaunch's
            os.replace(log, log.with_name(log.stem + ".crashed" + log.suffix))
        retry = engine.relaunch_spec(spec, change)
        try:
            return _up_once(retry, engine, timeout=timeout, on_wait=on_wait, poll=poll, on_spawn=on_spawn,
                            args=args or LaunchArgs(), hide_env=hide_env)
        except EngineCrashed as second:
            raise EngineCrashed(f"{second} (it had already {describe_exit(crash.returncode).split(',')[0]} once; "
                                f"the relaunch with {' '.join(change.args)} failed too)",
                                returncode=second.returncode, detail=second.detail) from None


def _up_once(spec: LaunchSpec, engine: Engine, *, timeout: float, on_wait: Callable[[str, float], None] | None,
             poll: float, on_spawn: Callable[[int], None] | None, args: LaunchArgs,
             hide_env: Sequence[str] = ()) -> ServerState:
    if port_in_use(spec.host, spec.port):
        raise BadInput(f"port {spec.port} on {spec.host} is already in use; pick another with --port.")
    log_path = Path(spec.log_path or last_log())
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    env = {k: v for k, v in os.environ.items() if k not in hide_env}
    env.update(spec.env)
    env[serverproc.MARK_ENV] = serverproc.mark(
        paths.state_dir(), engine=spec.engine, model=spec.model, model_path=spec.model_path, port=spec.port,
        host=spec.host, health_path=spec.health_path, engine_version=spec.engine_version, log_path=str(log_path))
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                list(spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        except OSError as exc:
            raise NotFound(f"cannot start {spec.argv[0]}: {exc.strerror}.") from None
    try:
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = None
        state = ServerState(
            pid=proc.pid, port=spec.port, host=spec.host, engine=spec.engine, argv=list(spec.argv),
            model=spec.model, model_path=spec.model_path, log_path=str(log_path), started_at=started,
            env=dict(spec.env), health_path=spec.health_path, engine_version=spec.engine_version,
            proc_created=created, changes=list(spec.changes), args=args,
        )
        _write_state(state)
        if on_spawn:
            on_spawn(proc.pid)
        # the engine's last log line (adapters with wait_hint) and the compiler it runs, if any, every 2 s
        hinted, last_hint, building = -2.0, "", None
        while True:
            code = proc.poll()
            if code is not None:
                lines = tail(log_path, 20)
                reason = engine.classify_failure("\n".join(tail(log_path, 200)))
                _clear_state()
                how = describe_exit(code)
                sentence = f"{spec.engine} {how} while loading"
                if code >= 0 or reason != UNKNOWN_FAILURE:
                    sentence += f" ({reason})"
                raise EngineCrashed(f"{sentence}; the last log lines are above; full log: {log_path}",
                                    returncode=code, detail="\n".join(lines))
            status = probe_health(spec.url, spec.health_path)
            phase = engine.health_state(status)
            elapsed = time.time() - started
            if phase == "ready":
                state.ready_at = time.time()
                state.memory = measured_memory(engine, log_path, proc.pid)
                _write_state(state)
                return state
            if on_wait:
                if elapsed - hinted >= 2:
                    hinted = elapsed
                    last_hint = engine.wait_hint("\n".join(tail(log_path, 40))) or last_hint
                    building = serverproc.compiling(proc.pid)
                on_wait(wait_line(phase, last_hint, building), elapsed)
            if elapsed > timeout:
                kill_tree(proc.pid)
                _clear_state()
                raise EngineFailed(
                    f"{spec.engine} was not healthy after {timeout:.0f} s (last state: {phase}); stopped it. "
                    f"Raise --timeout for slow loads; the last log lines are above; full log: {log_path}",
                    detail="\n".join(tail(log_path, 20)),
                )
            time.sleep(poll)
    except BaseException:
        # KeyboardInterrupt or any error above: leave nothing running.
        if proc.poll() is None:
            kill_tree(proc.pid)
        _clear_state()
        raise


def wait_line(phase: str, hint: str, building: tuple[str, float] | None) -> str:
    """The progress line of a start: the phase, the compiler the engine runs (an engine's first start builds
    kernels for minutes while its log stands still), and the engine's last log line."""
    if building:
        line = f"{phase}: compiling kernels ({building[0]}, {building[1]:.0f} s)"
        return f"{line}; last logged: {hint}" if hint else line
    return f"{phase}: {hint}" if hint else phase


def measured_memory(engine: Engine, log_path: Path, pid: int) -> dict:
    """What the engine reported allocating (its adapter reads its log), and NVML's per-GPU use
    by its process tree when a GPU is present; names as fit's components."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        text = ""
    report = engine.memory_report(text)
    out: dict = {"measured": {}, "measured_source": ""}
    if report is not None:
        out["measured"] = {c.name: c.bytes for c in report.components}
        out["measured_sources"] = {c.name: c.source for c in report.components}   # each row says what it read
        out["measured_source"] = report.source
        out["measured_device"] = report.device
    from .resources import gpu_memory_of

    try:
        pids = {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        pids = {pid}
    gpu = gpu_memory_of(pids)
    if gpu:
        for index, used in gpu.items():
            out["measured"][f"GPU{index}"] = used   # fit predicts each GPU's use under the same name
        out["measured_source"] = (out["measured_source"] + "; " if out["measured_source"] else "") + \
            "NVML used memory of the engine's processes"
    return out


def update_state(state: ServerState, **fields: Any) -> ServerState:
    """``state`` with ``fields`` changed, written back when it is still the managed server's."""
    from dataclasses import replace

    new = replace(state, **fields)
    current = read_state()
    if current is not None and current.pid == state.pid:
        _write_state(new)
    return new


def down(timeout: float = 10.0) -> ServerState | None:
    """Stop the managed server's whole process tree; None when nothing was running."""
    state = read_state()
    if state is None:
        return None
    if not _ours(state):
        _clear_state()        # stale: the process is gone, or its pid now belongs to another program
        return None
    kill_tree(state.pid, timeout=timeout)
    _clear_state()
    return state


@dataclass(frozen=True)
class Status:
    running: bool
    state: ServerState | None
    health: str            # ready | loading | starting | error | stopped
    uptime_s: float | None
    bound: tuple[str, ...] = ()   # host:port the engine's processes really listen on (psutil)


def status() -> Status:
    state = read_state()
    if state is None:
        return Status(False, None, "stopped", None)
    if not _ours(state):
        _clear_state()
        return Status(False, state, "stopped (process gone)", None)
    phase = adapter(state.engine).health_state(probe_health(state.url, state.health_path))
    return Status(True, state, phase, time.time() - state.started_at, tuple(serverproc.bound_addresses(state.pid)))


def managed_url() -> str:
    st = status()
    if not st.running or st.state is None:
        raise NotFound("no managed server is running; start one with `engineroom up MODEL` or pass --url.")
    return st.state.url


def follow(path: Path, poll: float = 0.5) -> Iterator[str]:
    """Yield new log lines as they are written (``logs -f``); stops when the server is gone."""
    with open(path, errors="replace") as fh:
        fh.seek(0, os.SEEK_END)
        while True:
            line = fh.readline()
            if line:
                yield line.rstrip("\n")
                continue
            try:
                if os.stat(path).st_size < fh.tell():   # `switch` restarted the server: new log
                    fh.seek(0)
                    continue
            except OSError:
                return
            st = read_state()
            if st is None or not _ours(st):
                return
            time.sleep(poll)


__all__ = [
    "ServerState", "Status", "down", "follow", "free_port", "kill_tree", "managed_url",
    "port_in_use", "read_state", "recover_state", "status", "tail", "up", "wait_line",
]
