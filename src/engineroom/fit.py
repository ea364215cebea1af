"""Memory fit per engine family: per-GPU breakdown, verdict, max context, max concurrency.

CONTRACT (used by plan.py and the CLI; extend with defaulted fields, never rename):

    fit(arch: ModelArch, req: FitRequest, rig: Rig) -> Fit
    max_context(arch, req, rig) -> int        # largest *fillable* ctx for req.n_seqs
    max_concurrency(arch, req, rig) -> int    # most sequences at req.ctx

Verdicts: "fits" (>= 5% headroom on every GPU), "tight" (< 5%), "does_not_fit"
(the binding constraint is named in Fit.binding, e.g. "GPU0: KV cache 9.13 GB > 6.2 GB free").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .arch import ModelArch
from .hardware import Rig


@dataclass(frozen=True)
class FitRequest:
    engine: str                        # catalog engine id: llama.cpp | ik_llama.cpp | vllm | sglang
    ctx: int
    quant: str | None = None           # catalog quant id ("Q4_K_M", "autoround-int4", "bf16")
    weight_bytes: int | None = None    # exact weight bytes when known (GGUF file, catalog size)
    kv_dtype: str = "f16"
    n_seqs: int = 1
    tp: int = 1
    spec_method: str | None = None     # "mtp" | "dflash" | "draft" | None
    spec_tokens: int = 0
    draft_bytes: int = 0
    vision: bool = False
    mem_fraction: float | None = None  # vLLM gpu_memory_utilization / SGLang mem_fraction_static
    ubatch: int = 512                  # llama.cpp -ub; vLLM/SGLang max batched tokens go in extra
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Component:
    name: str          # "weights", "kv_cache", "recurrent_state", "compute", "cuda_graphs", ...
    bytes: int
    note: str = ""     # how it was computed, e.g. "16 layers x 4 heads x 256 x 2 x 0.5625 B x 262144"


@dataclass(frozen=True)
class GpuFit:
    index: int
    capacity_bytes: int
    components: tuple[Component, ...]

    @property
    def used_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class Fit:
    request: FitRequest
    rig_label: str
    per_gpu: tuple[GpuFit, ...]        # one entry per GPU used (CPU-only rigs: one "device" = RAM)
    host: tuple[Component, ...] = ()   # host-memory components (mapped embeddings, repacks)
    verdict: str = "fits"              # fits | tight | does_not_fit
    binding: str = ""                  # the constraint that decides the verdict
    max_ctx: int | None = None
    max_seqs: int | None = None
    notes: tuple[str, ...] = ()
