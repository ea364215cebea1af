"""ModelArch: what a model is made of, as one frozen description.

Everything downstream (fit, plan, synth) works from this description; nothing downstream
reads config.json or GGUF files itself (``config.py`` and ``gguf_arch.py`` build it).

CONTRACT (shared by arch/fit/plan/synth authors; extend by adding fields with defaults,
never by renaming):

- ``layer_kinds`` has one entry per trunk layer (MTP layers excluded), each one of
  ``LayerKind`` values. Only FULL / SLIDING / MLA layers hold a KV cache that grows with
  context (SLIDING caps at ``sliding_window``); LINEAR (Gated DeltaNet) and MAMBA layers hold
  a fixed per-sequence recurrent state described by ``linear`` / ``mamba``.
- Sizes are element counts; byte sizes come from quant / dtype tables in fit.
- ``tensor_bytes`` is filled from a GGUF (exact bytes per tensor name, and its ggml type in
  ``tensor_types``); for config.json sources it is empty and fit estimates weight bytes
  from ``param_count`` and the chosen quant.
- ``estimated`` names every field that was guessed rather than read, with why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property


class LayerKind(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() of members
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
    """Mixture-of-experts MLP: experts per layer, how many one token uses, their widths."""

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

    def sparse_layers(self, n_layers: int) -> int:
        """How many of a model's ``n_layers`` route to experts: n_moe_layers, else all after the dense ones."""
        return self.n_moe_layers if self.n_moe_layers is not None else n_layers - self.first_dense_layers

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
    """The vision tower (ViT) a multimodal checkpoint ships beside the text model."""

    depth: int
    hidden_size: int
    n_heads: int
    patch_size: int
    param_count: int | None = None


@dataclass(frozen=True)
class ModelArch:
    """What a model is made of (the module's CONTRACT): layers by kind, attention shape, the
    blocks beside attention, sizes, and what was estimated rather than read."""

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
    active_param_count: int | None = None  # MoE: parameters one token reads, where a source states it
    # ---- facts about the attention block that memory models depend on, set by the reader
    # from the architecture's properties (config keys, GGUF tensors) so that nothing
    # downstream branches on an architecture name --------------------------------------
    attn_output_gate: bool = False   # the Q projection also yields an output gate (2 x n_heads x head_dim:
                                     # Qwen3-Next / Qwen3.5 / Qwen3.6 full-attention layers)
    qk_norm: bool = False            # per-head RMS norm of Q and K before RoPE (Qwen3, Gemma 3)
    # every block is the plain pre-norm decoder block (RMSNorm, RoPE attention without biases
    # or extra norms, SwiGLU MLP) of llama.cpp's llama / qwen3 graphs, which fit replays
    standard_block: bool = False

    # ---- derived counts ---------------------------------------------------------------
    def count(self, kind: LayerKind) -> int:
        return self.kind_counts.get(kind, 0)

    @cached_property
    def kind_counts(self) -> Counter[LayerKind]:
        """Layers of each kind (computed once: fit reads them for every request it sizes)."""
        return Counter(self.layer_kinds)

    def kind_counts_in(self, start: int, stop: int) -> dict[LayerKind, int]:
        """Layers of each kind among ``layer_kinds[start:stop]`` (one GPU's share of a layer split),
        from running counts kept per kind: fit asks for every device of every request it sizes."""
        n = len(self.layer_kinds)
        start, stop = min(max(start, 0), n), min(max(stop, 0), n)
        if stop <= start:
            return {}
        return {k: run[stop] - run[start] for k, run in self.kind_running_counts.items()}

    @cached_property
    def kind_running_counts(self) -> dict[LayerKind, tuple[int, ...]]:
        """Per kind, how many of the first i layers are of it, for i = 0 .. n_layers."""
        out: dict[LayerKind, tuple[int, ...]] = {}
        for kind in self.kind_counts:
            run, n = [0], 0
            for k in self.layer_kinds:
                n += k == kind
                run.append(n)
            out[kind] = tuple(run)
        return out

    @cached_property
    def recurrent_layers(self) -> tuple[int, ...]:
        """Positions of the layers that hold a fixed recurrent state (LINEAR and MAMBA), in order."""
        return tuple(i for i, k in enumerate(self.layer_kinds) if k in (LayerKind.LINEAR, LayerKind.MAMBA))

    @cached_property
    def n_kv_layers(self) -> int:
        """Layers whose KV cache grows with context (full + sliding + MLA)."""
        return sum(self.kind_counts.get(k, 0) for k in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA))

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

