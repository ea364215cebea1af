"""ModelArch: what a model is made of, read from an HF config.json or a GGUF header.

Everything downstream (fit, plan, synth) works from this one frozen description; nothing
downstream reads config.json or GGUF files itself.

CONTRACT (shared by arch/fit/plan/synth authors; extend by adding fields with defaults,
never by renaming):

- ``layer_kinds`` has one entry per trunk layer (MTP layers excluded), each one of
  ``LayerKind`` values. Only FULL / SLIDING / MLA layers hold a KV cache that grows with
  context (SLIDING caps at ``sliding_window``); LINEAR (Gated DeltaNet) and MAMBA layers hold
  a fixed per-sequence recurrent state described by ``linear`` / ``mamba``.
- Sizes are element counts; byte sizes come from quant / dtype tables in fit.py.
- ``tensor_bytes`` is filled from a GGUF (exact bytes per tensor name, and its ggml type in
  ``tensor_types``); for config.json sources it is empty and fit estimates weight bytes
  from ``param_count`` and the chosen quant.
- ``estimated`` names every field that was guessed rather than read, with why.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import httpx
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from .errors import BadInput, EngineroomError, NotFound
from .values import int_or_none


class LayerKind(str, Enum):
    FULL = "full"          # global softmax attention, KV grows with context
    SLIDING = "sliding"    # windowed attention, KV capped at sliding_window
    MLA = "mla"            # multi-head latent attention (DeepSeek): compressed KV per token
    LINEAR = "linear"      # linear attention (Gated DeltaNet etc.): fixed state per sequence
    MAMBA = "mamba"        # SSM layer: fixed conv + ssm state per sequence


@dataclass(frozen=True)
class LinearAttnSpec:
    """Gated DeltaNet-style linear attention (Qwen3-Next, Qwen3.5/3.6)."""

    n_key_heads: int
    n_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_bytes_per_elem: int = 4  # fp32 recurrent state

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_key_heads * self.key_head_dim + self.n_value_heads * self.value_head_dim


@dataclass(frozen=True)
class MambaSpec:
    """Mamba / Mamba-2 SSM layers (Jamba, Nemotron-H, Falcon-H1, granite-hybrid...)."""

    d_inner: int
    d_state: int
    d_conv: int
    n_groups: int = 1
    n_heads: int = 0          # Mamba-2 heads (0 for Mamba-1)
    state_bytes_per_elem: int = 4


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention: cache kv_lora_rank + qk_rope_head_dim per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None


@dataclass(frozen=True)
class MoESpec:
    n_experts: int
    n_experts_active: int
    expert_intermediate_size: int
    n_shared_experts: int = 0
    # the width of the shared-expert MLP as stored: all shared experts fused into one MLP
    # (DeepSeek: n_shared_experts x moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size).
    # None: n_shared_experts x expert_intermediate_size (llama.cpp deepseek2: n_ff_exp * n_expert_shared)
    shared_intermediate_size: int | None = None
    first_dense_layers: int = 0   # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    n_moe_layers: int | None = None  # sparse-MLP layers when not all after first_dense_layers (Jamba)

    @property
    def shared_width(self) -> int:
        """Width of the fused shared-expert MLP (0 without shared experts); never multiply it
        by n_shared_experts again (llama.cpp: ffn_*_shexp are n_embd x n_ff_exp * n_expert_shared)."""
        if not self.n_shared_experts and not self.shared_intermediate_size:
            return 0
        if self.shared_intermediate_size:
            return self.shared_intermediate_size
        return self.expert_intermediate_size * self.n_shared_experts


@dataclass(frozen=True)
class VisionSpec:
    depth: int
    hidden_size: int
    n_heads: int
    patch_size: int
    param_count: int | None = None


@dataclass(frozen=True)
class ModelArch:
    name: str                       # human label (repo id, file name)
    source: str                     # "config.json" | "gguf" | "catalog"
    architecture: str               # HF model_type (text) or GGUF general.architecture
    n_layers: int                   # trunk layers (MTP excluded)
    hidden_size: int
    vocab_size: int
    n_heads: int                    # query heads of attention layers
    n_kv_heads: int                 # KV heads of attention layers
    head_dim: int
    layer_kinds: tuple[LayerKind, ...]
    intermediate_size: int | None = None   # dense MLP width
    sliding_window: int | None = None
    max_position: int | None = None
    rope_dim: int | None = None            # rotary dims (partial rotary)
    tie_embeddings: bool = False
    mtp_layers: int = 0
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    linear: LinearAttnSpec | None = None
    mamba: MambaSpec | None = None
    vision: VisionSpec | None = None
    param_count: int | None = None         # trunk + embeddings + head, excluding vision
    torch_dtype: str | None = None         # dtype of the published weights (bf16, fp8...)
    file_type: str | None = None           # GGUF: dominant quant (e.g. "Q4_K_M")
    tensor_bytes: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    tensor_types: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    tensor_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, hash=False)  # GGUF ne dims
    estimated: tuple[str, ...] = ()        # "field: why" for every guessed value
    mtp_param_count: int | None = None     # MTP / nextn layers, not in param_count

    # ---- derived counts ---------------------------------------------------------------
    def count(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def n_kv_layers(self) -> int:
        """Layers whose KV cache grows with context (full + sliding + MLA)."""
        return sum(1 for k in self.layer_kinds if k in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA))

    @property
    def is_hybrid(self) -> bool:
        return any(k in (LayerKind.LINEAR, LayerKind.MAMBA) for k in self.layer_kinds)

    @property
    def weight_bytes_exact(self) -> int | None:
        """Sum of tensor bytes when read from a GGUF, else None."""
        return sum(self.tensor_bytes.values()) if self.tensor_bytes else None

    @property
    def total_param_count(self) -> int | None:
        """Everything the checkpoint ships: trunk + MTP + vision (the "685B" of DeepSeek-V3)."""
        if self.param_count is None:
            return None
        vision = self.vision.param_count if self.vision and self.vision.param_count else 0
        return self.param_count + (self.mtp_param_count or 0) + vision

    def layer_indices(self, kind: LayerKind) -> tuple[int, ...]:
        """Positions of the layers of one kind (e.g. the full-attention ones: 3, 7, ... 63)."""
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == kind)


# =======================================================================================
# Reading: HF config.json
# =======================================================================================

_GEMMA_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text")
_QK_NORM_TYPES = (
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
    "qwen3_5_moe_text", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "olmo2",
)
_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
_GATED_DELTANET_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


def _read_config(cfg: dict[str, Any] | str | Path) -> tuple[dict[str, Any], str]:
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
                estimated.append(f"layer_kinds: {key} lists {len(kinds)} of {n_layers} layers; the rest copy the pattern")
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
    data, label = _read_config(cfg)
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
        tie = model_type in _GEMMA_TYPES
        estimated.append(f"tie_embeddings: not stated; assumed {tie} for {model_type}")

    rope_params = t.get("rope_parameters") if isinstance(t.get("rope_parameters"), dict) else {}
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

    shapes = _Shapes(
        model_type=model_type, hidden=hidden, vocab=vocab, n_heads=n_heads, n_kv=n_kv,
        head_dim=head_dim, intermediate=intermediate, tie=tie,
        attn_gate=bool(t.get("attn_output_gate")), attn_bias=bool(t.get("attention_bias"))
        or model_type in _QKV_BIAS_TYPES,
        mla=mla, linear=linear, mamba=mamba, moe=moe, moe_blocks=moe_blocks, mamba_dt_rank=_int(t.get("mamba_dt_rank")),
        mamba_conv_bias=bool(t.get("mamba_conv_bias", True)),
        gated_mlp=model_type not in ("nemotron_h", "gpt2", "opt", "phi", "starcoder2", "falcon"),
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
    )


def _dtype_name(dtype: Any) -> str | None:
    if not isinstance(dtype, str):
        return None
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(dtype, dtype)


@dataclass(frozen=True)
class _Shapes:
    """Tensor shapes of one decoder stack, to count parameters per block kind."""

    model_type: str
    hidden: int
    vocab: int
    n_heads: int
    n_kv: int
    head_dim: int
    intermediate: int | None
    tie: bool
    attn_gate: bool
    attn_bias: bool
    mla: MLASpec | None
    linear: LinearAttnSpec | None
    mamba: MambaSpec | None
    moe: MoESpec | None
    moe_blocks: frozenset[int]
    mamba_dt_rank: int | None
    mamba_conv_bias: bool
    gated_mlp: bool

    def attention(self) -> int:
        h, hd = self.hidden, self.head_dim
        if self.mla:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.n_heads * qk
            else:
                q = h * self.n_heads * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * self.n_heads * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + self.n_heads * m.v_head_dim * h
        q_out = self.n_heads * hd * (2 if self.attn_gate else 1)
        n = h * q_out + 2 * h * self.n_kv * hd + self.n_heads * hd * h
        if self.attn_bias:
            n += q_out + 2 * self.n_kv * hd
        if self.model_type in _QK_NORM_TYPES:
            n += 2 * hd
        return n

    def linear_attention(self) -> int:
        la = self.linear
        assert la is not None
        h = self.hidden
        v_dim = la.n_value_heads * la.value_head_dim
        return (
            h * la.conv_dim + h * v_dim + 2 * h * la.n_value_heads   # in_proj qkv, z, b, a
            + la.conv_dim * la.conv_kernel                           # depthwise conv
            + 2 * la.n_value_heads + la.value_head_dim               # dt_bias, A_log, gated norm
            + v_dim * h                                              # out_proj
        )

    def mamba_mixer(self) -> int:
        m = self.mamba
        assert m is not None
        h, di = self.hidden, m.d_inner
        if m.n_heads:   # Mamba-2
            conv_dim = di + 2 * m.n_groups * m.d_state
            return (h * (di + conv_dim + m.n_heads) + conv_dim * m.d_conv + conv_dim
                    + 3 * m.n_heads + di + di * h)
        dt_rank = self.mamba_dt_rank or -(-h // 16)
        n = (h * 2 * di + di * m.d_conv + (di if self.mamba_conv_bias else 0)
             + di * (dt_rank + 2 * m.d_state) + dt_rank * di + di
             + di * m.d_state + di + di * h)
        if self.model_type == "jamba":
            n += dt_rank + 2 * m.d_state   # dt/B/C layernorms
        return n

    def dense_mlp(self, width: int | None = None) -> int:
        w = width if width is not None else (self.intermediate or 4 * self.hidden)
        return (3 if self.gated_mlp else 2) * self.hidden * w

    def moe_mlp(self) -> int:
        moe = self.moe
        assert moe is not None
        h = self.hidden
        n = h * moe.n_experts + moe.n_experts * 3 * h * moe.expert_intermediate_size
        if moe.shared_width:
            n += 3 * h * moe.shared_width
            if self.model_type.startswith(("qwen2_moe", "qwen3_next", "qwen3_5")):
                n += h   # shared_expert_gate
        if self.model_type.startswith("deepseek_v3"):
            n += moe.n_experts   # e_score_correction_bias
        return n

    def norms_per_block(self) -> int:
        return (4 if self.model_type in _GEMMA_TYPES else 2) * self.hidden

    def trunk_params(self, kinds: list[LayerKind], n_blocks: int,
                     block_types: list[str] | None, estimated: list[str]) -> int:
        """Embeddings + every block + final norm + untied head."""
        total = self.vocab * self.hidden + self.hidden
        if not self.tie:
            total += self.vocab * self.hidden
        moe_blocks = self.moe_blocks
        if block_types is not None:   # Nemotron-H: blocks are mixer OR mlp, one norm each
            for ch in block_types:
                total += self.hidden
                if ch == "M":
                    total += self.mamba_mixer()
                elif ch == "*":
                    total += self.attention()
                elif ch == "E" and self.moe:
                    total += self.moe_mlp()
                else:
                    total += self.dense_mlp()
            return total
        for i, kind in enumerate(kinds):
            total += self.norms_per_block()
            if kind == LayerKind.LINEAR:
                total += self.linear_attention()
            elif kind == LayerKind.MAMBA:
                total += self.mamba_mixer()
            else:
                total += self.attention()
            total += self.moe_mlp() if i in moe_blocks else self.dense_mlp()
        return total

    def mtp_params(self, n: int) -> int:
        """One MTP module: two input norms, a 2h->h projection, one decoder block, a final norm;
        embeddings and head are shared with the trunk (DeepSeek-V3 and Qwen3.5 layouts)."""
        h = self.hidden
        block = self.norms_per_block() + self.attention() + (self.moe_mlp() if self.moe else self.dense_mlp())
        return n * (2 * h + 2 * h * h + block + h)


# =======================================================================================
# Reading: GGUF header + tensor table (local mmap or remote HTTP range reads)
# =======================================================================================

_MAX_TENSORS = 1 << 20
_MAX_KV = 1 << 20
_MAX_STRING = 1 << 26       # 64 MiB: no sane key or value string is longer
_MAX_ARRAY = 1 << 28
_KEEP_ARRAY = 4096          # arrays longer than this keep only their length (token lists)
_FIRST_PREFIX = 2 << 20     # 2 MiB: enough for most headers without a 256k-token vocab
_MAX_PREFIX = 1 << 30       # give up on a header larger than 1 GiB

_SCALAR_FORMATS: dict[int, str] = {
    int(GGUFValueType.UINT8): "<B", int(GGUFValueType.INT8): "<b",
    int(GGUFValueType.UINT16): "<H", int(GGUFValueType.INT16): "<h",
    int(GGUFValueType.UINT32): "<I", int(GGUFValueType.INT32): "<i",
    int(GGUFValueType.FLOAT32): "<f", int(GGUFValueType.BOOL): "<?",
    int(GGUFValueType.UINT64): "<Q", int(GGUFValueType.INT64): "<q",
    int(GGUFValueType.FLOAT64): "<d",
}


class _NeedMore(Exception):
    """The buffer ended inside the header: read a longer prefix and parse again."""


@dataclass
class GGUFArray:
    """A GGUF array value: its element count always, its values when short."""

    count: int
    values: list[Any] | None


@dataclass
class GGUFHeader:
    """What a GGUF says about itself before its first weight byte."""

    version: int
    kv: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], int]]   # name -> (ne dims, ggml type id)
    header_bytes: int                                  # bytes up to the end of the tensor table

    def tensor_nbytes(self, name: str) -> int:
        dims, ggml_type = self.tensors[name]
        return _tensor_nbytes(name, dims, ggml_type)


def _tensor_nbytes(name: str, dims: tuple[int, ...], ggml_type: int) -> int:
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise BadInput(f"Tensor {name!r} has ggml type {ggml_type}, which this gguf package does not know.") from None
    n = math.prod(dims)
    if dims and dims[0] % block:
        raise BadInput(f"Tensor {name!r} has a first dimension {dims[0]} that is not a multiple of its block size {block}.")
    return n // block * type_size


class _Cursor:
    def __init__(self, buf: bytes | memoryview | mmap.mmap, complete: bool):
        self.buf = buf
        self.pos = 0
        self.complete = complete   # True: running out of bytes means a truncated file

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            if self.complete:
                raise BadInput("truncated")
            raise _NeedMore
        chunk = bytes(self.buf[self.pos:end])
        self.pos = end
        return chunk

    def skip(self, n: int) -> None:
        end = self.pos + n
        if end > len(self.buf):
            if self.complete:
                raise BadInput("truncated")
            raise _NeedMore
        self.pos = end

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > _MAX_STRING:
            raise BadInput(f"a string length of {n} bytes")
        return self.take(n).decode("utf-8", errors="replace")


def _read_value(cur: _Cursor, vtype: int, depth: int = 0) -> Any:
    if vtype in _SCALAR_FORMATS:
        return cur.scalar(_SCALAR_FORMATS[vtype])
    if vtype == GGUFValueType.STRING:
        return cur.string()
    if vtype == GGUFValueType.ARRAY:
        if depth > 2:
            raise BadInput("arrays nested too deep")
        etype = cur.scalar("<I")
        count = cur.scalar("<Q")
        if count > _MAX_ARRAY:
            raise BadInput(f"an array of {count} elements")
        keep = count <= _KEEP_ARRAY
        if etype in _SCALAR_FORMATS:
            size = struct.calcsize(_SCALAR_FORMATS[etype])
            if not keep:
                cur.skip(size * count)
                return GGUFArray(count, None)
            raw = cur.take(size * count)
            return GGUFArray(count, list(struct.unpack(f"<{count}{_SCALAR_FORMATS[etype][1]}", raw)))
        values = [_read_value(cur, etype, depth + 1) for _ in range(count)] if keep else None
        if not keep:
            for _ in range(count):
                _read_value(cur, etype, depth + 1)
        return GGUFArray(count, values)
    raise BadInput(f"a value of unknown type {vtype}")


def parse_gguf_header(buf: bytes | memoryview | mmap.mmap, complete: bool = True) -> GGUFHeader:
    """Parse the GGUF header and tensor table from ``buf`` (a whole file or a prefix).

    With ``complete=False`` a buffer that ends inside the header raises ``_NeedMore`` so the
    caller can fetch a longer prefix; otherwise every defect (bad magic, absurd counts,
    unknown types, truncation) is a ``BadInput`` whose message says what was wrong.
    """
    cur = _Cursor(buf, complete)
    magic = cur.take(4)
    if magic != b"GGUF":
        raise BadInput("not a GGUF file")
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise BadInput(f"GGUF version {version} (only 2 and 3 are read)")
    n_tensors = cur.scalar("<Q")
    n_kv = cur.scalar("<Q")
    if n_tensors > _MAX_TENSORS or n_kv > _MAX_KV:
        raise BadInput(f"{n_tensors} tensors and {n_kv} keys")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.scalar("<I")
        kv[key] = _read_value(cur, vtype)
    tensors: dict[str, tuple[tuple[int, ...], int]] = {}
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if not 1 <= n_dims <= 8:
            raise BadInput(f"tensor {name!r} with {n_dims} dimensions")
        dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
        ggml_type = cur.scalar("<I")
        cur.scalar("<Q")   # data offset: not needed, the weights are never read
        if any(d == 0 or d > 1 << 40 for d in dims):
            raise BadInput(f"tensor {name!r} with dimensions {dims}")
        _tensor_nbytes(name, dims, ggml_type)   # validates the type now
        tensors[name] = (dims, ggml_type)
    return GGUFHeader(version=version, kv=kv, tensors=tensors, header_bytes=cur.pos)


def _wrap_header_error(where: str, exc: BadInput) -> BadInput:
    msg = str(exc)
    if msg == "not a GGUF file":
        return BadInput(f"{where} is not a GGUF file (it does not start with the GGUF magic).")
    if msg == "truncated":
        return BadInput(f"{where} is a truncated GGUF file: it ends inside the header.")
    if msg.endswith("."):   # already a full sentence (unknown tensor type...)
        return BadInput(f"{where}: {msg[0].lower()}{msg[1:]}")
    return BadInput(f"{where} has a corrupt GGUF header ({msg}).")


def read_gguf_header_local(path: str | Path) -> GGUFHeader:
    """Header of a local GGUF via mmap: only the header pages are ever touched."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise BadInput(f"{p} is not a GGUF file (it is empty).")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                try:
                    return parse_gguf_header(mm, complete=True)
                except BadInput as exc:
                    raise _wrap_header_error(str(p), exc) from None
    except FileNotFoundError:
        raise BadInput(f"{p} does not exist.") from None
    except IsADirectoryError:
        raise BadInput(f"{p} is a directory, not a GGUF file.") from None
    except PermissionError:
        raise BadInput(f"{p} cannot be read (permission denied).") from None


def _auth_headers(url: str) -> dict[str, str]:
    """Send the user's Hugging Face token to the hub only, so gated repos work."""
    host = httpx.URL(url).host
    if host == "huggingface.co" or host.endswith(".huggingface.co"):
        try:
            from huggingface_hub import get_token
            token = get_token()
        except Exception:  # noqa: BLE001 - a missing token is not an error
            token = None
        if token:
            return {"Authorization": f"Bearer {token}"}
    return {}


def _fetch_prefix(client: httpx.Client, url: str, n: int) -> tuple[bytes, int | None]:
    """First ``n`` bytes of ``url`` and the total size when the server says it. A server
    that ignores Range gets its stream cut after ``n`` bytes, so weights are never pulled."""
    headers = {"Range": f"bytes=0-{n - 1}", **_auth_headers(url)}
    with client.stream("GET", url, headers=headers) as resp:
        if resp.status_code == 404:
            raise NotFound(f"{url} does not exist (HTTP 404).")
        if resp.status_code in (401, 403):
            raise BadInput(f"{url} refused access (HTTP {resp.status_code}); a gated repo needs a Hugging Face token.")
        if resp.status_code not in (200, 206):
            raise EngineroomError(f"{url} answered HTTP {resp.status_code} to a range request.")
        total: int | None = None
        content_range = resp.headers.get("content-range", "")
        if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
            total = int(content_range.rsplit("/", 1)[1])
        elif resp.status_code == 200 and resp.headers.get("content-length", "").isdigit():
            total = int(resp.headers["content-length"])
        chunks: list[bytes] = []
        got = 0
        for chunk in resp.iter_bytes():
            chunks.append(chunk)
            got += len(chunk)
            if got >= n:
                break
    return b"".join(chunks)[:n], total


def read_gguf_header_remote(url: str, client: httpx.Client | None = None) -> GGUFHeader:
    """Header of a GGUF over HTTP(S) with growing range reads (2 MiB, 4 MiB, ...), so a
    multi-gigabyte file costs a few megabytes of traffic."""
    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0))
    try:
        n = _FIRST_PREFIX
        while True:
            try:
                buf, total = _fetch_prefix(client, url, n)
            except httpx.HTTPError as exc:
                raise EngineroomError(f"Could not read {url} ({exc.__class__.__name__}: {_first_line(exc)}).") from None
            complete = len(buf) < n or (total is not None and len(buf) >= total)
            try:
                return parse_gguf_header(buf, complete=complete)
            except _NeedMore:
                if n >= _MAX_PREFIX:
                    raise BadInput(f"{url} has a GGUF header larger than {_MAX_PREFIX >> 20} MiB.") from None
                n *= 2
            except BadInput as exc:
                raise _wrap_header_error(url, exc) from None
    finally:
        if own:
            client.close()


def _first_sentence(exc: BaseException) -> str:
    line = _first_line(exc)
    return line.split(". ")[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else exc.__class__.__name__
    return line.rstrip(".")[:200]


_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def _kv_int(kv: dict[str, Any], key: str) -> int | None:
    v = kv.get(key)
    if isinstance(v, GGUFArray):
        return None
    return _int(v)


def _kv_per_layer(kv: dict[str, Any], key: str, n: int) -> list[int] | None:
    """A per-layer value: GGUF stores it as a scalar or as an array of ``n_layer`` ints."""
    v = kv.get(key)
    if isinstance(v, GGUFArray):
        if v.values is None or not all(_int(x) is not None for x in v.values):
            return None
        return [int(x) for x in v.values]
    iv = _int(v)
    return None if iv is None else [iv] * n


def _file_type_name(kv: dict[str, Any]) -> str | None:
    ft = _int(kv.get("general.file_type"))
    if ft is None:
        return None
    guessed = bool(ft & 1024)
    try:
        name = LlamaFileType(ft & ~1024).name
    except ValueError:
        return f"file_type {ft}"
    name = name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return f"{name} (guessed)" if guessed else name


_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_LINEAR_ATTN_ARCHS = ("qwen3next", "qwen35", "qwen35moe")


def arch_from_gguf(path_or_url: str | Path) -> ModelArch:
    """Describe a model from a GGUF's header and tensor table, locally or over HTTP.

    The tensor table gives exact byte sizes per tensor, so fit.py can place weights without
    guessing; layer kinds come from which tensors each block holds, refined by the
    architecture's keys (sliding-window pattern, full-attention interval, MLA ranks).
    """
    ref = str(path_or_url)
    remote = ref.startswith(("http://", "https://"))
    header = read_gguf_header_remote(ref) if remote else read_gguf_header_local(ref)
    kv = header.kv
    estimated: list[str] = []
    tensors: dict[str, tuple[tuple[int, ...], int]] = dict(header.tensors)

    split_count = _kv_int(kv, "split.count") or 1
    m = _SPLIT_RE.search(ref)
    if split_count > 1:
        if m:
            for i in range(2, split_count + 1):
                other = ref[: m.start()] + f"-{i:05d}-of-{split_count:05d}.gguf" + ref[m.end():]
                part = read_gguf_header_remote(other) if remote else read_gguf_header_local(other)
                tensors.update(part.tensors)
        else:
            estimated.append(f"tensor_bytes: shard 1 of {split_count} only; other shard names unknown")

    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise BadInput(f"{ref} has no general.architecture key, so its layout cannot be read.")
    a = arch

    def key(name: str) -> str:
        return f"{a}.{name}"

    block_count = _kv_int(kv, key("block_count"))
    hidden = _kv_int(kv, key("embedding_length"))
    missing = [k for k, v in (("block_count", block_count), ("embedding_length", hidden)) if not v]
    if missing:
        raise BadInput(f"{ref} lacks {', '.join(a + '.' + k for k in missing)}, so the model cannot be described.")
    assert block_count and hidden
    if block_count > 100_000 or hidden > 1 << 24:
        raise BadInput(f"{ref} declares {block_count} blocks of width {hidden}, which is not a real model.")

    # --- which block holds what ---------------------------------------------------------
    per_block: dict[int, set[str]] = {}
    for tname in tensors:
        bm = _BLK_RE.match(tname)
        if bm:
            per_block.setdefault(int(bm.group(1)), set()).add(bm.group(2))
    nextn = _kv_int(kv, key("nextn_predict_layers")) or 0
    mtp_blocks = {i for i, names in per_block.items() if any(n.startswith("nextn.") for n in names)}
    has_mtp_tensors = bool(mtp_blocks)
    trunk_blocks = block_count
    if nextn:
        last_present = max(per_block) if per_block else -1
        if has_mtp_tensors or last_present < block_count - 1:
            trunk_blocks = block_count - nextn
    if nextn and not has_mtp_tensors:
        estimated.append(f"mtp_layers: header declares {nextn} nextn layers but the file has no nextn tensors")
    mtp_blocks |= {i for i in per_block if i >= trunk_blocks}

    head_counts = _kv_per_layer(kv, key("attention.head_count"), block_count) or []
    kv_counts = _kv_per_layer(kv, key("attention.head_count_kv"), block_count)
    n_heads = max(head_counts) if head_counts else 0
    if not n_heads and a not in ("mamba", "mamba2"):
        raise BadInput(f"{ref} lacks {a}.attention.head_count, so the model cannot be described.")
    if kv_counts is None:
        kv_counts = [n_heads] * block_count
    n_kv = max(kv_counts) if kv_counts else n_heads
    key_len = _kv_int(kv, key("attention.key_length"))
    head_dim = key_len or (hidden // n_heads if n_heads else 0)

    is_mla = _kv_int(kv, key("attention.kv_lora_rank")) is not None
    mla: MLASpec | None = None
    rope_dim = _kv_int(kv, key("rope.dimension_count"))
    if is_mla:
        rope = rope_dim or 64
        k_mla = _kv_int(kv, key("attention.key_length_mla")) or key_len or 192
        v_mla = _kv_int(kv, key("attention.value_length_mla")) or _kv_int(kv, key("attention.value_length")) or 128
        mla = MLASpec(
            kv_lora_rank=_kv_int(kv, key("attention.kv_lora_rank")) or 512,
            qk_rope_head_dim=rope,
            qk_nope_head_dim=k_mla - rope,
            v_head_dim=v_mla,
            q_lora_rank=_kv_int(kv, key("attention.q_lora_rank")),
        )
        head_dim = k_mla

    kinds: list[LayerKind] = []
    ffn_only = 0
    for i in range(trunk_blocks):
        names = per_block.get(i, set())
        has_ssm = any(n.startswith("ssm_") for n in names)
        has_attn = any(n.startswith(("attn_q", "attn_k", "attn_qkv", "attn_kv_a_mqa")) for n in names)
        if has_ssm:
            kinds.append(LayerKind.LINEAR if a in _LINEAR_ATTN_ARCHS else LayerKind.MAMBA)
        elif has_attn or not names:
            kinds.append(LayerKind.MLA if is_mla else LayerKind.FULL)
            if not names:
                estimated.append(f"layer_kinds[{i}]: block has no tensors in the table; assumed attention")
        else:
            ffn_only += 1
    if ffn_only:
        estimated.append(f"layer_kinds: {ffn_only} feed-forward-only blocks hold no sequence state and are not listed")

    interval = _kv_int(kv, key("full_attention_interval"))
    if interval and a in _LINEAR_ATTN_ARCHS:
        expected = [LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.LINEAR for i in range(trunk_blocks)]
        if expected != kinds:
            estimated.append("layer_kinds: tensors disagree with full_attention_interval; the tensors were used")

    window = _kv_int(kv, key("attention.sliding_window"))
    if window and not is_mla:
        pattern = kv.get(key("attention.sliding_window_pattern"))
        sliding: list[bool] | None = None
        if isinstance(pattern, GGUFArray) and pattern.values is not None:
            # llama.cpp stores a per-layer bool array: true = sliding-window layer
            sliding = [bool(x) for x in pattern.values][:trunk_blocks]
        elif _int(pattern):
            p = int(pattern)
            sliding = [(i + 1) % p != 0 for i in range(trunk_blocks)]
        elif a == "gemma3":
            sliding = [(i + 1) % 6 != 0 for i in range(trunk_blocks)]
        elif a == "gemma2":
            sliding = [i % 2 == 0 for i in range(trunk_blocks)]
        elif a in ("mistral", "llama"):
            sliding = None   # a window key alone on llama-family GGUFs is informational
        else:
            sliding = [True] * trunk_blocks
            estimated.append(f"layer_kinds: {a} declares a sliding window but no pattern; all attention layers marked sliding")
        if sliding is not None:
            for idx, kind in enumerate(kinds):
                if kind == LayerKind.FULL and idx < len(sliding) and sliding[idx]:
                    kinds[idx] = LayerKind.SLIDING

    linear: LinearAttnSpec | None = None
    mamba: MambaSpec | None = None
    conv = _kv_int(kv, key("ssm.conv_kernel"))
    state = _kv_int(kv, key("ssm.state_size"))
    groups = _kv_int(kv, key("ssm.group_count"))
    rank = _kv_int(kv, key("ssm.time_step_rank"))
    inner = _kv_int(kv, key("ssm.inner_size"))
    if LayerKind.LINEAR in kinds:
        if not (state and groups and rank and inner):
            raise BadInput(f"{ref} has linear-attention blocks but lacks {a}.ssm.state_size/group_count/time_step_rank/inner_size.")
        linear = LinearAttnSpec(
            n_key_heads=groups, n_value_heads=rank, key_head_dim=state,
            value_head_dim=inner // rank, conv_kernel=conv or 4,
        )
    if LayerKind.MAMBA in kinds:
        if not (state and inner):
            raise BadInput(f"{ref} has Mamba blocks but lacks {a}.ssm.state_size/inner_size.")
        mamba = MambaSpec(d_inner=inner, d_state=state, d_conv=conv or 4,
                          n_groups=groups or 1, n_heads=rank if a not in ("mamba", "jamba") else 0)

    n_experts = _kv_int(kv, key("expert_count"))
    moe: MoESpec | None = None
    if n_experts and n_experts > 1:
        n_moe = sum(1 for i in range(trunk_blocks)
                    if any(n.startswith("ffn_gate_inp") for n in per_block.get(i, ())))
        first_dense = _kv_int(kv, key("leading_dense_block_count")) or 0
        moe = MoESpec(
            n_experts=n_experts,
            n_experts_active=_kv_int(kv, key("expert_used_count")) or 0,
            expert_intermediate_size=_kv_int(kv, key("expert_feed_forward_length"))
            or (_kv_per_layer(kv, key("feed_forward_length"), block_count) or [0])[-1],
            n_shared_experts=_kv_int(kv, key("expert_shared_count")) or 0,
            shared_intermediate_size=_kv_int(kv, key("expert_shared_feed_forward_length")),
            first_dense_layers=first_dense,
            n_moe_layers=n_moe if n_moe != trunk_blocks - first_dense else None,
        )
        if moe.n_shared_experts == 0 and any("ffn_up_shexp" in n for names in per_block.values() for n in names):
            moe = replace(moe, n_shared_experts=1)

    ff = _kv_per_layer(kv, key("feed_forward_length"), block_count)
    intermediate = max(ff) if ff else None

    vocab = _kv_int(kv, key("vocab_size"))
    tokens = kv.get("tokenizer.ggml.tokens")
    if not vocab and isinstance(tokens, GGUFArray):
        vocab = tokens.count
    if not vocab and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"][0][-1]
    if not vocab:
        estimated.append("vocab_size: no vocab key, token list or token_embd tensor")
        vocab = 0

    tensor_bytes: dict[str, int] = {}
    tensor_types: dict[str, str] = {}
    tensor_shapes: dict[str, tuple[int, ...]] = {}
    trunk_params = 0
    mtp_params = 0
    for tname, (dims, gtype) in tensors.items():
        tensor_bytes[tname] = _tensor_nbytes(tname, dims, gtype)
        tensor_types[tname] = GGMLQuantizationType(gtype).name
        tensor_shapes[tname] = tuple(int(d) for d in dims)
        bm = _BLK_RE.match(tname)
        if bm and int(bm.group(1)) in mtp_blocks:
            mtp_params += math.prod(dims)
        else:
            trunk_params += math.prod(dims)

    name = kv.get("general.name")
    return ModelArch(
        name=name if isinstance(name, str) and name else Path(httpx.URL(ref).path if remote else ref).name,
        source="gguf",
        architecture=a,
        n_layers=len(kinds),
        hidden_size=hidden,
        vocab_size=vocab,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        layer_kinds=tuple(kinds),
        intermediate_size=intermediate,
        sliding_window=window if LayerKind.SLIDING in kinds else None,
        max_position=_kv_int(kv, key("context_length")),
        rope_dim=rope_dim or head_dim,
        tie_embeddings="output.weight" not in tensors,
        mtp_layers=nextn if has_mtp_tensors else 0,
        moe=moe,
        mla=mla,
        linear=linear,
        mamba=mamba,
        param_count=trunk_params,
        file_type=_file_type_name(kv),
        tensor_bytes=tensor_bytes,
        tensor_types=tensor_types,
        tensor_shapes=tensor_shapes,
        estimated=tuple(estimated),
        mtp_param_count=mtp_params or None,
    )


# =======================================================================================
# Fetching and dispatch
# =======================================================================================

def _hub_unreachable(repo_id: str, revision: str | None) -> str | None:
    """One HEAD request for config.json, no retries: why the hub cannot be reached, or None.

    ``hf_hub_download`` retries a failed connection with backoff for ~20 s before it gives
    up; this probe answers at once when there is no network (HTTP errors such as a missing
    repo are left for ``hf_hub_download`` to raise)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if constants.is_offline_mode():
        return "offline mode is on (HF_HUB_OFFLINE)"
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision),
                             timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - httpx or httpx2 transport errors, by name
        if any(c.__name__ in ("TransportError", "OSError") for c in type(exc).__mro__):
            return f"cannot reach Hugging Face at {constants.ENDPOINT}: {_first_sentence(exc)}"
    return None


def fetch_hf_config(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    """Download config.json alone from the Hugging Face hub (cached by huggingface_hub),
    so a model can be planned before any weight is pulled. When the hub cannot be reached,
    a cached copy is used, else the error says so at once."""
    unreachable = None
    try:
        from huggingface_hub import hf_hub_download
        unreachable = _hub_unreachable(repo_id, revision)
        local = hf_hub_download(repo_id=repo_id, filename="config.json", revision=revision,
                                local_files_only=unreachable is not None)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types; the user needs one sentence
        kind = exc.__class__.__name__
        if "RepositoryNotFound" in kind:
            raise NotFound(f"Hugging Face has no repository {repo_id} (or it is private).") from None
        if "GatedRepo" in kind:
            raise BadInput(f"{repo_id} is gated on Hugging Face; accept its licence and log in with a token.") from None
        if "RevisionNotFound" in kind:
            raise NotFound(f"{repo_id} has no revision {revision!r} on Hugging Face.") from None
        if "EntryNotFound" in kind and "Local" not in kind:
            raise NotFound(f"{repo_id} on Hugging Face has no config.json.") from None
        if unreachable is not None:
            reason = f"{unreachable}, and no cached copy exists"
        elif "LocalEntryNotFound" in kind or "Offline" in kind:
            reason = "the hub is unreachable or offline mode is on, and no cached copy exists"
        else:
            reason = f"{kind}: {_first_sentence(exc)}"
        raise EngineroomError(f"Could not download config.json for {repo_id} from Hugging Face ({reason}).") from None
    data, _ = _read_config(local)
    return data


_HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def load_arch(ref: str) -> ModelArch:
    """One entry point for every way a user names a model:

    - ``path/to/config.json`` or a directory holding one (or holding exactly one .gguf)
    - ``path/to/model.gguf``
    - ``https://host/.../model.gguf`` (header read with range requests)
    - ``hf:ORG/REPO/FILE.gguf[@REVISION]`` (models.py grammar: a pulled copy, else the header on the hub)
    - ``org/repo`` (config.json downloaded alone)
    """
    ref = ref.strip()
    if not ref:
        raise BadInput("An empty model reference was given.")
    if ref.startswith("hf:"):
        from . import models  # the one grammar for model references

        if not models.is_hf_file(ref) or not ref.split("@")[0].endswith(".gguf"):
            raise BadInput(f"{ref!r} is not of the form hf:ORG/REPO/FILE.gguf[@REVISION].")
        mref = models.resolve(ref)
        if mref.is_local:  # pulled before: read the cached copy
            arch = arch_from_gguf(mref.path)
        else:
            from huggingface_hub import hf_hub_url

            arch = arch_from_gguf(hf_hub_url(mref.repo, mref.filename, revision=mref.revision))
        return replace(arch, name=f"{mref.repo}/{mref.filename}")
    if ref.startswith(("http://", "https://")):
        try:
            url = httpx.URL(ref)
        except httpx.InvalidURL as exc:
            raise BadInput(f"{ref} is not a valid URL ({_first_sentence(exc)}).") from None
        if url.path.endswith(".gguf"):
            return arch_from_gguf(ref)
        raise BadInput(f"{ref} is a URL that does not end in .gguf; only GGUF files are read over HTTP.")
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            if (path / "config.json").is_file():
                return arch_from_config(path / "config.json", name=path.name)
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return arch_from_gguf(ggufs[0])
            raise BadInput(f"{path} holds no config.json and {len(ggufs)} .gguf files, so the model is ambiguous.")
        if path.suffix == ".gguf":
            return arch_from_gguf(path)
        if path.suffix == ".json":
            return arch_from_config(path)
        with open(path, "rb") as fh:
            if fh.read(4) == b"GGUF":
                return arch_from_gguf(path)
        raise BadInput(f"{path} is neither a config.json nor a GGUF file.")
    if _HF_ID_RE.match(ref) and not ref.endswith((".gguf", ".json")):
        return arch_from_config(fetch_hf_config(ref), name=ref)
    raise BadInput(
        f"{ref!r} is not a local file, a directory, a GGUF URL, an hf:org/repo/file.gguf reference or an org/repo id."
    )
