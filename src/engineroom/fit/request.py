"""What fit is asked (``FitRequest``) and what it answers (``Fit``: per-device components,
a verdict and the constraint that decides it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..units import MiB, gib

if TYPE_CHECKING:
    from ..hardware import Rig

# RAM kept back from a CPU engine: the OS, its page cache and the engine's own process beyond
# the buffers it reports (5% of the total, at least 512 MiB)
RAM_MARGIN_FRACTION = 0.05
RAM_MARGIN_MIN = 512 * MiB


def usable_ram(rig: Rig) -> tuple[int, str]:
    """(bytes a CPU engine may fill, how): the RAM available now (MemAvailable, a detected
    rig) or the rig's stated total, less the margin (``RAM_MARGIN_FRACTION``)."""
    total = rig.cpu_ram_bytes or 0
    base = rig.cpu_ram_available_bytes if rig.cpu_ram_available_bytes is not None else total
    margin = max(int(total * RAM_MARGIN_FRACTION), RAM_MARGIN_MIN) if total else 0
    where = (f"{gib(base, 1)} available now (of {gib(total, 1)})" if rig.cpu_ram_available_bytes is not None
             else f"{gib(total, 1)} stated")
    return max(base - margin, 0), (f"RAM for the engine: {where} less a margin of {gib(margin, 1)} "
                                   f"({RAM_MARGIN_FRACTION:.0%} of the total, at least {gib(RAM_MARGIN_MIN, 1)}) "
                                   "for the OS, its page cache and the engine's process")


class Verdict(StrEnum):
    """How a request fits. A ``StrEnum`` so JSON, tables and comparisons with the plain
    strings keep working; code decides on the members, never on text."""

    FITS = "fits"                  # >= 5% headroom on every device
    TIGHT = "tight"                # < 5% headroom, or a paged pool that caps concurrency
    DOES_NOT_FIT = "does_not_fit"  # the binding constraint says why

    @property
    def severity(self) -> int:
        """Worse verdicts are larger: the verdict of several instances is their ``max``."""
        return _SEVERITY[self]


_SEVERITY = {Verdict.FITS: 0, Verdict.TIGHT: 1, Verdict.DOES_NOT_FIT: 2}


@dataclass(frozen=True)
class FitRequest:
    """What fit is asked to size: an engine's launch of one quant at ctx x parallel, and its knobs."""

    engine: str                        # catalog engine id or alias: llama.cpp | ik_llama.cpp | vllm | sglang
    ctx: int
    quant: str | None = None           # catalog quant id ("Q4_K_M", "autoround-int4", "bf16")
    weight_bytes: int | None = None    # exact weight bytes when known (GGUF file, catalog size)
    kv_dtype: str = "f16"              # a catalog KV type of the engine, id or alias
    parallel: int = 1
    tp: int = 1
    pp: int = 1                        # pipeline stages (kv_pool engines; the stages may sit on other nodes)
    spec_method: str | None = None     # "mtp" | "dflash" | "draft" | None
    spec_tokens: int = 0
    draft_bytes: int = 0
    vision: bool = False
    mem_fraction: float | None = None  # vLLM gpu_memory_utilization / SGLang mem_fraction_static
                                       # (None: the engine's rule for the GPU, else its default)
    # kv_pool builds with a fixed KV space (catalog backend kv_cache_space: vLLM's CPU build,
    # VLLM_CPU_KVCACHE_SPACE): the KV pool's bytes; None = the build's default (its default_gib,
    # or, when that is unset, the pool the build sizes itself from mem_fraction x RAM)
    kv_space_bytes: int | None = None
    ubatch: int = 512                  # llama.cpp -ub; vLLM/SGLang max batched tokens go in extra
    extra: dict[str, float] = field(default_factory=dict)
    # ---- added (defaulted) -----------------------------------------------------------
    flash_attn: bool = True            # llama.cpp -fa (auto resolves to on for CPU and CUDA)
    batch: int = 2048                  # llama.cpp -b (caps ubatch)
    # llama.cpp slots: parallel is -np; kv_unified is --kv-unified / --no-kv-unified. The engine's
    # own default (no -np) is the catalog's default_parallel / default_kv_unified (llama.cpp: 4
    # slots, unified); fit never guesses it: callers pass what they launch (engine_defaults()).
    # With a unified cache the one stream holds ctx x parallel cells (-c ctx*parallel), and any one
    # sequence may fill all of them; without it every sequence has its own ctx cells.
    kv_unified: bool = False
    # CPU features that really execute (/proc/cpuinfo flag names, cpuprobe.probe_cpu().usable)
    # for the CPU backend's extra buffers (CPU_REPACK, AMX). None: this machine's probe when the
    # rig was detected, else AVX2 without AMX (a note says so).
    cpu_features: frozenset[str] | None = None
    repack: bool = True                # llama.cpp --repack (default); False = -nr / --no-repack
    rope_scaling: str | None = None    # --rope-scaling yarn|linear: ctx may exceed the model's maximum
    swa_full: bool = False             # llama.cpp --swa-full (full-size SWA cache)
    # logits rows of the reserved graph (catalog graph_outputs; fit fills it from the engine)
    graph_outputs: str = "slots"

    def evolve(self, **changes: Any) -> FitRequest:
        """``dataclasses.replace(self, **changes)`` without running ``__init__`` again: the searches
        and the planner make thousands of these, and the frozen ``__init__`` sets every field."""
        unknown = changes.keys() - _REQUEST_FIELDS
        if unknown:
            raise TypeError(f"FitRequest has no field {', '.join(sorted(unknown))}")
        new = object.__new__(FitRequest)
        new.__dict__.update(self.__dict__, **changes)
        return new


_REQUEST_FIELDS = frozenset(FitRequest.__dataclass_fields__)


@dataclass(frozen=True)
class Component:
    """One buffer of a device's memory: its bytes and how they were computed."""

    name: str          # "weights", "kv_cache", "recurrent_state", "compute", "cuda_graphs", ...
    bytes: int
    note: str = ""     # how it was computed, e.g. "16 layers x 4 heads x 256 x 2 x 0.5625 B x 262144"


@dataclass(frozen=True)
class GpuFit:
    """One device's memory: its capacity and the components on it."""

    index: int
    capacity_bytes: int
    components: tuple[Component, ...]

    @cached_property
    def used_bytes(self) -> int:
        """The components' sum (computed once: the verdict, the searches and the ranking read it)."""
        return sum(c.bytes for c in self.components)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class Fit:
    """fit's answer: every device's components, the host's, a verdict and the constraint deciding it."""

    request: FitRequest
    rig_label: str
    per_gpu: tuple[GpuFit, ...]        # one entry per GPU used (CPU-only rigs: one "device" = RAM)
    host: tuple[Component, ...] = ()   # host-memory components (mapped embeddings, repacks)
    verdict: Verdict = Verdict.FITS
    binding: str = ""                  # the constraint that decides the verdict, in words
    max_ctx: int | None = None
    max_parallel: int | None = None
    notes: tuple[str, ...] = ()
    # a paged KV pool smaller than ctx x parallel: the engine runs, but serves only this many
    # sequences at once (verdict TIGHT). Left out of JSON, which says it in ``binding``.
    capped_parallel: int | None = field(default=None, metadata={"json": False})

    @property
    def servable(self) -> bool:
        """The engine serves the whole request: it fits, and no pool caps its sequences."""
        return self.verdict != Verdict.DOES_NOT_FIT and self.capped_parallel is None

    # ---- added helpers ---------------------------------------------------------------
    def component(self, name: str) -> int:
        """Bytes of every component called ``name`` over all devices and the host."""
        total = sum(c.bytes for g in self.per_gpu for c in g.components if c.name == name)
        return total + sum(c.bytes for c in self.host if c.name == name)

    @property
    def total_bytes(self) -> int:
        return sum(g.used_bytes for g in self.per_gpu) + sum(c.bytes for c in self.host)

    def bytes_by_component(self, *, per_gpu: bool = False) -> dict[str, int]:
        """Each component's bytes over all devices and the host (first-seen order); with
        ``per_gpu`` then ``GPU<i>``: each GPU's whole use, what NVML reports for an engine's processes."""
        out: dict[str, int] = {}
        for c in [c for g in self.per_gpu for c in g.components] + list(self.host):
            out[c.name] = out.get(c.name, 0) + c.bytes
        if per_gpu:
            out.update({f"GPU{g.index}": g.used_bytes for g in self.per_gpu})
        return out
