"""arch_from_config against real published config.json files (see fixtures/configs/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engineroom.arch import LayerKind, ModelArch, arch_from_config, fetch_hf_config, load_arch
from engineroom.errors import BadInput, EngineroomError

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def cfg(name: str) -> ModelArch:
    return arch_from_config(CONFIGS / name)


def test_every_fixture_has_provenance():
    sources = (CONFIGS / "SOURCES.md").read_text()
    fixtures = sorted(p.name for p in CONFIGS.glob("*.json"))
    assert len(fixtures) >= 8
    for name in fixtures:
        assert f"`{name}`" in sources, f"{name} has no provenance row"


def test_qwen36_27b_hybrid_layout():
    a = cfg("qwen3.6-27b.json")
    assert a.n_layers == 64
    assert a.count(LayerKind.LINEAR) == 48 and a.count(LayerKind.FULL) == 16
    assert a.layer_indices(LayerKind.FULL) == tuple(range(3, 64, 4))
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.rope_dim) == (24, 4, 256, 64)
    assert a.linear is not None
    assert (a.linear.n_key_heads, a.linear.n_value_heads, a.linear.key_head_dim,
            a.linear.value_head_dim, a.linear.conv_kernel) == (16, 48, 128, 128, 4)
    assert a.linear.conv_dim == 10240   # spec: attn_qkv [5120 x 10240]
    assert a.vocab_size == 248320 and not a.tie_embeddings
    assert a.intermediate_size == 17408 and a.moe is None
    assert a.mtp_layers == 1 and a.max_position == 262144
    assert a.n_kv_layers == 16 and a.is_hybrid
    assert a.vision is not None and (a.vision.depth, a.vision.hidden_size, a.vision.n_heads,
                                     a.vision.patch_size) == (27, 1152, 16, 16)
    # spec: ~55.6 GB of bf16 weights for the whole checkpoint (trunk + MTP + vision)
    assert a.total_param_count * 2 == pytest.approx(55.6e9, rel=0.01)
    assert a.param_count == pytest.approx(26.9e9, rel=0.01)
    assert a.torch_dtype == "bf16" and a.source == "config.json"


def test_qwen35_35b_a3b_moe_hybrid():
    a = cfg("qwen3.5-35b-a3b.json")
    assert a.architecture == "qwen3_5_moe_text"
    assert a.n_layers == 40 and a.count(LayerKind.FULL) == 10 and a.count(LayerKind.LINEAR) == 30
    assert (a.n_heads, a.n_kv_heads, a.head_dim) == (16, 2, 256)
    assert a.linear is not None and (a.linear.n_key_heads, a.linear.n_value_heads) == (16, 32)
    assert a.moe is not None
    assert (a.moe.n_experts, a.moe.n_experts_active, a.moe.expert_intermediate_size) == (256, 8, 512)
    assert (a.moe.n_shared_experts, a.moe.shared_intermediate_size) == (1, 512)
    # Hub: 35.95B parameters incl. vision tower and MTP (SOURCES.md)
    assert a.total_param_count == pytest.approx(35.95e9, rel=0.003)


def test_gemma3_sliding_window_pattern_and_vision():
    a = cfg("gemma-3-4b-it.json")
    assert a.n_layers == 34
    assert a.layer_indices(LayerKind.FULL) == (5, 11, 17, 23, 29)   # every 6th layer global
    assert a.count(LayerKind.SLIDING) == 29 and a.sliding_window == 1024
    assert (a.n_heads, a.n_kv_heads, a.head_dim) == (8, 4, 256)
    assert a.tie_embeddings and any(e.startswith("tie_embeddings") for e in a.estimated)
    assert a.vision is not None and a.vision.depth == 27 and a.vision.patch_size == 14
    # HF model page: 4.3B parameters incl. the SigLIP tower
    assert a.total_param_count == pytest.approx(4.3e9, rel=0.01)


def test_llama31_8b_dense():
    a = cfg("llama-3.1-8b.json")
    assert a.layer_kinds == (LayerKind.FULL,) * 32
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) == (32, 8, 128, 128256)
    assert a.max_position == 131072 and a.sliding_window is None
    # HF model page: 8.03B; the exact safetensors count is 8,030,261,248
    assert a.param_count == 8_030_261_248
    assert a.estimated == ()


def test_mixtral_moe():
    a = cfg("mixtral-8x7b.json")
    assert a.moe is not None and (a.moe.n_experts, a.moe.n_experts_active) == (8, 2)
    assert a.moe.expert_intermediate_size == 14336
    assert a.layer_kinds == (LayerKind.FULL,) * 32   # sliding_window is null in the v0.1 config
    # Mistral AI announcement: 46.7B total parameters
    assert a.param_count == pytest.approx(46.7e9, rel=0.001)


def test_deepseek_v3_mla_moe_mtp():
    a = cfg("deepseek-v3.json")
    assert a.layer_kinds == (LayerKind.MLA,) * 61 and a.n_kv_layers == 61
    assert a.mla is not None
    assert (a.mla.kv_lora_rank, a.mla.qk_rope_head_dim, a.mla.qk_nope_head_dim,
            a.mla.v_head_dim, a.mla.q_lora_rank) == (512, 64, 128, 128, 1536)
    assert a.moe is not None and a.moe.first_dense_layers == 3 and a.moe.n_experts == 256
    assert a.moe.n_shared_experts == 1 and a.mtp_layers == 1
    # DeepSeek README_WEIGHTS: 671B main model; MTP 11.5B unique (+0.9B embedding +0.9B head
    # stored again in the MTP module) -> the Hub's 685B
    assert a.param_count == pytest.approx(671e9, rel=0.002)
    assert a.mtp_param_count == pytest.approx(11.5e9, rel=0.02)
    shared = 2 * a.vocab_size * a.hidden_size
    assert a.param_count + a.mtp_param_count + shared == pytest.approx(685e9, rel=0.002)


def test_jamba_mamba_hybrid():
    a = cfg("jamba-1.5-mini.json")
    assert a.layer_indices(LayerKind.FULL) == (4, 12, 20, 28)
    assert a.count(LayerKind.MAMBA) == 28
    assert a.mamba is not None and (a.mamba.d_inner, a.mamba.d_state, a.mamba.d_conv) == (8192, 16, 4)
    assert a.moe is not None and a.moe.n_moe_layers == 16 and a.moe.n_experts == 16
    # AI21: Jamba 1.5 Mini has 52B total parameters
    assert a.param_count == pytest.approx(52e9, rel=0.01)


def test_smollm2_135m_tied():
    a = cfg("smollm2-135m.json")
    assert (a.n_layers, a.hidden_size, a.n_heads, a.n_kv_heads, a.head_dim) == (30, 576, 9, 3, 64)
    assert a.tie_embeddings
    assert a.param_count == 134_515_008   # exact safetensors count (SOURCES.md)


def test_mistral_sliding_and_qwen2_opt_out():
    base = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    mistral = {**base, "model_type": "mistral", "sliding_window": 4096}
    assert arch_from_config(mistral).layer_kinds == (LayerKind.SLIDING,) * 32
    qwen2 = {**base, "model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}
    assert arch_from_config(qwen2).layer_kinds == (LayerKind.FULL,) * 32


def test_nemotron_h_pattern_counts_mixers_only():
    pattern = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
    a = arch_from_config({
        "model_type": "nemotron_h", "num_hidden_layers": len(pattern), "hidden_size": 4480,
        "intermediate_size": 15680, "num_attention_heads": 40, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 131072, "hybrid_override_pattern": pattern,
        "ssm_state_size": 128, "conv_kernel": 4, "mamba_num_groups": 8, "mamba_num_heads": 128,
        "mamba_head_dim": 80, "tie_word_embeddings": False,
    })
    assert a.count(LayerKind.FULL) == 4 and a.count(LayerKind.MAMBA) == 27
    assert a.mamba is not None and a.mamba.n_heads == 128 and a.mamba.d_inner == 10240
    assert any("feed-forward-only" in e for e in a.estimated)


def test_unknown_architecture_uses_standard_fields_and_says_what_it_guessed():
    a = arch_from_config({"model_type": "mystery", "num_hidden_layers": 4, "hidden_size": 256,
                          "num_attention_heads": 4})
    assert a.layer_kinds == (LayerKind.FULL,) * 4 and a.head_dim == 64
    fields = {e.split(":")[0] for e in a.estimated}
    assert {"vocab_size", "n_kv_heads", "tie_embeddings"} <= fields


def test_missing_basics_is_bad_input_naming_them():
    with pytest.raises(BadInput) as err:
        arch_from_config({"model_type": "mystery", "hidden_size": 256})
    msg = str(err.value)
    assert "num_hidden_layers" in msg and "num_attention_heads" in msg and "hidden_size" not in msg
    assert msg.count(". ") == 0 and msg.endswith(".")


@pytest.mark.parametrize("text", ['{"num_hidden_layers": 2,', "[1, 2]", "", "\x00\x01"])
def test_malformed_config_is_one_sentence(tmp_path, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(BadInput) as err:
        arch_from_config(p)
    msg = str(err.value)
    assert str(p) in msg and msg.endswith(".") and "\n" not in msg


def test_directory_and_missing_file(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "smollm2-135m.json").read_text())
    assert arch_from_config(tmp_path).n_layers == 30
    assert load_arch(str(tmp_path)).name == tmp_path.name
    with pytest.raises(BadInput, match="does not exist"):
        arch_from_config(tmp_path / "nope.json")


def test_load_arch_dispatch(tmp_path):
    assert load_arch(str(CONFIGS / "llama-3.1-8b.json")).param_count == 8_030_261_248
    for bad in ("", "not a ref at all", "https://example.com/model.bin", "hf:org/repo"):
        with pytest.raises(BadInput):
            load_arch(bad)
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"\x00" * 16)
    with pytest.raises(BadInput, match="neither a config.json nor a GGUF"):
        load_arch(str(odd))


def test_fetch_hf_config_offline_is_one_sentence(monkeypatch, tmp_path):
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"), raising=False)
    with pytest.raises(EngineroomError) as err:
        fetch_hf_config("Qwen/Qwen3.6-27B")
    msg = str(err.value)
    assert "Qwen/Qwen3.6-27B" in msg and "\n" not in msg and msg.endswith(".")
    assert ". " not in msg   # one sentence
    with pytest.raises(EngineroomError):
        load_arch("Qwen/Qwen3.6-27B")


def test_hf_file_reference_shares_the_model_grammar_and_reads_a_pulled_copy(tmp_path, monkeypatch):
    """``hf:ORG/REPO/FILE.gguf[@REV]`` means the same to `plan` as to `models pull`; a file
    pulled before is read from the cache, with no network."""
    from dataclasses import replace as dc_replace

    from engineroom import refs
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    monkeypatch.setenv("ENGINEROOM_TOKENIZER_GGUF", str(tmp_path / "absent.gguf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")      # any network use would fail
    cached = refs.hf_cache_path("some-org/some-repo", "tiny-Q4_K_M.gguf", None)   # where `models pull` puts @main
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_synthetic_gguf(dc_replace(SHAPES["dense-m"], vocab_size=4096), "Q4_K_M", cached)
    for ref in ("hf:some-org/some-repo/tiny-Q4_K_M.gguf", "hf:some-org/some-repo/tiny-Q4_K_M.gguf@main"):
        arch = load_arch(ref)
        assert arch.source == "gguf" and arch.name == "some-org/some-repo/tiny-Q4_K_M.gguf"
        assert arch.weight_bytes_exact == load_arch(str(cached)).weight_bytes_exact > 0
    with pytest.raises(BadInput, match="hf:ORG/REPO/FILE.gguf"):
        load_arch("hf:some-org/some-repo/config.json")


@pytest.mark.parametrize("stage, forbidden", [
    ("arch", {"models", "catalog", "fit", "plan"}),
    ("catalog", {"models", "fit", "plan"}),
    ("fit", {"plan", "models"}),
])
def test_the_pipeline_imports_one_way(stage, forbidden):
    """arch <- catalog <- fit <- plan: no module-level import goes back up the pipeline (a
    function may import lazily, as arch/load.py does)."""
    import ast

    import engineroom

    root = Path(engineroom.__file__).parent
    back = []
    for p in sorted((root / stage).glob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                names = [node.module] if node.module else [a.name for a in node.names]
                back += [f"{p.name}: ..{n}" for n in names if n.split(".")[0] in forbidden]
    assert back == []
