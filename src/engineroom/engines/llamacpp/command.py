"""llama-server's command line: slots and unified KV always explicit, CPU workarounds, RoPE and KV
flags, API keys by file.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BadInput, NotFound
from ..argv import flag_value, has_flag, take_flags
from ..base import (
    LaunchChange,
    LaunchOptions,
    LaunchSpec,
    Settled,
)
from ..installs import read_manifest

if TYPE_CHECKING:
    from ...cpuprobe import CpuProbe


from .discovery import ENGINE, MANIFEST, Binary, binary_version

# --------------------------------------------------------------------------- launch
# Without -np llama-server picks its own slot count and unified setting (the catalog entry's
# default_parallel / default_kv_unified, with their source). engineroom always passes both
# explicitly, so `fit` sizes what runs.
MAX_SEQS = 256             # LLAMA_MAX_SEQ: llama_context refuses more ("n_seq_max must be <= 256")
NO_REPACK = "-nr"          # --no-repack: weights stay in the mmapped file, no CPU_REPACK / AMX buffers


def launch_defaults() -> tuple[int, bool]:
    """(slots, unified KV) llama-server runs with when no -np is given: its catalog entry's."""
    from ...catalog import find_engine, load_catalog

    e = find_engine(load_catalog(), ENGINE)
    return e.default_parallel, e.default_kv_unified


def slots_and_unified(parallel: int | None, kv_unified: bool | None) -> tuple[int, bool]:
    """The slot count and unified-KV setting a launch will use (the engine's defaults when unset)."""
    default_slots, default_unified = launch_defaults()
    slots = parallel if parallel else default_slots
    unified = default_unified if (kv_unified is None and not parallel) else bool(kv_unified)
    return slots, unified


def repack_disabled(args: Sequence[str]) -> bool:
    return (has_flag(args, "-nr", "--no-repack")
            or os.environ.get("LLAMA_ARG_REPACK", "").lower() in ("0", "false", "off"))


ROPE_SCALING_FLAGS = ("--rope-scaling", "--rope-scale", "--rope-freq-scale", "--yarn-orig-ctx")


def rope_scaling_arg(args: Sequence[str]) -> str | None:
    """The first RoPE-scaling argument among ``args`` (it lets -c exceed the model's trained context)."""
    return next((a for a in args if a.split("=")[0] in ROPE_SCALING_FLAGS), None)


def rope_scaling_example(factor: int) -> str:
    return f"--rope-scaling yarn --rope-scale {factor}"


def cpu_adjustments(probe: CpuProbe, extra_args: Sequence[str] = ()) -> list[LaunchChange]:
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


# llama-server keeps past prompts' KV cache in host RAM, its prompt cache (b11434
# tools/server/server-task.cpp; ik_llama.cpp has the same flag and default), up to --cache-ram MiB,
# 8,192 by default: none of it is allocated at load, it grows with requests, and fit's plan does not
# hold it. Where a launch leaves less than that of the host's usable memory (fit.usable_ram), the
# cache is capped there (0 turns it off); a user's own flag wins.
CACHE_RAM_FLAGS = ("-cram", "--cache-ram")
DEFAULT_CACHE_RAM_MIB = 8192


def host_cache_change(spare_bytes: int, extra_args: Sequence[str] = ()) -> LaunchChange | None:
    """``--cache-ram N`` where the launch leaves less than the default 8,192 MiB of usable host
    memory (N: what it leaves, in MiB; 0 turns the prompt cache off), else None."""
    if has_flag(extra_args, *CACHE_RAM_FLAGS) or spare_bytes >= DEFAULT_CACHE_RAM_MIB * 2**20:
        return None
    mib = max(int(spare_bytes // 2**20), 0)
    what = f"capped at {mib:,} MiB" if mib else "turned off (--cache-ram 0)"
    return LaunchChange((CACHE_RAM_FLAGS[1], str(mib)),
                        f"llama-server's prompt cache keeps past prompts' KV in host RAM as requests come, up to "
                        f"{DEFAULT_CACHE_RAM_MIB:,} MiB by default; this launch leaves {mib:,} MiB of the host's "
                        f"usable memory, so the cache is {what}", "host memory")


def crash_fallback(argv: Sequence[str], returncode: int) -> LaunchChange | None:
    """What to change after the server died by a signal while loading, or None (nothing left to try). A SIGILL
    or SIGSEGV at warm-up on the CPU is the signature of a repacked kernel using an instruction the machine
    traps (AMX under some hypervisors): relaunch once without repacking."""
    import signal as _signal

    if returncode not in (-_signal.SIGILL, -_signal.SIGSEGV) or repack_disabled(argv):
        return None
    if returncode == -_signal.SIGILL:     # the probe said AMX runs; this machine says otherwise: remembered
        from ...cpuprobe import remember_trap
        remember_trap("amx", "llama-server died by SIGILL at warm-up with its repacked (AMX) kernels although the "
                             "probe's AMX instructions ran")
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
        proc = subprocess.run([sys.executable, "-c", _COMPILED_PROBE, str(plain[0]),
                               json.dumps(list(_COMPILED_FEATURES))],
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


# the /proc/cpuinfo flags of instruction sets (-march=native may use any of the build machine's)
ISA_PREFIXES = ("avx", "sse", "ssse", "fma", "f16c", "bmi", "adx", "sha_ni", "vaes", "vpclmul", "gfni", "amx",
                "movbe", "popcnt", "abm", "aes", "pclmul")


def built_backend(binary: Binary) -> str:
    """The backend a llama.cpp-family build offloads to ("cuda", "cpu"; "" unknown): a stand-in's own, else
    what the install manifest beside an `engineroom engines install` build says."""
    if binary.backend:
        return binary.backend
    return str(read_manifest(binary.path.parent.parent.parent / MANIFEST).get("backend") or "")


def built_for_cpu(binary: Binary) -> dict | None:
    """The CPU an `engineroom engines install` build was compiled on (the manifest beside it), else None."""
    manifest = binary.path.parent.parent.parent / MANIFEST      # <tag>/install.json beside <tag>/build/bin
    return read_manifest(manifest).get("built_for_cpu")


def check_binary_cpu(binary: Binary, probe: CpuProbe) -> dict[str, object]:
    """Refuse, in one sentence, a llama-server compiled for instructions this machine cannot run.

    AMX is left out when it traps: ``cpu_adjustments`` launches without repacking, and AMX
    kernels only run on repacked weights. Returns what was checked, for the run's conditions.
    """
    from ...cpuprobe import FEATURES

    compiled, how = compiled_cpu_features(binary)
    if "<crashes on load>" in compiled:
        raise NotFound(f"{binary.path} cannot load its CPU backend on this machine ({how}); it was probably built "
                       "for another CPU: rebuild it here with `engineroom engines install llama.cpp`.")
    tolerated = set(FEATURES["amx"][1]) if "amx" in probe.traps else set()
    missing = sorted(compiled - probe.usable - tolerated) if probe.flags else []
    built_for = built_for_cpu(binary)
    if built_for and probe.flags and not missing:
        # -march=native may use any ISA extension of the build machine, not only those ggml reports
        isa = {f for f in built_for["usable_flags"] if f.startswith(ISA_PREFIXES)}
        missing = sorted(isa - probe.usable - tolerated)
    if missing:
        raise NotFound(f"{binary.path} was compiled for {', '.join(missing)}, which this CPU ({probe.model}) "
                       f"does not run (a build cached or copied from another machine?); rebuild it here with "
                       "`engineroom engines install llama.cpp`.")
    return {"compiled_features": sorted(compiled), "how": how}


# catalog KV type id -> llama-server's cache type name (-ctk / -ctv); f16 is its default
KV_CACHE_TYPES = {"f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q5_1": "q5_1", "q5_0": "q5_0",
                  "iq4_nl": "iq4_nl", "q4_1": "q4_1", "q4_0": "q4_0", "f32": "f32"}


# llama-server fits "unset arguments" to free device memory by default (b11434 common/arg.cpp: -fit on,
# --fit-target 1024 MiB per device; common/fit.cpp): when the launch would leave less than that free
# on a GPU it moves layers, or MoE experts, to the host (it cannot shrink a -c given explicitly), and
# without -c it shrinks the context; nothing in its answers says so. engineroom sizes every launch
# itself (fit, with the CUDA context and workspace), so it turns that off and checks the placement the
# engine logs after the launch (flows.serving.placement_check). A user's own fit flag wins.
FIT_FLAGS = ("-fit", "--fit", "-fitt", "--fit-target", "-fitc", "--fit-ctx")
FIT_OFF = ("-fit", "off")
FIT_OFF_WHY = ("-fit off: llama.cpp's own fitting (on by default, leaving 1024 MiB free per GPU) would move "
               "layers to the host or shrink the context where engineroom's plan packs the memory; engineroom "
               "sized this launch and checks the engine's placement after it starts")

# On every new task llama-server saves each idle slot to its host prompt cache (--cache-idle-slots, on by
# default with --cache-ram's 8,192 MiB; b11434 tools/server/server-context.cpp). With KV per slot (not
# unified) an idle slot's cache stays on the GPU anyway, so the copy only duplicates it; with many slots
# it is a device-to-host copy of every idle slot per request: on the H200 a 150-slot launch made 9,081
# saves of 468-737 MiB, about 0.3 s apart, and a 32-stream suite did not finish in 400 s
# (benchmarks/gpu_edge.md). engineroom turns it off for such launches; a user's own flag wins.
IDLE_SLOT_FLAGS = ("--cache-idle-slots", "--no-cache-idle-slots")
IDLE_SLOTS_OFF_WHY = ("--no-cache-idle-slots: each slot keeps its own KV cache on the device, so llama-server's "
                      "copy of every idle slot to host RAM on each new request duplicates it (and costs a "
                      "device-to-host copy per idle slot per request)")

# catalog spec method -> llama-server's --spec-type (b11434 common/speculative.cpp); MTP runs the
# model's own head (a GGUF with the MTP tensors), the draft methods need --spec-draft-model
SPEC_TYPE_FLAG = "--spec-type"
SPEC_TYPES = {"mtp": "draft-mtp", "dflash": "draft-dflash", "draft": "draft-simple", "eagle3": "draft-eagle3",
              "ngram": "ngram-simple"}
SPEC_N_MAX_FLAG = "--spec-draft-n-max"
SPEC_DRAFT_FLAG = "--spec-draft-model"
MMPROJ_FLAG = "--mmproj"


def spec_args(method: str, tokens: int | None, draft_model: str | None) -> list[str]:
    """llama-server's speculative-decoding flags for a catalog spec method."""
    kind = SPEC_TYPES.get(method)
    if kind is None:
        raise BadInput(f"llama.cpp has no speculative method {method!r}; it runs {', '.join(SPEC_TYPES)}.")
    if kind.startswith("draft-") and kind != "draft-mtp" and not draft_model:
        raise BadInput(f"speculative method {method} needs a GGUF drafter on llama.cpp; name its file, or use mtp "
                       "(the model's own MTP tensors) or ngram, which need none.")
    out = [SPEC_TYPE_FLAG, kind]
    if draft_model and kind != "draft-mtp":
        out += [SPEC_DRAFT_FLAG, str(draft_model)]
    if tokens:
        out += [SPEC_N_MAX_FLAG, str(tokens)]
    return out


def feature_args(options: LaunchOptions, extra: Sequence[str]) -> list[str]:
    """Speculative decoding and the vision projector of ``options`` (mainline and the fork alike)."""
    out: list[str] = []
    if options.spec_method and not has_flag(extra, SPEC_TYPE_FLAG):
        out += spec_args(options.spec_method, options.spec_tokens, options.draft_model)
    if options.vision and not has_flag(extra, MMPROJ_FLAG, "-mm"):
        if options.projector is None:
            raise BadInput("vision on llama.cpp needs the model's projector file (mmproj GGUF); name it, or serve "
                           "the model text-only.")
        out += [MMPROJ_FLAG, str(options.projector)]
    return out


def head_args(binary: Binary, o: LaunchOptions, slots: int, extra: Sequence[str]) -> list[str]:
    """The start of a llama.cpp-family command line (mainline's and the fork's common arguments): the
    model, host and port, the served name, ``-c``, threads and the slot count, always explicit."""
    argv: list[str] = [str(binary.path), "-m", str(Path(o.model_path)), "--host", o.host, "--port", str(o.port)]
    if o.model_name:
        argv += ["-a", o.model_name]        # /v1/models id = the user's name, not a home path
    if o.ctx:
        argv += ["-c", str(o.ctx * slots)]   # -c is the whole cache: every slot holds ctx tokens
    if o.threads:
        argv += ["-t", str(o.threads)]
    if not has_flag(extra, "-np", "--parallel"):
        argv += ["-np", str(slots)]
    return argv


def cache_split_args(o: LaunchOptions, extra: Sequence[str], kv_types: Mapping[str, str], engine: str) -> list[str]:
    """``-ctk``/``-ctv`` for the KV type (f16, the family's default, passes none; BadInput for a type
    ``kv_types`` lacks) and ``-sm layer`` over several GPUs, each unless the user's arguments give it."""
    argv: list[str] = []
    if o.kv_dtype and o.kv_dtype != "f16" and not has_flag(extra, "-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
        try:
            cache = kv_types[o.kv_dtype]
        except KeyError:
            raise BadInput(f"{engine} has no KV cache type {o.kv_dtype!r}; "
                           f"it has {', '.join(kv_types)}.") from None
        argv += ["-ctk", cache, "-ctv", cache]
    if o.tp > 1 and not has_flag(extra, "-sm", "--split-mode"):
        argv += ["-sm", "layer"]            # llama.cpp splits layers over the GPUs it sees
    return argv


def family_spec(engine: str, binary: Binary, o: LaunchOptions, argv: Sequence[str], version: str,
                notes: tuple[str, ...] = ()) -> LaunchSpec:
    """The LaunchSpec of a rendered llama.cpp-family command line (health on /health)."""
    model_path = Path(o.model_path)
    return LaunchSpec(
        engine=engine, argv=tuple(argv), port=o.port, host=o.host, env=dict(binary.env),
        log_path=o.log_path, model=o.model_name or str(model_path), model_path=str(model_path),
        health_path="/health", engine_version=version, changes=tuple(c.as_dict() for c in o.changes), notes=notes,
    )


def render(binary: Binary, options: LaunchOptions) -> LaunchSpec:
    """The llama-server command line for ``options``; nothing is started here.

    The slot count and unified-KV setting are always explicit (``slots_and_unified``), so
    ``fit`` sizes what runs; ``options.changes`` are arguments engineroom adds for this
    machine, recorded with their reason; the user's own arguments come last, verbatim.
    """
    o = options
    extra = list(o.extra_args)
    slots, unified = slots_and_unified(o.parallel, o.kv_unified)
    argv = head_args(binary, o, slots, extra)
    if not has_flag(extra, "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"):
        argv += ["--kv-unified" if unified else "--no-kv-unified"]
    argv += cache_split_args(o, extra, KV_CACHE_TYPES, ENGINE)
    if o.chat_template:
        if not Path(o.chat_template).is_file():
            raise BadInput(f"chat template file {o.chat_template} does not exist.")
        argv += ["--jinja", "--chat-template-file", str(o.chat_template)]
    argv += feature_args(o, extra)
    if o.api_key_file:
        argv += api_key_file_args(o.api_key_file)
    argv += ["--metrics", "-lv", "4"]   # -lv 4: log model / KV / compute buffer sizes (the fit oracle)
    notes: tuple[str, ...] = ()
    if not has_flag(extra, *FIT_FLAGS):
        argv += list(FIT_OFF)
        notes = (FIT_OFF_WHY,)
    if slots > 1 and not unified and not has_flag(extra, *IDLE_SLOT_FLAGS):
        argv += [IDLE_SLOT_FLAGS[1]]
        notes += (IDLE_SLOTS_OFF_WHY,)
    for change in o.changes:
        argv += list(change.args)
    argv += extra
    return family_spec(ENGINE, binary, o, argv, version_or_blank(binary, binary_version), notes)


def container_command(spec: LaunchSpec) -> list[str]:
    """The arguments after the image's entrypoint: the official server images run llama-server
    itself (ENTRYPOINT /app/llama-server), so everything after the program, unchanged."""
    return [str(a) for a in spec.argv[1:]]


def gguf_refusal(path: Path, engine: str, folder_advice: str) -> str | None:
    """Why a llama.cpp-family server (``engine``) cannot serve ``path`` (one sentence), or None: it
    serves one GGUF file (``folder_advice``: what to do with a model folder instead)."""
    if path.is_dir():
        return f"{path} is a model folder; {engine} serves one GGUF file ({folder_advice})."
    if not path.is_file():
        return f"{path} is not a file; {engine} serves one GGUF file."
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror})."
    if magic != b"GGUF":
        return f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); {engine} serves GGUF files."
    return None


def loads_refusal(path: Path) -> str | None:
    """Why llama-server cannot serve ``path`` (one sentence), or None: it serves one GGUF file."""
    return gguf_refusal(path, ENGINE, "name the .gguf, or convert the folder")


def family_settings(options: LaunchOptions, trained_ctx: int | None, *, slots: int, unified: bool,
                    repack_disabled: Callable[[Sequence[str]], bool]) -> Settled:
    """What a llama.cpp-family server runs with, in fit's words, for the slots and unified KV its
    engine settles on: ``ctx`` per sequence (``-c`` is ctx x slots; without it the server sizes the
    cache for the model's trained context, shared by the slots), ``-ctk``'s KV type, repacking as
    ``repack_disabled`` reads the added and the user's arguments, RoPE scaling, ``-ub`` / ``-b`` and
    flash attention as the user's arguments give them."""
    args = [a for c in options.changes for a in c.args] + list(options.extra_args)
    ctk = flag_value(options.extra_args, "-ctk", "--cache-type-k")
    ctx = options.ctx if options.ctx is not None else (max(1, trained_ctx // slots) if trained_ctx else None)
    ubatch, batch = batch_sizes(options.extra_args)
    return Settled(ctx=ctx, parallel=slots, kv_unified=unified, kv_dtype=ctk or options.kv_dtype or "f16",
                   repack=not repack_disabled(args), rope_scaling=rope_scaling_arg(options.extra_args),
                   ubatch=ubatch, batch=batch, flash_attn=flash_attn_on(options.extra_args))


def launch_settings(options: LaunchOptions, trained_ctx: int | None = None) -> Settled:
    """What llama-server will run with for ``options``, in fit's words (FitRequest fields).

    ``ctx`` is per sequence: ``-c`` is ctx x slots, so every slot holds ``ctx`` tokens (unified:
    any one slot may hold all of them). Without ``-c`` llama-server sizes the whole cache for the
    model's trained context, shared by the slots. Repacking is off when ``-nr`` is among the arguments.
    """
    slots, unified = slots_and_unified(options.parallel, options.kv_unified)
    return family_settings(options, trained_ctx, slots=slots, unified=unified, repack_disabled=repack_disabled)


FLASH_ATTN_FLAGS = ("-fa", "--flash-attn")


def flash_attn_on(args: Sequence[str]) -> bool:
    """Whether flash attention runs: llama-server's `-fa` is on, off or auto (its default, which resolves
    to on for the CPU and CUDA backends engineroom launches)."""
    value = flag_value(args, *FLASH_ATTN_FLAGS)
    return (value or "auto").lower() not in ("off", "0", "false", "disabled")


UBATCH_FLAGS = ("-ub", "--ubatch-size")
BATCH_FLAGS = ("-b", "--batch-size")
DEFAULT_UBATCH, DEFAULT_BATCH = 512, 2048      # llama-server's (common/common.h: n_ubatch, n_batch)


def batch_sizes(args: Sequence[str]) -> tuple[int, int]:
    """(-ub, -b) the arguments give, else llama-server's defaults; BadInput for a value that is not
    a positive number (llama-server would refuse it at start)."""
    out = []
    for flags, default in ((UBATCH_FLAGS, DEFAULT_UBATCH), (BATCH_FLAGS, DEFAULT_BATCH)):
        text = flag_value(args, *flags)
        try:
            value = int(text) if text is not None else default
        except ValueError:
            value = 0
        if value < 1:
            raise BadInput(f"{flags[0]} {text} is not a positive number of tokens.")
        out.append(value)
    return out[0], out[1]


def relaunch_spec(spec: LaunchSpec, change: LaunchChange) -> LaunchSpec:
    """``spec`` with ``change``'s arguments appended and the change recorded."""
    from dataclasses import replace

    return replace(spec, argv=tuple(spec.argv) + tuple(change.args), changes=tuple(spec.changes) + (change.as_dict(),))


def version_or_blank(binary: Binary, binary_version: Callable[..., str]) -> str:
    """The version for a run's conditions (``binary_version``: the engine's reading of it); a binary
    that cannot run is reported when it starts."""
    if not binary.path.is_absolute():
        return ""                        # a recipe's placeholder: nothing to ask
    try:
        return binary_version(binary, timeout=10)
    except NotFound:
        return ""




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
    rest, given = take_flags(args, API_KEY_FLAG, API_KEY_FILE_FLAG)
    return rest, given.get(API_KEY_FLAG), given.get(API_KEY_FILE_FLAG)


def api_key_file_in(argv: Sequence[str]) -> str | None:
    """The key file a running llama-server was given (from its argv), or None: it wants no key."""
    return split_api_key(argv)[2]
