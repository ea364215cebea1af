"""The CPU backend's weight buffers: which weights llama.cpp repacks (CPU_REPACK) or packs for
AMX beside the mmapped file, by the instructions that really execute on the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..arch import ModelArch
from ..hardware import Rig
from .llama_cache import round_up
from .request import FitRequest

if TYPE_CHECKING:
    from ..cpuprobe import CpuProbe

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
        probe_cpu: Callable[[], CpuProbe] | None
        try:
            from ..cpuprobe import probe_cpu
        except ImportError:
            probe_cpu = None
        if probe_cpu is not None:
            try:
                return frozenset(probe_cpu().usable), "this machine's CPU probe (instructions that execute)"
            except Exception as exc:  # noqa: BLE001 - a probe failure must not break fit
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
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # gguf loads numpy: only for a GGUF's tensors

    blk, size = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
    kb = shape[0] // blk
    return shape[1] * (kb * size + kb * AMX_ROW_EXTRA.get(t, 0))


# With tied embeddings the output head is token_embd loaded a second time (llama-model.cpp:
# TENSOR_DUPLICATED) as a MUL_MAT weight: the input copy stays a row lookup in the mapping,
# the head gets its own buffer. Found by `engineroom up` on a tied Q4_0 model, whose launch
# record showed CPU_REPACK 3.80 MiB measured against 0.42 MiB predicted.
TIED_OUTPUT = "output.weight (token_embd, tied)"


def tensor_nbytes(arch: ModelArch, name: str) -> int:
    """Bytes of a weight, the tied output head being token_embd's."""
    return arch.tensor_bytes["token_embd.weight" if name == TIED_OUTPUT else name]


def _tied_head(arch: ModelArch) -> bool:
    return "token_embd.weight" in arch.tensor_types and "output.weight" not in arch.tensor_types


def cpu_weight_buffers(arch: ModelArch, features: frozenset[str] = ASSUMED_CPU_FEATURES,
                       repack: bool = True) -> dict[str, str]:
    """Buffer type of every weight on the CPU backend: "AMX", "CPU_REPACK" or "CPU_Mapped";
    a tied output head appears as ``TIED_OUTPUT`` when it gets a buffer of its own."""
    out: dict[str, str] = {}
    amx = repack and all(f in features for f in AMX_FLAGS)
    avx512 = "avx512f" in features or "avx512" in features
    items = list(arch.tensor_types.items())
    if _tied_head(arch):
        items.append((TIED_OUTPUT, arch.tensor_types["token_embd.weight"]))
    for name, t in items:
        t = t.upper()
        shape = arch.tensor_shapes.get("token_embd.weight" if name == TIED_OUTPUT else name)
        op = "MUL_MAT" if name == TIED_OUTPUT and (shape is None or len(shape) == 2) else _weight_op(name, shape)
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
                stacked = op == "MUL_MAT_ID" or ".attn_k_b." in name or ".attn_v_b." in name
                nd = len(shape) if shape else (3 if stacked else 2)
                if (op == "MUL_MAT" and nd == 2) or (op == "MUL_MAT_ID" and nd == 3):
                    buf = "CPU_REPACK"
        if name != TIED_OUTPUT or buf != "CPU_Mapped":
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
    off = last = 0
    first: int | None = None
    for name, b in arch.tensor_bytes.items():
        if name not in repacked:
            first = off if first is None else first
            last = off + b
        off = round_up(off + b, alignment)
    return 0 if first is None else last - first
