"""Random-weight GGUF files of an exact architecture and quant that the real llama-server loads.

Random weights give realistic memory and (for dense models) speed, because neither depends
on weight values. The file carries every metadata key llama.cpp requires for the arch, the
tensor names/shapes its loader creates (src/models/<arch>.cpp of llama.cpp build 11434), a
real tokenizer (SmolLM2's gpt2 BPE vocab, padded to the arch's vocab size), and quantized
blocks of the right byte size whose fp16 scales are small and finite.

    write_synthetic_gguf(arch, quant, path) -> Path
    tensor_layout(arch, quant) -> list[TensorSpec]     # what would be written, no I/O
    arch_with_tensors(arch, quant) -> ModelArch        # arch + tensor_bytes/tensor_types in file order
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .arch import LayerKind, ModelArch
from .errors import BadInput
from .synthvocab import default_tokenizer_source, silent_tokens, vocabulary

try:
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError:  # pragma: no cover
    # gguf is a declared dependency; without it the module still imports and says so when used
    gguf = None  # type: ignore[assignment]  # a module name set to None
    T = None  # type: ignore[misc, assignment]  # an enum class name set to None

ALIGN = 32
# catalog/quant id -> ggml type used for the big matrices
_QUANT_ALIASES = {
    "q4_k_m": "Q4_K", "q4_k_s": "Q4_K", "q5_k_m": "Q5_K", "q5_k_s": "Q5_K", "q3_k_m": "Q3_K",
    "q3_k_s": "Q3_K", "q3_k_l": "Q3_K", "q2_k": "Q2_K", "q6_k": "Q6_K", "bf16": "BF16", "f16": "F16",
    "f32": "F32", "fp16": "F16",
}
# where the fp16 scale fields sit inside one block: (offset, count)
_F16_FIELDS = {
    "Q4_0": [(0, 1)], "Q4_1": [(0, 2)], "Q5_0": [(0, 1)], "Q5_1": [(0, 2)], "Q8_0": [(0, 1)],
    "IQ4_NL": [(0, 1)], "IQ4_XS": [(0, 1)], "Q4_K": [(0, 2)], "Q5_K": [(0, 2)],
    "Q6_K": [(208, 1)], "Q3_K": [(108, 1)], "Q2_K": [(80, 2)],
}

GGUF_ARCH = {
    "llama": "llama", "qwen3": "qwen3", "qwen3moe": "qwen3moe", "qwen3_moe": "qwen3moe",
    "gemma3": "gemma3", "gemma3_text": "gemma3", "qwen35": "qwen35", "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35", "qwen35moe": "qwen35moe", "qwen3_5_moe": "qwen35moe", "qwen3_5_moe_text": "qwen35moe",
    "deepseek2": "deepseek2", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]   # GGUF order: ne0, ne1, ...
    type: str                # ggml type name ("Q4_0", "F32", ...)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        blk, size = gguf.GGML_QUANT_SIZES[T[self.type]]
        return self.n_elements // blk * size


def ggml_type_for(quant: str) -> str:
    q = _QUANT_ALIASES.get(quant.lower(), quant.upper())
    if gguf is None or q not in T.__members__:
        raise BadInput(f"Quant {quant!r} cannot be synthesized; use a ggml type such as Q4_0, Q8_0, Q4_K, F16.")
    if q not in ("F32", "F16", "BF16") and q not in _F16_FIELDS:
        raise BadInput(f"Quant {quant!r} cannot be synthesized; supported: F32, F16, BF16, {', '.join(_F16_FIELDS)}.")
    return q


def _matrix_type(qt: str, ne0: int) -> str:
    blk = gguf.GGML_QUANT_SIZES[T[qt]][0]
    if ne0 % blk == 0:
        return qt
    return "Q8_0" if ne0 % 32 == 0 and qt not in ("F32", "F16", "BF16") else "F16"


# the Gated DeltaNet hybrids (Qwen3.5 / 3.6): 3 linear-attention layers to 1 full, post-attention norm, no ffn_norm;
# qwen35moe is qwen35 with routed experts and a gated shared expert (llama.cpp src/models/qwen35moe.cpp)
_HYBRID = ("qwen35", "qwen35moe")


def gguf_arch_name(arch: ModelArch) -> str:
    a = GGUF_ARCH.get(arch.architecture.lower())
    if a is None:
        raise BadInput(f"Cannot synthesize architecture {arch.architecture!r}; "
                       f"supported: {', '.join(sorted(set(GGUF_ARCH.values())))}.")
    return a


def tensor_layout(arch: ModelArch, quant: str) -> list[TensorSpec]:
    """Tensors llama.cpp creates for ``arch`` in the order we write them."""
    qt = ggml_type_for(quant)
    a = gguf_arch_name(arch)
    E, V = arch.hidden_size, arch.vocab_size
    H, KV, hd = arch.n_heads, arch.n_kv_heads, arch.head_dim
    out: list[TensorSpec] = []

    def mat(name: str, ne0: int, ne1: int, *more: int) -> None:
        out.append(TensorSpec(name, (ne0, ne1, *more), _matrix_type(qt, ne0)))

    def vec(name: str, n: int) -> None:
        out.append(TensorSpec(name, (n,), "F32"))

    mat("token_embd.weight", E, V)
    for i, kind in enumerate(arch.layer_kinds):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", E)
        if a in _HYBRID:
            vec(p + "post_attention_norm.weight", E)
            if kind == LayerKind.LINEAR:
                la = arch.linear
                assert la is not None
                vd = la.n_value_heads * la.value_head_dim
                mat(p + "attn_qkv.weight", E, la.conv_dim)
                mat(p + "attn_gate.weight", E, vd)
                out.append(TensorSpec(p + "ssm_conv1d.weight", (la.conv_kernel, la.conv_dim), "F32"))
                vec(p + "ssm_dt.bias", la.n_value_heads)
                vec(p + "ssm_a", la.n_value_heads)
                # F32 like the converter writes them (the measured 27B oracle's CUDA buffer
                # of 13,832.13 MiB only adds up with these two in F32)
                out.append(TensorSpec(p + "ssm_beta.weight", (E, la.n_value_heads), "F32"))
                out.append(TensorSpec(p + "ssm_alpha.weight", (E, la.n_value_heads), "F32"))
                vec(p + "ssm_norm.weight", la.value_head_dim)
                mat(p + "ssm_out.weight", vd, E)
            else:
                mat(p + "attn_q.weight", E, 2 * H * hd)
                mat(p + "attn_k.weight", E, KV * hd)
                mat(p + "attn_v.weight", E, KV * hd)
                mat(p + "attn_output.weight", H * hd, E)
                vec(p + "attn_q_norm.weight", hd)
                vec(p + "attn_k_norm.weight", hd)
        elif a == "deepseek2":
            m = arch.mla
            assert m is not None
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                vec(p + "attn_q_a_norm.weight", m.q_lora_rank)
            vec(p + "attn_kv_a_norm.weight", m.kv_lora_rank)
            if m.q_lora_rank:
                mat(p + "attn_q_a.weight", E, m.q_lora_rank)
                mat(p + "attn_q_b.weight", m.q_lora_rank, H * qk)
            else:
                mat(p + "attn_q.weight", E, H * qk)
            mat(p + "attn_kv_a_mqa.weight", E, m.kv_lora_rank + m.qk_rope_head_dim)
            mat(p + "attn_k_b.weight", m.qk_nope_head_dim, m.kv_lora_rank, H)
            mat(p + "attn_v_b.weight", m.kv_lora_rank, m.v_head_dim, H)
            mat(p + "attn_output.weight", H * m.v_head_dim, E)
        else:
            mat(p + "attn_q.weight", E, H * hd)
            mat(p + "attn_k.weight", E, KV * hd)
            mat(p + "attn_v.weight", E, KV * hd)
            mat(p + "attn_output.weight", H * hd, E)
            if a in ("qwen3", "qwen3moe", "gemma3"):
                vec(p + "attn_q_norm.weight", hd)
                vec(p + "attn_k_norm.weight", hd)
            if a == "gemma3":
                vec(p + "post_attention_norm.weight", E)
        if a not in _HYBRID:
            vec(p + "ffn_norm.weight", E)
        moe = arch.moe
        if moe and i >= moe.first_dense_layers:
            ff = moe.expert_intermediate_size
            out.append(TensorSpec(p + "ffn_gate_inp.weight", (E, moe.n_experts), "F32"))
            mat(p + "ffn_gate_exps.weight", E, ff, moe.n_experts)
            mat(p + "ffn_down_exps.weight", ff, E, moe.n_experts)
            mat(p + "ffn_up_exps.weight", E, ff, moe.n_experts)
            if moe.shared_width and a == "qwen35moe":
                # llama.cpp qwen35moe: a sigmoid gate of the shared expert, one weight per embedding channel
                vec(p + "ffn_gate_inp_shexp.weight", E)
            if moe.shared_width:
                # llama.cpp deepseek2: {n_embd, n_ff_exp * n_expert_shared}; shared_width is
                # already that fused width (never multiply it by n_shared_experts again)
                sff = moe.shared_width
                mat(p + "ffn_gate_shexp.weight", E, sff)
                mat(p + "ffn_down_shexp.weight", sff, E)
                mat(p + "ffn_up_shexp.weight", E, sff)
        else:
            ff = arch.intermediate_size or 4 * E
            mat(p + "ffn_gate.weight", E, ff)
            mat(p + "ffn_down.weight", ff, E)
            mat(p + "ffn_up.weight", E, ff)
        if a == "gemma3":
            vec(p + "post_ffw_norm.weight", E)
    vec("output_norm.weight", E)
    if not arch.tie_embeddings:
        mat("output.weight", E, V)
    return out


def arch_with_tensors(arch: ModelArch, quant: str) -> ModelArch:
    """``arch`` with tensor_bytes / tensor_types filled (file order) as write_synthetic_gguf writes them."""
    lay = tensor_layout(arch, quant)
    return replace(arch, tensor_bytes={t.name: t.nbytes for t in lay},
                   tensor_types={t.name: t.type for t in lay}, tensor_shapes={t.name: t.shape for t in lay},
                   file_type=ggml_type_for(quant))


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------

# Every quantized block's f16 scale d, per type: random quant bytes under these scales dequantize to
# weights of standard deviation ~0.02, a real model's size, and mean ~0 (measured with
# gguf.quants.dequantize on random blocks; tests/test_synth.py holds both). Types with a second f16
# field (a min: Q4_1, Q5_1; dmin: Q4_K, Q5_K, Q2_K) get it as ``MIN_OF_D`` x d, which centres each
# sub-block (what a real quantizer's min does), and every block's fields take a random sign, so no
# type leans one way. Why it matters: with the min equal to d (the writer until 2026-12-03) Q4_K
# weights had a mean of 0.93 standard deviations, so every row of a 5,120-wide matrix summed an
# all-positive input to ~95 where a real model's gives ~1, and every logit came back NaN on the H200
# (the CPU answered; which CUDA kernel overflowed was not located, f16 intermediates are the suspects);
# written this way the same cut answers finite log-probabilities there (benchmarks/gpu_edge.md, fifth
# visit). Speed does not depend on the values.
BLOCK_SCALES = {"Q4_0": 4.3e-3, "Q4_1": 4.3e-3, "Q5_0": 2.2e-3, "Q5_1": 2.2e-3, "Q8_0": 2.7e-4,
                "IQ4_NL": 3.0e-4, "IQ4_XS": 1.6e-5, "Q4_K": 7.75e-5, "Q5_K": 3.8e-5, "Q6_K": 1.46e-5,
                "Q3_K": 4.6e-4, "Q2_K": 1.44e-3}
# the second f16 field as a multiple of d: minus the mean quant (Q4_1, Q5_1: w = d q + m), or the
# mean quant level (Q4_K, Q5_K, Q2_K: w = d sc q - dmin m, with sc and m of one range)
MIN_OF_D = {"Q4_1": -7.5, "Q5_1": -15.5, "Q4_K": 7.5, "Q5_K": 15.5, "Q2_K": 1.5}


def _tensor_data(spec: TensorSpec, rng: np.random.Generator, block_scale: float | None = None) -> np.ndarray:
    """Numpy array in the layout GGUFWriter expects (rows x bytes for quantized types)."""
    np_shape = tuple(reversed(spec.shape))
    if spec.type == "F32":
        if spec.name.endswith("norm.weight"):
            return np.ones(np_shape, dtype=np.float32)
        if spec.name.endswith("ssm_a"):
            return -np.ones(np_shape, dtype=np.float32)
        return (rng.standard_normal(np_shape, dtype=np.float32) * 0.02).astype(np.float32)
    if spec.type == "F16":
        return (rng.standard_normal(np_shape, dtype=np.float32) * 0.02).astype(np.float16)
    blk, size = gguf.GGML_QUANT_SIZES[T[spec.type]]
    n_blocks = spec.n_elements // blk
    # a pool of random blocks tiled over the tensor (fast for big tensors; values do not matter)
    pool_n = min(n_blocks, 4096)
    pool = rng.integers(0, 256, size=(pool_n, size), dtype=np.uint8)
    if spec.type == "BF16":
        f32 = (rng.standard_normal(pool_n, dtype=np.float32) * 0.02).view(np.uint32)
        pool = f32.__rshift__(16).astype(np.uint16).view(np.uint8).reshape(pool_n, 2)
    else:
        fields = [(off + 2 * j) for off, cnt in _F16_FIELDS[spec.type] for j in range(cnt)]
        if block_scale is not None:      # the writer before 2026-12-03: one value in every field
            values = np.full((pool_n, len(fields)), block_scale, dtype=np.float32)
        else:
            d = BLOCK_SCALES[spec.type]
            per_field = [d] if len(fields) == 1 else [d, d * MIN_OF_D[spec.type]]
            sign = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(pool_n, 1))
            values = sign * np.array(per_field, dtype=np.float32)
        raw = values.astype(np.float16).view(np.uint8).reshape(pool_n, len(fields), 2)
        for i, at in enumerate(fields):
            pool[:, at: at + 2] = raw[:, i]
    data = np.resize(pool, (n_blocks, size))
    row_bytes = spec.shape[0] // blk * size
    return data.reshape(*np_shape[:-1], row_bytes)


def _file_type(qt: str) -> int:
    ft = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
          "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32}
    return ft.get(qt, 7)


RANDOM_WEIGHTS_KEY = "engineroom.random_weights"   # in every file written here: its weights mean nothing
# whether the output head is the embedding matrix: a GGUF says so by having no output.weight, which a file of the
# metadata alone cannot (it has no tensors), so every file says it here (read by ``engines.hffolder``)
TIED_KEY = "engineroom.tie_word_embeddings"
# a file of the metadata alone made from a Hugging Face config.json carries that config whole, so the folder an engine
# makes random weights from is the model's own (its architecture class, a vision tower's config) and not transformers'
# reading of a GGUF (vLLM 0.26 has no text-only Qwen3.5 class: the GGUF's Qwen3_5ForCausalLM failed on the H200)
HF_CONFIG_KEY = "engineroom.hf_config"


def write_synthetic_gguf(arch: ModelArch, quant: str, path: str | os.PathLike, *, seed: int = 0,
                         tokenizer_gguf: Path | None = None, block_scale: float | None = None,
                         tensors: bool = True, hf_config: dict | None = None) -> Path:
    """Write a random-weight GGUF of ``arch`` at ``quant`` to ``path`` and return the path
    (``block_scale``: one f16 scale for every quantized block instead of BLOCK_SCALES'). Every such file
    says so (``RANDOM_WEIGHTS_KEY``). ``tensors`` False: the metadata alone (the shape and the tokenizer),
    for an engine that initialises random weights itself (vLLM's dummy loading); ``hf_config``: the config.json
    the shape came from, kept in the file (HF_CONFIG_KEY)."""
    if gguf is None:
        raise BadInput("The gguf package is needed to write GGUF files (pip install gguf).")
    a = gguf_arch_name(arch)
    qt = ggml_type_for(quant)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(f"synthetic {arch.name}")
    w.add_type("model")
    w.add_file_type(_file_type(qt))
    w.add_quantization_version(2)
    w.add_bool(RANDOM_WEIGHTS_KEY, True)
    w.add_bool(TIED_KEY, bool(arch.tie_embeddings))
    if hf_config is not None:
        w.add_string(HF_CONFIG_KEY, json.dumps(hf_config))
    w.add_context_length(arch.max_position or 131072)
    w.add_embedding_length(arch.hidden_size)
    w.add_block_count(arch.n_layers)
    w.add_head_count(arch.n_heads)
    if a != "deepseek2":
        w.add_head_count_kv(arch.n_kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_vocab_size(arch.vocab_size)
    if arch.intermediate_size:
        w.add_feed_forward_length(arch.intermediate_size)
    if a != "deepseek2":
        w.add_key_length(arch.head_dim)
        w.add_value_length(arch.head_dim)
        w.add_rope_dimension_count(arch.rope_dim or arch.head_dim)
    if arch.moe:
        w.add_expert_count(arch.moe.n_experts)
        w.add_expert_used_count(arch.moe.n_experts_active)
        w.add_expert_feed_forward_length(arch.moe.expert_intermediate_size)
        if a == "qwen3moe" and not arch.intermediate_size:
            w.add_feed_forward_length(arch.moe.expert_intermediate_size * arch.moe.n_experts_active)
    if a == "gemma3":
        w.add_sliding_window(arch.sliding_window or 512)
        pattern = [k == LayerKind.SLIDING for k in arch.layer_kinds]
        w.add_array(f"{a}.attention.sliding_window_pattern", pattern)
    if a == "qwen35moe" and arch.moe is not None and arch.moe.shared_width:
        w.add_expert_shared_feed_forward_length(arch.moe.shared_width)
    if a in _HYBRID:
        la = arch.linear
        assert la is not None
        w.add_ssm_conv_kernel(la.conv_kernel)
        w.add_ssm_state_size(la.key_head_dim)
        w.add_ssm_group_count(la.n_key_heads)
        w.add_ssm_time_step_rank(la.n_value_heads)
        w.add_ssm_inner_size(la.n_value_heads * la.value_head_dim)
        kinds = arch.layer_kinds
        interval = next((i + 1 for i, k in enumerate(kinds) if k == LayerKind.FULL), 4)
        w.add_full_attention_interval(interval)
        rd = arch.rope_dim or arch.head_dim // 4
        half = rd // 2
        w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
    if a == "deepseek2":
        m = arch.mla
        assert m is not None and arch.moe is not None
        # llama.cpp reads attention.q_lora_rank for every deepseek2 model that is not one of
        # the Lite layer counts (src/models/deepseek2.cpp: is_lite = n_layer 26/27/48); 0 means
        # no Q compression (it then creates attn_q instead of attn_q_a/attn_q_b)
        w.add_q_lora_rank(m.q_lora_rank or 0)
        w.add_kv_lora_rank(m.kv_lora_rank)
        # MLA as llama.cpp sees it after the split of wkv_b: 1 KV head of kv_lora_rank + rope
        w.add_head_count_kv(1)
        w.add_key_length(m.kv_lora_rank + m.qk_rope_head_dim)
        w.add_value_length(m.kv_lora_rank)
        w.add_key_length_mla(m.qk_nope_head_dim + m.qk_rope_head_dim)
        w.add_value_length_mla(m.v_head_dim)
        w.add_rope_dimension_count(m.qk_rope_head_dim)
        w.add_leading_dense_block_count(arch.moe.first_dense_layers)
        w.add_expert_shared_count(arch.moe.n_shared_experts)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    tok = vocabulary(arch.vocab_size, tokenizer_gguf or default_tokenizer_source())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    if tok["merges"]:
        w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["ids"]["bos"])
    w.add_eos_token_id(tok["ids"]["eos"])
    w.add_unk_token_id(tok["ids"]["unknown"])
    w.add_pad_token_id(tok["ids"]["padding"])
    w.add_add_bos_token(False)
    if tok["template"]:
        w.add_chat_template(tok["template"])
    # the output projection (token_embd where it is tied) gets zero rows for the tokens that print nothing:
    # their logits are 0 where a random row's reach several standard deviations, so greedy decoding of
    # random weights never picks one, and every stream carries text
    projection = "token_embd.weight" if arch.tie_embeddings else "output.weight"
    silent = silent_tokens(tok)
    for spec in tensor_layout(arch, quant) if tensors else ():
        data = _tensor_data(spec, rng, block_scale)
        if spec.name == projection and silent:
            data[np.asarray(silent)] = 0
        w.add_tensor(spec.name, data, raw_dtype=T[spec.type] if spec.type not in ("F32", "F16") else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_random_projector(path: str | os.PathLike, text_embd: int, *, seed: int = 0, image_size: int = 32,
                           patch_size: int = 16, embd: int = 64, n_layer: int = 2) -> Path:
    """A random-weight LLaVA-style vision projector (``mmproj``: a small ViT and a two-layer MLP onto a
    text model of ``text_embd`` wide embeddings) that llama-server loads with ``--mmproj``: the keys
    and tensor names of llama.cpp 11434's tools/mtmd/clip.cpp for projector type "mlp". Random weights
    serve the vision path (an image becomes embeddings the text model reads); what the model says of
    the image means nothing."""
    if gguf is None:  # pragma: no cover
        raise BadInput("writing a projector needs the gguf package (`pip install gguf`).")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    for key, value in (("clip.has_vision_encoder", True), ("clip.use_gelu", True)):
        w.add_bool(key, value)
    w.add_string("clip.projector_type", "mlp")
    for key, number in (("image_size", image_size), ("patch_size", patch_size), ("embedding_length", embd),
                        ("feed_forward_length", 2 * embd), ("projection_dim", text_embd),
                        ("block_count", n_layer), ("attention.head_count", 4)):
        w.add_uint32(f"clip.vision.{key}", number)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def add(name: str, *shape: int) -> None:     # numpy order: a linear weight is (out, in)
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    n_pos = (image_size // patch_size) ** 2 + 1
    add("v.patch_embd.weight", embd, 3, patch_size, patch_size)
    add("v.class_embd", embd)
    add("v.position_embd.weight", n_pos, embd)
    for il in range(n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(f"v.blk.{il}.{part}.weight", embd, embd)
            add(f"v.blk.{il}.{part}.bias", embd)
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"v.blk.{il}.{norm}.weight", np.ones(embd, dtype=np.float32))
            w.add_tensor(f"v.blk.{il}.{norm}.bias", np.zeros(embd, dtype=np.float32))
        add(f"v.blk.{il}.ffn_up.weight", 2 * embd, embd)
        add(f"v.blk.{il}.ffn_up.bias", 2 * embd)
        add(f"v.blk.{il}.ffn_down.weight", embd, 2 * embd)
        add(f"v.blk.{il}.ffn_down.bias", embd)
    add("mm.0.weight", text_embd, embd)
    add("mm.0.bias", text_embd)
    add("mm.2.weight", text_embd, text_embd)
    add("mm.2.bias", text_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
