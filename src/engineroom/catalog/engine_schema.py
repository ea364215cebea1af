"""The shape of an engine's catalog entry (``engines/<id>.yaml`` in its adapter's catalog folder:
engineroom/engines/<package>/catalog/ for the built-in ones, a plugin's ``catalog_dir()``): one
engine per file, with its KV types, decode model, concurrency, multi-GPU mode, memory model and
per-vendor builds (backends)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import QuantFormat, Strict, Vendor
from .pool_schema import KvCacheSpace, PoolActivation, PoolProfile, StaticShare


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
    block_size: int = Field(default=1, ge=1)  # elements per quant block (ggml_blck_size; 1 = not blocked)


class KvBlockRule(Strict):
    """An engine's rule that a blocked KV type's block must divide the head size, K and V
    separately (llama.cpp: llama_init_from_model refuses the context otherwise).

    ``message`` is the engine's own refusal, formatted with ``side`` (K/V), ``side_l`` (k/v),
    ``kv`` (the type's id), ``block`` and ``dim``; ``when_flash_attn_only``: the K check
    applies only with flash attention on (a quantized V cache needs it on anyway)."""

    message: str
    when_flash_attn_only: bool = True
    source: str = ""


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
    def _ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class TypeRate(Strict):
    """A per-thread decode rate (GB/s of weights) for some ggml weight types ("q4_0", "q4_k")."""

    types: tuple[str, ...]
    low: float = Field(gt=0)
    high: float = Field(gt=0)


class TypeEfficiency(Strict):
    """A memory-roof efficiency (share of the copy bandwidth) for some ggml weight types: how
    the type's CPU kernel reads memory (ggml-cpu repack.cpp's interleaved Q4_0/Q4_K/IQ4_NL/MXFP4
    vs the plain vec_dot kernels of Q8_0/Q5_0/Q6_K/Q4_1 ...)."""

    types: tuple[str, ...]
    low: float = Field(gt=0)
    high: float = Field(gt=0)


class DecodeModel(Strict):
    """Single-stream decode time per token = bytes read / (bandwidth_efficiency x datasheet
    bandwidth) + per_token_ms + layers x per_layer_ms (x width / per_layer_width where that is
    set) + linear-attention layers x per_linear_layer_ms + MoE layers x per_moe_layer_ms. The
    bandwidth term is the roofline; the fixed terms are what a batch-1 step costs beyond
    streaming the bytes (kernel launches, norms, sampling, a recurrent state's update, expert
    routing), which is why small and shallow models fall further below their roofline than big
    ones. The band's slow end pairs the low efficiency with the high per-layer cost.

    A CPU build's model (``bandwidth: cpu_copy``) streams the bytes at
    min(threads x per_thread_gbs, efficiency x the CPU's copy bandwidth at those threads):
    few cores are compute-bound, many cores memory-bound. Both roofs are per ggml weight type
    (per_thread_by_type, bandwidth_efficiency_by_type), each type's bytes timed on its own."""

    bandwidth_efficiency: Range
    per_layer_ms: Range
    per_token_ms: float = Field(ge=0)
    source: str
    # the model width per_layer_ms was fitted at: a layer of another width costs in proportion (None: one
    # cost for every width)
    per_layer_width: int | None = Field(default=None, gt=0)
    per_linear_layer_ms: float = Field(default=0.0, ge=0)   # more per linear-attention / SSM layer
    per_moe_layer_ms: float = Field(default=0.0, ge=0)      # more per layer with routed experts
    # what the efficiency is a share of: a GPU's datasheet bandwidth, or (CPU builds) the
    # rig's CPU bandwidth at the decode's thread count, which ``hardware`` measures with a
    # copy probe on this machine (GB/s read + written) or takes from the catalog class
    bandwidth: Literal["datasheet", "cpu_copy"] = "datasheet"
    # CPU builds: weight bytes ONE thread's dequantise-and-dot kernels stream per second, so a
    # decode at T threads reaches at most T x this (compute roof) before the memory roof
    # (efficiency x bandwidth) binds; None = no compute roof (GPUs)
    per_thread_gbs: Range | None = None      # weight types not listed in per_thread_by_type
    per_thread_by_type: tuple[TypeRate, ...] = ()   # measured types (kernels differ: repacked Q4_0 vs Q4_1 ...)
    # CPU builds: the memory roof per weight type (each type's bytes stream at
    # min(threads x its per-thread rate, its efficiency x bandwidth)); types not listed take
    # bandwidth_efficiency. Empty (the default, and every GPU build): one efficiency for all
    bandwidth_efficiency_by_type: tuple[TypeEfficiency, ...] = ()
    fitted_on: str = ""                      # the machine (and date) the numbers were fitted on
    # CPU builds: cores the engine keeps off the decode (vLLM's CPU backend binds its model to
    # the cores less one it reserves for the frontend); decode runs at the rig's threads less these
    reserved_cpus: int = Field(default=0, ge=0)
    reserved_cpus_source: str = ""

    def per_thread_for(self, ggml_type: str) -> tuple[float, float] | None:
        """(low, high) per-thread GB/s for a ggml weight type, else the default range."""
        key = ggml_type.lower()
        for r in self.per_thread_by_type:
            if key in r.types:
                return (r.low, r.high)
        return (self.per_thread_gbs.low, self.per_thread_gbs.high) if self.per_thread_gbs else None

    def efficiency_for(self, ggml_type: str) -> tuple[float, float]:
        """(low, high) memory-roof efficiency for a ggml weight type, else bandwidth_efficiency."""
        key = ggml_type.lower()
        for r in self.bandwidth_efficiency_by_type:
            if key in r.types:
                return (r.low, r.high)
        return (self.bandwidth_efficiency.low, self.bandwidth_efficiency.high)

    def fixed_ms(self, layers: int, per_layer_ms: float, *, width: int = 0, linear: int = 0, moe: int = 0) -> float:
        """The fixed part of a token's time (ms) for ``layers`` layers ``width`` wide, ``linear`` of them linear
        attention (or SSM) and ``moe`` of them with routed experts."""
        scale = width / self.per_layer_width if self.per_layer_width and width else 1.0
        return (self.per_token_ms + layers * per_layer_ms * scale + linear * self.per_linear_layer_ms
                + moe * self.per_moe_layer_ms)


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
    # the engine's own arguments for this split, as messages quote them (llama.cpp: "-sm layer")
    split_args: str = ""
    # runs pipeline-parallel stages across nodes of a cluster (TP within a node, PP across):
    # plan proposes TP = GPUs per node x PP = nodes for a rig like 2x(8xH100)
    multi_node: bool = False


MemoryModel = Literal["llama_buffers", "kv_pool"]


class DockerImage(Strict):
    """The engine's official container image, pinned by tag (``recipe --compose``, ``up --docker``).

    ``image`` None: the engine publishes no official image; ``source`` is then the one sentence
    that says so (and what to do instead), which engineroom prints when refusing a compose file.
    ``entrypoint`` replaces the program of the adapter's argv (``argv[0]``): the image's path to
    it, or the interpreter that runs ``-m module`` for a Python engine; the adapter's
    ``container_command`` gives the arguments that follow it. ``health_probe``: the tool the
    image has for its healthcheck; ``ipc`` / ``shm_size``: what the engine's workers need for
    shared memory (PyTorch's tensor sharing between processes).
    """

    image: str | None = None                 # registry/repository, e.g. vllm/vllm-openai
    tag: str | None = None                   # pinned tag (never "latest")
    source: str                              # where the image and tag come from
    entrypoint: tuple[str, ...] = ()         # what replaces argv[0] in the container
    health_probe: Literal["curl", "python3"] = "curl"
    ipc: str | None = None                   # "host": the engine shares memory between processes
    shm_size: str | None = None              # e.g. "16gb" (only where ipc is not host)

    @model_validator(mode="after")
    def _pinned(self) -> DockerImage:
        if (self.image is None) != (self.tag is None):
            raise ValueError("docker: give image and tag together (or neither, for an engine with no official image)")
        if self.tag is not None and self.tag in ("latest", ""):
            raise ValueError("docker: pin the image by a release tag, not 'latest'")
        if self.image is not None and not self.entrypoint:
            raise ValueError("docker: an image needs the entrypoint that replaces the adapter's program")
        return self

    @property
    def reference(self) -> str | None:
        """``image:tag``, or None when the engine has no official image."""
        return f"{self.image}:{self.tag}" if self.image and self.tag else None


class ComputeDtype(Strict):
    """The dtype a build computes at unless the CPU computes its 16-bit checkpoint natively
    (vLLM's CPU build: float32 without ``avx512_fp16`` / ``amx_fp16``). The adapter asks for
    ``value`` at launch; plan and fit hold the weights of ``formats`` as ``weights_quant`` and
    the KV type ``auto`` as ``kv_auto``, so the sizes and speeds are the launch's."""

    value: str                               # the engine's dtype name (vLLM's --dtype)
    native_flags: tuple[str, ...]            # /proc/cpuinfo flags that compute the 16-bit dtype natively
    formats: tuple[QuantFormat, ...]         # weight formats held at ``value`` (the 16-bit checkpoints)
    weights_quant: str                       # fit's quant for them at ``value`` (tables bits_per_weight)
    kv_auto: str                             # the KV type ``auto`` is at ``value`` (one of the engine's)
    source: str


class Backend(Strict):
    """One build of an engine for one kind of device (llama.cpp's CPU build, its CUDA
    build, vLLM's CPU wheel, ...): which rigs it serves (``vendors``) and what it can run
    there. A field left out is the engine's own (its top-level value); a field given
    narrows the engine to what this build runs:

    * ``quant_formats``: weight formats it loads (a subset of the engine's);
    * ``kv_dtypes``: KV types it runs (ids of the engine's ``kv_dtypes``);
      ``plan_kv_dtypes``: those the planner searches (default: its ``kv_dtypes`` the
      engine marks ``plan: true``);
    * ``spec_methods``: speculative-decoding methods it runs (empty: none);
    * ``decode``: its single-stream decode model (a CPU build's is fitted on a CPU);
    * ``memory_model`` / ``default_mem_fraction``: how ``fit`` sizes this build;
    * ``compute_dtype``: the dtype it computes at on a CPU without a native 16-bit type.
    """

    id: str                                  # cpu | cuda | rocm | metal | sycl | vulkan
    vendors: tuple[Vendor, ...]
    quant_formats: tuple[QuantFormat, ...] | None = None
    kv_dtypes: tuple[str, ...] | None = None
    plan_kv_dtypes: tuple[str, ...] | None = None
    spec_methods: tuple[str, ...] | None = None
    decode: DecodeModel | None = None
    memory_model: MemoryModel | None = None
    default_mem_fraction: float | None = Field(default=None, gt=0, le=1)
    kv_cache_space: KvCacheSpace | None = None   # kv_pool builds with a fixed KV space (vLLM CPU)
    compute_dtype: ComputeDtype | None = None
    source: str


class FamilyParsers(Strict):
    """The engine's parser names for one model family (``Model.family``): tool calls, reasoning."""

    tool: str | None = None
    reasoning: str | None = None
    source: str = ""


class Engine(Strict):
    """One inference engine. ``memory_model`` says how ``fit`` sizes it:

    * ``llama_buffers``: llama.cpp-style fixed buffers (weights split by layers, a KV cache
      of ctx x parallel cells, compute buffers for the worst-case graph);
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
    # model family -> its launches' parsers (parsed server-side: vLLM, SGLang; llama.cpp reads the template)
    parsers: dict[str, FamilyParsers] = Field(default_factory=dict)
    # ids of options the adapter defines that every planned launch gets (the adapter's ENGINE_OPTIONS)
    plan_options: tuple[str, ...] = ()
    tools: bool = True
    vision: bool = False
    text_only_launch: bool = True    # a text-only pick leaves a checkpoint's vision tower unbuilt; else sized
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
    pool_activation: PoolActivation | None = None   # kv_pool engines only (required there)
    pool_profile: PoolProfile | None = None         # kv_pool engines that profile on a GPU (vLLM)
    static_share: StaticShare | None = None         # kv_pool engines whose share follows the GPU (SGLang)
    # the engine's launch defaults when no slot flag is given (llama-server: no -np = 4 slots,
    # unified KV); fit/plan/up use these for a "default launch", explicit flags otherwise
    default_parallel: int = Field(default=1, ge=1)
    default_kv_unified: bool = False
    # llama_buffers engines: the logits rows the reserved compute graph holds -- one per slot
    # (llama.cpp: n_outputs_max = n_seqs, its name for the parallel sequences) or one per ubatch token
    # (ik_llama.cpp reserves them all)
    graph_outputs: Literal["slots", "ubatch"] = "slots"
    defaults_source: str = ""
    kv_block_rule: KvBlockRule | None = None  # None: the engine is not known to refuse any head size
    backends: tuple[Backend, ...] = ()       # its builds per device kind; each vendor in exactly one
    backend: str | None = None               # set on a view: the build this Engine describes
    kv_cache_space: KvCacheSpace | None = None   # set on a view from its backend (None: VRAM-fraction pool)
    compute_dtype: ComputeDtype | None = None    # set on a view from its backend
    docker: DockerImage | None = None        # its official container image (None: not described yet)

    @model_validator(mode="after")
    def _parsers_are_the_engines(self) -> Engine:
        for family, fp in self.parsers.items():
            if fp.tool is not None and fp.tool not in self.tool_parsers:
                raise ValueError(f"parsers.{family}.tool {fp.tool!r} is not one of tool_parsers {self.tool_parsers}")
            if fp.reasoning is not None and fp.reasoning not in self.reasoning_parsers:
                raise ValueError(f"parsers.{family}.reasoning {fp.reasoning!r} is not one of reasoning_parsers "
                                 f"{self.reasoning_parsers}")
        return self

    @model_validator(mode="after")
    def _backends_cover_vendors(self) -> Engine:
        if not self.backends:
            return self
        ids = [b.id for b in self.backends]
        if len(set(ids)) != len(ids):
            raise ValueError(f"backend ids repeat: {ids}")
        covered = [v for b in self.backends for v in b.vendors]
        for v in self.vendors:
            if covered.count(v) != 1:
                raise ValueError(f"vendor '{v}' must be served by exactly one backend, not {covered.count(v)}")
        # a backend for a vendor the engine does not list is unused: ``vendors`` decides where it runs
        kv_ids = {k.id for k in self.kv_dtypes}
        for b in self.backends:
            if b.quant_formats is not None and not set(b.quant_formats) <= set(self.quant_formats):
                extra = sorted(set(b.quant_formats) - set(self.quant_formats))
                raise ValueError(f"backend {b.id}: quant_formats {extra} are not in the engine's quant_formats")
            for field_name in ("kv_dtypes", "plan_kv_dtypes"):
                bad = sorted(set(getattr(b, field_name) or ()) - kv_ids)
                if bad:
                    raise ValueError(f"backend {b.id}: {field_name} {bad} are not KV type ids of the engine")
            if (b.plan_kv_dtypes is not None and b.kv_dtypes is not None
                    and not set(b.plan_kv_dtypes) <= set(b.kv_dtypes)):
                raise ValueError(f"backend {b.id}: plan_kv_dtypes must be a subset of its kv_dtypes")
            if b.spec_methods is not None and not set(b.spec_methods) <= set(self.spec_methods):
                raise ValueError(f"backend {b.id}: spec_methods {sorted(set(b.spec_methods) - set(self.spec_methods))} "
                                 "are not in the engine's spec_methods")
            frac = b.default_mem_fraction if b.default_mem_fraction is not None else self.default_mem_fraction
            if b.memory_model == "kv_pool" and frac is None:   # inherited: the engine's own check below
                raise ValueError(f"backend {b.id}: a kv_pool build needs default_mem_fraction")
            if b.memory_model == "kv_pool" and self.pool_activation is None:
                raise ValueError(f"backend {b.id}: a kv_pool build needs the engine's pool_activation")
            if b.kv_cache_space is not None and (b.memory_model or self.memory_model) != "kv_pool":
                raise ValueError(f"backend {b.id}: kv_cache_space applies to kv_pool builds only")
        return self

    def backend_for(self, vendor: str) -> Backend | None:
        """The build of this engine that serves ``vendor`` ("cpu", "nvidia", ...), or None."""
        for b in self.backends:
            if vendor in b.vendors:
                return b
        return None

    def for_vendor(self, vendor: str) -> Engine:
        """This engine as its build for ``vendor`` runs it: the backend's quant formats, KV
        types, spec methods, decode and memory model in place of the engine-wide ones (the
        same Engine when it lists no backends or none serves ``vendor``)."""
        b = self.backend_for(vendor)
        if b is None:
            return self
        kv = self.kv_dtypes
        if b.kv_dtypes is not None:
            keep = set(b.kv_dtypes)
            kv = tuple(k for k in kv if k.id in keep)
        if b.plan_kv_dtypes is not None:
            plan = set(b.plan_kv_dtypes)
            kv = tuple(k.model_copy(update={"plan": k.id in plan}) for k in kv)
        mm = b.memory_model or self.memory_model
        frac = b.default_mem_fraction if b.default_mem_fraction is not None else self.default_mem_fraction
        return self.model_copy(update={
            "quant_formats": b.quant_formats if b.quant_formats is not None else self.quant_formats,
            "kv_dtypes": kv,
            "spec_methods": b.spec_methods if b.spec_methods is not None else self.spec_methods,
            "decode": b.decode or self.decode,
            "memory_model": mm,
            "default_mem_fraction": frac if mm == "kv_pool" else None,
            "kv_cache_space": b.kv_cache_space if mm == "kv_pool" else None,
            "static_share": self.static_share if mm == "kv_pool" else None,
            "compute_dtype": b.compute_dtype,
            "backend": b.id,
        })

    @model_validator(mode="after")
    def _memory_model_facts(self) -> Engine:
        if self.memory_model == "kv_pool" and self.default_mem_fraction is None:
            raise ValueError("a kv_pool engine needs default_mem_fraction (the share of VRAM it reserves)")
        if self.memory_model != "kv_pool" and self.default_mem_fraction is not None:
            raise ValueError(f"default_mem_fraction applies to kv_pool engines only, not {self.memory_model}")
        if self.memory_model != "kv_pool" and self.static_share is not None:
            raise ValueError(f"static_share applies to kv_pool engines only, not {self.memory_model}")
        if self.memory_model == "kv_pool" and self.pool_activation is None:
            raise ValueError("a kv_pool engine needs pool_activation (its activation coefficients)")
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
