"""Finding and building ik_llama.cpp's llama-server: `engines install ik_llama.cpp`, $ENGINEROOM_IK_LLAMA_SERVER.

The fork's server is built from the ``ik-llama-cpp-python`` source package on PyPI (it vendors the
whole ik_llama.cpp tree under ``vendor/ik_llama.cpp``) or from a tree the user points to. The
llama.cpp ``llama-server`` on PATH is never taken: it has the same name but is another engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ... import paths
from ...errors import BadInput, EngineFailed, NotFound
from ..llamacpp.discovery import Binary, detect_cuda_arch

ENGINE = "ik_llama.cpp"
BINARY = "llama-server"
ENV_BINARY = "ENGINEROOM_IK_LLAMA_SERVER"
SOURCE_PACKAGE = "ik-llama-cpp-python"   # PyPI source package vendoring ik_llama.cpp's full tree
SOURCE_VERSION = "0.1.5"
BUILD_TARGETS = ("llama-server",)
MANIFEST = "install.json"
JOBS_ENV = "LLAMA_CPP_BUILD_JOBS"
# shown while it builds (benchmarks/ik_llamacpp_cpu.md: measured at -j2)
EXPECTED_BUILD = "about 13 minutes on 2 cores, less with more"


def install_root() -> Path:
    return paths.data_dir() / "engines" / ENGINE


def installed() -> list[dict]:
    """Manifests of the builds `engineroom engines install ik_llama.cpp` made, newest first."""
    out = []
    for manifest in sorted(install_root().glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if (Path(data.get("bin_dir", "")) / BINARY).is_file():
            out.append(data)
    return out


def cmake_options(*, cuda_arch: str | None) -> list[str]:
    """Native CPU code, the server only (the fork builds it as an example), no network, no tests."""
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF",
            "-DLLAMA_SERVER_SSL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    if cuda_arch:
        opts += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", "-DGGML_NCCL=OFF"]
    return opts


def _tree_of(root: Path) -> Path:
    """The ik_llama.cpp tree inside an unpacked sdist (vendor/ik_llama.cpp) or the tree itself."""
    for cand in (root / "vendor" / "ik_llama.cpp", root / "ik_llama.cpp", root):
        if (cand / "CMakeLists.txt").is_file() and (cand / "examples" / "server").is_dir():
            return cand
    raise BadInput(f"{root} is not an ik_llama.cpp source tree (no CMakeLists.txt with examples/server).")


# What common/CMakeLists.txt runs to regenerate build-info.cpp (ninja runs it once, having no log
# entry for the output): the sdist lacks this script too, so engineroom's keeps the file it wrote.
_GENERATOR = """# Written by engineroom: the ik-llama-cpp-python sdist ships neither git metadata nor this generator.
set(OUTPUT_FILE "${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp")
if(NOT EXISTS "${OUTPUT_FILE}")
    set(BUILD_NUMBER 0)
    set(BUILD_COMMIT "@COMMIT@")
    set(BUILD_COMPILER "unknown")
    set(BUILD_TARGET "unknown")
    configure_file("${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in" "${OUTPUT_FILE}")
endif()
"""


def write_build_info(tree: Path, version: str) -> Path | None:
    """Supply ``common/build-info.cpp``, which the sdist lacks (it is generated from git, and neither
    the git metadata nor the generator script ship): filled from the tree's template with the
    package version, plus a generator script that keeps it. Returns the file written (None: both there)."""
    target = tree / "common" / "build-info.cpp"
    template = tree / "common" / "build-info.cpp.in"
    generator = tree / "common" / "cmake" / "build-info-gen-cpp.cmake"
    commit = f"{SOURCE_PACKAGE}-{version}"
    if not generator.is_file() and template.is_file():
        generator.parent.mkdir(parents=True, exist_ok=True)
        generator.write_text(_GENERATOR.replace("@COMMIT@", commit))
    if target.is_file() or not template.is_file():
        return None
    import platform

    values = {"BUILD_NUMBER": "0", "BUILD_COMMIT": commit, "BUILD_COMPILER": "unknown",
              "BUILD_TARGET": f"{platform.machine()}-linux"}
    text = template.read_text()
    for key, val in values.items():
        text = text.replace(f"@{key}@", val)
    target.write_text(text)
    return target


def install(*, version: str | None = None, source: Path | None = None, jobs: int | None = None,
            cuda: bool | None = None, progress: Callable[[float | None, str], None] | None = None) -> dict:
    """Build ik_llama.cpp's llama-server for this machine; returns the manifest it records (install.json).

    Source: ``source`` (an ik_llama.cpp tree, an unpacked ik-llama-cpp-python sdist or its .tar.gz)
    or the ``ik-llama-cpp-python`` sdist from PyPI. A second call for the same source reuses the
    build folder (CMake/Ninja rebuild only what changed).
    """
    from ... import pypi
    from ...cpuprobe import probe_cpu
    from .. import build

    say = progress or (lambda _f, _m: None)
    version = version or SOURCE_VERSION
    if source is not None:
        source = Path(source).expanduser()
        if not source.exists():
            raise NotFound(f"--source {source} does not exist.")
        origin: dict[str, object] = {"path": str(source.resolve())}
        archive = source if source.is_file() else None
        tag = "source-" + hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:8]
    else:
        archive = build.fetch_sdist(SOURCE_PACKAGE, version, say)
        origin = {"package": SOURCE_PACKAGE, "version": version, "sha256": pypi.sha256_file(archive)}
        tag = f"v{version}"
    dest = install_root() / tag
    if archive is not None:
        unpacked = paths.cache_dir() / "build" / f"{ENGINE}-{tag}" / "src"
        stamp = unpacked / ".engineroom-unpacked"
        if not (stamp.is_file() and stamp.read_text() == str(origin.get("sha256", archive))):
            say(None, f"unpacking {archive.name}")
            build.unpack(archive, unpacked)
            stamp.write_text(str(origin.get("sha256", archive)))
        tops = [p for p in unpacked.iterdir() if p.is_dir()]
        tree = _tree_of(tops[0] if len(tops) == 1 else unpacked)
    else:
        assert source is not None
        tree = _tree_of(source)
    write_build_info(tree, version)
    cuda_arch = detect_cuda_arch() if cuda is None or cuda else None
    if cuda and not cuda_arch:
        raise NotFound("--cuda needs nvcc on PATH and an NVIDIA GPU that NVML can see.")
    opts = cmake_options(cuda_arch=cuda_arch)
    jobs = jobs or int(os.environ.get(JOBS_ENV) or 0) or os.cpu_count() or 1
    dest.mkdir(parents=True, exist_ok=True)
    build_dir = dest / "build"
    log_path = dest / "build.log"
    with _build_lock(dest):
        seconds = build.cmake_build(tree, build_dir, opts, BUILD_TARGETS, jobs=jobs, log_path=log_path,
                                    progress=say)
    bin_dir = build_dir / "bin"
    if not (bin_dir / BINARY).is_file():
        raise EngineFailed(f"the build finished but {bin_dir / BINARY} is missing; full log: {log_path}")
    probe = probe_cpu()
    previous = _read_manifest(dest / MANIFEST)
    manifest = {
        "engine": ENGINE, "version": version, "tag": tag, "origin": origin, "bin_dir": str(bin_dir),
        "cmake_options": opts, "targets": list(BUILD_TARGETS), "jobs": jobs, "build_seconds": round(seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": "cuda" if cuda_arch else "cpu",
        "cuda_arch": cuda_arch, "built_for_cpu": {"model": probe.model, "usable_flags": sorted(probe.usable)},
        "build_log": str(log_path),
    }
    if previous.get("first_build_seconds") or previous.get("build_seconds"):
        # a rebuild that found everything built: keep what the full build took
        manifest["first_build_seconds"] = previous.get("first_build_seconds") or previous["build_seconds"]
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


@contextmanager
def _build_lock(dest: Path) -> Iterator[None]:
    """One build per install folder at a time: a second `engines install` would rebuild the same
    objects under the first one's feet (and truncate its log)."""
    import fcntl

    with open(dest / ".build.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise EngineFailed(f"another build of {ENGINE} is running in {dest}; wait for it to finish "
                               "(its progress is in build.log there).") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_manifest(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: explicit ``--engine-bin``, ``$ENGINEROOM_IK_LLAMA_SERVER``, engineroom's own build
    (`engineroom engines install ik_llama.cpp`). Never PATH: mainline llama.cpp's server has the same name."""
    for value, where in ((explicit, "--engine-bin"), (os.environ.get(ENV_BINARY), f"${ENV_BINARY}")):
        if value:
            path = Path(value).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise NotFound(f"ik_llama.cpp's llama-server given by {where} ({path}) is not an executable file.")
            return Binary(path.resolve(), where, {})
    for manifest in installed():
        return Binary(Path(manifest["bin_dir"]) / BINARY, f"engineroom engines install ({manifest['tag']})", {})
    raise NotFound(
        "ik_llama.cpp's llama-server not found: build it with `engineroom engines install ik_llama.cpp`, "
        f"or pass --engine-bin / set ${ENV_BINARY}."
    )


def placeholder_binary() -> Binary:
    """The binary's name alone, for a recipe printed where ik_llama.cpp is not installed."""
    return Binary(path=Path(BINARY), origin="not installed here", env={})


def binary_version(binary: Binary, timeout: float = 20) -> str:
    """What ``llama-server --version`` says (``version: 0 (ik-llama-cpp-python-0.1.5)``), with the
    install tag when engineroom built it. Raises NotFound if the binary cannot run."""
    try:
        proc = subprocess.run([str(binary.path), "--version"], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **binary.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotFound(f"{binary.path} does not run ({exc}).") from exc
    out = proc.stdout + proc.stderr
    match = re.search(r"version:\s*(.+)", out)
    if proc.returncode != 0 or not match:
        last = out.strip().splitlines()[-1:] or ["no output"]
        raise NotFound(f"{binary.path} --version failed: {last[0]}")
    version = match.group(1).strip()
    if binary.origin.startswith("engineroom engines install"):
        tag = binary.origin.split("(")[-1].rstrip(")")
        version = f"{tag} [{version}]" if tag.startswith("v") else version
    return version
