"""Memory fit per engine memory model: per-GPU breakdown, verdict, max context, max concurrency.

CONTRACT (used by plan.py and the CLI; extend with defaulted fields, never rename):

    fit(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog=None) -> Fit
    max_context(arch, req, rig, *, catalog=None) -> int        # largest *fillable* ctx for req.n_seqs
    max_concurrency(arch, req, rig, *, catalog=None) -> int    # most sequences at req.ctx

Verdicts: "fits" (>= 5% headroom on every GPU), "tight" (< 5%), "does_not_fit"
(the binding constraint is named in Fit.binding, e.g. "GPU0: KV cache 9.13 GB > 6.2 GB free").

Everything engine-specific comes from the engine's catalog entry (catalog/engines/*.yaml):
its ``memory_model``, the KV types it accepts with their bytes per element, its default
memory fraction and the step of the context search. ``req.engine`` is looked up in the
packaged catalog, or in ``catalog=`` when the caller passes one (plan passes its own). Two
memory models, because engines allocate differently:

* ``llama_buffers`` (llama.cpp, ik_llama.cpp) allocate exactly what the graph needs:
  weights (split by layers across GPUs, the input embedding stays on the host for CUDA), a
  KV cache of ``ctx x n_seqs`` cells (padded to 256) for the layers whose cache grows with
  context, fixed recurrent state per sequence, and compute buffers sized for the worst-case
  ubatch graph at a full cache. On a CPU-only rig the device is the RAM; Q4_0/Q4_K/IQ4_NL
  matrices are repacked into a CPU_REPACK buffer beside the mmapped file (CPU_Mapped).
* ``kv_pool`` (vLLM, SGLang) reserve ``mem_fraction x VRAM`` and hand what the weights,
  activations and CUDA graphs leave over to a KV pool; the question is whether that pool
  holds the requested ``ctx x n_seqs``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from .arch import LayerKind, ModelArch
from .catalog import Catalog, Engine, KvDtype, load_catalog
from .errors import BadInput
from .hardware import Rig

MiB = 1024 * 1024
GB = 1_000_000_000


@dataclass(frozen=True)
class FitRequest:
    engine: str                        # catalog engine id or alias: llama.cpp | ik_llama.cpp | vllm | sglang
    ctx: int
    quant: str | None = None           # catalog quant id ("Q4_K_M", "autoround-int4", "bf16")
    weight_bytes: int | None = None    # exact weight bytes when known (GGUF file, catalog size)
    kv_dtype: str = "f16"              # a catalog KV type of the engine, id or alias
    n_seqs: int = 1
    tp: int = 1
    spec_method: str | None = None     # "mtp" | "dflash" | "draft" | None
    spec_tokens: int = 0
    draft_bytes: int = 0
    vision: bool = False
    mem_fraction: float | None = None  # vLLM gpu_memory_utilization / SGLang mem_fraction_static
                                       # (None: the catalog's default_mem_fraction)
    ubatch: int = 512                  # llama.cpp -ub; vLLM/SGLang max batched tokens go in extra
    extra: dict[str, float] = field(default_factory=dict)
    # ---- added (defaulted) -----------------------------------------------------------
    flash_attn: bool = True            # llama.cpp -fa (auto resolves to on for CPU and CUDA)
    batch: int = 2048                  # llama.cpp -b (caps ubatch)


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

    # ---- added helpers ---------------------------------------------------------------
    def component(self, name: str) -> int:
        """Bytes of every component called ``name`` over all devices and the host."""
        total = sum(c.bytes for g in self.per_gpu for c in g.components if c.name == name)
        return total + sum(c.bytes for c in self.host if c.name == name)

    @property
    def total_bytes(self) -> int:
        return sum(g.used_bytes for g in self.per_gpu) + sum(c.bytes for c in self.host)


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------

# Effective bits per weight over a whole checkpoint (embeddings and norms included) for
# standard quant ids. GGUF k-quant mixes: llama.cpp's published averages; the int4 /
# fp8 / nvfp4 entries are fitted to the published Qwen3.6-27B disk sizes (spec: AutoRound
# ~17.5-19 GB, GPTQ ~16.5-17, AWQ ~16-17, FP8 ~29, NVFP4 ~22) because their
# embeddings, heads and vision tower stay in bf16.
BITS_PER_WEIGHT: dict[str, float] = {
    "f32": 32.0, "fp32": 32.0,
    "bf16": 16.0, "f16": 16.0, "fp16": 16.0,
    "fp8": 8.35, "fp8-dynamic": 8.35, "fp8_e4m3": 8.35,
    "q8_0": 8.5, "q6_k": 6.5625, "q5_k_m": 5.69, "q5_k_s": 5.54, "q5_0": 5.5, "q5_1": 6.0,
    "q4_k_m": 4.85, "q4_k_s": 4.58, "q4_0": 4.5, "q4_1": 5.0,
    "iq4_xs": 4.25, "iq4_nl": 4.5, "iq4_ks": 4.37, "iq4_k": 4.5,
    "ud-q4_k_xl": 4.9, "ud-q3_k_xl": 4.25, "q3_k_m": 3.91, "q3_k_s": 3.5, "q3_k_l": 4.27,
    "iq3_xxs": 3.06, "iq3_m": 3.66, "q2_k": 3.35, "ud-q2_k_xl": 3.2, "iq2_xxs": 2.06,
    "autoround-int4": 5.2, "gptq-int4": 4.85, "awq-int4": 4.7, "int4": 4.85,
    "nvfp4": 6.4, "mxfp4": 4.25,
}

# kv_pool activation coefficient per KV bytes-per-element (the catalog's number; spec:
# "coef x 48 x ctx / TP" bytes, measured on vLLM).
_VLLM_ACT_COEF = {2.0: 135.0, 1.0: 130.0, 0.75: 155.0, 0.5625: 155.0}


def engine_spec(engine: str, catalog: Catalog | None = None) -> Engine:
    """The catalog entry of ``engine`` (id, name or alias); BadInput names the known ids."""
    cat = catalog or load_catalog()
    e = cat.engine(engine)
    if e is None:
        raise BadInput(f"Unknown engine {engine!r}; known: {', '.join(x.id for x in cat.engines)}.")
    return e


def kv_dtype_spec(engine: str, kv_dtype: str, catalog: Catalog | None = None) -> KvDtype:
    """The catalog KV type ``kv_dtype`` (id or alias) of ``engine``; BadInput names the valid ones."""
    e = engine_spec(engine, catalog)
    k = e.kv(kv_dtype)
    if k is None:
        raise BadInput(f"KV type {kv_dtype!r} is not valid for {e.id}; valid: {e.kv_names()}.")
    return k


def kv_bytes_per_elem(engine: str, kv_dtype: str, catalog: Catalog | None = None) -> float:
    """Bytes per cached element for ``kv_dtype`` on ``engine`` (the catalog's number)."""
    return kv_dtype_spec(engine, kv_dtype, catalog).bytes_per_elem


# ---------------------------------------------------------------------------------------
# Per-token / per-sequence sizes
# ---------------------------------------------------------------------------------------

def kv_elems_per_token_layer(arch: ModelArch, kind: LayerKind, heads_div: int = 1) -> tuple[int, int]:
    """(K elements, V elements) per token for one layer of ``kind`` on one shard."""
    if kind == LayerKind.MLA and arch.mla is not None:
        # llama.cpp caches the compressed latent + rope key only (V is a view of it).
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, 0
    kvh = max(1, arch.n_kv_heads // max(1, heads_div))
    return kvh * arch.head_dim, kvh * arch.head_dim


def kv_shard(n_kv_heads: int, tp: int) -> int:
    """Divisor of the KV heads per card: heads shard up to TP = n_kv_heads, replicate above."""
    return max(1, min(tp, n_kv_heads))


def recurrent_state_bytes(arch: ModelArch, n_seqs: int = 1) -> tuple[int, int]:
    """(R conv bytes, S state bytes) for all recurrent layers and ``n_seqs`` sequences (fp32)."""
    r = s = 0
    n_lin = arch.count(LayerKind.LINEAR)
    if n_lin and arch.linear is not None:
        la = arch.linear
        r += n_lin * (la.conv_kernel - 1) * la.conv_dim * 4
        s += n_lin * la.n_value_heads * la.key_head_dim * la.value_head_dim * la.state_bytes_per_elem
    n_mamba = arch.count(LayerKind.MAMBA)
    if n_mamba and arch.mamba is not None:
        m = arch.mamba
        r += n_mamba * (m.d_conv - 1) * (m.d_inner + 2 * m.n_groups * m.d_state) * 4
        s += n_mamba * m.d_state * m.d_inner * m.state_bytes_per_elem
    return r * n_seqs, s * n_seqs


# ---------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------

_BLK = re.compile(r"^blk\.(\d+)\.")


def _bpw(quant: str | None) -> float | None:
    if quant is None:
        return None
    return BITS_PER_WEIGHT.get(quant.lower())


def estimate_param_count(arch: ModelArch) -> int:
    """Trunk + embeddings + head parameters from the shape alone (used when param_count is unknown)."""
    e, v = arch.hidden_size, arch.vocab_size
    total = v * e * (1 if arch.tie_embeddings else 2)
    q = arch.n_heads * arch.head_dim
    kvd = arch.n_kv_heads * arch.head_dim
    for i, kind in enumerate(arch.layer_kinds):
        if kind in (LayerKind.FULL, LayerKind.SLIDING):
            total += e * (q + 2 * kvd) + q * e
        elif kind == LayerKind.MLA and arch.mla:
            m = arch.mla
            qd = arch.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            total += (e * m.q_lora_rank + m.q_lora_rank * qd) if m.q_lora_rank else e * qd
            total += e * (m.kv_lora_rank + m.qk_rope_head_dim)
            total += m.kv_lora_rank * arch.n_heads * (m.qk_nope_head_dim + m.v_head_dim)
            total += arch.n_heads * m.v_head_dim * e
        elif kind == LayerKind.LINEAR and arch.linear:
            la = arch.linear
            vd = la.n_value_heads * la.value_head_dim
            total += e * la.conv_dim + e * vd + 2 * e * la.n_value_heads + vd * e
        elif kind == LayerKind.MAMBA and arch.mamba:
            m = arch.mamba
            total += e * (2 * m.d_inner + 2 * m.n_groups * m.d_state + m.n_heads) + m.d_inner * e
        if arch.moe and i >= arch.moe.first_dense_layers:
            mo = arch.moe
            total += 3 * e * mo.expert_intermediate_size * mo.n_experts + e * mo.n_experts
            if mo.n_shared_experts:
                total += 3 * e * (mo.shared_intermediate_size or mo.expert_intermediate_size) * mo.n_shared_experts
        elif arch.intermediate_size:
            total += 3 * e * arch.intermediate_size
    return total


@dataclass(frozen=True)
class WeightSplit:
    """Weight bytes of a model split into the pieces the engines place separately."""

    embedding: int                 # token_embd (a lookup: stays on the host for llama.cpp CUDA)
    per_layer: tuple[int, ...]     # trunk layers (+ MTP layers appended)
    head: int                      # output + output_norm
    source: str

    @property
    def total(self) -> int:
        return self.embedding + sum(self.per_layer) + self.head


def weight_split(arch: ModelArch, req: FitRequest) -> WeightSplit:
    """Exact tensor bytes when the arch came from a GGUF (and the request is that file: no
    other quant named, or exactly its bytes given); else a bits-per-weight estimate."""
    n_layers = arch.n_layers + arch.mtp_layers
    same_file = req.weight_bytes == arch.weight_bytes_exact if req.weight_bytes is not None else (
        req.quant is None or arch.file_type is None or req.quant.lower() == str(arch.file_type).lower())
    if arch.tensor_bytes and same_file:
        per = [0] * max(n_layers, 1 + max((int(m.group(1)) for n in arch.tensor_bytes if (m := _BLK.match(n))), default=0))
        emb = head = 0
        for name, b in arch.tensor_bytes.items():
            m = _BLK.match(name)
            if m:
                per[int(m.group(1))] += b
            elif name.startswith("token_embd"):
                emb += b
            else:
                head += b
        return WeightSplit(emb, tuple(per), head, "GGUF tensor bytes")
    params = arch.param_count or estimate_param_count(arch)
    bpw = _bpw(req.quant)
    if req.weight_bytes is not None:
        total = req.weight_bytes
        src = "given weight bytes"
    elif bpw is not None:
        total = int(params * bpw / 8)
        src = f"{params / 1e9:.2f}B params x {bpw} bpw ({req.quant})"
    elif arch.torch_dtype:
        total = int(params * BITS_PER_WEIGHT.get(arch.torch_dtype.lower(), 16.0) / 8)
        src = f"{params / 1e9:.2f}B params at {arch.torch_dtype}"
    else:
        raise BadInput(f"Cannot size weights: unknown quant {req.quant!r}; known: {', '.join(sorted(BITS_PER_WEIGHT))}.")
    frac = total / params if params else 0
    emb = int(arch.vocab_size * arch.hidden_size * frac)
    head = 0 if arch.tie_embeddings else emb
    rest = max(0, total - emb - head)
    per = tuple([rest // max(n_layers, 1)] * max(n_layers, 1))
    return WeightSplit(emb, per, head, src)


# ---------------------------------------------------------------------------------------
# memory_model: llama_buffers (llama.cpp, ik_llama.cpp)
# ---------------------------------------------------------------------------------------

def _pad(x: int, to: int) -> int:
    return ((x + to - 1) // to) * to


def llama_kv_cells(arch: ModelArch, kind: LayerKind, ctx: int, n_seqs: int, ubatch: int) -> int:
    """Cells llama.cpp allocates for one layer (non-unified KV: one stream per sequence)."""
    per_seq = _pad(ctx, 256)
    if kind == LayerKind.SLIDING and arch.sliding_window:
        per_seq = min(per_seq, _pad(min(per_seq, arch.sliding_window + ubatch), 256))
    return per_seq * n_seqs


def llama_kv_bytes(arch: ModelArch, req: FitRequest, layers: range | None = None, *,
                   catalog: Catalog | None = None) -> tuple[int, str]:
    bk = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    total = 0.0
    kinds = arch.layer_kinds
    idx = layers if layers is not None else range(len(kinds))
    n = 0
    for i in idx:
        k = kinds[i]
        if k not in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA):
            continue
        ke, ve = kv_elems_per_token_layer(arch, k)
        cells = llama_kv_cells(arch, k, req.ctx, req.n_seqs, _ubatch(req))
        total += cells * (ke + ve) * bk
        n += 1
    if req.spec_method == "mtp" and arch.mtp_layers and layers is None:
        ke, ve = kv_elems_per_token_layer(arch, LayerKind.FULL)
        total += arch.mtp_layers * _pad(req.ctx, 256) * req.n_seqs * (ke + ve) * bk
        n += arch.mtp_layers
    return int(total), f"{n} KV layers x {_pad(req.ctx, 256)} cells x {req.n_seqs} seq(s) x {bk:g} B/elem ({req.kv_dtype})"


def _ubatch(req: FitRequest) -> int:
    """Effective -ub: llama.cpp caps n_batch at n_ctx (total) and n_ubatch at n_batch."""
    return max(1, min(req.ubatch, req.batch, _pad(req.ctx, 256) * req.n_seqs))


# Compute-buffer model for llama.cpp CUDA (worst-case ubatch graph at a full KV cache, flash
# attention on, n_outputs_max = n_seqs so the reserved graph's logits are tiny). The peak is
# the larger of two blocks:
#   FFN block : f16 KQ mask (2 B x n_kv x ub, + the SWA mask) + ub x 4 B x (3 ff + 4 n_embd)
#               (MoE: 4 ff + 4 n_embd, ff = n_active x expert width + shared)
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
_CUDA_RUNTIME = 600 * MiB  # CUDA context + cuBLAS workspace beyond llama.cpp's buffers: 597-604 MiB by nvidia-smi in 32 H200 runs (benchmarks/cuda_fit_and_speed.md)


def _ffn_width(arch: ModelArch) -> int:
    if arch.moe:
        m = arch.moe
        return (m.expert_intermediate_size * m.n_experts_active
                + (m.shared_intermediate_size or m.expert_intermediate_size) * m.n_shared_experts)
    return arch.intermediate_size or 4 * arch.hidden_size


def _masks(arch: ModelArch, req: FitRequest, ub: int, bytes_per: int = 2) -> int:
    """KQ masks over one KV stream (non-unified KV: one stream per sequence)."""
    n_kv = _pad(req.ctx, 256)
    m = bytes_per * n_kv * ub if any(k in (LayerKind.FULL, LayerKind.MLA) for k in arch.layer_kinds) else 0
    if arch.count(LayerKind.SLIDING):
        m += bytes_per * llama_kv_cells(arch, LayerKind.SLIDING, req.ctx, 1, ub) * ub
    return m


def kv_rotation_bytes(arch: ModelArch, req: FitRequest) -> int:
    """Hadamard rotation inputs llama.cpp adds to the graph for a quantized KV cache
    (llama-kv-cache.cpp, attn_rot_k/v): K: n x n f32 with n the largest power-of-two multiple
    of 64 dividing head_dim; V: 64 x 64 f32; once per KV cache (an iSWA model has two).
    Derived from the source, not fitted: it explains the +0.03 / +0.08 / +0.53 MiB that
    quantized caches add at head_dim 64 / 128 / 256."""
    if arch.mla is not None or not arch.n_kv_layers:
        return 0
    if req.kv_dtype.lower() in ("f32", "f16", "bf16") or arch.head_dim % 64:
        return 0
    n = 64
    while arch.head_dim % (2 * n) == 0:
        n *= 2
    caches = 2 if arch.count(LayerKind.SLIDING) and arch.count(LayerKind.FULL) else 1
    return caches * (n * n * 4 + 64 * 64 * 4)


def llama_cuda_compute(arch: ModelArch, req: FitRequest) -> tuple[int, int]:
    """(CUDA compute buffer, CUDA_Host compute buffer) bytes for one GPU holding every layer."""
    ub = _ubatch(req)
    e = arch.hidden_size
    n_kv = _pad(req.ctx, 256)
    ff = _ffn_width(arch)
    if arch.mla is not None:
        # no flash attention: f32 KQ (n_head) + f32 mask + f16 mask copy per cell and token
        gpu = n_kv * ub * (4 * arch.n_heads + 4 + 1) + ub * 4 * (_CUDA_FFN[0] * ff + _CUDA_FFN[1] * e)
        host = 4 * n_kv * ub + int(ub * 4 * _CUDA_HOST_EMBD * e)
        return int(gpu), int(host)
    masks = _masks(arch, req, ub)
    kf, ke = _CUDA_FFN_MOE if arch.moe else _CUDA_FFN
    ffn = masks + ub * 4 * (kf * ff + ke * e)
    attn = 0
    if req.kv_dtype.lower() != "f16" and arch.n_kv_layers:
        kel, vel = kv_elems_per_token_layer(arch, LayerKind.FULL)
        q1 = arch.n_heads * arch.head_dim
        # the f16 copy covers one layer's whole cache tensor (every stream/slot, not just one);
        # only the layer being computed holds its copy, so a SWA layer's smaller copy never adds
        conv = n_kv * req.n_seqs * (kel + vel) * 2
        if arch.architecture.lower() in ("qwen35", "qwen3_5", "qwen3_5_text"):
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
# n_seqs so the reserved graph's logits are tiny).
# Measured structure (llama.cpp 11434): compute = f16 KQ mask over all cells (2 B x n_kv x ub,
# plus one per SWA cache) + a ctx-independent activation peak in the FFN block:
#   ff > n_embd : ub x 4 B x (3 x ff + k_arch x n_embd)     (gate, up, swiglu + residual stream)
#   ff <= n_embd: ub x 4 B x (5 x n_embd + (ff if 2 ff > n_embd else 0))
# with ff = dense width, or n_active x expert width (+ shared experts) for MoE.
# Constants FROZEN after calibration on: (a) the calibration set of
# benchmarks/fit_vs_llamacpp.py (dense-s, moe-s, swa-s, hybrid-s, mla-s x ctx 4096/16384/32768
# x KV f16/q8_0/q4_0) and (b) a 2-layer qwen3 grid n_embd {256..2048} x ff {512..6144} at
# ctx 1024; they were not changed after the held-out set was measured. Added afterwards, with
# no fitted constant: the mask spans one KV stream per slot, and kv_rotation_bytes (from source).
_CPU_K_ARCH = {"qwen35": 5.0, "qwen3": 5.0, "qwen3moe": 5.0, "gemma3": 5.0, "llama": 5.0, "deepseek2": 5.0}
_CPU_K_DEFAULT = 5.0
_CPU_MLA_ATTN = 2.5     # MLA: absorbed-attention buffers of n_head x kv_lora_rank floats per token
_CPU_CONST = 0.02 * MiB  # small graph inputs (positions, output ids)


def llama_cpu_compute(arch: ModelArch, req: FitRequest) -> int:
    ub = _ubatch(req)
    e = arch.hidden_size
    # KV is not unified (llama-server default): one stream per sequence, the mask spans one stream
    n_kv = _pad(req.ctx, 256)
    mask = 2 * n_kv * ub if any(k in (LayerKind.FULL, LayerKind.MLA) for k in arch.layer_kinds) else 0
    if arch.count(LayerKind.SLIDING):
        mask += 2 * llama_kv_cells(arch, LayerKind.SLIDING, req.ctx, 1, ub) * ub
    if arch.moe:
        m = arch.moe
        ff = m.expert_intermediate_size * m.n_experts_active
        ff += (m.shared_intermediate_size or m.expert_intermediate_size) * m.n_shared_experts
    else:
        ff = arch.intermediate_size or 4 * e
    k = _CPU_K_ARCH.get(arch.architecture.lower(), _CPU_K_DEFAULT)
    if ff > e:
        units = 3 * ff + k * e
    else:
        units = 5 * e + (ff if 2 * ff > e else 0)
    if arch.mla is not None:
        units = max(units, k * e + _CPU_MLA_ATTN * arch.n_heads * arch.mla.kv_lora_rank)
    return int(mask + ub * 4 * units + _CPU_CONST) + kv_rotation_bytes(arch, req)


REPACK_TYPES_AVX2 = {"q4_0", "q4_k", "iq4_nl", "mxfp4"}


def repacked_tensors(arch: ModelArch, cpu_flags: frozenset[str] = frozenset({"avx2"})) -> set[str]:
    """Tensors the CPU backend moves into CPU_REPACK (x86 AVX2 rules of ggml-cpu/repack.cpp).

    Matrices (used by MUL_MAT / MUL_MAT_ID) of Q4_0, Q4_K, IQ4_NL or MXFP4 are repacked
    (Q2_K too with AVX-512); the input embedding is a row lookup and is not. Rows must be a
    multiple of 8, which every shape we meet satisfies.
    """
    types = set(REPACK_TYPES_AVX2)
    if "avx512" in cpu_flags or "avx512f" in cpu_flags:
        types.add("q2_k")
    out = set()
    for name, t in arch.tensor_types.items():
        if ".attn_k_b." in name or ".attn_v_b." in name:
            continue  # 3-D batched MUL_MAT (MLA absorption): only 2-D matmuls and MUL_MAT_ID repack
        if t.lower() in types and name.endswith(".weight") and not name.startswith("token_embd"):
            out.add(name)
    return out


def cpu_mapped_bytes(arch: ModelArch, repacked: set[str], alignment: int = 32) -> int:
    """Size of llama.cpp's CPU_Mapped buffer: the file range from the first to the last
    tensor that is NOT repacked (tensor_bytes is in file order; data aligned to 32 B)."""
    off = 0
    first = last = None
    for name, b in arch.tensor_bytes.items():
        if name not in repacked:
            first = off if first is None else first
            last = off + b
        off = _pad(off + b, alignment)
    return 0 if first is None else last - first


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


def _fit_llama(arch: ModelArch, req: FitRequest, rig: Rig,
               catalog: Catalog | None) -> tuple[list[GpuFit], list[Component], list[str]]:
    notes: list[str] = []
    split = weight_split(arch, req)
    kv_total, kv_note = llama_kv_bytes(arch, req, catalog=catalog)
    r, s = recurrent_state_bytes(arch, req.n_seqs)
    output_buf = arch.vocab_size * 4 * req.n_seqs
    if not rig.gpus:  # CPU device: the RAM holds everything
        cap = rig.cpu_ram_bytes or 0
        comps: list[Component] = []
        repacked = repacked_tensors(arch) if arch.tensor_types else set()
        if arch.tensor_bytes and split.source == "GGUF tensor bytes":
            rep = sum(_pad(arch.tensor_bytes[n], 32) for n in repacked)
            mapped = cpu_mapped_bytes(arch, repacked)
            comps.append(Component("weights", mapped, "CPU_Mapped: mmapped file range of non-repacked tensors"))
            if rep:
                comps.append(Component("weights_repack", rep, f"CPU_REPACK: {len(repacked)} Q4_0/Q4_K/IQ4_NL matrices"))
        else:
            comps.append(Component("weights", split.total, split.source))
            if req.quant and req.quant.lower() in ("q4_0", "q4_k_m", "q4_k_s", "iq4_nl"):
                rep = int((split.total - split.embedding) * (1.0 if req.quant.lower() == "q4_0" else 0.8))
                comps.append(Component("weights_repack", rep, "CPU_REPACK estimate (repacked matrices duplicated beside the mapping)"))
        comps.append(Component("kv_cache", kv_total, kv_note))
        if r + s:
            comps.append(Component("recurrent_state", r + s, f"R {r / MiB:.2f} MiB + S {s / MiB:.2f} MiB"))
        comps.append(Component("compute", llama_cpu_compute(arch, req), f"CPU compute buffer, ub {_ubatch(req)}"))
        comps.append(Component("output", output_buf, "logits buffer"))
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
            Component("output", output_buf, "logits buffer (host)")]
    out: list[GpuFit] = []
    n_trunk = arch.n_layers
    for gi, (g, rg) in enumerate(zip(gpus, ranges)):
        comps = []
        w = sum(split.per_layer[i] for i in rg) + (split.head if gi == n_use - 1 else 0)
        comps.append(Component("weights", w, f"layers {rg.start}-{rg.stop - 1}" + (" + output head" if gi == n_use - 1 else "")))
        kv, _ = llama_kv_bytes(arch, req, range(rg.start, min(rg.stop, n_trunk)), catalog=catalog)
        if gi == n_use - 1 and req.spec_method == "mtp" and arch.mtp_layers:
            kv += kv_total - llama_kv_bytes(arch, req, range(n_trunk), catalog=catalog)[0]
        comps.append(Component("kv_cache", kv, kv_note if n_use == 1 else f"share of: {kv_note}"))
        if r + s:
            lin = [i for i in range(rg.start, min(rg.stop, n_trunk)) if arch.layer_kinds[i] in (LayerKind.LINEAR, LayerKind.MAMBA)]
            n_rec = sum(1 for k in arch.layer_kinds if k in (LayerKind.LINEAR, LayerKind.MAMBA))
            share = (r + s) * len(lin) // max(n_rec, 1)
            comps.append(Component("recurrent_state", share, f"{len(lin)} recurrent layers"))
        comps.append(Component("compute", gpu_c, f"CUDA compute buffer, ub {_ubatch(req)}"))
        comps.append(Component("cuda_runtime", _CUDA_RUNTIME, "CUDA context + cuBLAS workspace (measured on an H200: ~600 MiB beyond the buffers)"))
        if gi == 0 and req.draft_bytes:
            comps.append(Component("draft", req.draft_bytes, "draft model"))
        if gi == 0 and req.vision:
            comps.append(Component("vision", _vision_bytes(arch), "mmproj vision tower (f16)"))
        out.append(GpuFit(gi, caps[gi], tuple(comps)))
    return out, host, notes


def _vision_bytes(arch: ModelArch) -> int:
    if arch.vision is None:
        return 0
    v = arch.vision
    params = v.param_count or 12 * v.depth * v.hidden_size ** 2
    return params * 2


# ---------------------------------------------------------------------------------------
# memory_model: kv_pool (vLLM, SGLang)
# ---------------------------------------------------------------------------------------

def valid_tp(arch: ModelArch, max_tp: int = 8) -> list[int]:
    """TP sizes that divide the attention heads (and the linear-attention key/value heads,
    which vLLM shards the same way: 24 q heads but 16 GDN key heads make TP 3 and 6 fail
    for Qwen3.6-27B). KV heads may be fewer than TP: they replicate."""
    heads = [arch.n_heads]
    if arch.linear is not None and arch.count(LayerKind.LINEAR):
        heads += [arch.linear.n_key_heads, arch.linear.n_value_heads]
    return [t for t in range(1, max_tp + 1) if all(h % t == 0 for h in heads)]


def pool_kv_grow_per_card(arch: ModelArch, req: FitRequest, *, catalog: Catalog | None = None) -> tuple[int, str]:
    bpe = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    div = kv_shard(arch.n_kv_heads, req.tp)
    per_tok = 0.0
    for k in arch.layer_kinds:
        if k in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA):
            ke, ve = kv_elems_per_token_layer(arch, k, div if k != LayerKind.MLA else 1)
            per_tok += (ke + ve) * bpe
    n_mtp = req.spec_tokens if req.spec_method == "mtp" else 0
    toks = req.ctx + 32 * n_mtp
    # sliding layers only hold the window
    total = 0.0
    for k in arch.layer_kinds:
        if k in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA):
            ke, ve = kv_elems_per_token_layer(arch, k, div if k != LayerKind.MLA else 1)
            t = min(toks, arch.sliding_window) if (k == LayerKind.SLIDING and arch.sliding_window) else toks
            total += (ke + ve) * bpe * t
    return int(total * req.n_seqs), (f"{arch.n_kv_layers} KV layers, {arch.n_kv_heads}/{div} KV heads/card, "
                                     f"{per_tok:.0f} B/token/card x ({req.ctx} + 32 x {n_mtp}) x {req.n_seqs}")


def _fit_pool(arch: ModelArch, req: FitRequest, rig: Rig,
              catalog: Catalog | None) -> tuple[list[GpuFit], list[Component], list[str], dict]:
    eng = engine_spec(req.engine, catalog)
    tp = max(1, req.tp)
    if tp not in valid_tp(arch, max(8, tp)):
        raise BadInput(f"TP={tp} does not divide the {arch.n_heads} attention heads of {arch.name}; "
                       f"valid TP: {', '.join(map(str, valid_tp(arch)))}.")
    if rig.gpus and tp > len(rig.gpus):
        raise BadInput(f"TP={tp} needs {tp} GPUs but the rig {rig.label or ''} has {len(rig.gpus)}.")
    frac = req.mem_fraction if req.mem_fraction is not None else eng.default_mem_fraction
    split = weight_split(arch, req)
    w = split.total // tp
    kv_need, kv_note = pool_kv_grow_per_card(arch, req, catalog=catalog)
    r, s = recurrent_state_bytes(arch, req.n_seqs)
    kv_fixed = (r + s) // tp
    bpe = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    coef = _VLLM_ACT_COEF.get(bpe, 165.0 if bpe < 0.5 else 135.0)
    act = int(coef * 48 * req.ctx / tp)
    b = int(req.extra.get("max_num_batched_tokens", 0))
    n_lin = arch.count(LayerKind.LINEAR)
    scratch = 0
    if b and n_lin and arch.linear:
        vh = arch.linear.n_value_heads / tp
        kd, vd = arch.linear.key_head_dim, arch.linear.value_head_dim
        scratch = int(math.ceil(b / 64) * vh * kd * vd * 2 + 2 * b * vh * vd * 2)
    overhead = int((0.5 + frac + 0.3 * (tp - 1)) * GB)
    draft = req.draft_bytes // tp
    gpus = rig.gpus[:tp] if rig.gpus else ()
    out: list[GpuFit] = []
    info = {}
    for gi in range(tp):
        cap = (gpus[gi].free_bytes or gpus[gi].vram_bytes) if gpus else (rig.cpu_ram_bytes or 0)
        fixed = [Component("weights", w, split.source + (f" / TP {tp}" if tp > 1 else "")),
                 Component("activations", act + scratch, f"{coef:g} x 48 x ctx / TP" + (f" + GDN prefill scratch (b={b})" if scratch else "")),
                 Component("cuda_graphs", overhead, f"(0.5 + {frac} + 0.3 x (TP-1)) GB")]
        if kv_fixed:
            fixed.append(Component("recurrent_state", kv_fixed, f"{req.n_seqs} seq(s) of linear-attention state / TP"))
        if draft:
            fixed.append(Component("draft", draft, "draft model / TP"))
        budget = int(frac * cap)
        pool = budget - sum(c.bytes for c in fixed)
        comps = list(fixed) + [Component("kv_cache", kv_need, kv_note)]
        # the engine grabs the rest of its fraction for the KV pool
        if pool > kv_need:
            comps.append(Component("kv_pool_spare", pool - kv_need, f"pool sized from {frac} x VRAM"))
        out.append(GpuFit(gi, cap, tuple(comps)))
        info[gi] = (pool, kv_need, budget)
    notes = [f"{eng.id} sizes its KV pool from {frac} x VRAM"]
    if req.vision and arch.vision is not None:
        # a safetensors checkpoint carries its vision tower: it is already in the weights
        # (a language-model-only launch would leave it out)
        notes.append("the vision tower is part of the checkpoint's weights")
    return out, [], notes, info


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------

def _gb(b: float) -> str:
    return f"{b / GB:.2f} GB"


def fit(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> Fit:
    """Per-device memory breakdown and a verdict for serving ``arch`` with ``req`` on ``rig``
    (engine facts from ``catalog``, default: the packaged catalog)."""
    if req.ctx <= 0 or req.n_seqs <= 0:
        raise BadInput("Context and number of sequences must be positive.")
    eng = engine_spec(req.engine, catalog)
    kv_dtype_spec(req.engine, req.kv_dtype, catalog)  # validates the dtype first
    if eng.memory_model == "llama_buffers":
        gpus, host, notes = _fit_llama(arch, req, rig, catalog)
        verdict, binding = "fits", ""
        worst = None
        for g in gpus:
            dev = f"GPU{g.index}" if rig.gpus else "RAM"
            if g.used_bytes > g.capacity_bytes:
                big = max(g.components, key=lambda c: c.bytes)
                verdict = "does_not_fit"
                binding = (f"{dev}: needs {_gb(g.used_bytes)} > {_gb(g.capacity_bytes)} "
                           f"(largest: {big.name} {_gb(big.bytes)})")
                break
            frac = g.headroom_bytes / g.capacity_bytes if g.capacity_bytes else 0
            if worst is None or frac < worst[0]:
                worst = (frac, dev, g)
        if verdict != "does_not_fit" and worst is not None:
            frac, dev, g = worst
            binding = f"{dev}: {_gb(g.used_bytes)} of {_gb(g.capacity_bytes)} ({frac * 100:.1f}% headroom)"
            if frac < 0.05:
                verdict = "tight"
        return Fit(req, rig.label, tuple(gpus), tuple(host), verdict, binding, notes=tuple(notes))
    gpus, host, notes, info = _fit_pool(arch, req, rig, catalog)
    verdict, binding = "fits", ""
    for gi, (pool, need, budget) in info.items():
        per_seq = need // req.n_seqs
        if pool < per_seq:
            return Fit(req, rig.label, tuple(gpus), tuple(host), "does_not_fit",
                       f"GPU{gi}: KV pool {_gb(max(pool, 0))} < one sequence's KV {_gb(per_seq)} "
                       f"(budget {_gb(budget)})", notes=tuple(notes))
        if need > pool:
            verdict = "tight"
            binding = (f"GPU{gi}: KV need {_gb(need)} > pool {_gb(pool)}; the engine caps "
                       f"concurrency at {int(pool // max(per_seq, 1))} seq(s)")
        elif need > pool / 1.05 and verdict == "fits":
            verdict = "tight"
            binding = f"GPU{gi}: KV need {_gb(need)} within 5% of pool {_gb(pool)}"
        elif verdict == "fits":
            binding = f"GPU{gi}: KV need {_gb(need)} of pool {_gb(pool)}"
    return Fit(req, rig.label, tuple(gpus), tuple(host), verdict, binding, notes=tuple(notes))


def need_bytes(f: Fit) -> int:
    """What the request needs at most on one device (without a vLLM pool's spare)."""
    return max(sum(c.bytes for c in g.components if c.name != "kv_pool_spare") for g in f.per_gpu)


def _ok(arch: ModelArch, req: FitRequest, rig: Rig, catalog: Catalog | None) -> bool:
    """Servable: a llama_buffers engine when it fits; a kv_pool engine only when the pool
    holds all of ctx x seqs."""
    f = fit(arch, req, rig, catalog=catalog)
    if f.verdict == "does_not_fit":
        return False
    return engine_spec(req.engine, catalog).memory_model != "kv_pool" or "caps" not in f.binding


def max_context(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> int:
    """Largest ctx that can be *filled* by req.n_seqs sequences (compute scratch at that fill
    included); 0 when even the smallest context does not fit. Binary search in the engine's
    max_context_step (catalog: 256 tokens for llama.cpp, 1024 for vLLM/SGLang) up to the
    model's max positions."""
    step = engine_spec(req.engine, catalog).max_context_step
    hi = (arch.max_position or (1 << 21)) // step
    ok = lambda n: _ok(arch, replace(req, ctx=n * step), rig, catalog)  # noqa: E731
    if not ok(1):
        return 0
    if ok(hi):
        return hi * step
    return _last_ok(ok, 1, hi) * step


def max_concurrency(arch: ModelArch, req: FitRequest, rig: Rig, limit: int = 4096, *,
                    catalog: Catalog | None = None) -> int:
    """Most sequences that fit at req.ctx each (0 when one does not)."""
    ok = lambda n: _ok(arch, replace(req, n_seqs=n), rig, catalog)  # noqa: E731
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    return _last_ok(ok, lo, hi)


def _last_ok(ok, lo: int, hi: int) -> int:
    """Largest n in [lo, hi) with ok(n), given ok(lo) and not ok(hi) (memory grows with n)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
