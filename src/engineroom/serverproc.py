"""The managed engine's process, told by the mark engineroom puts in its environment, and the
addresses it really listens on (psutil).

Every engine ``launch.up`` starts runs in a session of its own with ``MARK_ENV`` in its
environment: JSON naming engineroom's state folder, the engine, the model, the port and the log
(nothing secret). When the state file cannot be read, ``find_marked`` finds the server again,
so ``status`` and ``down`` still reach it; ``bound_addresses`` is what ``status`` shows of where
the engine listens, whatever its arguments asked for; ``compiling`` what it builds while it starts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil

MARK_ENV = "ENGINEROOM_MANAGED"
# the programs that build kernels: CUDA's compiler and its stages, the host compiler's, ninja (an engine's first
# start on a machine JIT-builds some: SGLang's with nvcc for minutes, Triton's with ptxas)
COMPILERS = frozenset({"nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "ninja", "cc1plus", "cc1"})


def mark(state_dir: Path, **fields: Any) -> str:
    """The value of ``MARK_ENV`` for an engine started for ``state_dir``."""
    return json.dumps({"state_dir": str(Path(state_dir).resolve()), **fields})


def find_marked(state_dir: Path) -> tuple[int, dict[str, Any], list[str], float] | None:
    """(pid, mark, argv, start time) of the session leader of this user whose mark names
    ``state_dir`` and which listens on the mark's port (or on nothing yet: still loading)."""
    here = str(Path(state_dir).resolve())
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            uids = proc.info["uids"]
            if uids is not None and uids.real != os.getuid():
                continue
            if os.getsid(proc.pid) != proc.pid:
                continue
            raw = proc.environ().get(MARK_ENV)
            if not raw:
                continue
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("state_dir") != here:
                continue
            port = str(int(data["port"]))
            bound = bound_addresses(proc.pid)
            if bound and not any(b.rsplit(":", 1)[-1] == port for b in bound):
                continue
            return proc.pid, data, proc.cmdline(), proc.create_time()
        except (psutil.Error, OSError, ValueError, KeyError, TypeError):
            continue
    return None


def bound_addresses(pid: int) -> list[str]:
    """``host:port`` of every TCP socket the process tree of ``pid`` listens on, sorted."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found: set[str] = set()
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
        except psutil.Error:
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr:
                host = conn.laddr.ip
                found.add(f"[{host}]:{conn.laddr.port}" if ":" in host else f"{host}:{conn.laddr.port}")
    return sorted(found)


def compiling(pid: int) -> tuple[str, float] | None:
    """The compiler (``COMPILERS``) that has run longest among ``pid``'s descendants, and for how many seconds;
    None when none runs (or the process is gone)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    now, found = time.time(), []
    for child in children:
        try:
            name, created = child.name(), child.create_time()
        except psutil.Error:
            continue
        if name in COMPILERS:
            found.append((now - created, name))
    if not found:
        return None
    age, name = max(found)
    return name, max(age, 0.0)


__all__ = ["COMPILERS", "MARK_ENV", "bound_addresses", "compiling", "find_marked", "mark"]
