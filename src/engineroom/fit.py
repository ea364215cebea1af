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

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

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
    # kv_pool builds with a fixed KV space (catalog backend kv_cache_space: vLLM's CPU build,
    # VLLM_CPU_KVCACHE_SPACE): the KV pool's bytes; None = the build's default (its default_gib,
    # or, when that is unset, the pool the build sizes itself from mem_fraction x RAM)
    kv_space_bytes: int | None = None
    ubatch: int = 512                  # llama.cpp -ub; vLLM/SGLang max batched tokens go in extra
    extra: dict[str, float] = field(default_factory=dict)
    # ---- added (defaulted) -----------------------------------------------------------
    flash_attn: bool = True            # llama.cpp -fa (auto resolves to on for CPU and CUDA)
    batch: int = 2048                  # llama.cpp -b (caps ubatch)
    # llama.cpp slots: n_seqs is -np; kv_unified is --kv-unified / --no-kv-unified. The engine's
    # own default (no -np) is the catalog's default_slots / default_kv_unified (llama.cpp: 4
    # slots, unified); fit never guesses it: callers pass what they launch (engine_defaults()).
    # With a unified cache the one stream holds ctx x n_seqs cells (-c ctx*n_seqs), and any one
    # sequence may fill all of them; without it every sequence has its own ctx cells.
    kv_unified: bool = False
    # CPU features that really execute (/proc/cpuinfo flag names, cpuprobe.probe_cpu().usable)
    # for the CPU backend's extra buffers (CPU_REPACK, AMX). None: this machine's probe when the
    # rig was detected, else AVX2 without AMX (a note says so).
    cpu_features: frozenset[str] | None = None
    repack: bool = True                # llama.cpp --repack (default); False = -nr / --no-repack
    rope_scaling: str | None = None    # --rope-scaling yarn|linear: ctx may exceed the model's maximum
    swa_full: bool = False             # llama.cpp --swa-full (full-size SWA cache)


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
            total += 3 * e * mo.shared_width
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


def llama_n_ctx(ctx: int, n_seqs: int, unified: bool) -> tuple[int, int, int]:
    """(n_ctx, n_ctx_seq, n_stream) as llama_context computes them for ``-c ctx*n_seqs
    -np n_seqs`` (src/llama-context.cpp: n_ctx = GGML_PAD(n_ctx, 256); unified: n_ctx_seq =
    n_ctx, one stream; else n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256), one stream per
    sequence, n_ctx = n_ctx_seq x n_seq_max)."""
    n_ctx = _pad(ctx * n_seqs, 256)
    if unified:
        return n_ctx, n_ctx, 1
    seq = _pad(n_ctx // n_seqs, 256)
    return seq * n_seqs, seq, n_seqs


def llama_kv_stream_cells(arch: ModelArch, kind: LayerKind, ctx: int, n_seqs: int, ubatch: int,
                          unified: bool = False, swa_full: bool = False) -> tuple[int, int]:
    """(cells per stream, streams) of one layer's KV tensor [n_embd_gqa, kv_size, n_stream].

    The base cache has n_ctx_seq cells per stream. A sliding layer's cache (src/llama-kv-cache-
    iswa.cpp) has GGML_PAD(min(size_base, n_swa x (unified ? n_seq_max : 1) + n_ubatch), 256)
    cells per stream, or size_base with --swa-full."""
    _, size_base, n_stream = llama_n_ctx(ctx, n_seqs, unified)
    if kind == LayerKind.SLIDING and arch.sliding_window and not swa_full:
        size = _pad(min(size_base, arch.sliding_window * (n_seqs if unified else 1) + ubatch), 256)
        return size, n_stream
    return size_base, n_stream


def llama_kv_cells(arch: ModelArch, kind: LayerKind, ctx: int, n_seqs: int, ubatch: int,
                   unified: bool = False, swa_full: bool = False) -> int:
    """Cells llama.cpp allocates for one layer over all its streams."""
    cells, streams = llama_kv_stream_cells(arch, kind, ctx, n_seqs, ubatch, unified, swa_full)
    return cells * streams


def _slots_text(req: FitRequest) -> str:
    return f"{req.n_seqs} slot(s), {'unified KV (1 stream)' if req.kv_unified else f'{req.n_seqs} KV stream(s)'}"


def llama_kv_bytes(arch: ModelArch, req: FitRequest, layers: range | None = None, *,
                   catalog: Catalog | None = None) -> tuple[int, str]:
    bk = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    total = 0.0
    kinds = arch.layer_kinds
    idx = layers if layers is not None else range(len(kinds))
    ub = _ubatch(req)
    groups: dict[tuple[str, int, int], int] = {}   # (kind, cells/stream, elems) -> layers
    for i in idx:
        k = kinds[i]
        if k not in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA):
            continue
        ke, ve = kv_elems_per_token_layer(arch, k)
        cells, streams = llama_kv_stream_cells(arch, k, req.ctx, req.n_seqs, ub, req.kv_unified, req.swa_full)
        total += cells * streams * (ke + ve) * bk
        key = (k.value, cells, ke + ve)
        groups[key] = groups.get(key, 0) + 1
    _, base, streams = llama_n_ctx(req.ctx, req.n_seqs, req.kv_unified)
    if req.spec_method == "mtp" and arch.mtp_layers and layers is None:
        ke, ve = kv_elems_per_token_layer(arch, LayerKind.FULL)
        total += arch.mtp_layers * base * streams * (ke + ve) * bk
        key = ("mtp", base, ke + ve)
        groups[key] = groups.get(key, 0) + arch.mtp_layers
    parts = [f"{n} {kind} layer(s) x {cells} cells x {streams} stream(s) x {el} elem x {bk:g} B"
             for (kind, cells, el), n in groups.items()]
    note = " + ".join(parts) + f" ({req.kv_dtype}; {_slots_text(req)}"
    if arch.count(LayerKind.SLIDING) and arch.sliding_window:
        note += (f"; SWA cap: pad256(min(n_ctx_seq, window {arch.sliding_window}"
                 + (f" x {req.n_seqs} seqs" if req.kv_unified else "") + f" + ubatch {ub})) per sliding layer"
                 + (", --swa-full: off" if not req.swa_full else "; --swa-full: on, no cap"))
    return int(total), note + ")"


def _ubatch(req: FitRequest) -> int:
    """Effective -ub: llama.cpp caps n_batch at n_ctx (total) and n_ubatch at n_batch."""
    return max(1, min(req.ubatch, req.batch, llama_n_ctx(req.ctx, req.n_seqs, req.kv_unified)[0]))


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
        return m.expert_intermediate_size * m.n_experts_active + m.shared_width
    return arch.intermediate_size or 4 * arch.hidden_size


def _masks(arch: ModelArch, req: FitRequest, ub: int, bytes_per: int = 2) -> int:
    """KQ masks: [n_kv, n_tokens / n_stream, 1, n_stream] (llama-graph.cpp build_attn_inp_kv),
    i.e. one stream's cells x ubatch tokens; unified KV: the one stream spans every slot's cells."""
    n_kv, _ = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.n_seqs, ub, req.kv_unified)
    m = bytes_per * n_kv * ub if any(k in (LayerKind.FULL, LayerKind.MLA) for k in arch.layer_kinds) else 0
    if arch.count(LayerKind.SLIDING):
        swa, _ = llama_kv_stream_cells(arch, LayerKind.SLIDING, req.ctx, req.n_seqs, ub, req.kv_unified, req.swa_full)
        m += bytes_per * swa * ub
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
    n_kv, n_stream = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.n_seqs, ub, req.kv_unified)
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
        conv = n_kv * n_stream * (kel + vel) * 2
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


# ---- CPU compute buffer by replaying llama.cpp's graph allocator ---------------------------
# ggml-alloc.c (ggml_gallocr_alloc_graph_impl + ggml_dyn_tallocr): graph inputs are allocated
# first; then every node in execution order is placed in the best-fitting free block (the last,
# open-ended block only when none fits), or in its parent's memory when the op may work in
# place (ggml_op_can_inplace: ADD, MUL, RMS_NORM, ROPE, SCALE, ...) and that parent has no
# other consumer; a tensor is freed when its last consumer has run. The buffer is the highest
# offset reached. Used for the dense llama / qwen3 graphs (src/models/llama.cpp, qwen3.cpp),
# whose peak depends on the holes the embedding inputs leave (narrow FFNs, wide Q).

_ALIGN = 32
_INPLACE = {"ADD", "MUL", "RMS_NORM", "ROPE", "SCALE", "UNARY", "SOFT_MAX"}


class _T:
    __slots__ = ("name", "size", "op", "srcs", "view_src", "external", "output", "n_children", "n_views",
                 "allocated", "offset")

    def __init__(self, name, size, op="", srcs=(), view_src=None, external=False, output=False):
        self.name, self.size, self.op, self.srcs = name, size, op, list(srcs)
        self.view_src, self.external, self.output = view_src, external, output
        self.n_children = self.n_views = 0
        self.allocated, self.offset = False, None


class _DynAlloc:
    """ggml_dyn_tallocr: sorted free blocks, best fit except the last block, merge on free."""

    def __init__(self):
        self.blocks = [[0, 1 << 62]]   # [offset, size]
        self.max = 0

    def alloc(self, size):
        size = _pad(size, _ALIGN)
        best, best_size = -1, None
        for i, (_, bs) in enumerate(self.blocks[:-1]):
            if bs >= size and (best_size is None or bs <= best_size):
                best, best_size = i, bs
        if best == -1:
            best = len(self.blocks) - 1
        off = self.blocks[best][0]
        self.blocks[best][0] += size
        self.blocks[best][1] -= size
        if self.blocks[best][1] == 0:
            del self.blocks[best]
        self.max = max(self.max, off + size)
        return off

    def free(self, off, size):
        size = _pad(size, _ALIGN)
        for i, b in enumerate(self.blocks):
            if b[0] + b[1] == off:
                b[1] += size
                if i + 1 < len(self.blocks) and b[0] + b[1] == self.blocks[i + 1][0]:
                    b[1] += self.blocks[i + 1][1]
                    del self.blocks[i + 1]
                return
            if off + size == b[0]:
                b[0], b[1] = off, b[1] + size
                if i > 0 and self.blocks[i - 1][0] + self.blocks[i - 1][1] == b[0]:
                    self.blocks[i - 1][1] += b[1]
                    del self.blocks[i]
                return
        self.blocks.append([off, size])
        self.blocks.sort()


def _gallocr_peak(inputs: list[_T], nodes: list[_T]) -> int:
    """The compute buffer ggml_gallocr reserves for this graph (bytes)."""
    for n in nodes:
        if n.view_src is not None:
            n.view_src.n_views += 1
        for s in n.srcs:
            s.n_children += 1
    a = _DynAlloc()
    for t in inputs:
        t.offset, t.allocated = a.alloc(t.size), True

    def free(t):
        if t.output or t.external or not t.allocated:
            return
        a.free(t.offset, t.size)
        t.allocated = False

    for n in nodes:
        if n.view_src is None and not n.allocated and not n.external:
            reused = False
            if n.op in _INPLACE:
                for p in n.srcs:
                    # a view is never "own" memory at this point (ggml_gallocr_is_own): no reuse
                    if p.external or p.output or p.view_src is not None or p.size != n.size \
                            or p.n_children != 1 or p.n_views:
                        continue
                    if p.allocated:
                        n.offset, n.allocated, reused = p.offset, True, True
                        p.allocated = False
                        break
            if not reused:
                n.offset, n.allocated = a.alloc(n.size), True
        for p in n.srcs:
            p.n_children -= 1
            if p.n_children == 0 and p.n_views == 0:
                if p.view_src is not None:
                    v = p.view_src
                    v.n_views -= 1
                    if v.n_views == 0 and v.n_children == 0:
                        free(v)
                else:
                    free(p)
    return a.max


def _dense_graph(arch: ModelArch, req: FitRequest) -> tuple[list[_T], list[_T]] | None:
    """The llama / qwen3 decoder graph of the worst-case ubatch as llama.cpp builds it on the CPU
    (flash attention, f16 cache; node order and sizes as ggml-alloc sees them)."""
    a = arch.architecture.lower()
    if a not in ("llama", "qwen3") or arch.moe or arch.mla or any(k != LayerKind.FULL for k in arch.layer_kinds):
        return None
    ub = _ubatch(req)
    e, q, kv = arch.hidden_size, arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
    n_out = min(ub, req.n_seqs)
    n_kv, n_stream = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.n_seqs, ub, req.kv_unified)
    W = _T("weights", 0, external=True)
    f32 = lambda n: 4 * n * ub  # noqa: E731
    # a quantized cache adds Hadamard rotations (llama-kv-cache.cpp attn_rot_k / attn_rot_v):
    # K (and Q) times an n x n f32 matrix before the store, V times 64 x 64, the attention
    # output rotated back
    rot = kv_rotation_bytes(arch, req) > 0
    n_rot = 64
    while rot and arch.head_dim % (2 * n_rot) == 0:
        n_rot *= 2
    inputs = [_T("inp_tokens", 4 * ub), _T("inp_embd", f32(e)), _T("inp_mixed_tokens", 4 * ub),
              _T("inp_mixed_slots", 8 * ub), _T("inp_mixed_embd", f32(e))]
    if rot:
        inputs.append(_T("k_rot", 4 * n_rot * n_rot))
    inputs.append(_T("inp_pos", 4 * ub))
    if rot:
        inputs.append(_T("v_rot", 4 * 64 * 64))
    inputs += [_T("k_idxs", 8 * ub), _T("v_idxs", 8 * ub), _T("kq_mask", 2 * n_kv * ub),
               _T("out_ids", 4 * n_out), _T("embd", f32(e))]
    it = {t.name: t for t in inputs}
    nodes: list[_T] = []

    def node(name, size, op, *srcs, view_src=None):
        t = _T(name, size, op, srcs, view_src)
        nodes.append(t)
        return t

    g1 = node("node_1", f32(e), "GET_ROWS", W, it["inp_mixed_tokens"])
    g2 = node("node_2", f32(e), "DUP", it["inp_mixed_embd"])
    node("set_rows", f32(e), "SET_ROWS", g1, it["inp_mixed_slots"], g2, view_src=g2)
    cur_in = it["embd"]
    L = arch.n_layers
    for il in range(L):
        last = il == L - 1
        norm = node(f"norm-{il}", f32(e), "RMS_NORM", cur_in)
        an = node(f"attn_norm-{il}", f32(e), "MUL", norm, W)

        def proj(nm, width):
            m = node(nm, f32(width), "MUL_MAT", W, an)
            r = node(nm + "-r", f32(width), "RESHAPE", m, view_src=m)
            if a == "qwen3":
                qn = node(nm + "-n", f32(width), "RMS_NORM", r)
                r = node(nm + "-nw", f32(width), "MUL", qn, W)
            return r

        def rotate(t, width, mat, nm):
            """reshape -> mul_mat by the rotation -> reshape (llama_mul_mat_hadamard)"""
            src = t.view_src or t
            r = node(nm + "-rr", f32(width), "RESHAPE", t, view_src=src)
            m = node(nm + "-rot", f32(width), "MUL_MAT", it[mat], r)
            return node(nm + "-rot-r", f32(width), "RESHAPE", m, view_src=m)

        qc = proj(f"Qcur-{il}", q)
        qr = node(f"Qrope-{il}", f32(q), "ROPE", qc, it["inp_pos"])
        if rot:
            qr = rotate(qr, q, "k_rot", f"Q-{il}")
        vc = node(f"Vcur-{il}", f32(kv), "MUL_MAT", W, an)
        vr = node(f"Vcur-{il}-r", f32(kv), "RESHAPE", vc, view_src=vc)
        if rot:
            vr = rotate(vr, kv, "v_rot", f"V-{il}")
        kc = proj(f"Kcur-{il}", kv)
        kr = node(f"Krope-{il}", f32(kv), "ROPE", kc, it["inp_pos"])
        if rot:
            kr = rotate(kr, kv, "k_rot", f"K-{il}")
        kv_ = node(f"Kview-{il}", f32(kv), "VIEW", kr, view_src=kr.view_src or kr)
        node(f"set_k-{il}", 0, "SET_ROWS", kv_, it["k_idxs"], W, view_src=W)
        vv = node(f"Vview-{il}", f32(kv), "VIEW", vr, view_src=vr.view_src or vr)
        node(f"set_v-{il}", 0, "SET_ROWS", vv, it["v_idxs"], W, view_src=W)
        qbase = qr.view_src or qr
        qv = node(f"Qview-{il}", f32(q), "VIEW", qr, view_src=qbase)
        qp = node(f"Qperm-{il}", f32(q), "PERMUTE", qv, view_src=qbase)
        fa = node(f"fa-{il}", f32(q), "FLASH_ATTN_EXT", qp, W, W, it["kq_mask"])
        ko = node(f"kqv_out-{il}", f32(q), "RESHAPE", fa, view_src=fa)
        if rot:
            ko = rotate(ko, q, "v_rot", f"O-{il}")
        ao = node(f"attn_out-{il}", f32(e), "MUL_MAT", W, ko)
        rows, res = ub, cur_in
        if last:
            rows = n_out
            ao = node(f"out_rows_a-{il}", 4 * e * rows, "GET_ROWS", ao, it["out_ids"])
            res = node(f"out_rows_r-{il}", 4 * e * rows, "GET_ROWS", cur_in, it["out_ids"])
        r4 = lambda n: 4 * n * rows  # noqa: E731
        fi = node(f"ffn_inp-{il}", r4(e), "ADD", ao, res)
        fn = node(f"ffn_norm_-{il}", r4(e), "RMS_NORM", fi)
        fn = node(f"ffn_norm-{il}", r4(e), "MUL", fn, W)
        ff = arch.intermediate_size or 4 * e
        gate = node(f"ffn_gate-{il}", r4(ff), "MUL_MAT", W, fn)
        up = node(f"ffn_up-{il}", r4(ff), "MUL_MAT", W, fn)
        sw = node(f"ffn_swiglu-{il}", r4(ff), "SWIGLU", gate, up)
        fo = node(f"ffn_out-{il}", r4(e), "MUL_MAT", W, sw)
        cur_in = node(f"l_out-{il}", r4(e), "ADD", fo, fi)
    nrm = node("norm", 4 * e * n_out, "RMS_NORM", cur_in)
    rn = node("result_norm", 4 * e * n_out, "MUL", nrm, W)
    out = node("result_output", 4 * arch.vocab_size * n_out, "MUL_MAT", W, rn)
    out.output = True
    return inputs, nodes


def llama_cpu_compute_sim(arch: ModelArch, req: FitRequest) -> int | None:
    """CPU compute bytes by replaying ggml-alloc over the dense llama / qwen3 graph (f16 KV;
    None for other graphs, which keep the calibrated block formula below)."""
    if req.kv_dtype.lower() == "f32" or not req.flash_attn:
        return None
    g = _dense_graph(arch, req)
    if g is None:
        return None
    return _gallocr_peak(*g)


def _cpu_compute_terms(arch: ModelArch, req: FitRequest) -> tuple[int, int, float, str]:
    """(mask bytes, ubatch, activation units per token (x 4 B), which branch) of the CPU compute buffer."""
    ub = _ubatch(req)
    e = arch.hidden_size
    # f16 KQ masks over one KV stream (unified: the one stream spans every slot's cells)
    mask = _masks(arch, req, ub)
    ff = _ffn_width(arch)
    k = _CPU_K_ARCH.get(arch.architecture.lower(), _CPU_K_DEFAULT)
    if ff > e:
        units, how = 3 * ff + k * e, f"3 x ff {ff} + {k:g} x n_embd {e}"
    else:
        units = 5 * e + (ff if 2 * ff > e else 0)
        how = f"5 x n_embd {e}" + (f" + ff {ff}" if 2 * ff > e else "")
    if arch.mla is not None:
        mla = k * e + _CPU_MLA_ATTN * arch.n_heads * arch.mla.kv_lora_rank
        if mla > units:
            units, how = mla, f"{k:g} x n_embd {e} + {_CPU_MLA_ATTN:g} x n_head {arch.n_heads} x kv_lora_rank {arch.mla.kv_lora_rank}"
    return mask, ub, units, how


def llama_cpu_compute(arch: ModelArch, req: FitRequest) -> int:
    sim = llama_cpu_compute_sim(arch, req)
    if sim is not None:
        return sim
    mask, ub, units, _ = _cpu_compute_terms(arch, req)
    return int(mask + ub * 4 * units + _CPU_CONST) + kv_rotation_bytes(arch, req)


def _cpu_compute_note(arch: ModelArch, req: FitRequest) -> str:
    sim = llama_cpu_compute_sim(arch, req)
    if sim is not None:
        ub = _ubatch(req)
        n_kv, _ = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.n_seqs, ub, req.kv_unified)
        return (f"CPU compute {sim / MiB:.2f} MiB: ggml-alloc replayed over the {arch.architecture} graph of a "
                f"{ub}-token ubatch (inputs incl. the f16 KQ mask of {n_kv} cells x {ub}; {_slots_text(req)}; "
                f"{req.n_seqs} output row(s))")
    mask, ub, units, how = _cpu_compute_terms(arch, req)
    rot = kv_rotation_bytes(arch, req)
    cells = f"{mask // (2 * ub)}"
    if arch.count(LayerKind.SLIDING) and mask:
        swa, _ = llama_kv_stream_cells(arch, LayerKind.SLIDING, req.ctx, req.n_seqs, ub, req.kv_unified, req.swa_full)
        cells = f"({mask // (2 * ub) - swa} full + {swa} SWA)"
    return (f"CPU compute: f16 KQ masks {mask / MiB:.2f} MiB (2 B x {cells} cells of one stream x ub {ub}; "
            f"{_slots_text(req)}) + ub {ub} x 4 B x ({how}) + {_CPU_CONST / MiB:.2f} MiB inputs"
            + (f" + {rot / MiB:.2f} MiB KV rotation" if rot else ""))


# ---- CPU backend weight buffers (ggml-cpu extra buffer types) --------------------------
# ggml_backend_cpu_get_extra_buffer_types (ggml-cpu.cpp) lists AMX first (built only with
# __AMX_INT8__ && __AVX512VNNI__, and only when arch_prctl grants the tile state), then
# CPU_REPACK; llama.cpp's loader (llama-model-loader.cpp select_weight_buft) gives a weight the
# first buffer type whose supports_op accepts the op that uses it (a MUL_MAT against an f32
# [ne0, 512] input, MUL_MAT_ID for expert stacks, GET_ROWS for token_embd); -nr
# (use_extra_bufts = false, llama-model.cpp make_cpu_buft_list) drops both: every weight stays
# in the mmapped file (CPU_Mapped).

# x86 rules of ggml_repack_get_optimal_repack_type (ggml-cpu/repack.cpp): type -> CPU flag the
# build needs (ggml_cpu_has_avx2 / ggml_cpu_has_avx512 = __AVX2__ / __AVX512F__); rows (ne[1])
# must be a multiple of 8; MUL_MAT needs a 2-D weight, MUL_MAT_ID a 3-D one.
REPACK_X86 = {"Q4_0": "avx2", "Q4_K": "avx2", "IQ4_NL": "avx2", "MXFP4": "avx2", "Q2_K": "avx512f"}
REPACK_TYPES_AVX2 = {t.lower() for t, f in REPACK_X86.items() if f == "avx2"}
# AMX (ggml-cpu/amx/amx.cpp supports_op): MUL_MAT only, src0 ne[0] a multiple of the alignment
# below, op ne[0] (= weight ne[1]) a multiple of TILE_N x 2 = 32. Sizes: ggml_backend_amx_get_alloc_size
# (amx/mmq.cpp): ne[1] x get_row_size(ne[0]) = KB x sizeof(block) (+ KB x 4 B of int32
# compensation for Q8_0, + KB x 4 B for Q4_K/Q5_K, + KB x 2 B for IQ4_XS), KB = ne[0] / block;
# F16 is not packed (ggml_nbytes).
AMX_ALIGN = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256, "F16": 16}
AMX_ROW_EXTRA = {"Q8_0": 4, "Q4_K": 4, "Q5_K": 4, "IQ4_XS": 2}
AMX_FLAGS = ("amx_int8", "avx512_vnni")
ASSUMED_CPU_FEATURES = frozenset({"avx", "avx2", "fma", "f16c"})


def cpu_features_for(req: FitRequest, rig: Rig) -> tuple[frozenset[str], str]:
    """The CPU flags fit sizes the CPU backend's buffers with, and where they come from:
    ``req.cpu_features`` when given; this machine's probe (cpuprobe.probe_cpu().usable: the
    flags whose instructions really execute) when the rig was detected; else AVX2 without AMX."""
    if req.cpu_features is not None:
        return frozenset(req.cpu_features), "CPU features as given"
    if rig.source == "detected":
        try:
            from .cpuprobe import probe_cpu
        except ImportError:
            probe_cpu = None
        if probe_cpu is not None:
            try:
                return frozenset(probe_cpu().usable), "this machine's CPU probe (instructions that execute)"
            except Exception as exc:  # a probe failure must not break fit
                why = f"the CPU probe failed ({exc.__class__.__name__})"
        else:
            why = "no CPU probe available"
        return ASSUMED_CPU_FEATURES, f"{why}: assumed AVX2 without AMX"
    return ASSUMED_CPU_FEATURES, "hypothetical rig: assumed AVX2 without AMX (AVX-512 and AMX not assumed)"


def _weight_op(name: str, shape: tuple[int, ...] | None) -> str | None:
    """The op llama.cpp tests a weight's buffer type with (LLM_TENSOR_INFOS): GET_ROWS for the
    token embedding, MUL_MAT_ID for expert stacks, MUL_MAT for the other matrices; None for
    vectors and the SSM conv kernel (no extra buffer type supports MUL / SSM_CONV)."""
    if not name.endswith(".weight") or name.startswith(("token_embd", "per_layer_token_embd")):
        return None
    if "ssm_conv1d" in name or "norm" in name.rsplit(".", 2)[-2]:
        return None
    if shape is not None and len(shape) < 2:
        return None
    return "MUL_MAT_ID" if "_exps." in name else "MUL_MAT"


def amx_alloc_bytes(ggml_type: str, shape: tuple[int, ...], nbytes: int) -> int:
    """ggml_backend_amx_get_alloc_size: ne[1] x row size of ne[0] (see AMX_ROW_EXTRA)."""
    t = ggml_type.upper()
    if t == "F16" or len(shape) < 2:
        return nbytes
    blk, size = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
    kb = shape[0] // blk
    return shape[1] * (kb * size + kb * AMX_ROW_EXTRA.get(t, 0))


def cpu_weight_buffers(arch: ModelArch, features: frozenset[str] = ASSUMED_CPU_FEATURES,
                       repack: bool = True) -> dict[str, str]:
    """Buffer type of every weight on the CPU backend: "AMX", "CPU_REPACK" or "CPU_Mapped"."""
    out: dict[str, str] = {}
    amx = repack and all(f in features for f in AMX_FLAGS)
    avx512 = "avx512f" in features or "avx512" in features
    for name, t in arch.tensor_types.items():
        t = t.upper()
        shape = arch.tensor_shapes.get(name)
        op = _weight_op(name, shape)
        buf = "CPU_Mapped"
        if repack and op is not None:
            ne0 = shape[0] if shape else None
            ne1 = shape[1] if shape and len(shape) > 1 else None
            if (amx and op == "MUL_MAT" and t in AMX_ALIGN and (ne0 is None or ne0 % AMX_ALIGN[t] == 0)
                    and (ne1 is None or ne1 % 32 == 0)):
                buf = "AMX"
            elif t in REPACK_X86 and (avx512 if REPACK_X86[t] == "avx512f" else "avx2" in features) \
                    and (ne1 is None or ne1 % 8 == 0):
                # without shapes: expert stacks and the MLA k_b/v_b stacks are 3-D
                nd = len(shape) if shape else (3 if op == "MUL_MAT_ID" or ".attn_k_b." in name or ".attn_v_b." in name else 2)
                if (op == "MUL_MAT" and nd == 2) or (op == "MUL_MAT_ID" and nd == 3):
                    buf = "CPU_REPACK"
        out[name] = buf
    return out


def repacked_tensors(arch: ModelArch, cpu_flags: frozenset[str] = ASSUMED_CPU_FEATURES) -> set[str]:
    """Tensors the CPU backend moves into CPU_REPACK (x86 rules of ggml-cpu/repack.cpp, no AMX):
    2-D MUL_MAT weights and 3-D MUL_MAT_ID expert stacks of Q4_0, Q4_K, IQ4_NL, MXFP4 (AVX2) or
    Q2_K (AVX-512) whose rows are a multiple of 8; the input embedding is a row lookup."""
    bufs = cpu_weight_buffers(arch, frozenset(cpu_flags) - set(AMX_FLAGS), True)
    return {n for n, b in bufs.items() if b == "CPU_REPACK"}


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
        feats, feat_src = cpu_features_for(req, rig)
        amx_on = req.repack and all(f in feats for f in AMX_FLAGS)
        buf_rule = ("-nr (no repack): no CPU_REPACK or AMX buffer" if not req.repack else
                    f"repack on, {'AMX + ' if amx_on else 'no AMX, '}"
                    f"{'AVX-512' if ('avx512f' in feats or 'avx512' in feats) else 'AVX2' if 'avx2' in feats else 'no AVX2'}"
                    f" rules ({feat_src})")
        if arch.tensor_bytes and split.source == "GGUF tensor bytes":
            bufs = cpu_weight_buffers(arch, feats, req.repack)
            moved = {n for n, b in bufs.items() if b != "CPU_Mapped"}
            rep_names = [n for n, b in bufs.items() if b == "CPU_REPACK"]
            amx_names = [n for n, b in bufs.items() if b == "AMX"]
            mapped = cpu_mapped_bytes(arch, moved)
            comps.append(Component("weights", mapped, f"CPU_Mapped: mmapped file range of the {len(bufs) - len(moved)} "
                                                      f"tensors left in the file; {buf_rule}"))
            if rep_names:
                rep = sum(_pad(arch.tensor_bytes[n], 32) for n in rep_names)
                types = "/".join(sorted({arch.tensor_types[n] for n in rep_names}))
                comps.append(Component("weights_repack", rep, f"CPU_REPACK: {len(rep_names)} {types} matrices, "
                                                              "their bytes padded to 32 B, beside the mapping"))
            if amx_names:
                amx = sum(_pad(amx_alloc_bytes(arch.tensor_types[n], arch.tensor_shapes.get(n, ()), arch.tensor_bytes[n]), 32)
                          for n in amx_names)
                types = "/".join(sorted({arch.tensor_types[n] for n in amx_names}))
                comps.append(Component("weights_amx", amx, f"AMX: {len(amx_names)} {types} matrices at "
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
                comps.append(Component("weights_amx", amx, "AMX estimate: the non-embedding matrices packed beside the "
                                                           "mapping (from ggml-cpu/amx source; no tensor table to size it exactly)"))
            elif req.repack and "avx2" in feats and q in ("q4_0", "q4_k_m", "q4_k_s", "iq4_nl"):
                rep = int((split.total - split.embedding) * (1.0 if q == "q4_0" else 0.8))
                comps.append(Component("weights_repack", rep, "CPU_REPACK estimate (repacked matrices duplicated beside the mapping)"))
        comps.append(Component("kv_cache", kv_total, kv_note))
        if r + s:
            comps.append(Component("recurrent_state", r + s, _rs_note(arch, req, r, s)))
        comps.append(Component("compute", llama_cpu_compute(arch, req), _cpu_compute_note(arch, req)))
        comps.append(Component("output", output_buf, f"logits buffer: vocab {arch.vocab_size} x 4 B x "
                                                     f"n_seq_max {req.n_seqs} ({_slots_text(req)})"))
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
            Component("output", output_buf, f"logits buffer (host): vocab {arch.vocab_size} x 4 B x n_seq_max {req.n_seqs}")]
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
            comps.append(Component("recurrent_state", share, f"{len(lin)} of {n_rec} recurrent layers' share of: "
                                                             + _rs_note(arch, req, r, s)))
        comps.append(Component("compute", gpu_c, f"CUDA compute buffer, ub {_ubatch(req)}, masks over "
                                                 f"{_masks(arch, req, _ubatch(req)) // (2 * _ubatch(req))} cells ({_slots_text(req)})"))
        comps.append(Component("cuda_runtime", _CUDA_RUNTIME, "CUDA context + cuBLAS workspace (measured on an H200: ~600 MiB beyond the buffers)"))
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
    return (" + ".join(parts) + f" x {req.n_seqs} seq(s) (one cell per slot, {_slots_text(req)}) = "
            f"R {r / MiB:.2f} MiB + S {s / MiB:.2f} MiB")


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
    ks = eng.kv_cache_space if not gpus else None   # a fixed-space build (vLLM CPU): catalog data
    if ks is not None:
        return _fit_space(arch, req, rig, eng, ks, frac, w, split.source, act + scratch, coef, kv_need, kv_note,
                          kv_fixed, draft, catalog)
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


def _pool_bytes_per_token(arch: ModelArch, req: FitRequest, catalog: Catalog | None) -> int:
    """KV bytes one cached token costs over every growing KV layer (per card)."""
    one, _ = pool_kv_grow_per_card(arch, replace(req, ctx=1, n_seqs=1, spec_method=None, spec_tokens=0),
                                   catalog=catalog)
    return max(one, 1)


def _fit_space(arch: ModelArch, req: FitRequest, rig: Rig, eng: Engine, ks, frac: float, w: int, w_src: str,
               act: int, coef: float, kv_need: int, kv_note: str, kv_fixed: int,
               draft: int, catalog: Catalog | None) -> tuple[list[GpuFit], list[Component], list[str], dict]:
    """A kv_pool build with a fixed KV space (catalog ``kv_cache_space``; vLLM's CPU build):
    RAM holds weights + the runtime + activations, and a KV pool of exactly the space (the
    user's ``req.kv_space_bytes``, else the build's ``default_gib``); the pool holds whole
    blocks of ``block_size`` tokens, each ``block_size x KV bytes per token``, after the
    sequences' recurrent state. With no default the build sizes the pool itself:
    ``frac x RAM`` less weights, runtime and activations (no CUDA graphs)."""
    cap = rig.cpu_ram_bytes or 0
    runtime = int(ks.runtime_gib * (1 << 30))
    fixed = [Component("weights", w, w_src),
             Component("activations", act, f"{coef:g} x 48 x ctx"),
             Component("runtime", runtime, f"{ks.runtime_gib:g} GiB process beside the weights (catalog "
                                           f"kv_cache_space.runtime_gib; no CUDA graphs on this build)")]
    if draft:
        fixed.append(Component("draft", draft, "draft model"))
    fixed_bytes = sum(c.bytes for c in fixed)
    unit = ks.unit_bytes
    if req.kv_space_bytes is not None:
        space, how = int(req.kv_space_bytes), f"{ks.env}={req.kv_space_bytes / unit:g} GiB (set)"
    elif ks.default_gib is not None:
        space, how = int(ks.default_gib * unit), f"{ks.env}={ks.default_gib:g} GiB (its default when unset)"
    else:
        space = int(frac * cap) - fixed_bytes
        how = (f"{ks.env} unset: {frac} x RAM - weights - runtime - activations = {_gb(max(space, 0))}")
    block = ks.block_size
    per_tok = _pool_bytes_per_token(arch, req, catalog)
    block_bytes = block * per_tok
    kv_room = max(space - kv_fixed, 0)
    cap_blocks = kv_room // block_bytes
    cap_tokens = cap_blocks * block
    per_seq = kv_need // req.n_seqs
    seq_blocks = -(-per_seq // block_bytes) if per_seq else 0
    need_blocks = seq_blocks * req.n_seqs
    kv_blocked = need_blocks * block_bytes
    comps = list(fixed) + [Component("kv_cache", kv_blocked,
                                     f"{kv_note}, in {block}-token blocks ({need_blocks:,} blocks of {block_bytes:,} B) "
                                     f"of the pool {how}")]
    if kv_fixed:
        comps.append(Component("recurrent_state", kv_fixed, f"{req.n_seqs} seq(s) of linear-attention state, "
                                                            f"taken from the KV pool"))
    spare = space - kv_blocked - kv_fixed
    if spare > 0:
        comps.append(Component("kv_pool_spare", spare, f"rest of the pool ({how})"))
    info = {"space": {"space": space, "how": how, "env": ks.env, "unit": unit, "cap": cap, "fixed": fixed_bytes,
                      "need_blocks": need_blocks, "cap_blocks": cap_blocks, "cap_tokens": cap_tokens,
                      "block": block, "per_tok": per_tok, "state": kv_fixed, "set": req.kv_space_bytes is not None
                      or ks.default_gib is not None}}
    notes = [f"{eng.id}'s {eng.backend or ''} build keeps its KV cache in a fixed pool: {how}; "
             f"{block}-token blocks of {block_bytes:,} B ({per_tok:,} B per token)"]
    if req.vision and arch.vision is not None:
        notes.append("the vision tower is part of the checkpoint's weights")
    return [GpuFit(0, cap, tuple(comps))], [], notes, info


def _space_verdict(info: dict, req: FitRequest) -> tuple[str, str]:
    """Verdict and binding sentence of a fixed-space pool (``_fit_space``)."""
    sp = info["space"]
    env, unit, block, per_tok = sp["env"], sp["unit"], sp["block"], sp["per_tok"]
    need_bytes_ = sp["need_blocks"] * block * per_tok + sp["state"]
    need_units = -(-need_bytes_ // unit)
    pool_txt = (f"{env}={sp['space'] / unit:g} GiB" if sp["set"] else sp["how"])
    holds = f"{pool_txt} holds {sp['cap_tokens']:,} tokens ({sp['cap_blocks']:,} blocks of {block})"
    if sp["state"]:
        holds += f" beside {_gb(sp['state'])} of recurrent state"
    total = sp["fixed"] + max(sp["space"], 0)
    if sp["space"] <= sp["state"] or (sp["cap_blocks"] <= 0 and sp["need_blocks"]):
        return "does_not_fit", f"RAM: {holds}; ctx x seqs {req.ctx:,} x {req.n_seqs} needs {env}={need_units} GiB"
    if sp["need_blocks"] > sp["cap_blocks"]:
        room = sp["cap"] - sp["fixed"]
        fits_ram = need_units * unit <= room
        return "does_not_fit", (f"RAM: {holds} < ctx x seqs {req.ctx:,} x {req.n_seqs} "
                                f"({sp['need_blocks']:,} blocks); raise it to {env}={need_units} GiB "
                                + ("" if fits_ram else f"(more than the {_gb(max(room, 0))} RAM left beside "
                                                       "the weights and runtime) ")
                                + "or lower the context / sequences")
    if total > sp["cap"]:
        return "does_not_fit", (f"RAM: weights + runtime + activations {_gb(sp['fixed'])} + {pool_txt} = "
                                f"{_gb(total)} > {_gb(sp['cap'])}")
    frac = (sp["cap"] - total) / sp["cap"] if sp["cap"] else 0
    verdict = "tight" if frac < 0.05 else "fits"
    return verdict, (f"RAM: {holds}; ctx x seqs {req.ctx:,} x {req.n_seqs} uses {sp['need_blocks']:,}; "
                     f"{_gb(total)} of {_gb(sp['cap'])} ({frac * 100:.1f}% headroom)")


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------

def _gb(b: float) -> str:
    from .units import gib   # memory in GiB, the one convention (units.py)

    return gib(b, 2)


def engine_defaults(engine: str, catalog: Catalog | None = None) -> tuple[int, bool]:
    """(slots, unified KV) the engine runs with when launched without slot flags (catalog:
    default_slots / default_kv_unified; llama.cpp: 4 slots, unified). Pass them as
    FitRequest(n_seqs=..., kv_unified=...) to size a default launch."""
    e = engine_spec(engine, catalog)
    return e.default_slots, e.default_kv_unified


def kv_head_dims(arch: ModelArch) -> tuple[int, int]:
    """(n_embd_head_k, n_embd_head_v) as llama.cpp sees them (MLA: the cached latent + rope
    key as K, the latent as V: how the GGUF's key_length / value_length are written)."""
    if arch.mla is not None:
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, arch.mla.kv_lora_rank
    return arch.head_dim, arch.head_dim


def kv_refusal(arch: ModelArch, req: FitRequest, catalog: Catalog | None = None) -> str | None:
    """The engine's own refusal when its KV type's block size does not divide the head size
    (catalog: the engine's kv_block_rule and each KV type's block_size), else None."""
    eng = engine_spec(req.engine, catalog)
    rule = eng.kv_block_rule
    if rule is None or not arch.n_kv_layers:
        return None
    kv = kv_dtype_spec(req.engine, req.kv_dtype, catalog)
    if kv.block_size <= 1:
        return None
    dk, dv = kv_head_dims(arch)
    # K and V use the same type here (-ctk = -ctv); K is checked only with flash attention on,
    # a quantized V cache turns flash attention on (or is refused without it)
    for side, dim, applies in (("K", dk, req.flash_attn or not rule.when_flash_attn_only), ("V", dv, True)):
        if applies and dim % kv.block_size:
            return rule.message.format(side=side, side_l=side.lower(), kv=kv.id, block=kv.block_size, dim=dim)
    return None


def check_ctx(arch: ModelArch, ctx: int, rope_scaling: str | None = None) -> None:
    """BadInput when ``ctx`` (tokens per sequence) is beyond the model's maximum positions
    (config.json max_position_embeddings / GGUF context_length) and no RoPE scaling is asked
    for. `fit`, `plan` and `up` call this."""
    if ctx <= 0:
        raise BadInput(f"context {ctx} must be a positive number of tokens.")
    if arch.max_position and ctx > arch.max_position and not rope_scaling:
        raise BadInput(f"context {ctx:,} is beyond {arch.name}'s maximum of {arch.max_position:,} positions "
                       "(max_position_embeddings / GGUF context_length); use at most that, or pass a RoPE-scaling "
                       "option (--rope-scaling yarn) to extend it.")


def fit(arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> Fit:
    """Per-device memory breakdown and a verdict for serving ``arch`` with ``req`` on ``rig``
    (engine facts from ``catalog``, default: the packaged catalog)."""
    if req.ctx <= 0 or req.n_seqs <= 0:
        raise BadInput("Context and number of sequences must be positive.")
    check_ctx(arch, req.ctx, req.rope_scaling)
    eng = engine_spec(req.engine, catalog)
    kv_dtype_spec(req.engine, req.kv_dtype, catalog)  # validates the dtype first
    if eng.memory_model == "llama_buffers":
        gpus, host, notes = _fit_llama(arch, req, rig, catalog)
        if req.rope_scaling and arch.max_position and req.ctx > arch.max_position:
            notes.append(f"ctx {req.ctx:,} is beyond the model's {arch.max_position:,} positions: RoPE scaling "
                         f"{req.rope_scaling} assumed")
        refused = kv_refusal(arch, req, catalog)
        if refused:
            return Fit(req, rig.label, tuple(gpus), tuple(host), "does_not_fit", f"{eng.id} refuses: {refused}",
                       notes=tuple(notes))
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
    if "space" in info:                       # a fixed KV space (catalog kv_cache_space)
        verdict, binding = _space_verdict(info, req)
        return Fit(req, rig.label, tuple(gpus), tuple(host), verdict, binding, notes=tuple(notes))
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
