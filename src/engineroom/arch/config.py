"""ModelArch from a Hugging Face config.json (a dict, a file, or its directory).

Multimodal wrappers are unwrapped, layer kinds follow transformers' own precedence, and
parameters are counted from the declared shapes (``params.py``) so a model can be sized for
any quant before a weight is downloaded. Every guess is named in ``ModelArch.estimated``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..values import int_or_none
from .model import LayerKind, LinearAttnSpec, MambaSpec, MLASpec, ModelArch, MoESpec, VisionSpec
from .params import GEMMA_TYPES, StackShapes

# model types whose config.json implies what its keys do not say
_QK_NORM_TYPES = (
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
    "qwen3_5_moe_text", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "olmo2",
)
_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
_GATED_DELTANET_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
# families whose every block is llama.cpp's plain llama / qwen3 decoder block (ModelArch.standard_block)
_STANDARD_BLOCK_TYPES = ("llama", "qwen3")


def read_config(cfg: dict[str, Any] | str | Path) -> tuple[dict[str, Any], str]:
    """Return the parsed config and a label; every failure is one BadInput sentence."""
    if isinstance(cfg, dict):
        return cfg, "config"
    path = Path(cfg)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path} cannot be read as text ({exc.__class__.__name__}).") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} holds a JSON {type(data).__name__}, not the object a config.json must be.")
    return data, str(path)


_int = int_or_none


def _first_int(cfg: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        v = _int(cfg.get(key))
        if v is not None:
            return v
    return None


def _text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language-model half of a config: ``text_config`` (or ``llm_config``) merged over
    the top level, because wrappers keep some fields (tie_word_embeddings, dtype) outside."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = cfg.get(key)
        if isinstance(inner, dict) and inner:
            merged = {k: v for k, v in cfg.items() if k not in ("vision_config", "audio_config", key)}
            merged.update(inner)
            # the wrapper's model_type names the wrapper; keep the text one when it has one
            if "model_type" not in inner and "model_type" in cfg:
                merged["model_type"] = cfg["model_type"]
            return merged
    return cfg


def _layer_kinds_from_config(
    t: dict[str, Any], n_layers: int, model_type: str, is_mla: bool, estimated: list[str]
) -> tuple[list[LayerKind], int, int]:
    """Layer kinds, plus (number of feed-forward-only blocks dropped, raw block count).

    The precedence mirrors how transformers itself decides: an explicit per-layer list wins,
    then the family-specific period/pattern keys, then a uniform default.
    """
    mapping = {
        "full_attention": LayerKind.FULL, "attention": LayerKind.FULL, "global": LayerKind.FULL,
        "sliding_attention": LayerKind.SLIDING, "chunked_attention": LayerKind.SLIDING,
        "local": LayerKind.SLIDING, "linear_attention": LayerKind.LINEAR,
        "mamba": LayerKind.MAMBA, "mamba2": LayerKind.MAMBA,
    }
    base_attn = LayerKind.MLA if is_mla else LayerKind.FULL
    for key in ("layer_types", "layers_block_type"):
        types = t.get(key)
        if isinstance(types, list) and types and all(isinstance(x, str) for x in types):
            kinds = []
            for i, name in enumerate(types[:n_layers]):
                kind = mapping.get(name.lower())
                if kind is None:
                    estimated.append(f"layer_kinds[{i}]: unknown layer type {name!r}, counted as full attention")
                    kind = LayerKind.FULL
                kinds.append(base_attn if kind == LayerKind.FULL else kind)
            if len(kinds) < n_layers:
                estimated.append(f"layer_kinds: {key} lists {len(kinds)} of {n_layers} layers; "
                                 "the rest copy the pattern")
                kinds += [kinds[i % len(kinds)] for i in range(len(kinds), n_layers)]
            return kinds, 0, n_layers
    pattern = t.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        # Nemotron-H: one char per block: M = Mamba-2, * = attention, - = MLP, E = MoE
        kinds = []
        dropped = 0
        for ch in pattern:
            if ch == "M":
                kinds.append(LayerKind.MAMBA)
            elif ch == "*":
                kinds.append(LayerKind.FULL)
            else:
                dropped += 1
        if dropped:
            estimated.append(
                f"layer_kinds: {dropped} feed-forward-only blocks of hybrid_override_pattern hold no "
                "sequence state and are not listed (their weights are in param_count)"
            )
        return kinds, dropped, len(pattern)
    interval = _int(t.get("full_attention_interval"))
    if interval and interval > 0 and (model_type in _GATED_DELTANET_TYPES or "linear_num_value_heads" in t):
        return [
            LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.LINEAR for i in range(n_layers)
        ], 0, n_layers
    period = _int(t.get("attn_layer_period"))
    if period:
        offset = _int(t.get("attn_layer_offset")) or 0
        return [LayerKind.FULL if i % period == offset else LayerKind.MAMBA for i in range(n_layers)], 0, n_layers
    if model_type in ("mamba", "mamba2", "falcon_mamba"):
        return [LayerKind.MAMBA] * n_layers, 0, n_layers
    window = _int(t.get("sliding_window"))
    if window and not is_mla:
        swp = _int(t.get("sliding_window_pattern"))
        if swp and swp > 0:
            return [LayerKind.FULL if (i + 1) % swp == 0 else LayerKind.SLIDING for i in range(n_layers)], 0, n_layers
        if model_type == "gemma2":
            return [LayerKind.SLIDING if i % 2 == 0 else LayerKind.FULL for i in range(n_layers)], 0, n_layers
        if model_type.startswith("gemma3"):
            estimated.append("layer_kinds: gemma3 config without a pattern key; used transformers' default of 6")
            return [LayerKind.FULL if (i + 1) % 6 == 0 else LayerKind.SLIDING for i in range(n_layers)], 0, n_layers
        use_sw = t.get("use_sliding_window")
        if use_sw is True:
            first = _int(t.get("max_window_layers"))
            first = n_layers if first is None else first
            return [LayerKind.SLIDING if i >= first else LayerKind.FULL for i in range(n_layers)], 0, n_layers
        if use_sw is None and model_type in ("mistral", "mixtral", "phi3", "starcoder2"):
            return [LayerKind.SLIDING] * n_layers, 0, n_layers
    return [base_attn] * n_layers, 0, n_layers


def _moe_from_config(
    t: dict[str, Any], n_blocks: int, estimated: list[str]
) -> tuple[MoESpec | None, frozenset[int]]:
    """The MoE spec and the indices of blocks whose MLP is sparse."""
    n_experts = _first_int(t, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
    if not n_experts or n_experts <= 1:
        return None, frozenset()
    active = _first_int(t, "num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts")
    if active is None:
        estimated.append("moe.n_experts_active: no num_experts_per_tok; guessed 2")
        active = 2
    expert_ff = _first_int(t, "moe_intermediate_size", "expert_intermediate_size")
    if expert_ff is None:
        # Mixtral and Jamba size each expert with the dense intermediate_size
        expert_ff = _int(t.get("intermediate_size"))
    if expert_ff is None:
        raise BadInput("The config declares experts but no moe_intermediate_size or intermediate_size.")
    n_shared = _first_int(t, "n_shared_experts", "num_shared_experts") or 0
    shared_ff = _int(t.get("shared_expert_intermediate_size"))
    if shared_ff and not n_shared:
        n_shared = 1
    elif n_shared and shared_ff is None:
        shared_ff = n_shared * expert_ff   # DeepSeek: shared experts fused into one MLP this wide
    first_dense = _first_int(t, "first_k_dense_replace") or 0
    blocks = set(range(first_dense, n_blocks))
    period = _int(t.get("expert_layer_period"))
    if period and period > 1:   # Jamba: experts every `period` blocks from `offset`
        offset = _int(t.get("expert_layer_offset")) or 0
        blocks = {i for i in blocks if i % period == offset}
    step = _first_int(t, "moe_layer_freq", "decoder_sparse_step") or 1
    only_dense = t.get("mlp_only_layers")
    only_dense = set(only_dense) if isinstance(only_dense, list) else set()
    blocks = {i for i in blocks if (i - first_dense) % step == 0 and i not in only_dense}
    n_moe = len(blocks) if len(blocks) != n_blocks - first_dense else None
    return MoESpec(
        n_experts=n_experts,
        n_experts_active=active,
        expert_intermediate_size=expert_ff,
        n_shared_experts=n_shared,
        shared_intermediate_size=shared_ff,
        first_dense_layers=first_dense,
        n_moe_layers=n_moe,
    ), frozenset(blocks)


def _vision_from_config(v: dict[str, Any], text_hidden: int, estimated: list[str]) -> VisionSpec | None:
    """Vision tower size from a generic ViT layout (patch embed, position table, blocks,
    merger/projector). Towers differ in details, so the count is marked as estimated."""
    depth = _first_int(v, "depth", "num_hidden_layers", "num_layers")
    hidden = _first_int(v, "hidden_size", "embed_dim", "width")
    heads = _first_int(v, "num_heads", "num_attention_heads")
    patch = _first_int(v, "patch_size") or 14
    if not depth or not hidden:
        if v:
            estimated.append("vision: vision_config has no depth/hidden_size; tower not described")
        return None
    inter = _first_int(v, "intermediate_size", "mlp_dim") or 4 * hidden
    channels = _first_int(v, "in_channels", "num_channels") or 3
    temporal = _first_int(v, "temporal_patch_size") or 1
    block = 4 * hidden * hidden + 4 * hidden + 2 * hidden * inter + inter + hidden + 4 * hidden
    embed = channels * temporal * patch * patch * hidden + hidden
    n_pos = _int(v.get("num_position_embeddings"))
    if n_pos is None:
        image = _int(v.get("image_size"))
        n_pos = (image // patch) ** 2 if image else 0
    out = _first_int(v, "out_hidden_size") or text_hidden
    merge = _int(v.get("spatial_merge_size"))
    if merge:   # Qwen-VL merger: LayerNorm, fc1 (h*m^2)^2, fc2 -> text hidden
        wide = hidden * merge * merge
        projector = 2 * hidden + wide * wide + wide + wide * out + out
    else:       # Gemma-3 style projector: RMSNorm + one projection matrix
        projector = hidden + hidden * out
    total = embed + n_pos * hidden + depth * block + 2 * hidden + projector
    estimated.append("vision.param_count: generic ViT layout (embed, blocks, merger), not read per tensor")
    return VisionSpec(depth=depth, hidden_size=hidden, n_heads=heads or max(1, hidden // 64),
                      patch_size=patch, param_count=total)


def arch_from_config(cfg: dict[str, Any] | str | Path, name: str | None = None) -> ModelArch:
    """Describe a model from its Hugging Face config.json (a dict, a file, or its directory).

    Multimodal wrappers (``text_config`` + ``vision_config``) are unwrapped: the trunk comes
    from the text part, the vision tower is sized separately. Parameter counts are computed
    from the declared shapes so that fit.py can size weights for any quant without the
    safetensors index. Missing fields are guessed only where a family default is well known,
    and each guess is named in ``estimated``.
    """
    data, label = read_config(cfg)
    data = {k: v for k, v in data.items() if not k.startswith("_source")}
    t = _text_part(data)
    estimated: list[str] = []
    model_type = str(t.get("model_type") or data.get("model_type") or "unknown")
    archs = data.get("architectures")
    if model_type == "unknown" and isinstance(archs, list) and archs:
        model_type = str(archs[0])
        estimated.append("architecture: no model_type; used architectures[0]")

    n_blocks = _first_int(t, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    hidden = _first_int(t, "hidden_size", "d_model", "n_embd", "dim")
    n_heads = _first_int(t, "num_attention_heads", "n_head", "n_heads")
    missing = [n for n, v in (("num_hidden_layers", n_blocks), ("hidden_size", hidden),
                              ("num_attention_heads", n_heads)) if not v]
    if missing:
        raise BadInput(f"{label} lacks the basic shape fields {', '.join(missing)}, so the model cannot be described.")
    assert n_blocks and hidden and n_heads

    vocab = _first_int(t, "vocab_size", "padded_vocab_size", "n_vocab")
    if not vocab:
        estimated.append("vocab_size: absent; guessed 32000")
        vocab = 32000
    n_kv = _first_int(t, "num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
    if n_kv is None:
        n_kv = n_heads
        if model_type not in ("llama", "mistral", "gpt2", "opt"):
            estimated.append("n_kv_heads: no num_key_value_heads; assumed multi-head (= num_attention_heads)")
    head_dim = _int(t.get("head_dim")) or _int(t.get("attention_head_dim")) or hidden // n_heads

    is_mla = _int(t.get("kv_lora_rank")) is not None
    mla: MLASpec | None = None
    if is_mla:
        rope = _int(t.get("qk_rope_head_dim")) or 64
        nope = _int(t.get("qk_nope_head_dim")) or 128
        mla = MLASpec(
            kv_lora_rank=_int(t.get("kv_lora_rank")) or 512,
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            v_head_dim=_int(t.get("v_head_dim")) or nope,
            q_lora_rank=_int(t.get("q_lora_rank")),
        )
        head_dim = rope + nope

    kinds, _dropped, raw_blocks = _layer_kinds_from_config(t, n_blocks, model_type, is_mla, estimated)

    linear: LinearAttnSpec | None = None
    if LayerKind.LINEAR in kinds:
        lk = _int(t.get("linear_num_key_heads"))
        lv = _int(t.get("linear_num_value_heads"))
        if lk is None or lv is None:
            raise BadInput(f"{label} has linear-attention layers but no linear_num_key_heads/linear_num_value_heads.")
        linear = LinearAttnSpec(
            n_key_heads=lk,
            n_value_heads=lv,
            key_head_dim=_int(t.get("linear_key_head_dim")) or 128,
            value_head_dim=_int(t.get("linear_value_head_dim")) or 128,
            conv_kernel=_int(t.get("linear_conv_kernel_dim")) or 4,
        )

    mamba: MambaSpec | None = None
    if LayerKind.MAMBA in kinds:
        d_state = _first_int(t, "mamba_d_state", "ssm_state_size", "state_size", "d_state") or 16
        d_conv = _first_int(t, "mamba_d_conv", "conv_kernel", "d_conv") or 4
        n_mheads = _first_int(t, "mamba_n_heads", "mamba_num_heads") or 0
        m_head_dim = _first_int(t, "mamba_d_head", "mamba_head_dim")
        if n_mheads and m_head_dim:
            d_inner = n_mheads * m_head_dim
        else:
            d_inner = _first_int(t, "mamba_d_ssm", "mamba_intermediate_size") or \
                (_first_int(t, "mamba_expand", "expand") or 2) * hidden
        mamba = MambaSpec(
            d_inner=d_inner, d_state=d_state, d_conv=d_conv,
            n_groups=_first_int(t, "mamba_n_groups", "n_groups", "mamba_num_groups") or 1,
            n_heads=n_mheads,
        )

    moe, moe_blocks = _moe_from_config(t, raw_blocks, estimated)
    intermediate = _int(t.get("intermediate_size"))
    if intermediate is None and _int(t.get("ffn_hidden_size")) is not None:
        intermediate = _int(t.get("ffn_hidden_size"))

    tie = t.get("tie_word_embeddings")
    if not isinstance(tie, bool):
        tie = model_type in GEMMA_TYPES
        estimated.append(f"tie_embeddings: not stated; assumed {tie} for {model_type}")

    raw_rope = t.get("rope_parameters")
    rope_params = raw_rope if isinstance(raw_rope, dict) else {}
    partial = t.get("partial_rotary_factor", rope_params.get("partial_rotary_factor"))
    if mla:
        rope_dim: int | None = mla.qk_rope_head_dim
    elif isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial <= 1:
        rope_dim = int(round(head_dim * partial))
    else:
        rope_dim = head_dim

    mtp = _first_int(t, "mtp_num_hidden_layers", "num_nextn_predict_layers", "n_mtp_layers") or 0
    dtype = t.get("torch_dtype") or t.get("dtype") or data.get("torch_dtype") or data.get("dtype")
    qcfg = data.get("quantization_config") or t.get("quantization_config")
    qmethod = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
    qbits = qcfg.get("bits") if isinstance(qcfg, dict) else None
    int4 = {"awq": "awq-int4", "gptq": "gptq-int4", "auto-round": "autoround-int4", "autoround": "autoround-int4"}
    if qmethod == "fp8":
        dtype = "fp8"   # the published weights are fp8; torch_dtype names the unquantized type
    elif qmethod in int4 and qbits == 4:
        dtype = int4[qmethod]   # 4-bit linear weights; torch_dtype names the activations' type
    elif qmethod:
        estimated.append(f"torch_dtype: the weights are quantized with {qmethod}, which is not read; "
                         f"sizes from torch_dtype overstate them")

    shapes = StackShapes(
        model_type=model_type, hidden=hidden, vocab=vocab, n_heads=n_heads, n_kv=n_kv,
        head_dim=head_dim, intermediate=intermediate, tie=tie,
        attn_gate=bool(t.get("attn_output_gate")), attn_bias=bool(t.get("attention_bias"))
        or model_type in _QKV_BIAS_TYPES,
        mla=mla, linear=linear, mamba=mamba, moe=moe, moe_blocks=moe_blocks, mamba_dt_rank=_int(t.get("mamba_dt_rank")),
        mamba_conv_bias=bool(t.get("mamba_conv_bias", True)),
        gated_mlp=model_type not in ("nemotron_h", "gpt2", "opt", "phi", "starcoder2", "falcon"),
        qk_norm=model_type in _QK_NORM_TYPES,
    )
    pattern = t.get("hybrid_override_pattern")
    block_types = list(pattern) if isinstance(pattern, str) else None
    trunk = shapes.trunk_params(kinds, raw_blocks, block_types, estimated)
    mtp_params = shapes.mtp_params(mtp) if mtp else None

    vision = None
    vcfg = data.get("vision_config")
    if isinstance(vcfg, dict):
        vision = _vision_from_config(vcfg, hidden, estimated)

    return ModelArch(
        name=name or str(t.get("_name_or_path") or data.get("_name_or_path") or label),
        source="config.json",
        architecture=model_type,
        n_layers=len(kinds),
        hidden_size=hidden,
        vocab_size=vocab,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        layer_kinds=tuple(kinds),
        intermediate_size=intermediate,
        sliding_window=_int(t.get("sliding_window")) if LayerKind.SLIDING in kinds else None,
        max_position=_first_int(t, "max_position_embeddings", "n_positions", "seq_length"),
        rope_dim=rope_dim,
        tie_embeddings=tie,
        mtp_layers=mtp,
        moe=moe,
        mla=mla,
        linear=linear,
        mamba=mamba,
        vision=vision,
        param_count=trunk,
        torch_dtype=_dtype_name(dtype),
        estimated=tuple(estimated),
        mtp_param_count=mtp_params,
        attn_output_gate=shapes.attn_gate,
        qk_norm=shapes.qk_norm,
        standard_block=model_type in _STANDARD_BLOCK_TYPES,
    )


def _dtype_name(dtype: Any) -> str | None:
    if not isinstance(dtype, str):
        return None
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(dtype, dtype)


