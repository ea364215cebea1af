"""memory_model ``llama_buffers`` (llama.cpp, ik_llama.cpp): exactly what the graph needs.

Weights split by layers across GPUs (the input embedding stays on the host for CUDA), a KV
cache of ctx x parallel cells for the layers whose cache grows with context, fixed recurrent
state per sequence, and compute buffers for the worst-case ubatch graph at a full cache. On
a CPU-only rig the device is the RAM, with the CPU backend's repack / AMX buffers.
"""

from __future__ import annotations

from bisect import bisect_left

from ..arch import LayerKind, ModelArch
from ..catalog import Catalog
from ..hardware import Rig
from ..units import mib
from .cpu_buffers import (
    AMX_FLAGS,
    TIED_OUTPUT,
    amx_alloc_bytes,
    cpu_features_for,
    cpu_mapped_bytes,
    cpu_weight_buffers,
    tensor_nbytes,
)
from .engine import engine_spec
from .kv import recurrent_state_bytes
from .llama_cache import effective_ubatch, kq_mask_bytes, llama_kv_bytes, llama_kv_shares, round_up, slots_text
from .llama_compute import (
    CUDA_RUNTIME,
    cpu_compute_note,
    llama_cpu_compute,
    llama_cpu_compute_sim,
    llama_cuda_compute,
)
from .request import Component, FitRequest, GpuFit, usable_ram
from .weights import WeightSplit, weight_split


def _llama_layer_split(split: WeightSplit, caps: list[int]) -> list[range]:
    """Assign layers to GPUs proportionally to capacity (llama.cpp -sm layer, default -ts)."""
    n = len(split.per_layer)
    tot = sum(caps)
    ranges, start = [], 0
    for i, c in enumerate(caps):
        end = n if i == len(caps) - 1 else start + round(n * c / tot)
        ranges.append(range(start, min(end, n)))
        start = min(end, n)
    return ranges


def fit_llama(arch: ModelArch, req: FitRequest, rig: Rig,
              catalog: Catalog | None) -> tuple[list[GpuFit], list[Component], list[str]]:
    notes: list[str] = []
    outputs = engine_spec(req.engine, catalog).graph_outputs
    if req.graph_outputs != outputs:
        req = req.evolve(graph_outputs=outputs)
    split = weight_split(arch, req, catalog)
    kv_total, kv_note = llama_kv_bytes(arch, req, catalog=catalog)
    r, s = recurrent_state_bytes(arch, req.parallel)
    output_buf = arch.vocab_size * 4 * req.parallel
    if not rig.gpus:  # CPU device: the RAM holds everything
        cap, ram_how = usable_ram(rig)
        notes.append(ram_how)
        comps: list[Component] = []
        feats, feat_src = cpu_features_for(req, rig)
        amx_on = req.repack and all(f in feats for f in AMX_FLAGS)
        vec = 'AVX-512' if ('avx512f' in feats or 'avx512' in feats) else 'AVX2' if 'avx2' in feats else 'no AVX2'
        buf_rule = ("repack off: no CPU_REPACK or AMX buffer" if not req.repack else
                    f"repack on, {'AMX + ' if amx_on else 'no AMX, '}{vec} rules ({feat_src})")
        if arch.tensor_bytes and split.source == "GGUF tensor bytes":
            bufs = cpu_weight_buffers(arch, feats, req.repack)
            moved = {n for n, b in bufs.items() if b != "CPU_Mapped"}
            rep_names = [n for n, b in bufs.items() if b == "CPU_REPACK"]
            amx_names = [n for n, b in bufs.items() if b == "AMX"]
            mapped = cpu_mapped_bytes(arch, moved)
            left = sum(1 for n in arch.tensor_types if n not in moved)
            comps.append(Component("weights", mapped, f"CPU_Mapped: mmapped file range of the {left} "
                                                      f"tensors left in the file; {buf_rule}"))

            def kind(n: str) -> str:
                return arch.tensor_types["token_embd.weight" if n == TIED_OUTPUT else n]

            tied = " (the tied output head: token_embd again)" if TIED_OUTPUT in moved else ""
            if rep_names:
                rep = sum(round_up(tensor_nbytes(arch, n), 32) for n in rep_names)
                types = "/".join(sorted({kind(n) for n in rep_names}))
                comps.append(Component("weights_repack", rep, f"CPU_REPACK: {len(rep_names)} {types} matrices, "
                                                              f"their bytes padded to 32 B, beside the mapping{tied}"))
            if amx_names:
                amx = sum(round_up(amx_alloc_bytes(kind(n), arch.tensor_shapes.get(
                    "token_embd.weight" if n == TIED_OUTPUT else n, ()), tensor_nbytes(arch, n)), 32)
                          for n in amx_names)
                types = "/".join(sorted({kind(n) for n in amx_names}))
                comps.append(Component("weights_amx", amx,
                                       f"AMX: {len(amx_names)} {types} matrices at "
                                       "ggml_backend_amx_get_alloc_size (ne1 x packed row), beside the "
                                       "mapping; modelled from ggml-cpu/amx source and measured on one "
                                       "AMX machine only (benchmarks/fit_vs_llamacpp.md, section amx), "
                                       "not on the machine this benchmark's other rows ran on"))
        else:
            q = (req.quant or "").lower()
            comps.append(Component("weights", split.total, split.source + f"; {buf_rule}"))
            if req.repack and amx_on and q in ("q8_0", "q4_0", "q4_1", "q4_k_m", "q4_k_s", "q6_k", "q5_k_m"):
                extra = 4 / 34 if q == "q8_0" else 0.0
                amx = int((split.total - split.embedding) * (1 + extra))
                comps.append(Component("weights_amx", amx,
                                       "AMX estimate: the non-embedding matrices packed beside the mapping "
                                       "(from ggml-cpu/amx source; no tensor table to size it exactly)"))
            elif req.repack and "avx2" in feats and q in ("q4_0", "q4_k_m", "q4_k_s", "iq4_nl"):
                rep = int((split.total - split.embedding) * (1.0 if q == "q4_0" else 0.8))
                comps.append(Component("weights_repack", rep,
                                       "CPU_REPACK estimate (repacked matrices duplicated beside the mapping)"))
        comps.append(Component("kv_cache", kv_total, kv_note))
        if r + s:
            comps.append(Component("recurrent_state", r + s, _rs_note(arch, req, r, s)))
        sim = llama_cpu_compute_sim(arch, req)    # the allocator replay, run once for the bytes and the note
        comps.append(Component("compute", llama_cpu_compute(arch, req, sim), cpu_compute_note(arch, req, sim)))
        comps.append(Component("output", output_buf, f"logits buffer: vocab {arch.vocab_size} x 4 B x "
                                                     f"n_seq_max {req.parallel} ({slots_text(req)})"))
        if req.draft_bytes:
            comps.append(Component("draft", req.draft_bytes, "draft model"))
        if req.vision:
            comps.append(Component("vision", _vision_bytes(arch), "mmproj vision tower (f16)"))
        return [GpuFit(0, cap, tuple(comps))], [], notes

    n_use = min(max(1, req.tp), len(rig.gpus))
    gpus = rig.gpus[:n_use]
    caps = [g.free_bytes if g.free_bytes is not None else g.vram_bytes for g in gpus]
    ranges = _llama_layer_split(split, caps)
    gpu_c, host_c = llama_cuda_compute(arch, req)
    host = [Component("weights_embedding", split.embedding, "token_embd stays on the host (CPU_Mapped)"),
            Component("compute_host", host_c, "CUDA_Host compute buffer"),
            Component("output", output_buf,
                      f"logits buffer (host): vocab {arch.vocab_size} x 4 B x n_seq_max {req.parallel}")]
    out: list[GpuFit] = []
    n_trunk = arch.n_layers
    # a tied output head is token_embd loaded again (TENSOR_DUPLICATED) with the output layer, on
    # the GPU; the input copy stays on the host (measured on an H200: benchmarks/gpu_launch_memory.md)
    tied_head = ("output.weight" not in arch.tensor_bytes) if arch.tensor_bytes else arch.tie_embeddings
    gpu_head = split.head + (split.embedding if tied_head else 0)
    recurrent = arch.recurrent_layers if r + s else ()
    rs_note = _rs_note(arch, req, r, s) if r + s else ""
    ub = effective_ubatch(req)
    compute_note = (f"CUDA compute buffer, ub {ub}, masks over {kq_mask_bytes(arch, req, ub) // (2 * ub)} cells "
                    f"({slots_text(req)})")
    # each GPU's layers' KV (the last range: the whole trunk, to tell MTP layers' KV from it)
    kv_shares = llama_kv_shares(arch, req, [range(rg.start, min(rg.stop, n_trunk)) for rg in ranges]
                                + [range(n_trunk)], catalog=catalog)
    for gi, rg in enumerate(ranges):   # one range per GPU in use
        comps = []
        w = sum(split.per_layer[rg.start:rg.stop]) + (gpu_head if gi == n_use - 1 else 0)
        head = (" + output head" + (" (token_embd again: tied)" if tied_head else "")) if gi == n_use - 1 else ""
        comps.append(Component("weights", w, f"layers {rg.start}-{rg.stop - 1}" + head))
        kv = kv_shares[gi]
        if gi == n_use - 1 and req.spec_method == "mtp" and arch.mtp_layers:
            kv += kv_total - kv_shares[-1]
        comps.append(Component("kv_cache", kv, kv_note if n_use == 1 else f"share of: {kv_note}"))
        if r + s:
            here = bisect_left(recurrent, min(rg.stop, n_trunk)) - bisect_left(recurrent, rg.start)
            n_rec = len(recurrent)
            share = (r + s) * here // max(n_rec, 1)
            comps.append(Component("recurrent_state", share, f"{here} of {n_rec} recurrent layers' share of: "
                                                             + rs_note))
        comps.append(Component("compute", gpu_c, compute_note))
        comps.append(Component("cuda_runtime", CUDA_RUNTIME,
                               "CUDA context + cuBLAS workspace (measured on an H200: ~600 MiB beyond the buffers)"))
        if gi == 0 and req.draft_bytes:
            comps.append(Component("draft", req.draft_bytes, "draft model"))
        if gi == 0 and req.vision:
            comps.append(Component("vision", _vision_bytes(arch), "mmproj vision tower (f16)"))
        out.append(GpuFit(gi, caps[gi], tuple(comps)))
    return out, host, notes


def _rs_note(arch: ModelArch, req: FitRequest, r: int, s: int) -> str:
    """The recurrent state's formula: one cell per sequence (llama-model.cpp create_memory:
    recurrent_rs_size = max(1, n_seq_max), unified or not)."""
    parts = []
    n_lin = arch.count(LayerKind.LINEAR)
    if n_lin and arch.linear is not None:
        la = arch.linear
        parts.append(f"{n_lin} GDN layers x [conv ({la.conv_kernel}-1) x {la.conv_dim} x 4 B + state "
                     f"{la.n_value_heads} x {la.key_head_dim} x {la.value_head_dim} x {la.state_bytes_per_elem} B]")
    n_m = arch.count(LayerKind.MAMBA)
    if n_m and arch.mamba is not None:
        m = arch.mamba
        parts.append(f"{n_m} Mamba layers x [conv ({m.d_conv}-1) x {m.d_inner + 2 * m.n_groups * m.d_state} x 4 B + "
                     f"state {m.d_state} x {m.d_inner} x {m.state_bytes_per_elem} B]")
    return (" + ".join(parts) + f" x {req.parallel} seq(s) (one cell per slot, {slots_text(req)}) = "
            f"R {mib(r)} + S {mib(s)}")


def _vision_bytes(arch: ModelArch) -> int:
    if arch.vision is None:
        return 0
    v = arch.vision
    params = v.param_count or 12 * v.depth * v.hidden_size ** 2
    return params * 2
