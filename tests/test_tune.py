"""engineroom tune (issue 19 item 3): the knobs that matter for a priority, each value an A/B over
interleaved boots against the incumbent, kept only when its gain is real; the result a plan that
`up --from-plan` launches exactly as it was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engineroom.engines import ikllamacpp, llamacpp
from engineroom.engines.base import LaunchOptions, Settled
from engineroom.errors import BadInput
from engineroom.flows import picks
from engineroom.flows.tuning import _request_with, _write_plan, guarded_knobs, objective_of
from engineroom.plan.request import LaunchRequest, Weights

from conftest import MACHINE_CHECKS, cli


def test_each_priority_names_what_tune_measures_and_what_it_must_not_trade_for_it():
    assert objective_of("balanced") == ("decode_tps", ("ctx", "kv_precision"))
    assert objective_of("full-features") == ("decode_tps", ())
    assert objective_of("concurrent-throughput") == ("aggregate_tps", ())
    assert objective_of("multi-tenant") == ("aggregate_tps", ())    # shared-prefix throughput: every slot's
    assert objective_of("leanest-vram") == ("decode_tps", ("gpu_bytes",))
    with pytest.raises(BadInput, match="ranks by max_ctx, .* which `engineroom plan` sizes from memory"):
        objective_of("max-context")
    said = cli("tune", "smollm2-135m", "--priority", "max-context")
    assert said.returncode == 2 and "max-context ranks by max_ctx" in said.stderr
    assert said.stderr.startswith("error: ") and "\n" not in said.stderr.strip(), said.stderr


def test_a_priority_keeps_what_it_ranks_above_speed_out_of_the_search():
    knobs = llamacpp.tune_knobs("decode_tps", kv_dtype="q8_0", parallel=1, cpu_cores=2, kv_dtypes=("f16", "q4_0"))
    widths = {"f16": 2.0, "q8_0": 1.0625, "q4_0": 0.5625}
    assert [k.values for k in knobs] == [(1,), ("f16",)]
    kept, held = guarded_knobs(knobs, ("ctx", "kv_precision"), widths, "q8_0")     # balanced: wider KV only
    assert [(k.field, k.values) for k in kept] == [("threads", (1,)), ("kv_dtype", ("f16",))] and not held
    narrower = llamacpp.tune_knobs("decode_tps", kv_dtype="f16", parallel=1, cpu_cores=2, kv_dtypes=("q8_0",))
    kept, held = guarded_knobs(narrower, ("ctx", "kv_precision"), widths, "f16")
    assert [k.field for k in kept] == ["threads"] and "keeps KV precision" in held[0]
    kept, held = guarded_knobs(narrower, ("gpu_bytes",), widths, "f16")              # leanest-vram: no memory
    assert [k.field for k in kept] == ["threads"] and "changes memory" in held[0]


def test_llama_cpp_names_threads_kv_slots_and_ubatch_for_the_objective_it_is_asked():
    kinds = ("f16", "q8_0", "q4_0")
    cpu = llamacpp.tune_knobs("decode_tps", kv_dtype="f16", parallel=1, cpu_cores=4, kv_dtypes=kinds)
    assert [(k.field, k.values) for k in cpu] == [("threads", (3, 2)), ("kv_dtype", ("q8_0",))]
    gpu = llamacpp.tune_knobs("decode_tps", kv_dtype="q8_0", parallel=1, cpu_cores=None, kv_dtypes=kinds)
    assert [(k.field, k.values) for k in gpu] == [                              # no threads on a GPU
        ("engine_args", (("-bs",),)), ("engine_args", (("-fa", "off"),)), ("kv_dtype", ("f16",))]
    fork = ikllamacpp.tune_knobs("decode_tps", kv_dtype="q8_0", parallel=1, cpu_cores=None, kv_dtypes=kinds)
    assert [(k.field, k.values) for k in fork] == [                             # the fork has no -bs
        ("engine_args", (("-fa", "off"),)), ("kv_dtype", ("f16",))]
    many = llamacpp.tune_knobs("aggregate_tps", kv_dtype="q4_0", parallel=4, cpu_cores=None, kv_dtypes=kinds)
    assert [(k.field, k.values) for k in many] == [
        ("parallel", (8, 2)), ("kv_dtype", ("f16", "q8_0"))]
    one = llamacpp.tune_knobs("aggregate_tps", kv_dtype="f16", parallel=1, cpu_cores=2, kv_dtypes=("f16",))
    assert [(k.field, k.values) for k in one][:2] == [("threads", (1,)), ("parallel", (2,))]   # no 0 slots, no q8_0


def test_throughput_tunes_no_micro_batch_which_cannot_move_the_rate_while_every_slot_decodes():
    """The H200 visit of 2026-12-04 (benchmarks/tune_gpu.md): a throughput trial is 4 boots of 32-64 busy
    slots, 5-8 minutes there. Its objective is the rate while every slot decodes: a step of one token a
    slot, at most 256 slots, which no -ub of 256 or more splits, so a -ub trial could only measure noise."""
    from engineroom.engines.llamacpp.command import MAX_SEQS

    kinds = ("f16", "q8_0", "q4_0")
    for engine in (llamacpp, ikllamacpp):
        for parallel, cores in ((MAX_SEQS, None), (32, None), (4, 8)):
            knobs = engine.tune_knobs("aggregate_tps", kv_dtype="q4_0", parallel=parallel, cpu_cores=cores,
                                      kv_dtypes=kinds)
            args = [a for k in knobs if k.field == "engine_args" for v in k.values for a in v]
            assert "-ub" not in args and "--ubatch-size" not in args
            assert max(v for k in knobs if k.field == "parallel" for v in k.values) <= MAX_SEQS


def test_the_launchs_micro_batch_reaches_fit_through_the_adapters_settled_launch(tmp_path):
    assert llamacpp.batch_sizes(()) == (512, 2048)
    assert llamacpp.batch_sizes(("-ub", "1024", "--batch-size=4096")) == (1024, 4096)
    with pytest.raises(BadInput, match="-ub x is not a positive number"):
        llamacpp.batch_sizes(("-ub", "x"))
    options = LaunchOptions(model_path=tmp_path / "m.gguf", ctx=1024, parallel=1, extra_args=("-ub", "256"))
    assert llamacpp.launch_settings(options).ubatch == 256 and llamacpp.launch_settings(options).flash_attn
    assert ikllamacpp.launch_settings(options).ubatch == 256
    plain = LaunchOptions(model_path=tmp_path / "m.gguf", ctx=1024, parallel=1, extra_args=("-fa", "off"))
    assert not llamacpp.launch_settings(plain).flash_attn and not ikllamacpp.launch_settings(plain).flash_attn

    from engineroom.cpuprobe import probe_cpu
    from engineroom.flows.prediction import predict_memory

    probe = probe_cpu()
    small = predict_memory("llama.cpp", None, Settled(ctx=1024, parallel=1, ubatch=256), probe,
                           model_id="smollm2-135m", quant="Q4_1")
    default = predict_memory("llama.cpp", None, Settled(ctx=1024, parallel=1), probe,
                             model_id="smollm2-135m", quant="Q4_1")
    assert small.request["ubatch"] == 256 and default.request["ubatch"] == 512
    assert 0 < small.components["compute"] < default.components["compute"]


def test_a_request_carries_threads_and_engine_args_to_the_argv_and_back():
    r = LaunchRequest(model="m", engine="llama.cpp", weights=Weights(ref="m"), ctx=1024, threads=1,
                      engine_args=("-ub", "256"))
    back = LaunchRequest.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r and back.engine_args == ("-ub", "256")
    options = picks.launch_options(r, model_path=Path("m.gguf"), extra_args=("--mlock",), port=8080)
    assert options.threads == 1 and options.extra_args == ("-ub", "256", "--mlock")
    other = picks.typed_request("m", picks.Pick(request=r, plan={}, source="s"), _args(engine="vllm"), "llama.cpp")
    assert other.engine == "vllm" and other.engine_args == ()       # llama.cpp's own words stay behind


def test_a_boot_of_settings_other_than_the_picks_makes_no_speed_point(tmp_path, monkeypatch):
    """The H200 visit of 2026-12-04: a balanced tune's 8 boots (4 of them `-bs` or `-fa off`, 15% slower)
    each stored a speed point against the pick's band, and the next plan of another model said "calibrated
    x1.31 from 8 runs". A boot of the pick as planned still makes one; a changed pick, and the plan file
    tune writes from it, carry no uncalibrated band to set a measurement against."""
    from engineroom.speedpoints import point_from

    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    pick = picks.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp", ctx=1024)
    summary = {"status": "OK", "workloads": {"narrative": {"decode_tps": {"mean": 50.0}}}}
    assert pick.plan.get("decode_tps_uncalibrated") and point_from(pick.plan, summary) is not None
    assert _request_with(pick, {}) is pick
    for setting in ({"engine_args": ("-fa", "off")}, {"parallel": 2}, {"kv_dtype": "q8_0"}, {"threads": 1}):
        changed = _request_with(pick, setting)
        assert point_from(changed.plan, summary) is None and changed.plan.get("decode_tps") == pick.plan["decode_tps"]
    best = _request_with(pick, {"threads": 1})
    path = Path(_write_plan(best, pick, None, "smollm2-135m", "balanced", "decode_tps", 7, None))
    row = json.loads(path.read_text())["plans"][0]
    assert "decode_tps_uncalibrated" not in row and point_from(row, summary) is None


def _args(**given):
    from engineroom.launchargs import LaunchArgs

    return LaunchArgs(**given)


def test_the_tuned_plan_file_renders_exactly_the_settings_tune_measured(tmp_path, monkeypatch):
    """What tune writes is what `recipe --from-plan` (and so `up --from-plan`) renders: the tuned
    threads and micro-batch in the argv, the pick's weights and context unchanged."""
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    pick = picks.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp", ctx=1024)
    best = _request_with(pick, {"threads": 1, "engine_args": ("-ub", "256")})
    gain = {"a_mean": 100.0, "b_mean": 110.0, "gain_pct": 10.0, "band_pct": 2.0}
    path = Path(_write_plan(best, pick, None, "smollm2-135m", "balanced", "decode_tps", 7, gain))
    assert path.parent == tmp_path / "data" / "tune" and path.name == "smollm2-135m-balanced-7.json"
    again = picks.pick_from_file(path)
    assert again.request == best.request and again.request.threads == 1
    doc = json.loads(path.read_text())
    assert doc["plans"][0]["tuned"]["gain"]["gain_pct"] == 10.0 and doc["plans"][0]["tuned"]["run"] == 7
    done = cli("recipe", "--from-plan", str(path), "--json")
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert argv[argv.index("-t") + 1] == "1" and argv[argv.index("-ub") + 1] == "256"
    assert argv[argv.index("-c") + 1] == str(1024 * (pick.request.parallel or 1))


def test_bad_tune_input_is_one_sentence_before_anything_runs():
    said = cli("tune", "smollm2-135m", "--boots", "1")
    assert said.returncode == 2 and said.stderr == "error: --boots must be at least 2 for tune, not 1.\n"
    said = cli("tune", "smollm2-135m", "--engine", "llama.cpp", "--knob", "flash", "--ctx", "1024")
    assert said.returncode == 2
    last = said.stderr.splitlines()[-1]         # after the plan stage's progress line
    assert last.startswith("error: llama.cpp has no knob flash to tune for decode_tps here; it has "), said.stderr
    said = cli("tune", "smollm2-135m", "--budget-min", "0")
    assert said.returncode == 2 and "--budget-min must be positive" in said.stderr


def test_tune_on_the_real_llama_server(llama_server_binary, smollm2, tmp_path, monkeypatch):
    """A real search for concurrent throughput from one slot: the slots knob's value (2) against the pick
    over four interleaved boots of llama-server, each boot a stored concurrency run; the verdict with
    its numbers; the tune run stored; a kept value written as a plan that carries it."""
    from engineroom.store import Store

    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    proc = cli("tune", "smollm2-135m", "--priority", "concurrent-throughput", "--engine", "llama.cpp",
               "--ctx", "512", "--parallel", "1", "--knob", "parallel", "--max-tokens", "48", "--warmup", "0",
               "--runs", "2", "--json", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["objective"] == "aggregate_tps" and out["pick"]["parallel"] == 1
    [trial] = out["trials"]
    assert trial["knob"] == "slots (-np)" and trial["value"] == 2 and trial["setting"] == {"parallel": 2}
    assert "boot 1/4: arm A (the pick)" in proc.stderr
    if trial["outcome"] == "not measured":          # a busy machine: said, with the checks that failed; the trial
        failed = trial["why"].split("stayed INVALID: ", 1)[1].rsplit("; not compared", 1)[0].split("; ")
        assert {f.split(":")[0] for f in failed} <= MACHINE_CHECKS, trial["why"]       # stops at that boot
        return
    assert "boot 4/4: arm A (the pick)" in proc.stderr
    assert trial["outcome"] in ("kept", "not kept"), trial
    assert len(trial["runs_a"]) == 2 and len(trial["runs_b"]) == 2
    assert trial["a_mean"] > 0 and trial["b_mean"] > 0 and trial["band_pct"] is not None
    with Store() as store:
        run = store.get_run(out["run_id"])
        assert run["kind"] == "tune" and run["status"] == "OK"
        boots = [store.get_run(i) for i in trial["runs_a"] + trial["runs_b"]]
    assert all(b["kind"] == "bench" and "concurrency" in b["label"] for b in boots)
    card = cli("report", str(out["run_id"]), env=env).stdout     # the stored run's card: the same table
    assert "## Tune" in card and "| 1 | slots (-np) = 2 |" in card and f"{trial['outcome']}:" in card
    if trial["outcome"] == "kept":
        assert out["changes"] == {"parallel": 2} and out["gain"]["gain_pct"] > 0
        assert picks.pick_from_file(Path(out["plan_file"])).request.parallel == 2
    else:
        assert out["changes"] == {} and out["plan_file"] is None



def test_a_tuned_plan_launches_as_tuned_on_the_real_llama_server(llama_server_binary, smollm2, tmp_path, monkeypatch):
    """`up --from-plan` of a tuned plan: the tuned threads and micro-batch in llama-server's argv, and fit's
    compute buffer for that micro-batch against the engine's own line (the contract: what tune measured
    is what launches, and the prediction is made for it)."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    pick = picks.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp", ctx=1024)
    best = _request_with(pick, {"threads": 1, "engine_args": ("-ub", "256")})
    path = _write_plan(best, pick, tmp_path / "tuned.json", "smollm2-135m", "balanced", "decode_tps", 1, None)
    up = cli("up", "--from-plan", path, "--port", "0", "--json", env=env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        state = json.loads(up.stdout)
        argv = state["argv"]
        assert argv[argv.index("-t") + 1] == "1" and argv[argv.index("-ub") + 1] == "256"
        rows = {r["component"]: r for r in state["memory"]["rows"]}
        assert abs(rows["compute"]["error_pct"]) < 1.0, rows["compute"]
    finally:
        cli("down", env=env)


def test_quant_narrows_the_plan_to_one_of_the_models_quants():
    """`--quant` (plan, try, tune): the pick among that quant's configurations only; a quant the model
    does not have, or --quant on a how-to-choose table, is one sentence."""
    pick = picks.pick_from_plan("qwen3.6-27b", rig="1xH200", priority="concurrent-throughput", engine="llama.cpp",
                                parallel=32, quant="q4_k_m")
    assert pick.request.weights.quant == "Q4_K_M" and pick.request.parallel == 32
    said = cli("plan", "qwen3.6-27b", "--priority", "balanced", "--quant", "Q9")
    assert said.returncode == 2 and said.stderr.startswith("error: Qwen3.6-27B has no quant 'Q9'; known: ")
    said = cli("plan", "qwen3.6-27b", "--quant", "Q4_K_M")
    assert said.returncode == 2
    assert said.stderr == "error: --quant goes with --priority (a how-to-choose table compares every quant).\n"


def test_the_engines_own_arguments_add_up_over_the_knobs_kept():
    """A kept `-bs` stays when the next knob tries `-fa off` (the H200 visit's second trial ran `-fa off`
    alone against `-bs`: the arguments replaced each other)."""
    from engineroom.flows.tuning import _with

    kept = _with({}, {"engine_args": ("-bs",)})
    assert _with(kept, {"engine_args": ("-fa", "off")}) == {"engine_args": ("-bs", "-fa", "off")}
    assert _with({"threads": 1, "engine_args": ("-bs",)}, {"threads": 2}) == {"threads": 2, "engine_args": ("-bs",)}


def test_flash_attention_off_is_sized_as_the_h200_measured_it():
    """`-fa off` (tune's GPU knob) on the H200: llama-server's CUDA compute buffer was 1,680 MiB and its
    host buffer 108 MiB for the Qwen3.6-27B layout at 32K x 1 (benchmarks/data/tune_gpu/2026-12-04/balanced,
    launch run 12), where fit still predicted the flash-attention buffers (174 / 72 MiB)."""
    from engineroom.catalog import arch_from_catalog
    from engineroom.fit.llama_compute import llama_cuda_compute
    from engineroom.fit.request import FitRequest
    from engineroom.plan import resolve_model

    arch = arch_from_catalog(resolve_model("qwen3.6-27b").model)
    req = FitRequest(engine="llama.cpp", ctx=32768, quant="Q4_K_M", parallel=1)
    on = llama_cuda_compute(arch, req)
    off = llama_cuda_compute(arch, FitRequest(engine="llama.cpp", ctx=32768, quant="Q4_K_M", parallel=1,
                                              flash_attn=False))
    assert [round(x / 2**20) for x in on] == [174, 72]                 # as measured with flash attention
    assert abs(off[0] / (1680 * 2**20) - 1) < 0.05 and abs(off[1] / (108 * 2**20) - 1) < 0.05


def test_up_dry_run_prints_what_recipe_prints_and_starts_nothing(tmp_path, monkeypatch):
    """`up --dry-run` (issue 18 item 3): the same record as `recipe`, for a plan's pick and for a tuned plan
    file, with nothing started or downloaded; with --docker, the compose file `recipe --compose` writes."""
    from engineroom import launch

    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    args = ("smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp", "--ctx", "1024", "--json")
    dry = cli("up", *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    recipe = cli("recipe", *args)
    assert recipe.returncode == 0 and json.loads(dry.stdout) == json.loads(recipe.stdout)
    assert launch.read_state() is None                                  # nothing was started
    compose = cli("up", "smollm2-135m", "--dry-run", "--docker", "--json")
    assert compose.returncode == 0 and "services" in json.loads(compose.stdout)["compose"], compose.stderr
