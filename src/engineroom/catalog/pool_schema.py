"""What a ``kv_pool`` engine's catalog entry says of its memory (engine_schema's ``Engine`` holds them): the
activation reserve, a GPU build's profiling pass (vLLM), the fixed KV space of a CPU build, and the static share of
the GPU an engine takes by its own rule when none is given (SGLang)."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import Strict


class PoolActivation(Strict):
    """kv_pool engines: the activation memory fit reserves beside weights and KV, as
    ``coef x 48 x ctx / TP`` bytes, ``coef`` chosen by the KV type's bytes per element."""

    coef_by_kv_bytes: dict[float, float]     # KV bytes per element -> coef
    coef_below_half_byte: float = Field(gt=0)   # a KV type under 0.5 bytes per element not listed
    coef_default: float = Field(gt=0)        # any other KV type not listed
    source: str

    def coef(self, kv_bytes_per_elem: float) -> float:
        found = self.coef_by_kv_bytes.get(kv_bytes_per_elem)
        if found is not None:
            return found
        return self.coef_below_half_byte if kv_bytes_per_elem < 0.5 else self.coef_default


class PoolProfile(Strict):
    """A kv_pool engine that sizes its pool by profiling on a GPU (vLLM's CUDA build): it asks
    for ``mem_fraction`` x the device's total as CUDA reports it, loads the weights, runs one
    forward pass of max_num_batched_tokens tokens, and gives the KV pool what the weights, that
    pass's peak, the memory outside torch and its CUDA-graph estimate leave of the request.

    ``fit`` models each term: the CUDA total is the device's (NVML's) total less
    ``device_reserved`` of it; the peak is the batched tokens x ``activation_per_hidden`` x the
    hidden size, plus the Gated-DeltaNet prefill scratch and the fused-MoE workspace of that
    many tokens; CUDA graphs grow from ``cuda_graphs_gib`` at the smallest capture sizes to
    ``cuda_graphs_full_gib`` at 512 (vLLM captures up to 2 x max-num-seqs, at most 512).
    The loaded weights are the text model's: no vision tower for a text-only launch, no MTP
    layers unless MTP drafts. The recurrent state of hybrid models is in the pool."""

    batched_tokens: int = Field(gt=0)             # max_num_batched_tokens of the profiling pass (large GPUs)
    batched_tokens_small: int = Field(gt=0)       # ... on GPUs under large_gpu_gib, and on those named below
    large_gpu_gib: float = Field(gt=0)            # a GPU this large (and not named below) gets batched_tokens
    small_gpu_names: tuple[str, ...] = ()         # lower-case name parts kept at the small default (a100)
    activation_per_hidden: float = Field(gt=0)    # bytes per token per hidden unit of the peak
    non_torch_gib: float = Field(ge=0)            # CUDA context and kernels' memory outside torch
    cuda_graphs_gib: float = Field(ge=0)          # graph pool at the smallest capture sizes (<= 8 tokens)
    cuda_graphs_full_gib: float = Field(ge=0)     # graph pool at captures up to 512 tokens
    device_reserved: float = Field(ge=0, lt=1)    # the share of NVML's total CUDA does not report as its total
    source: str

    def default_batched_tokens(self, vram_bytes: int, name: str) -> int:
        """The engine's max_num_batched_tokens on a GPU of ``vram_bytes`` named ``name``."""
        small = any(part in name.lower() for part in self.small_gpu_names)
        return self.batched_tokens if vram_bytes >= self.large_gpu_gib * (1 << 30) and not small \
            else self.batched_tokens_small


class KvCacheSpace(Strict):
    """A kv_pool build whose KV cache is a fixed space the user sets (vLLM's CPU backend:
    ``VLLM_CPU_KVCACHE_SPACE`` GiB) instead of what ``mem_fraction x device memory`` leaves.

    ``fit`` then sizes RAM as weights + ``runtime_gib`` (the process beside its weights; no
    CUDA graphs) + activations, and a KV pool of exactly the space: tokens = whole blocks of
    ``block_size`` tokens that fit in it. ``default_gib`` is the space when ``env`` is unset;
    None: the build then sizes the pool itself (``default_mem_fraction`` x RAM less what the
    process holds), which ``fit`` models as the kv_pool budget without the CUDA-graph term."""

    env: str                                 # the variable users set (VLLM_CPU_KVCACHE_SPACE)
    unit_bytes: int = Field(default=1 << 30, gt=0)   # what one unit of ``env`` is (GiB)
    default_gib: float | None = Field(default=None, gt=0)
    block_size: int = Field(default=16, ge=1)        # tokens per KV block (the build's default)
    runtime_gib: float = Field(default=0.0, ge=0)    # process memory beside the weights
    source: str


class GpuClass(Strict):
    """One GPU size class of ``StaticShare``: the engine's defaults on GPUs under ``below_gib`` (None: any larger)."""

    below_gib: float | None = Field(default=None, gt=0)
    prefill_tokens: int = Field(gt=0)       # the chunked-prefill size
    prefill_graphs: int = Field(ge=0)       # prefill CUDA-graph capture sizes up to that many tokens
    decode_graphs: int = Field(gt=0)        # the decode CUDA graphs' largest batch below TP 4
    decode_graphs_tp4: int = Field(gt=0)    # ... at TP 4 and above


class StaticShare(Strict):
    """The share of each GPU a kv_pool engine's weights and KV pool take (SGLang's ``--mem-fraction-static``), by the
    engine's own rule for a launch that gives none: the rest is reserved for activations and CUDA graphs,
    ``base_mib + mib_per_prefill_token x max(prefill tokens, min_prefill_tokens) + mib_per_decode_graph x decode
    batch + the prefill graphs (mib_per_prefill_graph each, or mla_prefill_graphs_mib) + gib_per_eight_ranks x TP x
    PP / 8 GiB``, at least ``floor_gib`` on a GPU over ``floor_above_gib``; share = 1 - reserve / GPU, rounded to
    ``round_to`` places. A launch that builds a vision tower multiplies it by ``vision_factor`` x a factor of the
    tower's size (its layers x hidden^2 against ``vision_baseline_layers`` x ``vision_baseline_hidden``^2: less
    ``vision_per_doubling`` for each 100% above it, within ``vision_low``..``vision_high``), rounded again. ``fit``
    sizes the pool at that share and the pick passes it, so the launch holds what was planned whatever the engine's
    version."""

    base_mib: float = Field(ge=0)
    mib_per_prefill_token: float = Field(ge=0)
    min_prefill_tokens: int = Field(ge=0)
    mib_per_decode_graph: float = Field(ge=0)
    mib_per_prefill_graph: float = Field(ge=0)
    mla_prefill_graphs_mib: float = Field(ge=0)
    gib_per_eight_ranks: float = Field(ge=0)
    floor_above_gib: float = Field(gt=0)
    floor_gib: float = Field(ge=0)
    round_to: int = Field(ge=1)
    by_gpu: tuple[GpuClass, ...] = Field(min_length=1)      # ascending below_gib, the last without one
    vision_factor: float = Field(gt=0, le=1)
    vision_baseline_layers: int = Field(gt=0)
    vision_baseline_hidden: int = Field(gt=0)
    vision_per_doubling: float = Field(ge=0)
    vision_low: float = Field(gt=0)
    vision_high: float = Field(gt=0)
    source: str

    @model_validator(mode="after")
    def _classes_ascend(self) -> StaticShare:
        bounds = [c.below_gib for c in self.by_gpu[:-1]]
        known = [b for b in bounds if b is not None]
        if self.by_gpu[-1].below_gib is not None or len(known) < len(bounds) or known != sorted(known):
            raise ValueError("static_share.by_gpu: classes by ascending below_gib, the last (any larger GPU) "
                             "without one")
        return self

    def gpu_class(self, vram_bytes: int) -> GpuClass:
        """The class of a GPU of ``vram_bytes``."""
        gib = vram_bytes / (1 << 30)
        return next((c for c in self.by_gpu if c.below_gib is None or gib < c.below_gib), self.by_gpu[-1])
