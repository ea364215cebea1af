"""SGLang's command line (``python -m sglang.launch_server``): what was sized is passed explicitly,
KV and speculative names translated from the catalog's, API keys by file, multi-node recipes.

Flag names are SGLang 0.5.23's (``sglang/srt/arg_groups/fields/*.py``, registered by
``ServerArgs.add_cli_args``); ``validate.validate_argv`` checks a rendered command line with
that parser itself.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ... import apikey
from ...arch import arch_from_config
from ...errors import BadInput
from ..argv import flag_value, has_flag, take_flags
from ..base import LaunchOptions, LaunchSpec, Settled
from ..hffolder import (
    dummy_loading,
    dummy_weights,
    folder_config,
    folder_config_refusal,
    folder_of,
    int4_quant,
    is_gguf,
    random_weights_file,
)
from .discovery import ENGINE, MODULE, Binary, find_binary

DEFAULT_PORT = 30000          # SGLang's own default; engineroom always passes --port
DIST_PORT = 20000             # the head's rendezvous port in SGLang's multi-node examples

# catalog KV type id (catalog/engines/sglang.yaml) -> SGLang's --kv-cache-dtype name. "f16" is
# FitRequest's default and the catalog's alias of "auto" (the model's own dtype).
KV_CACHE_DTYPES = {"auto": "auto", "f16": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
                   "fp8": "fp8_e4m3", "bf16": "bf16", "fp4_e2m1": "fp4_mx_block16"}
# every choice SGLang 0.5.23's --kv-cache-dtype takes (a user may name one directly)
SGLANG_KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")

# catalog spec method -> SGLang's --speculative-algorithm
SPEC_ALGORITHMS = {"mtp": "NEXTN", "nextn": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM",
                   "dflash": "DFLASH", "draft_model": "STANDALONE", "standalone": "STANDALONE"}
NEEDS_DRAFT_MODEL = frozenset({"EAGLE", "EAGLE3", "DFLASH", "STANDALONE"})   # NEXTN uses the model's own MTP layers
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})

MODEL_FLAG = "--model-path"
CONTEXT_FLAG = "--context-length"
SEQS_FLAG = "--max-running-requests"
TP_FLAG = "--tp-size"
PP_FLAG = "--pp-size"
KV_FLAG = "--kv-cache-dtype"
MEM_FLAG = "--mem-fraction-static"
METRICS_FLAG = "--enable-metrics"
NAME_FLAG = "--served-model-name"
TOOL_FLAG = "--tool-call-parser"
REASONING_FLAG = "--reasoning-parser"
TEMPLATE_FLAG = "--chat-template"
TEMPLATE_KWARGS_FLAG = "--default-chat-template-kwargs"
SPEC_FLAG = "--speculative-algorithm"
DRAFT_FLAG = "--speculative-draft-model-path"
STEPS_FLAG = "--speculative-num-steps"
TOPK_FLAG = "--speculative-eagle-topk"
DRAFT_TOKENS_FLAG = "--speculative-num-draft-tokens"
NNODES_FLAG = "--nnodes"
NODE_RANK_FLAG = "--node-rank"
DIST_ADDR_FLAG = "--dist-init-addr"
LOAD_FORMAT_FLAG = "--load-format"
SKIP_WARMUP_FLAG = "--skip-server-warmup"
MULTIMODAL_FLAG = "--enable-multimodal"
# the architectures SGLang serves text-only unless --enable-multimodal (ModelConfig's mm_disabled_models, 0.5.16 to
# 0.5.23); it builds every other checkpoint's vision tower: it has no text-only launch for them (--language-only is
# a worker of encoder disaggregation; 0.5.23's --language-model-only takes a few architectures, not Qwen3.5/3.6's)
MULTIMODAL_OFF = frozenset({"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                            "Step3VLForConditionalGeneration", "InklingForConditionalGeneration"})
DTYPE_FLAG = "--dtype"
# SGLang keeps a linear-attention or Mamba layer's conv state at bfloat16 whatever the model's dtype unless this says
# otherwise (configs/mamba_utils.py, 0.5.16 to 0.5.23). Beside float16 activations (a float16 checkpoint, most AWQ and
# GPTQ ones, and engineroom's random-weight folders) 0.5.16's Triton conv kernel does not compile: its branches load
# the columns at the two types (seen on the H100, 2026-12-06; sgl-project/sglang#19406; 0.5.23 casts the loads)
CONV_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"
# SGLang's --dtype names -> torch's (ModelConfig's _STR_DTYPE_TO_TORCH_DTYPE)
_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}
API_KEY_FLAG = "--api-key"
# not SGLang's: the launcher shim takes it off the command line and reads the file
API_KEY_FILE_FLAG = apikey.SHIM_KEY_FLAG

_ALIASES = {TP_FLAG: ("--tensor-parallel-size",), PP_FLAG: ("--pipeline-parallel-size",),
            DRAFT_FLAG: ("--speculative-draft-model",), DIST_ADDR_FLAG: ("--nccl-init-addr",)}

# SGLang 0.5.23 reads its API key from --api-key only (no environment variable, no key file;
# a --config YAML is merged back into the argv it logs). So with a key the command line is
# engineroom's launcher shim instead of `-m sglang.launch_server` (apikey.launcher_shim): the
# process's /proc cmdline, engineroom's state and logs hold the file's path only, and SGLang's
# log of its server_args has the key masked.
KEY_SHIM = apikey.launcher_shim(MODULE, API_KEY_FLAG)


def _names(flags: Sequence[str]) -> list[str]:
    """The flags with their aliases: SGLang's parser takes either spelling."""
    return [n for f in flags for n in (f, *_ALIASES.get(f, ()))]


def _has_flag(args: Sequence[str], *flags: str) -> bool:
    return has_flag(args, *_names(flags))


def _flag_value(args: Sequence[str], *flags: str) -> str | None:
    return flag_value(args, *_names(flags))


def _nearest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=1, cutoff=0.4)
    if not close:
        return ""
    orig = next(c for c in choices if c.lower() == close[0])
    return f" (nearest: {orig})"


def kv_cache_dtype(kv: str) -> str:
    """SGLang's --kv-cache-dtype for a catalog KV type id (or one of SGLang's own names)."""
    if kv in KV_CACHE_DTYPES:
        return KV_CACHE_DTYPES[kv]
    if kv in SGLANG_KV_DTYPES:
        return kv
    raise BadInput(f"SGLang has no KV cache type {kv!r}{_nearest(kv, list(KV_CACHE_DTYPES))}; "
                   f"it takes {', '.join(k for k in KV_CACHE_DTYPES if k != 'f16')}.")


def spec_algorithm(method: str) -> str:
    """SGLang's --speculative-algorithm for a catalog spec method (or SGLang's own upper-case name)."""
    key = method.strip().lower()
    if key in SPEC_ALGORITHMS:
        return SPEC_ALGORITHMS[key]
    raise BadInput(f"SGLang has no speculative method {method!r}{_nearest(key, list(SPEC_ALGORITHMS))}; "
                   f"it runs {', '.join(sorted(set(SPEC_ALGORITHMS) - {'nextn', 'standalone'}))}.")


def spec_args(method: str, tokens: int | None, draft_model: str | None) -> list[str]:
    """The speculative-decoding flags: the algorithm, its drafter, and how many tokens a step drafts.

    EAGLE family (EAGLE, EAGLE3, NEXTN = MTP, STANDALONE): ``tokens`` draft steps, top-1 chain,
    so ``tokens + 1`` tokens are verified. DFLASH: the verify block is ``tokens + 1`` (else SGLang
    infers it from the drafter's config). NGRAM: ``tokens`` drafted tokens.
    """
    algo = spec_algorithm(method)
    if algo in NEEDS_DRAFT_MODEL and not draft_model:
        raise BadInput(f"speculative method {method} ({algo}) needs a draft model on SGLang; name the drafter's "
                       "folder or repo, or use mtp (the model's own MTP layers) or ngram, which need none.")
    if tokens is not None and tokens < 1:
        raise BadInput(f"the speculative token count must be 1 or more, not {tokens}.")
    out = [SPEC_FLAG, algo]
    if draft_model:
        out += [DRAFT_FLAG, str(draft_model)]
    if tokens:
        if algo in EAGLE_FAMILY:
            out += [STEPS_FLAG, str(tokens), TOPK_FLAG, "1", DRAFT_TOKENS_FLAG, str(tokens + 1)]
        elif algo == "DFLASH":
            out += [DRAFT_TOKENS_FLAG, str(tokens + 1)]
        else:
            out += [DRAFT_TOKENS_FLAG, str(tokens)]
    return out


def loads_refusal(path: Path) -> str | None:
    """Why SGLang cannot serve ``path`` (one sentence), or None.

    SGLang loads a Hugging Face model folder (config.json + safetensors) or a hub repo id; its
    GGUF loader is an experimental path for a few named checkpoints, which engineroom does not size.
    """
    path = Path(path)
    if path.is_file():
        try:
            with open(path, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            return f"cannot read {path} ({exc.strerror})."
        if magic == b"GGUF" and random_weights_file(path):
            return None                 # engineroom's random-weight file: serving_model makes its folder
        if magic == b"GGUF":
            return (f"{path} is a GGUF file; SGLang serves a Hugging Face model folder (config.json + safetensors): "
                    "use the model's safetensors repo with SGLang, or serve the GGUF with llama.cpp.")
        return f"{path} is a single file; SGLang serves a Hugging Face model folder (config.json + safetensors)."
    if path.is_dir() and not (path / "config.json").is_file():
        return f"{path} has no config.json; SGLang serves a Hugging Face model folder (config.json + safetensors)."
    return folder_config_refusal(path, "SGLang") if path.is_dir() else None


def random_weights_loading(quant_format: str) -> str | None:
    """How SGLang serves random weights of a pick in ``quant_format`` (``hffolder.dummy_loading``: its 16-bit and
    4-bit packed picks; SGLang 0.5.23 reads awq, gptq and auto-round configs), or None."""
    return dummy_loading("SGLang", quant_format)


def serving_model(path: Path, progress: Callable[[float | None, str], None] | None = None, *,
                  weights_format: str = "") -> Path:
    """The folder SGLang serves for ``path``: a random-weight GGUF (engineroom's) as its config and tokenizer
    alone, written once in SGLang's environment, which SGLang serves with weights of its own making; anything
    else as it is (a real GGUF is refused at render: ``loads_refusal``)."""
    path = Path(path)
    if not path.is_file() or not is_gguf(path) or not random_weights_file(path):
        return path
    return folder_of(path, engine=ENGINE, python=lambda: find_binary().python, progress=progress,
                     weights_format=weights_format)


def builds_vision_tower(folder: Path, extra: Sequence[str] = (), *, asked: bool | None = None) -> bool:
    """Whether SGLang builds the vision tower of the model in ``folder``: its config.json has one, and SGLang serves
    that architecture with it, or the launch asks (``asked``, the pick's vision: ``--enable-multimodal``). Without a
    config to read (a hub id), what the launch asks."""
    config = folder_config(folder)
    if config is None:
        return bool(asked)
    if not isinstance(config.get("vision_config"), dict):
        return False
    return (str((config.get("architectures") or [""])[0]) not in MULTIMODAL_OFF or bool(asked)
            or _has_flag(extra, MULTIMODAL_FLAG))


def activation_dtype(config: dict, extra: Sequence[str] = ()) -> str:
    """The dtype SGLang runs the model of ``config`` at: ``--dtype`` when given, else the text config's
    (``ModelConfig._get_and_verify_dtype``: a float32 or unnamed one runs at float16, Gemma's at bfloat16)."""
    asked = (_flag_value(extra, DTYPE_FLAG) or "auto").lower()
    if asked != "auto":
        return _DTYPES.get(asked, asked)
    inner = config.get("text_config")
    text: dict = inner if isinstance(inner, dict) else config
    named = str(text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
                or "float32")
    dtype = _DTYPES.get(named, named)
    if dtype == "float32":
        return "bfloat16" if str(text.get("model_type") or config.get("model_type") or "").startswith("gemma") \
            else "float16"
    return dtype


def conv_state_env(folder: Path, extra: Sequence[str] = ()) -> tuple[dict[str, str], tuple[str, ...]]:
    """The environment that keeps the conv state of the model in ``folder`` at its activations' dtype
    (``CONV_DTYPE_ENV``), and the note saying why: only a model with linear-attention or Mamba layers run at float16,
    and not where the user's environment names the state's dtype itself. Without a config to read (a hub id),
    nothing."""
    config = folder_config(folder)
    if CONV_DTYPE_ENV in os.environ or config is None or activation_dtype(config, extra) != "float16":
        return {}, ()
    try:
        recurrent = arch_from_config(config).recurrent_layers
    except BadInput:
        return {}, ()
    if not recurrent:
        return {}, ()
    return {CONV_DTYPE_ENV: "float16"}, (
        f"{CONV_DTYPE_ENV}=float16: the model runs at float16 and SGLang keeps the conv state of its "
        f"{len(recurrent)} linear-attention/Mamba layers at bfloat16 unless told, a mix its conv kernel does not "
        "compile before 0.5.23 (sgl-project/sglang#19406); the state is as large at either type",)


def _check_host(host: str) -> None:
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise BadInput(f"engineroom binds engines to 127.0.0.1, not {host}; reach the server through an SSH "
                       "tunnel or a proxy you run yourself.")


def render(binary: Binary, options: LaunchOptions) -> LaunchSpec:
    """The ``sglang.launch_server`` command line for ``options``; nothing is started here.

    What fit sized is passed explicitly: ``--context-length`` (tokens per sequence: SGLang's
    context length is per request), ``--max-running-requests`` (sequences), ``--tp-size``,
    ``--kv-cache-dtype``, ``--mem-fraction-static``. A setting the user's own arguments already
    give is left to them; the user's arguments come last, verbatim.
    """
    o = options
    _check_host(o.host)
    extra = list(o.extra_args)
    if _has_flag(extra, API_KEY_FLAG):
        raise BadInput("an API key among the engine arguments would sit on SGLang's command line; "
                       "pass it with --api-key-file or --api-key-env instead.")
    model_path = Path(o.model_path)
    if not (_flag_value(extra, LOAD_FORMAT_FLAG) or "").startswith("gguf"):
        why = loads_refusal(model_path) if model_path.exists() else None
        if why:
            raise BadInput(why)
    args: list[str] = [MODEL_FLAG, str(model_path), "--host", o.host, "--port", str(o.port)]

    def add(flag: str, *values: str) -> None:
        if not _has_flag(extra, flag):
            args.extend((flag, *values))

    if dummy_weights(model_path):
        add(LOAD_FORMAT_FLAG, "dummy")             # a random-weight file's folder: SGLang makes the weights
        if builds_vision_tower(model_path, extra, asked=o.vision) and not _has_flag(extra, SKIP_WARMUP_FLAG):
            # SGLang warms a vision model up with an image through its chat template, which the folder's
            # tokenizer (the shape file's vocabulary: no image tokens) cannot place; engineroom's own checks follow
            args.append(SKIP_WARMUP_FLAG)
    if o.vision and not builds_vision_tower(model_path, extra):
        add(MULTIMODAL_FLAG)                   # an architecture SGLang serves text-only unless asked
    if o.model_name:
        add(NAME_FLAG, o.model_name)           # /v1/models id = the user's name, not a home path
    if o.ctx:
        add(CONTEXT_FLAG, str(o.ctx))
    if o.parallel:
        add(SEQS_FLAG, str(o.parallel))
    add(TP_FLAG, str(max(1, o.tp)))
    if o.kv_dtype:
        add(KV_FLAG, kv_cache_dtype(o.kv_dtype))
    if o.mem_fraction is not None:
        if not 0.0 < o.mem_fraction < 1.0:
            raise BadInput(f"the memory fraction must be between 0 and 1 (exclusive), not {o.mem_fraction}.")
        add(MEM_FLAG, f"{o.mem_fraction:g}")
    if o.tool_parser:
        add(TOOL_FLAG, o.tool_parser)
    if o.reasoning_parser:
        add(REASONING_FLAG, o.reasoning_parser)
    if o.thinking is not None:
        add(TEMPLATE_KWARGS_FLAG, json.dumps({"enable_thinking": o.thinking}))
    if o.chat_template:
        if not Path(o.chat_template).is_file():
            raise BadInput(f"chat template file {o.chat_template} does not exist.")
        add(TEMPLATE_FLAG, str(o.chat_template))
    if o.spec_method:
        if not _has_flag(extra, SPEC_FLAG):
            args += spec_args(o.spec_method, o.spec_tokens, o.draft_model)
    elif o.spec_tokens or o.draft_model:
        raise BadInput("a speculative token count or draft model was given without a speculative method; "
                       "name one (mtp, eagle, eagle3, dflash, ngram).")
    if not _has_flag(extra, METRICS_FLAG):
        args.append(METRICS_FLAG)
    for change in o.changes:
        args += list(change.args)
    args += extra
    if o.api_key_file:
        head = [str(binary.python), "-c", KEY_SHIM, API_KEY_FILE_FLAG, str(o.api_key_file)]
    else:
        head = [str(binary.python), "-m", MODULE]
    conv_env, notes = conv_state_env(model_path, extra)
    return LaunchSpec(
        engine=ENGINE, argv=tuple(head + args), port=o.port, host=o.host, env={**binary.env, **conv_env},
        log_path=o.log_path, model=o.model_name or str(model_path), model_path=str(model_path),
        health_path="/health", engine_version=binary.version,
        changes=tuple(c.as_dict() for c in o.changes), notes=notes,
    )


def server_args(argv: Sequence[str]) -> list[str]:
    """The arguments SGLang's own parser sees for a rendered command line (the interpreter and
    ``-m sglang.launch_server`` or the key shim taken off; the shim's key file stands in as a key)."""
    argv = list(argv)
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == MODULE:
        return argv[3:]
    if apikey.shim_key_file(argv, KEY_SHIM):
        return [*argv[5:], API_KEY_FLAG, "<key read from the file>"]
    raise BadInput("not an SGLang command line rendered by engineroom (python -m sglang.launch_server ...).")


# --------------------------------------------------------------------------- API keys
def split_api_key(args: Sequence[str]) -> tuple[list[str], str | None, str | None]:
    """``args`` without ``--api-key KEY`` / ``--api-key-file F``, the key and the file they gave."""
    rest, given = take_flags(args, API_KEY_FLAG, API_KEY_FILE_FLAG)
    return rest, given.get(API_KEY_FLAG), given.get(API_KEY_FILE_FLAG)


def api_key_file_in(argv: Sequence[str]) -> str | None:
    """The key file a running SGLang was launched with (the shim's argument), or None: no key."""
    argv = list(argv)
    if len(argv) >= 5 and argv[1] == "-c" and argv[3] == API_KEY_FILE_FLAG:
        return argv[4]
    return None


def launch_settings(options: LaunchOptions, trained_ctx: int | None = None) -> Settled:
    """What SGLang will run with, in fit's words: one paged KV pool shared by all sequences,
    the context per request (the model's trained context when none is given), and the vision tower where SGLang
    builds one (``builds_vision_tower``), whatever the pick's vision."""
    extra = options.extra_args
    ctx_arg = _flag_value(extra, CONTEXT_FLAG)
    seqs_arg = _flag_value(extra, SEQS_FLAG)
    mem_arg = _flag_value(extra, MEM_FLAG)
    kv_arg = _flag_value(extra, KV_FLAG)
    ctx = int(ctx_arg) if ctx_arg and ctx_arg.isdigit() else (options.ctx or trained_ctx)
    tp_arg = _flag_value(extra, TP_FLAG)
    kv = kv_arg or options.kv_dtype or "auto"
    return Settled(ctx=ctx, parallel=int(seqs_arg) if seqs_arg and seqs_arg.isdigit() else (options.parallel or 1),
                   kv_unified=True, kv_dtype="auto" if kv == "f16" else kv,
                   tp=int(tp_arg) if tp_arg and tp_arg.isdigit() else max(1, options.tp),
                   mem_fraction=float(mem_arg) if mem_arg else options.mem_fraction,
                   quant=int4_quant(options.quant_format),
                   vision=builds_vision_tower(Path(options.model_path), extra, asked=options.vision))


# --------------------------------------------------------------------------- multi-node
def _dist_addr(head_addr: str, port: int) -> str:
    host = head_addr.strip()
    if not host or any(c in host for c in " /") or (host.count(":") == 1):
        raise BadInput(f"the head address {head_addr!r} must be a host name or IP address without a port "
                       "(the rendezvous port is given separately).")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if (ip is not None and ip.is_loopback) or host == "localhost":
        raise BadInput(f"the head address {head_addr} is this machine's loopback, which the other nodes cannot "
                       "reach; give the head node's address on the cluster network.")
    if ip is not None and ip.version == 6:
        host = f"[{ip}]"
    if not 1 <= port <= 65535:
        raise BadInput(f"the rendezvous port must be 1-65535, not {port}.")
    return f"{host}:{port}"


def render_cluster(binary: Binary, options: LaunchOptions, *, nodes: int, gpus_per_node: int, head_addr: str,
                   dist_port: int = DIST_PORT, pipeline: bool = False) -> list[LaunchSpec]:
    """One SGLang instance over ``nodes`` machines of ``gpus_per_node`` GPUs: one LaunchSpec per
    node, in rank order (run each on its node; rank 0 is the head and serves HTTP).

    The hook's engine-neutral signature (vLLM's Ray recipe has the same):
    ``render_cluster(binary, options, *, nodes, gpus_per_node, head_addr, ...) -> list[LaunchSpec]``.
    ``options`` is the single-node launch (``options.tp`` must be 1 or the cluster's size);
    ``head_addr`` is the head node's address on the cluster network (host or IP, no port), used
    for SGLang's torch.distributed rendezvous (``--dist-init-addr HEAD:dist_port``); every
    node's HTTP server still binds to ``options.host`` (127.0.0.1). Tensor parallel across all
    GPUs by default (``--tp-size nodes x gpus_per_node``); ``pipeline=True`` splits layers
    across nodes instead (``--tp-size gpus_per_node --pp-size nodes``), which needs less
    inter-node bandwidth.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise BadInput(f"a cluster needs at least one node and one GPU per node (got {nodes} x {gpus_per_node}).")
    total = nodes * gpus_per_node
    tp, pp = (gpus_per_node, nodes) if pipeline else (total, 1)
    if options.tp not in (1, tp, total):
        raise BadInput(f"tp {options.tp} does not match the cluster: {nodes} nodes x {gpus_per_node} GPUs run "
                       f"tp {tp}{f' x pp {pp}' if pp > 1 else ''}.")
    extra = list(options.extra_args)
    for flag in (NNODES_FLAG, NODE_RANK_FLAG, DIST_ADDR_FLAG, TP_FLAG, PP_FLAG):
        if _has_flag(extra, flag):
            raise BadInput(f"{flag} among the engine arguments conflicts with the cluster recipe, which sets it "
                           "per node; leave it out.")
    addr = _dist_addr(head_addr, dist_port) if nodes > 1 else None
    base = render(binary, replace(options, tp=tp))
    head_len = 3 if base.argv[1] == "-m" else 5
    head, rest = list(base.argv[:head_len]), list(base.argv[head_len:])
    i = rest.index(TP_FLAG)
    specs = []
    for rank in range(nodes):
        topo = [TP_FLAG, str(tp)] + ([PP_FLAG, str(pp)] if pp > 1 else [])
        if addr:
            topo += [NNODES_FLAG, str(nodes), NODE_RANK_FLAG, str(rank), DIST_ADDR_FLAG, addr]
        argv = head + rest[:i] + topo + rest[i + 2:]
        specs.append(replace(base, argv=tuple(argv), node=rank,
                             role="rank 0 (head: serves the API)" if rank == 0 else f"rank {rank}"))
    return specs
