"""ik_llama.cpp's llama-server command line: what differs from mainline llama.cpp's.

The fork parses the older common argument set: ``-np`` defaults to 1 and there is no unified-KV
switch (one KV buffer of ``-c`` cells is shared by the slots, each slot capped at ``-c / -np``);
flash attention is on by default; ``--jinja`` is off by default, so engineroom always passes it
(tool calls need the Jinja template path); the KV cache types add q6_0 and q8_KV; it repacks
weights only when asked (``-rtr``); speculative stages are ``--spec-type`` values. Every rendered
argv is checked against the binary's own ``--help`` (``flags.validate_argv``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BadInput, NotFound
from ..argv import flag_value, has_flag
from ..base import Knob, LaunchOptions, LaunchSpec, Settled
from ..llamacpp.command import (
    ISA_PREFIXES,
    api_key_file_args,
    built_backend,
    built_for_cpu,
    cache_split_args,
    family_settings,
    family_spec,
    feature_args,
    gguf_refusal,
    head_args,
    version_or_blank,
)
from ..llamacpp.discovery import Binary
from ..llamacpp.knobs import BACKEND_SAMPLING
from ..llamacpp.knobs import tune_knobs as _mainline_knobs
from .discovery import ENGINE, SOURCE_VERSION, binary_version
from .flags import validate_argv

if TYPE_CHECKING:
    from ...cpuprobe import CpuProbe

def default_parallel() -> int:
    """The slots the fork runs without -np: its catalog entry's (default_parallel, with the source)."""
    from ...catalog import find_engine, load_catalog

    return find_engine(load_catalog(), ENGINE).default_parallel


RUN_TIME_REPACK = "-rtr"           # --run-time-repack: off by default in the fork
# the fork offloads no layer unless asked (its llama_model_default_params: 0 but on Metal), where mainline
# offloads all; a GPU build is therefore always told to put every layer on the GPU, as fit places them
GPU_LAYERS, ALL_LAYERS = ("-ngl", "--gpu-layers", "--n-gpu-layers"), "999"
JINJA = "--jinja"                  # off by default in the fork; tool calls need it
SPEC_TYPE = "--spec-type"
SPLIT_MODES = ("none", "layer", "attn", "graph")
# catalog KV type id -> the fork's cache type name (-ctk / -ctv); f16 is its default
KV_CACHE_TYPES = {"f16": "f16", "bf16": "bf16", "f32": "f32", "q8_0": "q8_0", "q6_0": "q6_0", "q5_1": "q5_1",
                  "q5_0": "q5_0", "iq4_nl": "iq4_nl", "q4_1": "q4_1", "q4_0": "q4_0", "q8_KV": "q8_KV"}
HADAMARD_K, HADAMARD_V = "-khad", "-vhad"
MERGE_QKV = "--merge-qkv"
# the fork's options a launch request may turn on (catalog engine entry `plan_options` names them):
# the comparison's tested recipes run both (seeds/engines-comparison-v2.md); Hadamard rotation
# applies to a quantized KV cache only, so it is left out with an f16/bf16/f32 one
ENGINE_OPTIONS = {"hadamard_kv": (HADAMARD_K, HADAMARD_V), "merge_qkv": (MERGE_QKV,)}
# the fork's tested flag set (specs/engines.md) also names --parallel-tool-calls; the release
# engineroom builds has no such flag, so a launch with the fork's options says why it is absent
NO_PARALLEL_TOOL_CALLS = (f"the fork's --parallel-tool-calls is not passed: ik_llama.cpp {SOURCE_VERSION} (the "
                          "release engineroom builds) has no such flag in its --help")
UNQUANTISED_KV = ("f16", "bf16", "f32")
# the older common argument set (the ik-llama-cpp-python 0.1.5 build) turns MTP on with these;
# newer builds reject them and take `--spec-type mtp:...` (specs/engines.md)
LEGACY_MTP, LEGACY_DRAFT_MAX = "-mtp", "--draft-max"
SPEC_KINDS = {"mtp": "mtp", "dflash": "dflash", "draft": "draft", "ngram": "ngram-mod"}


def spec_type_args(stages: Sequence[tuple[str, Mapping[str, object]]]) -> list[str]:
    """``--spec-type TYPE[:k=v,...]`` once per speculative stage, in order (newer ik_llama.cpp);
    e.g. ``[("mtp", {"n_max": 2, "p_min": 0.0})]`` -> ``--spec-type mtp:n_max=2,p_min=0.0``."""
    out: list[str] = []
    for kind, params in stages:
        if not kind or any(c in kind for c in ":, "):
            raise BadInput(f"speculative stage {kind!r} is not a type name (mtp, draft, dflash, ngram-mod, ...).")
        opts = ",".join(f"{k}={v}" for k, v in params.items())
        out += [SPEC_TYPE, f"{kind}:{opts}" if opts else kind]
    return out


def spec_args(binary: Binary, method: str, tokens: int | None, draft_model: str | None) -> list[str]:
    """The fork's speculative flags: ``--spec-type KIND:n_max=N`` (MTP with p_min=0.0, as the
    reference recipe), or ``-mtp --draft-max N`` where the binary's own --help still lists ``-mtp``."""
    from .flags import known_flags

    kind = SPEC_KINDS.get(method)
    if kind is None:
        raise BadInput(f"ik_llama.cpp has no speculative method {method!r}; it runs {', '.join(SPEC_KINDS)}.")
    if kind in ("draft", "dflash") and not draft_model:
        raise BadInput(f"speculative method {method} needs a GGUF drafter on ik_llama.cpp; name its file, or use "
                       "mtp (the model's own MTP tensors) or ngram.")
    known = known_flags(binary)
    if kind == "mtp" and known is not None and LEGACY_MTP in known:
        return [LEGACY_MTP] + ([LEGACY_DRAFT_MAX, str(tokens)] if tokens else [])
    params: dict[str, object] = {"n_max": tokens} if tokens else {}
    if kind == "mtp":
        params["p_min"] = 0.0
    out = spec_type_args([(kind, params)])
    return out + (["-md", str(draft_model)] if draft_model else [])


def option_args(options: LaunchOptions) -> list[str]:
    """The flags of the fork's own options the request turned on (``ENGINE_OPTIONS`` ids)."""
    out: list[str] = []
    for name in options.engine_options:
        if name not in ENGINE_OPTIONS:
            raise BadInput(f"ik_llama.cpp has no option {name!r}; it has {', '.join(ENGINE_OPTIONS)}.")
        if name == "hadamard_kv" and (options.kv_dtype or "f16") in UNQUANTISED_KV:
            continue
        out += ENGINE_OPTIONS[name]
    return out


def repack_disabled(args: Sequence[str]) -> bool:
    """The fork keeps weights as loaded unless ``-rtr`` asks it to repack them."""
    return not has_flag(args, RUN_TIME_REPACK, "--run-time-repack")


def render(binary: Binary, options: LaunchOptions) -> LaunchSpec:
    """The fork's llama-server command line for ``options``, checked against the binary's parser.

    ``-c`` is the whole KV buffer shared by the slots (ctx x slots, so each slot holds ``ctx``);
    ``-np`` is always explicit (the fork's default is 1). Raises BadInput naming an unknown flag.
    """
    o = options
    extra = list(o.extra_args)
    slots = o.parallel or default_parallel()
    argv = head_args(binary, o, slots, extra) + cache_split_args(o, extra, KV_CACHE_TYPES, ENGINE)
    if built_backend(binary) not in ("", "cpu") and not has_flag(extra, *GPU_LAYERS):
        argv += [GPU_LAYERS[0], ALL_LAYERS]
    if not has_flag(extra, JINJA):
        argv += [JINJA]
    if o.chat_template:
        if not Path(o.chat_template).is_file():
            raise BadInput(f"chat template file {o.chat_template} does not exist.")
        argv += ["--chat-template-file", str(o.chat_template)]
    if o.spec_method and not has_flag(extra, SPEC_TYPE, LEGACY_MTP):
        argv += spec_args(binary, o.spec_method, o.spec_tokens, o.draft_model)
    argv += feature_args(replace(o, spec_method=None), extra)     # the projector, as mainline
    argv += [a for a in option_args(o) if not has_flag(extra, a)]
    if o.api_key_file:
        argv += api_key_file_args(o.api_key_file)
    argv += ["--metrics"]            # the fork logs model / KV / compute buffer sizes at its default verbosity
    for change in o.changes:
        argv += list(change.args)
    argv += extra
    _check_split_mode(argv)
    problem = validate_argv(binary, argv)
    if problem:
        raise BadInput(problem)
    return family_spec(ENGINE, binary, o, argv, version_or_blank(binary, binary_version),
                       (NO_PARALLEL_TOOL_CALLS,) if o.engine_options else ())


def _check_split_mode(argv: Sequence[str]) -> None:
    mode = flag_value(argv, "-sm", "--split-mode")
    if mode is not None and mode not in SPLIT_MODES:
        raise BadInput(f"ik_llama.cpp's split mode is one of {', '.join(SPLIT_MODES)}; got {mode!r}.")


def launch_settings(options: LaunchOptions, trained_ctx: int | None = None) -> Settled:
    """What the fork's llama-server runs with for ``options``, in fit's words.

    One KV buffer of ``-c`` = ctx x slots cells serves every slot (fit's single-stream, "unified"
    geometry); without ``-c`` the fork sizes it for the model's trained context. It repacks only
    with ``-rtr``.
    """
    # the fork's -c, -ctk, -ub / -b, -fa and RoPE flags: mainline's, with the same defaults
    return family_settings(options, trained_ctx, slots=options.parallel or default_parallel(), unified=True,
                           repack_disabled=repack_disabled)


def loads_refusal(path: Path) -> str | None:
    """Why the fork cannot serve ``path``, or None: it serves one GGUF file, its own IQK quants
    (IQ4_KS, IQ2_KT, ...) as well as every mainline type."""
    return gguf_refusal(path, ENGINE, "name the .gguf")


def check_binary_cpu(binary: Binary, probe: CpuProbe) -> dict[str, object]:
    """Refuse a build of the fork made (-march=native) on a CPU with instructions this one lacks, or one on the
    wheel's kernels (``--prebuilt``) where the CPU lacks what they use, from the manifest `engines install` wrote
    beside it; a binary without one is not checked."""
    built_for = built_for_cpu(binary)
    if not built_for or not probe.flags:
        return {"compiled_features": [], "how": "no install manifest beside the binary"}
    isa = {f for f in built_for.get("usable_flags", []) if f.startswith(ISA_PREFIXES)}
    missing = sorted(isa - set(probe.usable))
    if missing:
        raise NotFound(f"{binary.path} was compiled for {', '.join(missing)}, which this CPU ({probe.model}) does "
                       "not run (a build copied from another machine?); rebuild it here with "
                       "`engineroom engines install ik_llama.cpp`.")
    return {"compiled_features": sorted(isa),
            "how": built_for.get("how") or "the install manifest's build CPU (-march=native)"}


def tune_knobs(objective: str, *, kv_dtype: str | None, parallel: int, cpu_cores: int | None,
               kv_dtypes: Sequence[str]) -> tuple[Knob, ...]:
    """llama-server's knobs (the fork takes the same -t, -np, -ub, -ctk and -fa) but GPU sampling: the
    fork has no ``-bs`` (tests/fixtures/ik_llamacpp/help.txt)."""
    knobs = _mainline_knobs(objective, kv_dtype=kv_dtype, parallel=parallel, cpu_cores=cpu_cores, kv_dtypes=kv_dtypes)
    return tuple(k for k in knobs if k.values != ((BACKEND_SAMPLING,),))
