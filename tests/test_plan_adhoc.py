"""Planning and fitting a model that is not in the catalog: from a config.json (sizes are
estimates), a GGUF (its exact header bytes) or an org/repo on Hugging Face (offline here)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from engineroom.catalog import load_catalog
from engineroom.errors import BadInput
from engineroom.fit import bits_per_weight
from engineroom.hardware import parse_rig
from engineroom.plan import class_quality, fit_one, how_to_choose, plan, resolve_model

from conftest import cli, run_cli

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
LLAMA = str(CONFIGS / "llama-3.1-8b.json")
LLAMA_PARAMS = 8_030_261_248      # counted from the config's shapes (test_arch)
ONE = "1x3090"
LLAMA_ENGINES = ("llama.cpp", "ik_llama.cpp")


@pytest.fixture(scope="module")
def synth_gguf(tmp_path_factory) -> Path:
    """A random-weight Q4_K_M GGUF of a small real-shaped dense model (byte-level vocab)."""
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGINEROOM_TOKENIZER_GGUF", str(tmp_path_factory.mktemp("none") / "absent.gguf"))
        return write_synthetic_gguf(replace(SHAPES["dense-m"], vocab_size=4096), "Q4_K_M",
                                    tmp_path_factory.mktemp("gguf") / "dense-m-Q4_K_M.gguf")


def header_bytes(path: Path) -> int:
    """Tensor bytes as the gguf package itself reads them (independent of arch.py)."""
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


# ---- config.json -------------------------------------------------------------------


def test_config_json_plans_with_estimated_quants():
    subject = resolve_model(LLAMA)
    assert not subject.in_catalog and subject.source == f"config.json at {LLAMA}"
    quants = {q.id: q for q in subject.model.quants}
    assert list(quants) == ["bf16", "Q8_0", "Q4_K_M", "fp8", "awq-int4", "gptq-int4", "autoround-int4"]
    assert quants["Q4_K_M"].weight_bytes == pytest.approx(LLAMA_PARAMS * 4.85 / 8, rel=0.005)
    assert quants["bf16"].weight_bytes == pytest.approx(LLAMA_PARAMS * 2, rel=0.005)
    for q in quants.values():
        assert q.size_source.startswith("estimate:") and "no such file checked" in q.size_source
        assert q.size_bytes is None and q.hf_repo is None      # a local file: no repo to name
        assert "no KLD known" in q.quality.source
    assert set(quants["Q4_K_M"].engines) == set(quants["Q8_0"].engines) == set(LLAMA_ENGINES)
    assert {frozenset(quants[q].engines) for q in ("bf16", "fp8", "awq-int4", "gptq-int4", "autoround-int4")} \
        == {frozenset({"vllm", "sglang"})}
    assert {q: quants[q].quality.tier for q in quants} == {"bf16": 6, "Q8_0": 5, "Q4_K_M": 4, "fp8": 5, "awq-int4": 4,
                                                           "gptq-int4": 4, "autoround-int4": 4}
    assert quants["gptq-int4"].weight_bytes == pytest.approx(LLAMA_PARAMS * 4.85 / 8, rel=0.005)
    assert subject.model.features == ()                        # nothing the config does not prove
    assert any("no such file was checked" in e for e in subject.estimates)

    plans = plan(LLAMA, parse_rig(ONE), "balanced", limit=5)
    assert plans and all(p.model == LLAMA for p in plans)
    assert all(any(t.startswith("not in the catalog") and "estimate" in t for t in p.tradeoffs) for p in plans)
    assert {p.quant for p in plans} <= set(quants)


def test_config_json_how_to_choose_says_why_tools_are_missing():
    rows = {r.priority: r for r in how_to_choose(LLAMA, parse_rig(ONE))}
    assert rows["balanced"].plan is not None
    assert rows["full-features"].plan is None and "not in the catalog" in rows["full-features"].why_none


def test_fp8_config_publishes_fp8_and_vision_is_a_feature():
    ds = resolve_model(str(CONFIGS / "deepseek-v3.json"))
    assert ds.arch.torch_dtype == "fp8"                         # quantization_config.quant_method
    ids = [q.id for q in ds.model.quants]
    assert ids[0] == "fp8" and "bf16" not in ids and ids.count("fp8") == 1
    gemma = resolve_model(str(CONFIGS / "gemma-3-4b-it.json"))
    assert gemma.model.features == ("vision",)
    # what the config reader guessed is labelled as such
    assert any(e.startswith("architecture: tie_embeddings: not stated") for e in gemma.estimates)


@pytest.mark.parametrize("method, qid, fmt", [("awq", "awq-int4", "awq"), ("gptq", "gptq-int4", "gptq"),
                                               ("auto-round", "autoround-int4", "autoround")])
def test_int4_checkpoint_config_publishes_its_quant(tmp_path: Path, method, qid, fmt):
    cfg = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    subject = resolve_model(str(path))
    published = subject.model.quants[0]
    assert (published.id, published.format) == (qid, fmt)
    assert published.weight_bytes == pytest.approx(LLAMA_PARAMS * bits_per_weight()[qid] / 8, rel=0.005)
    assert "bf16" not in [q.id for q in subject.model.quants]     # the checkpoint is not 16-bit
    # 8-bit GPTQ is not read: sized at torch_dtype, and said so
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 8}
    path.write_text(json.dumps(cfg))
    eight = resolve_model(str(path))
    assert eight.model.quants[0].id == "bf16"
    assert any("quantized with gptq" in e and "overstate" in e for e in eight.estimates)


def test_vision_tower_is_in_safetensors_sizes_not_in_gguf_ones():
    gemma = resolve_model(str(CONFIGS / "gemma-3-4b-it.json"))
    arch = gemma.arch
    vision = arch.vision.param_count
    assert vision and vision > 100e6
    q = {x.id: x for x in gemma.model.quants}
    assert q["bf16"].weight_bytes == pytest.approx(arch.total_param_count * 2, rel=0.005)
    assert q["Q4_K_M"].weight_bytes == pytest.approx((arch.total_param_count - vision) * 4.85 / 8, rel=0.005)


def test_moe_decode_reads_the_active_experts_only():
    mixtral = resolve_model(str(CONFIGS / "mixtral-8x7b.json"))
    assert mixtral.model.architecture.active_param_count == pytest.approx(12.9e9, rel=0.01)   # "12.9B active"
    assert any(e.startswith("decode speed:") for e in mixtral.estimates)
    assert resolve_model(LLAMA).model.architecture.active_param_count is None


def test_gguf_without_tensors_is_one_sentence(tmp_path: Path):
    import gguf  # a declared dependency

    path = tmp_path / "vocab-only.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(BadInput, match="holds no weight tensors"):
        resolve_model(str(path))


@pytest.mark.parametrize("qid,tier", [
    ("bf16", 6), ("F16", 6), ("f32", 6), ("Q8_0", 5), ("fp8", 5), ("Q6_K", 5), ("Q5_K_M", 5),
    ("Q4_K_M", 4), ("Q4_0", 4), ("IQ4_XS", 4), ("awq-int4", 4), ("gptq-int4", 4), ("nvfp4", 4),
    ("MXFP4_MOE", 4), ("Q3_K_M", 3), ("UD-Q3_K_XL", 3), ("IQ3_XXS", 3), ("Q2_K", 2), ("IQ2_XXS", 2),
    ("IQ1_S", 2), ("TQ1_0", 2),
])
def test_class_tiers(qid, tier):
    assert class_quality(qid).tier == tier


def test_class_tiers_agree_with_the_catalog():
    assert class_quality("mystery") is None
    for m in load_catalog().models:
        for q in m.quants:
            assert class_quality(q.id).tier == q.quality.tier, (m.id, q.id)


# ---- GGUF --------------------------------------------------------------------------


def test_gguf_is_one_quant_at_its_exact_bytes(synth_gguf: Path):
    subject = resolve_model(str(synth_gguf))
    assert subject.source == f"GGUF header of {synth_gguf}"
    (q,) = subject.model.quants
    exact = header_bytes(synth_gguf)
    assert q.id == "Q4_K_M" and q.format == "gguf" and set(q.engines) == set(LLAMA_ENGINES)
    assert q.size_bytes == q.weight_bytes == subject.arch.weight_bytes_exact == exact
    assert q.quality.tier == 4 and q.file == synth_gguf.name

    plans = plan(str(synth_gguf), parse_rig(ONE), "balanced", limit=5)
    assert plans and {p.engine for p in plans} <= set(LLAMA_ENGINES) and {p.quant for p in plans} == {"Q4_K_M"}
    rows = how_to_choose(str(synth_gguf), parse_rig(ONE))
    assert all(r.plan is None or r.plan.engine in LLAMA_ENGINES for r in rows)

    model, f = fit_one(str(synth_gguf), parse_rig(ONE), "llama.cpp", "q4_k_m", "q8_0", 8192)
    assert model.id == str(synth_gguf) and f.verdict == "fits"
    # the header's tensors, placed exactly: the embedding on the host, the rest on the GPU
    assert f.component("weights") + f.component("weights_embedding") == exact
    with pytest.raises(BadInput, match="does not load in vllm"):
        fit_one(str(synth_gguf), parse_rig(ONE), "vllm", "Q4_K_M", "fp8", 8192)
    with pytest.raises(BadInput, match="no quant 'Q8_0'"):
        fit_one(str(synth_gguf), parse_rig(ONE), "llama.cpp", "Q8_0", "q8_0", 8192)


# ---- CLI ---------------------------------------------------------------------------


def test_cli_plan_and_fit_outside_the_catalog(synth_gguf: Path):
    proc = cli("plan", LLAMA, "--rig", ONE, "--json", check=True)
    data = json.loads(proc.stdout)
    assert data["model"] == LLAMA and data["model_source"] == f"config.json at {LLAMA}" and data["estimates"]
    assert any(r["pick"] for r in data["how_to_choose"])

    proc = cli("plan", str(synth_gguf), "--rig", ONE, "--priority", "balanced", "--json", check=True)
    data = json.loads(proc.stdout)
    assert data["model_source"].startswith("GGUF header of")
    assert data["plans"] and all(p["engine"] in LLAMA_ENGINES and p["quant"] == "Q4_K_M" for p in data["plans"])

    proc = cli("fit", str(synth_gguf), "--engine", "llama.cpp", "--quant", "Q4_K_M", "--kv", "q8_0",
               "--ctx", "8192", "--rig", ONE, "--json", check=True)
    data = json.loads(proc.stdout)
    assert data["model_source"].startswith("GGUF header of") and data["fit"]["verdict"] == "fits"
    assert data["fit"]["request"]["weight_bytes"] == header_bytes(synth_gguf)

    human = cli("plan", LLAMA, "--rig", ONE, "--priority", "balanced", check=True)
    assert "(not in the catalog)" in human.stdout and "no such file was checked" in human.stdout


def _one_line_error(proc, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_cli_unreadable_files_are_one_line_errors(tmp_path: Path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 2,')
    _one_line_error(cli("plan", str(bad), "--rig", ONE), "not in the catalog", "not valid JSON")
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"this is not a gguf file at all")
    _one_line_error(cli("fit", str(fake), "--engine", "llama.cpp", "--quant", "Q4_K_M", "--kv", "q8_0",
                        "--ctx", "4096", "--rig", ONE), "not in the catalog", "not a GGUF file")


@pytest.mark.parametrize("env,needle", [
    ({"HF_HUB_OFFLINE": "1"}, "offline mode is on"),
    ({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}, "cannot reach Hugging Face"),
])
def test_cli_org_repo_offline_fails_fast(tmp_path: Path, env, needle):
    """A process of its own: the hub client reads HF_HUB_OFFLINE and HF_ENDPOINT when it is imported."""
    t0 = time.monotonic()
    proc = run_cli("plan", "engineroom-tests/no-such-model", "--rig", ONE,
                   env={**env, "HF_HOME": str(tmp_path / "hf")})
    assert time.monotonic() - t0 < 15       # one attempt, not the hub client's retries with backoff
    _one_line_error(proc, "not in the catalog", "engineroom-tests/no-such-model", needle, "no cached copy")


def test_misspelt_catalog_id_keeps_the_catalog_error():
    with pytest.raises(BadInput) as err:
        plan("qwen3.6-72b", parse_rig(ONE))
    assert "did you mean 'qwen3.6-27b'" in str(err.value) and "cannot be read" not in str(err.value)
    _one_line_error(cli("plan", "qwen3.6-72b", "--rig", ONE), "did you mean 'qwen3.6-27b'")


def test_catalog_models_stay_catalog_models():
    assert resolve_model("meta-llama/Llama-3.1-8B-Instruct").in_catalog     # its hf_repo: no download
    p = plan("qwen3.6-27b", parse_rig(ONE), "balanced", limit=1)[0]
    assert not any("not in the catalog" in t for t in p.tradeoffs)


# ---- issue 6: quant, MoE bytes, refused KV types, context beyond the model's maximum ---------

def _adhoc(tmp_path: Path, cfg: dict, name: str = "m") -> str:
    p = tmp_path / name / "config.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(cfg))
    return str(p.parent)


def test_float32_config_is_offered_at_the_16_bit_type_engines_load():
    cfg = json.loads(Path(LLAMA).read_text())
    cfg["torch_dtype"] = "float32"
    from engineroom.arch import arch_from_config
    from engineroom.plan import model_from_arch

    subject = model_from_arch("llama-f32", arch_from_config(cfg))
    ids = [q.id for q in subject.model.quants]
    assert "f32" not in ids and ids[0] == "f16"
    assert subject.model.quants[0].weight_bytes == pytest.approx(LLAMA_PARAMS * 2, rel=0.005)
    assert any("float32" in n or "f32" in n for n in subject.estimates)


def test_moe_bytes_per_token_leave_embeddings_out_of_the_active_share():
    """The active share is (active - emb - head) / (params - emb - head), applied to the
    trunk's bytes; the head is read every token, the embedding is a lookup."""
    from engineroom.arch import count_active_params
    from engineroom.plan import weights_read_per_token

    subject = resolve_model(str(CONFIGS / "qwen3.5-35b-a3b.json"))
    arch, model = subject.arch, subject.model
    q = next(x for x in model.quants if x.id == "Q4_K_M")
    w, params = q.weight_bytes, arch.param_count
    active = count_active_params(arch)
    emb_p = arch.vocab_size * arch.hidden_size
    n = 1 if arch.tie_embeddings else 2
    emb_b = emb_p * w / params
    want = (w - n * emb_b) * (active - n * emb_p) / (params - n * emb_p) + emb_b
    got = weights_read_per_token(model, arch, q)
    assert got == pytest.approx(want, rel=1e-6)
    old = (w - n * emb_b) * active / params + emb_b            # the double-counted share
    assert got < old * 0.95


def test_plan_never_recommends_a_kv_type_the_engine_refuses():
    from engineroom.plan import model_from_arch
    from engineroom.synthshapes import SHAPES

    subject = model_from_arch("hd80", _with_params(SHAPES["hd80"]))
    cat = load_catalog()
    for prio in cat.priorities:
        try:
            plans = plan(subject, parse_rig("cpu:64GB"), prio.id, engine="llama.cpp", limit=5)
        except Exception as err:  # noqa: BLE001 - a priority nothing satisfies on a CPU is fine; a refused KV is not
            assert "q4_0" not in str(err) or "refuses" in str(err)
            continue
        assert all(p.kv_dtype == "f16" for p in plans), [(p.kv_dtype, prio.id) for p in plans]


def _with_params(a):
    from engineroom.fit import estimate_param_count

    return replace(a, param_count=estimate_param_count(a), torch_dtype="bf16")


def test_fit_one_refuses_an_undividable_kv_type_in_one_sentence():
    from engineroom.plan import model_from_arch
    from engineroom.synthshapes import SHAPES

    subject = model_from_arch("hd80", _with_params(SHAPES["hd80"]))
    with pytest.raises(BadInput, match="K cache type q4_0 with block size 32 does not divide n_embd_head_k=80"):
        fit_one(subject, parse_rig("cpu:64GB"), "llama.cpp", "Q8_0", "q4_0", 4096)
    _, f = fit_one(subject, parse_rig("cpu:64GB"), "llama.cpp", "Q8_0", "f16", 4096)
    assert f.verdict == "fits"


def test_default_launch_fit_uses_the_engines_slots():
    from engineroom.plan import model_from_arch
    from engineroom.synthshapes import SHAPES

    subject = model_from_arch("swa", _with_params(SHAPES["swa-s"]))
    _, f = fit_one(subject, parse_rig("cpu:64GB"), "llama.cpp", "Q8_0", "f16", 1024, parallel=None)
    assert (f.request.parallel, f.request.kv_unified) == (4, True)


def test_ctx_beyond_max_positions_is_refused_unless_rope_scaling():
    subject = resolve_model(LLAMA)
    maxpos = subject.arch.max_position
    with pytest.raises(BadInput, match=f"maximum of {maxpos:,} positions"):
        plan(subject, parse_rig("1xH200"), ctx=maxpos + 1024, limit=1)
    with pytest.raises(BadInput, match=f"maximum of {maxpos:,} positions"):
        fit_one(subject, parse_rig("1xH200"), "llama.cpp", "Q8_0", "f16", maxpos + 1024)
    with pytest.raises(BadInput, match="without a scale factor does not extend it"):
        plan(subject, parse_rig("1xH200"), ctx=maxpos + 1024, limit=1, engine="llama.cpp", rope_scaling="yarn")
    plans = plan(subject, parse_rig("1xH200"), ctx=maxpos + 1024, limit=1, engine="llama.cpp", rope_scaling="yarn:2")
    assert plans and plans[0].ctx == maxpos + 1024


def test_mla_decode_reads_the_compressed_kv_not_zero():
    """DeepSeek-V3's 61 MLA layers: the KV a decode step reads is fit's formula (latent + rope
    key per token per layer), so the speed band depends on the KV type as for any model."""
    from engineroom.catalog import load_catalog
    from engineroom.plan import kv_bytes_per_token, weights_read_per_token

    subject = resolve_model(str(CONFIGS / "deepseek-v3.json"))
    p = plan(subject, parse_rig("4xH200"), "balanced", limit=1)[0]
    arch, q = subject.arch, subject.model.quant(p.quant)
    kv = load_catalog().engine(p.engine).kv(p.kv_dtype)
    read = kv_bytes_per_token(arch, kv, min(4096, p.ctx))
    per_layer = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    assert read == int(arch.n_layers * per_layer * min(4096, p.ctx) * kv.bytes_per_elem) > 0
    assert p.decode.bytes_per_token == weights_read_per_token(subject.model, arch, q) + read


def test_how_to_choose_rows_come_from_a_typed_error_not_its_text():
    from engineroom.errors import NotFound
    from engineroom.plan import NothingFits

    subject = resolve_model(str(CONFIGS / "deepseek-v3.json"))     # 671B parameters on one 3090
    with pytest.raises(NothingFits, match="no configuration of") as err:
        plan(subject, parse_rig(ONE), "balanced", limit=1)
    assert isinstance(err.value, NotFound)                         # the CLI's exit code stays NotFound's
    rows = how_to_choose(subject, parse_rig(ONE))
    assert rows and all(r.plan is None and r.why_none.startswith("no configuration of") for r in rows)
    with pytest.raises(NotFound) as missing:        # a NotFound that is the user's error is raised, never a row
        how_to_choose(str(CONFIGS / "absent.json"), parse_rig(ONE))
    assert not isinstance(missing.value, NothingFits)
