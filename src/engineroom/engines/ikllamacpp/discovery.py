"""Finding and building ik_llama.cpp's llama-server: `engines install ik_llama.cpp`, $ENGINEROOM_IK_LLAMA_SERVER.

The fork's server is built from the ``ik-llama-cpp-python`` source package on PyPI (it vendors the
whole ik_llama.cpp tree under ``vendor/ik_llama.cpp``) or from a tree the user points to. The
llama.cpp ``llama-server`` on PATH is never taken: it has the same name but is another engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ... import paths
from ...errors import BadInput, EngineFailed, NotFound
from ..installs import MANIFEST, engine_root, given_program, read_manifest
from ..llamacpp.discovery import (  # the fork's server has mainline's name and --version line
    BINARY,
    Binary,
    build_server,
    builds_in,
    server_version,
)

ENGINE = "ik_llama.cpp"
ENV_BINARY = "ENGINEROOM_IK_LLAMA_SERVER"
SOURCE_PACKAGE = "ik-llama-cpp-python"   # PyPI source package vendoring ik_llama.cpp's full tree
SOURCE_VERSION = "0.1.5"
# shown while it builds (benchmarks/ik_llamacpp_cpu.md: measured at -j2)
EXPECTED_BUILD = "about 13 minutes on 2 cores, less with more"


def install_root() -> Path:
    return engine_root(ENGINE)


def installed() -> list[dict]:
    """Manifests of the builds `engineroom engines install ik_llama.cpp` made, newest first."""
    return builds_in(install_root())


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


def source_tree(version: str, source: Path | None, say: Callable[[float | None, str], None]
                ) -> tuple[Path, dict[str, object], str]:
    """The fork's tree to build (``source``, or the ``ik-llama-cpp-python`` sdist of ``version`` from PyPI,
    unpacked once into the cache), the origin the manifest records, and the install folder's tag."""
    from .. import build

    where, origin, tag = build.fetch_source(source, SOURCE_PACKAGE, version, sdist_tag=f"v{version}", progress=say)
    if where.is_file():
        unpacked = paths.cache_dir() / "build" / f"{ENGINE}-{tag}" / "src"
        stamp = unpacked / ".engineroom-unpacked"
        if not (stamp.is_file() and stamp.read_text() == str(origin.get("sha256", where))):
            say(None, f"unpacking {where.name}")
            build.unpack(where, unpacked)
            stamp.write_text(str(origin.get("sha256", where)))
        tops = [p for p in unpacked.iterdir() if p.is_dir()]
        tree = _tree_of(tops[0] if len(tops) == 1 else unpacked)
    else:
        tree = _tree_of(where)
    write_build_info(tree, version)
    return tree, origin, tag


def record(dest: Path, manifest: dict) -> dict:
    """Write ``dest``'s install.json; a rebuild that found everything built keeps what the full build took."""
    previous = read_manifest(dest / MANIFEST)
    if previous.get("first_build_seconds") or previous.get("build_seconds"):
        manifest["first_build_seconds"] = previous.get("first_build_seconds") or previous["build_seconds"]
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def install(*, version: str | None = None, source: Path | None = None, jobs: int | None = None,
            cuda: bool | None = None, progress: Callable[[float | None, str], None] | None = None) -> dict:
    """Build ik_llama.cpp's llama-server for this machine; returns the manifest it records (install.json).

    Source: ``source`` (an ik_llama.cpp tree, an unpacked ik-llama-cpp-python sdist or its .tar.gz)
    or the ``ik-llama-cpp-python`` sdist from PyPI. A second call for the same source reuses the
    build folder (CMake/Ninja rebuild only what changed). ``install_prebuilt`` (prebuilt.py) builds the
    server alone against the kernels of the package's wheel.
    """
    say = progress or (lambda _f, _m: None)
    version = version or SOURCE_VERSION
    tree, origin, tag = source_tree(version, source, say)
    dest = install_root() / tag
    manifest = build_server(tree, dest, engine=ENGINE, version=version, tag=tag, origin=origin,
                            options_for=cmake_options, cuda=cuda, jobs=jobs, progress=say, guard=build_lock(dest))
    return record(dest, manifest)


@contextmanager
def build_lock(dest: Path) -> Iterator[None]:
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


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: explicit ``--engine-bin``, ``$ENGINEROOM_IK_LLAMA_SERVER``, engineroom's own build
    (`engineroom engines install ik_llama.cpp`). Never PATH: mainline llama.cpp's server has the same name."""
    given = given_program(explicit, ENV_BINARY, "ik_llama.cpp's llama-server")
    if given is not None:
        return Binary(given[0].resolve(), given[1], {})
    for manifest in installed():
        return Binary(Path(manifest["bin_dir"]) / BINARY, f"engineroom engines install ({manifest['tag']})", {})
    raise NotFound(
        "ik_llama.cpp's llama-server not found: build it with `engineroom engines install ik_llama.cpp`, "
        f"or pass --engine-bin / set ${ENV_BINARY}."
    )


def placeholder_binary(vendor: str = "cpu") -> Binary:
    """The binary's name alone, for a recipe printed where ik_llama.cpp is not installed: the build
    `engines install` makes for that machine (``vendor`` "nvidia": the CUDA build)."""
    return Binary(path=Path(BINARY), origin="not installed here", env={},
                  backend="cuda" if vendor == "nvidia" else "cpu")


def binary_version(binary: Binary, timeout: float = 20) -> str:
    """What ``llama-server --version`` says (``version: 0 (ik-llama-cpp-python-0.1.5)``), with the
    install tag when engineroom built it. Raises NotFound if the binary cannot run."""
    return server_version(binary, timeout, tag_prefix="v")
