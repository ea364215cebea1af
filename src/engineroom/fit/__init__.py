"""Memory fit per engine memory model: per-device breakdown, verdict, max context, max concurrency.

CONTRACT (used by plan and the CLI; extend with defaulted fields, never rename):

    fit(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog=None) -> Fit
    max_context(arch, req, rig, *, catalog=None) -> int        # largest *fillable* ctx for req.parallel
    max_concurrency(arch, req, rig, *, catalog=None) -> int    # most sequences at req.ctx

Verdicts (``Verdict``): fits (>= 5% headroom on every device), tight (< 5%, or a paged pool
that caps concurrency below the sequences asked for: ``Fit.capped_parallel``), does_not_fit
(the binding constraint is named in ``Fit.binding``).

Everything engine-specific comes from the engine's catalog entry (its adapter's catalog/engines/<id>.yaml):
its ``memory_model``, the KV types it accepts with their bytes per element, its default
memory fraction and the step of the context search. The modules follow the pipeline:
``request`` (what is asked, what is answered), ``engine`` (catalog facts), ``kv`` (the one
KV formula), ``weights``, one module per memory model (``llama`` with ``llama_cache``,
``llama_compute``, ``cpu_graph``, ``cpu_buffers``: llama.cpp's buffers; ``pool``: the paged
pools of vLLM/SGLang; ``space``: a pool of a fixed size, vLLM's CPU build), ``verdict``
(``fit`` itself) and ``search`` (max context / concurrency).
"""

from __future__ import annotations

from .cpu_buffers import (
    AMX_ALIGN,
    AMX_FLAGS,
    AMX_ROW_EXTRA,
    ASSUMED_CPU_FEATURES,
    REPACK_TYPES_AVX2,
    REPACK_X86,
    amx_alloc_bytes,
    cpu_features_for,
    cpu_mapped_bytes,
    cpu_weight_buffers,
    repacked_tensors,
)
from .engine import engine_defaults, engine_spec, kv_bytes_per_elem, kv_dtype_spec
from .kv import (
    KV_KINDS,
    kv_bytes,
    kv_elems_per_token_layer,
    kv_head_dims,
    kv_layer_bytes,
    kv_refusal,
    kv_shard,
    pool_kv_grow_per_card,
    recurrent_state_bytes,
)
from .llama_cache import (
    kv_rotation_bytes,
    llama_kv_bytes,
    llama_kv_cells,
    llama_kv_stream_cells,
    llama_n_ctx,
)
from .llama_compute import (
    llama_cpu_compute,
    llama_cpu_compute_sim,
    llama_cuda_compute,
)
from .memo import FitMemo
from .pool import valid_tp
from .request import RAM_MARGIN_FRACTION, Component, Fit, FitRequest, GpuFit, Verdict, usable_ram
from .search import Fitter, max_concurrency, max_context
from .verdict import check_ctx, fit, need_bytes
from .weights import WeightSplit, bits_per_weight, estimate_param_count, weight_split

__all__ = [
    "AMX_ALIGN", "amx_alloc_bytes", "AMX_FLAGS", "AMX_ROW_EXTRA", "ASSUMED_CPU_FEATURES", "bits_per_weight",
    "check_ctx", "Component", "cpu_features_for", "cpu_mapped_bytes", "cpu_weight_buffers", "engine_defaults",
    "engine_spec", "estimate_param_count", "Fit", "fit", "FitMemo", "Fitter", "FitRequest", "GpuFit", "kv_bytes",
    "kv_bytes_per_elem", "kv_dtype_spec", "kv_elems_per_token_layer", "kv_head_dims", "KV_KINDS",
    "kv_layer_bytes", "kv_refusal", "kv_rotation_bytes", "kv_shard", "llama_cpu_compute",
    "llama_cpu_compute_sim", "llama_cuda_compute", "llama_kv_bytes", "llama_kv_cells",
    "llama_kv_stream_cells", "llama_n_ctx", "max_concurrency", "max_context", "need_bytes",
    "pool_kv_grow_per_card", "recurrent_state_bytes", "REPACK_TYPES_AVX2", "REPACK_X86", "repacked_tensors",
    "valid_tp", "Verdict", "weight_split", "WeightSplit", "usable_ram", "RAM_MARGIN_FRACTION",
]
