"""llama.cpp's compute buffers: CUDA (calibrated block formula) and CPU (the allocator replay
for dense llama/qwen3 graphs, else the calibrated block formula), with the notes that say how.
"""

from __future__ import annotations

from ..arch import LayerKind, ModelArch
from ..units import mib
from .cpu_graph import dense_graph, gallocr_peak
from .kv import kv_elems_per_token_layer
from .llama_cache import effective_ubatch, kq_mask_bytes, kv_rotation_bytes, llama_kv_stream_cells, slots_text
from .request import FitRequest, MiB

# Compute-buffer model for llama.cpp CUDA (worst-case ubatch graph at a full KV cache, flash
# attention on, n_outputs_max = n_seqs, its name for the parallel sequences, so the reserved graph's
# logits are tiny). The peak is the larger of two blocks:
#   FFN block : f16 KQ mask (2 B x n_kv x ub, + the SWA mask) + ub x 4 B x (3 ff + 4 n_embd)
#               (MoE: 4 ff + 4 n_embd, ff = n_active x expert width + shared; where the experts'
#               down output n_active x n_embd is wider than 2 ff: 3 ff + 4 n_embd + that output)
#   attention : the same masks + f16 copies of one layer's K and V over all cells (only when
#               the cache is not f16: flash attention converts them) + ub x 4 B x (3 q + 2 n_embd)
#               (q = n_head x head_dim); qwen35 (gated query): from an allocator trace,
#               ub x 4 B x (4 q + 4 n_embd) + the Hadamard-rotated Q (q) of a quantized cache
#               when q > n_embd (same as 3 x 2q + 2 n_embd where q = n_embd)
# CUDA_Host compute: the masks + ub x 4 B x 4 n_embd.
# Constants FROZEN after calibration on the CUDA calibration set (benchmarks/fit_vs_llamacpp.py
# --device cuda --set calibration: dense-s, moe-s, swa-s, hybrid-s x ctx 4096/16384/32768 x
# f16/q8_0/q4_0 on an H200, llama.cpp 11434 built with CUDA 13.0 for sm_90); checked against the
# spec's 27B oracle (1,380.29 / 296.29 MiB: predicted 1,372.0 / 296.0) and then the CUDA
# held-out set. MLA (deepseek2) runs its attention without flash attention on CUDA in this build
# (f32 KQ of n_head x n_kv x ub): modelled from the calibration slope only, quantized MLA caches
# were not reproducible (ops fall back to the CPU) and are not modelled.
_CUDA_FFN = (3.0, 4.0)       # (x ff, x n_embd) dense
_CUDA_FFN_MOE = (4.0, 4.0)   # (x ff, x n_embd) MoE
_CUDA_ATTN = (3.0, 2.0)      # (x q, x n_embd) beside the f16 K/V copies
_CUDA_HOST_EMBD = 4.0
# CUDA context + cuBLAS workspace beyond llama.cpp's buffers: 597-604 MiB by nvidia-smi in 32 H200 runs
# (benchmarks/cuda_fit_and_speed.md)
CUDA_RUNTIME = 600 * MiB
# What a CUDA launch must leave free beyond every buffer fit counts: kernel code loads lazily, at
# each kernel's first launch. On the H200 a MoE pick planned at 0 MiB spare aborted at its first
# graph (`cudaFuncGetAttributes`: out of memory) while picks leaving 0.5-1.2 GiB ran
# (benchmarks/gpu_edge.md, lease 4). 1,024 MiB is llama.cpp's own free-memory target (`--fit-target`),
# the margin its automatic fitting keeps, which engineroom's launches turn off (`-fit off`).
CUDA_LAUNCH_RESERVE = 1024 * MiB


def ffn_width(arch: ModelArch) -> int:
    if arch.moe:
        m = arch.moe
        return m.expert_intermediate_size * m.n_experts_active + m.shared_width
    return arch.intermediate_size or 4 * arch.hidden_size


def llama_cuda_compute(arch: ModelArch, req: FitRequest) -> tuple[int, int]:
    """(CUDA compute buffer, CUDA_Host compute buffer) bytes for one GPU holding every layer."""
    ub = effective_ubatch(req)
    e = arch.hidden_size
    n_kv, n_stream = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.parallel, ub, req.kv_unified)
    ff = ffn_width(arch)
    if arch.mla is not None or not req.flash_attn:
        # no flash attention (MLA always runs without it on CUDA in this build; others with `-fa off`):
        # f32 KQ (n_head) + f32 mask + f16 mask copy per cell and token. Measured with `-fa off` on the
        # H200 (the Qwen3.6-27B layout Q4_K_M, 32K x 1, b11434; benchmarks/tune_gpu.md): 1,680 MiB CUDA /
        # 108 MiB host, this 1,758 / 104 (+4.6% / -3.7%), where the flash-attention buffer (174 / 72) was
        # predicted before: one shape measured, so the term's split is not traced
        gpu = n_kv * ub * (4 * arch.n_heads + 4 + 1) + ub * 4 * (_CUDA_FFN[0] * ff + _CUDA_FFN[1] * e)
        host: float = 4 * n_kv * ub + int(ub * 4 * _CUDA_HOST_EMBD * e)
        return int(gpu), int(host)
    masks = kq_mask_bytes(arch, req, ub)
    kf, ke = _CUDA_FFN_MOE if arch.moe else _CUDA_FFN
    ffn = masks + ub * 4 * (kf * ff + ke * e)
    if arch.moe is not None and arch.moe.n_experts_active * e > 2 * ff:
        # the routed experts' down projection writes n_active x n_embd floats per token above the
        # dense block's live set, as on the CPU (_cpu_compute_terms) with CUDA's 4 x n_embd: a
        # Qwen3-30B-A3B-like shape (48 layers, 2048 wide, 128 experts, 8 x 768) on the H200, 32K
        # f16, 1 slot: 116.01 MiB measured, 96.02 predicted without this term, 116.02 with it
        # (benchmarks/gpu_edge.md, fourth visit). moe-s / moe-m sit at exactly 2 x ff: unchanged.
        ffn = max(ffn, masks + ub * 4 * (_CUDA_FFN[0] * ff + _CUDA_FFN[1] * e + arch.moe.n_experts_active * e))
    attn: float = 0
    if req.kv_dtype.lower() != "f16" and arch.n_kv_layers:
        kel, vel = kv_elems_per_token_layer(arch, LayerKind.FULL)
        q1 = arch.n_heads * arch.head_dim
        # the f16 copy covers one layer's whole cache tensor (every stream/slot, not just one);
        # only the layer being computed holds its copy, so a SWA layer's smaller copy never adds
        conv = n_kv * n_stream * (kel + vel) * 2
        if arch.attn_output_gate and arch.moe is None:
            # Gated query (ModelArch.attn_output_gate), dense MLP: the layout this was traced on
            # (a gated MoE keeps the calibrated formula below until it is traced).
            # From an allocator trace of the 27B layout (ggml-alloc AT_PRINTF, CUDA, q8_0 vs
            # LLAMA_ATTN_ROT_DISABLE=1): below the FA node lie 4 n_embd-wide slots (residual,
            # attn_norm, a freed n_embd hole, the DUP'd input) + the gated Qcur_full (2 q1) +
            # the normed/roped Q (q1); the FA node adds its f32 output (q1) to the f16 copies.
            # With a quantized cache llama.cpp also rotates Q (llama-graph.cpp:2959,
            # llama_mul_mat_hadamard, llama-impl.h:70: a new f32 mul_mat output of q1 floats per
            # token, allocated while Q is still live). Its only free slot below is the n_embd
            # hole, so it stacks under the FA node when q1 > n_embd (27B: 6144 > 5120, +ub x 24
            # KiB) and costs nothing when q1 <= n_embd (hybrid-s/-m: q1 = n_embd). Same values
            # as the calibrated 3 x (2 q1) + 2 n_embd wherever q1 = n_embd.
            rot_q = q1 if kv_rotation_bytes(arch, req) and q1 > e else 0
            attn = masks + conv + ub * 4 * (4 * q1 + 4 * e + rot_q)
        else:
            attn = masks + conv + ub * 4 * (_CUDA_ATTN[0] * q1 + _CUDA_ATTN[1] * e)
    host = masks + ub * 4 * _CUDA_HOST_EMBD * e
    rot = kv_rotation_bytes(arch, req)
    return int(max(ffn, attn) + _CPU_CONST + rot), int(host + _CPU_CONST + rot)


# CPU compute buffer (llama.cpp CPU backend, flash attention auto -> on, n_outputs_max =
# parallel so the reserved graph's logits are tiny).
# Measured structure (llama.cpp 11434): compute = f16 KQ mask over all cells (2 B x n_kv x ub,
# plus one per SWA cache) + a ctx-independent activation peak in the FFN block:
#   ff > n_embd : ub x 4 B x (3 x ff + k x n_embd)          (gate, up, swiglu + residual stream)
#   ff <= n_embd: ub x 4 B x (5 x n_embd + (ff if 2 ff > n_embd else 0))
# with ff = dense width, or n_active x expert width (+ shared experts) for MoE.
# Constants FROZEN after calibration on: (a) the calibration set of
# benchmarks/fit_vs_llamacpp.py (dense-s, moe-s, swa-s, hybrid-s, mla-s x ctx 4096/16384/32768
# x KV f16/q8_0/q4_0) and (b) a 2-layer qwen3 grid n_embd {256..2048} x ff {512..6144} at
# ctx 1024; they were not changed after the held-out set was measured. Added afterwards, with
# no fitted constant: the mask spans one KV stream per slot, and kv_rotation_bytes (from source).
# k: one value for every architecture calibrated (qwen35, qwen3, qwen3moe, gemma3, llama, deepseek2)
_CPU_K = 5.0
_CPU_MLA_ATTN = 2.5     # MLA: absorbed-attention buffers of n_head x kv_lora_rank floats per token
_CPU_CONST = 0.02 * MiB  # small graph inputs (positions, output ids)


def llama_cpu_compute_sim(arch: ModelArch, req: FitRequest) -> int | None:
    """CPU compute bytes by replaying ggml-alloc over the dense llama / qwen3 graph (f16 KV;
    None for other graphs, which keep the calibrated block formula below)."""
    if req.kv_dtype.lower() == "f32" or not req.flash_attn:
        return None
    g = dense_graph(arch, req)
    if g is None:
        return None
    return gallocr_peak(*g)


def _cpu_compute_terms(arch: ModelArch, req: FitRequest) -> tuple[int, int, float, str]:
    """(mask bytes, ubatch, activation units per token (x 4 B), which branch) of the CPU compute buffer."""
    ub = effective_ubatch(req)
    e = arch.hidden_size
    # f16 KQ masks over one KV stream (unified: the one stream spans every slot's cells)
    mask = kq_mask_bytes(arch, req, ub)
    ff = ffn_width(arch)
    k = _CPU_K
    if ff > e:
        units, how = 3 * ff + k * e, f"3 x ff {ff} + {k:g} x n_embd {e}"
    else:
        units = 5 * e + (ff if 2 * ff > e else 0)
        how = f"5 x n_embd {e}" + (f" + ff {ff}" if 2 * ff > e else "")
    if arch.moe is not None and arch.moe.n_experts_active * e > 2 * ff:
        # the routed experts' down projection writes n_active x n_embd floats per token; where that
        # is wider than the gate + up outputs it frees (2 x ff) it is placed above everything live
        # (measured, llama.cpp 11434 CPU: moe-a3b 92.02 MiB = 3 ff + 5 n_embd + 8 x 2048; moe-wide
        # 30.02 MiB = 5 n_embd + 8 x 1024; moe-s / moe-m sit at exactly 2 x ff and do not grow)
        down = arch.moe.n_experts_active * e
        above = (3 * ff if ff > e else 0) + k * e + down
        if above > units:
            units, how = above, (f"{'3 x ff ' + str(ff) + ' + ' if ff > e else ''}{k:g} x n_embd {e} + "
                                 f"experts' down output {arch.moe.n_experts_active} x n_embd {e}")
    if arch.mla is not None:
        mla = k * e + _CPU_MLA_ATTN * arch.n_heads * arch.mla.kv_lora_rank
        if mla > units:
            units, how = mla, (f"{k:g} x n_embd {e} + {_CPU_MLA_ATTN:g} x n_head {arch.n_heads} "
                               f"x kv_lora_rank {arch.mla.kv_lora_rank}")
    return mask, ub, units, how


def llama_cpu_compute(arch: ModelArch, req: FitRequest, sim: int | None = None) -> int:
    """CPU compute bytes: ``sim`` (the allocator replay, when the caller already ran it) or
    ``llama_cpu_compute_sim``, else the calibrated block formula."""
    sim = sim if sim is not None else llama_cpu_compute_sim(arch, req)
    if sim is not None:
        return sim
    mask, ub, units, _ = _cpu_compute_terms(arch, req)
    peak = mask + ub * 4 * units
    if req.graph_outputs == "ubatch":      # logits for every ubatch token at the graph's end
        peak = max(peak, mask + 4 * arch.vocab_size * ub + 4 * arch.hidden_size * ub)
    return int(peak + _CPU_CONST) + kv_rotation_bytes(arch, req)


def cpu_compute_note(arch: ModelArch, req: FitRequest, sim: int | None = None) -> str:
    sim = sim if sim is not None else llama_cpu_compute_sim(arch, req)
    if sim is not None:
        ub = effective_ubatch(req)
        n_kv, _ = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.parallel, ub, req.kv_unified)
        return (f"CPU compute {mib(sim)}: ggml-alloc replayed over the {arch.architecture} graph of a "
                f"{ub}-token ubatch (inputs incl. the f16 KQ mask of {n_kv} cells x {ub}; {slots_text(req)}; "
                f"{ub if req.graph_outputs == 'ubatch' else req.parallel} output row(s))")
    mask, ub, units, how = _cpu_compute_terms(arch, req)
    rot = kv_rotation_bytes(arch, req)
    cells = f"{mask // (2 * ub)}"
    if arch.count(LayerKind.SLIDING) and mask:
        swa, _ = llama_kv_stream_cells(arch, LayerKind.SLIDING, req.ctx, req.parallel, ub, req.kv_unified, req.swa_full)
        cells = f"({mask // (2 * ub) - swa} full + {swa} SWA)"
    return (f"CPU compute: f16 KQ masks {mib(mask)} (2 B x {cells} cells of one stream x ub {ub}; "
            f"{slots_text(req)}) + ub {ub} x 4 B x ({how}) + {mib(_CPU_CONST)} inputs"
            + (f" + {mib(rot)} KV rotation" if rot else ""))
