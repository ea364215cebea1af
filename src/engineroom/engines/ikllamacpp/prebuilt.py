"""ik_llama.cpp's server built against the kernels of the package's own wheel: `engines install ik_llama.cpp
--prebuilt`.

The ``ik-llama-cpp-python`` wheel for Linux ships ggml, the fork's compute library (its IQK matrix
multiplications and FlashAttention for every head size and KV type), compiled once for any x86-64 CPU with
AVX2 (the package's README: "CPU (AVX2)"; its code has FMA and F16C, no AVX-512) or for generic aarch64.
Those kernels are most of the fork's compile time. ``install_prebuilt`` compiles only libllama, common and
the server, from the sdist of the same release (its ggml headers are byte for byte the wheel's), and links
them to the wheel's ggml, which it copies beside the build with the OpenMP library the wheel bundles: the
server finds both through its RPATH, so the install needs no environment and can be copied to another
machine of that kind. The trade: portable kernels instead of ones compiled for this CPU (-march=native);
benchmarks/ik_prebuilt.md measures both.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from ... import paths, pypi
from ...errors import BadInput, EngineFailed, NotFound
from ..llamacpp.discovery import BINARY, build_server
from .discovery import ENGINE, SOURCE_PACKAGE, SOURCE_VERSION, build_lock, install_root, record, source_tree

# what the wheel's kernels need of the CPU, per machine (read from its code: AVX2, FMA and F16C instructions,
# no AVX-512); a CPU without them is refused before anything is downloaded
WHEEL_ISA = {"x86_64": ("avx", "avx2", "f16c", "fma"), "aarch64": ()}
TAG_SUFFIX = "-prebuilt"     # v0.1.5-prebuilt beside the native build's v0.1.5
HOW = "the kernels of the package's wheel (portable, not -march=native)"
EXPECTED_PREBUILT = "about 3 minutes on 2 cores, less with more"   # benchmarks/ik_prebuilt.md

# The project engineroom writes around the fork's tree: ggml is the wheel's library (the fork's top-level
# CMakeLists.txt adds its own ggml only when no target of that name exists), the tree's top folder is on
# the include path (the server includes src/llama-impl.h from there).
PROJECT = """# Written by engineroom: ik_llama.cpp's server against the ggml of the ik-llama-cpp-python wheel.
cmake_minimum_required(VERSION 3.14)
project(engineroom-ik-server C CXX)
add_library(ggml SHARED IMPORTED)
set_target_properties(ggml PROPERTIES IMPORTED_LOCATION "@GGML@" INTERFACE_INCLUDE_DIRECTORIES "@TREE@/ggml/include")
include_directories("@TREE@")
add_subdirectory("@TREE@" ik)
"""


def cmake_options(*, cuda_arch: str | None) -> list[str]:
    """The server only, no network; no warning flags (the fork takes them from ggml's CMake, which this build
    does not include); the libraries found beside the build through an RPATH the loader also applies to
    their own dependencies (ggml's OpenMP)."""
    if cuda_arch:
        raise BadInput("--prebuilt takes the wheel's CPU kernels and builds no CUDA; drop --prebuilt to build "
                       "for the GPU.")
    return ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_ALL_WARNINGS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_SERVER_SSL=OFF",
            "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_BUILD_RPATH=$ORIGIN/../../lib",
            "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags"]


def wheel_isa() -> tuple[str, ...]:
    """What the wheel's kernels need of this machine's kind of CPU; BadInput where there is no such wheel."""
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in WHEEL_ISA:
        raise BadInput(f"--prebuilt takes the kernels of the package's Linux x86_64 or aarch64 wheel; on "
                       f"{sys.platform} {machine} build them here: drop --prebuilt.")
    return WHEEL_ISA[machine]


def refusal_on_this_cpu(isa: tuple[str, ...]) -> str | None:
    """Why the wheel's kernels cannot run on this CPU (it lacks an instruction set they use), or None."""
    from ...cpuprobe import probe_cpu

    probe = probe_cpu()
    missing = [f for f in isa if probe.flags and f not in probe.usable]
    if missing:
        return (f"the wheel's kernels need {', '.join(missing)}, which this CPU ({probe.model}) does not run; "
                "build them for it: drop --prebuilt.")
    return None


def kernel_libraries(wheel: Path, into: Path) -> Path:
    """Copy the wheel's ggml and the libraries it loads (those auditwheel bundled under ``*.libs/``, but its
    libllama: the server links the one built here) into ``into``; returns ggml's path."""
    into.mkdir(parents=True, exist_ok=True)
    ggml: Path | None = None
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            folder, _, name = member.rpartition("/")
            if not folder.endswith(".libs") or "/" in folder or ".so" not in name or name.startswith("libllama"):
                continue
            target = into / name
            target.write_bytes(zf.read(member))
            if name.startswith("libggml"):
                ggml = target
    if ggml is None:
        raise NotFound(f"{wheel.name} carries no ggml library under *.libs/; build the kernels here: drop --prebuilt.")
    return ggml


def install_prebuilt(*, version: str | None = None, jobs: int | None = None,
                     progress: Callable[[float | None, str], None] | None = None) -> dict:
    """Build the fork's llama-server against the wheel's kernels (see the module's text); returns the manifest it
    records. The wheel and the sdist are the same release, checked against PyPI's sha256."""
    say = progress or (lambda _f, _m: None)
    version = version or SOURCE_VERSION
    isa = wheel_isa()
    refusal = refusal_on_this_cpu(isa)
    if refusal:
        raise BadInput(refusal)
    tree, origin, tag = source_tree(version, None, say)
    tag += TAG_SUFFIX
    wheel = pypi.download(SOURCE_PACKAGE, version, "bdist_wheel", paths.cache_dir() / "sources", say,
                          for_this_machine=True)
    dest = install_root() / tag
    dest.mkdir(parents=True, exist_ok=True)
    with build_lock(dest):
        ggml = kernel_libraries(wheel, dest / "lib")
        project = dest / "project"
        project.mkdir(exist_ok=True)
        (project / "CMakeLists.txt").write_text(PROJECT.replace("@GGML@", ggml.as_posix())
                                                .replace("@TREE@", tree.as_posix()))
        manifest = build_server(project, dest, engine=ENGINE, version=version, tag=tag, origin=origin,
                                options_for=cmake_options, cuda=False, jobs=jobs, progress=say)
    server = Path(manifest["bin_dir"]) / BINARY
    try:
        done = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineFailed(f"the server built against {wheel.name}'s kernels does not start ({exc}).") from None
    if done.returncode != 0:
        raise EngineFailed(f"the server built against {wheel.name}'s kernels does not start: "
                           f"{(done.stderr or done.stdout).strip()[-300:]}")
    manifest["kernels"] = {"from": wheel.name, "sha256": pypi.sha256_file(wheel), "how": HOW}
    manifest["built_for_cpu"] = {"model": f"any {platform.machine()} CPU" + (f" with {', '.join(isa)}" if isa else ""),
                                 "usable_flags": list(isa), "how": HOW}
    return record(dest, manifest)
