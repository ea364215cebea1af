"""Speed calibration (issue 19 item 2): the plan's decode band corrected by runs measured on this
machine, with its provenance; points read back from the store for this machine only."""

from __future__ import annotations

import json

import pytest

from engineroom.arch import LayerKind
from engineroom.catalog import arch_from_catalog, load_catalog
from engineroom.hardware import host_summary, parse_rig
from engineroom.plan import UNCALIBRATED, Calibration, SpeedPoint, plan, plans_as_rows, shape_class
from engineroom.plan.calibration import NO_POINT_HERE
from engineroom.speedpoints import POINT_KEY, calibration_here, device_of, point_from
from engineroom.store import Store

from conftest import cli


def _point(run_id: int, engine: str, shape: str, measured: float, planned: float = 100.0) -> SpeedPoint:
    return SpeedPoint(run_id=run_id, engine=engine, shape=shape, model="m", measured_tps=measured,
                      planned_mid_tps=planned)


def test_the_factor_is_the_median_of_the_engines_points_of_that_shape_else_of_its_other_shapes():
    cal = Calibration.of("1 x GPU", [_point(1, "llama.cpp", "dense", 80), _point(2, "llama.cpp", "dense", 90),
                                     _point(3, "llama.cpp", "dense", 130), _point(4, "llama.cpp", "moe", 150),
                                     _point(5, "vllm", "dense", 50)])
    dense = cal.factor("llama.cpp", "dense")
    assert dense is not None and dense.factor == pytest.approx(0.9) and dense.runs == (1, 2, 3) and dense.same_shape
    assert "from 3 runs of this shape class on this machine (#1, #2, #3)" in dense.text
    hybrid = cal.factor("llama.cpp", "hybrid")          # no hybrid point: every llama.cpp point, said so
    assert hybrid is not None and hybrid.factor == pytest.approx(1.1) and not hybrid.same_shape
    assert "other shapes" in hybrid.text
    assert cal.factor("sglang", "dense") is None         # engines never borrow each other's points
    assert Calibration.of("x", []).factor("llama.cpp", "dense") is None


def test_weight_families_never_calibrate_each_other_and_an_old_point_counts_for_every_family():
    """vLLM's CPU build runs a 4-bit AWQ pick at float16 through its packed-int4 kernel and a 16-bit pick at float32:
    its try of SmolLM2's shape at awq-int4 decoded at 0.35x the catalog's band, which would have put its bf16 pick
    at a third of its speed. bf16, f16 and f32 are one family; a point stored without a family counts for each."""
    from engineroom.plan import weight_family

    assert [weight_family(f) for f in ("bf16", "F16", "fp32", "awq", "gguf", "", None)] == \
        ["16-bit", "16-bit", "16-bit", "awq", "gguf", "", ""]
    awq = SpeedPoint(run_id=1, engine="vllm", shape="dense", model="m", measured_tps=35, planned_mid_tps=100,
                     family="awq")
    cal = Calibration.of("cpu", [awq])
    assert cal.factor("vllm", "dense", "16-bit") is None and cal.factor("vllm", "dense", "awq").factor == 0.35  # type: ignore[union-attr]
    assert cal.factor("vllm", "moe", "awq").same_shape is False                    # type: ignore[union-attr]
    old = _point(2, "vllm", "dense", 70)
    both = Calibration.of("cpu", [awq, old])
    assert both.factor("vllm", "dense", "16-bit").runs == (2,)                     # type: ignore[union-attr]
    assert both.factor("vllm", "dense", "awq").runs == (1, 2)                      # type: ignore[union-attr]
    assert SpeedPoint.from_dict(awq.to_dict()) == awq and SpeedPoint.from_dict(old.to_dict()) == old


def test_the_plan_calibrates_each_weight_family_from_its_own_points_only():
    """On this machine's rig: an AWQ point of vLLM corrects vLLM's awq-int4 pick of SmolLM2's config and leaves its
    bf16 pick uncalibrated, said so."""
    from pathlib import Path

    from engineroom.hardware import detect_rig

    rig = detect_rig()
    config = Path(__file__).parent / "fixtures" / "configs" / "smollm2-135m.json"
    cal = Calibration.of(device_of(host_summary(rig)), [
        SpeedPoint(run_id=9, engine="vllm", shape="dense", model="m", measured_tps=20, planned_mid_tps=100,
                   family="awq")])

    def row(quant: str) -> dict:
        p = plan(str(config), rig, priority="balanced", engine="vllm", quant=quant, calibration=cal)
        return plans_as_rows(p)[0]

    awq, bf16 = row("awq-int4"), row("bf16")
    assert awq["speed_basis"].startswith("calibrated x0.20") and "#9" in awq["speed_basis"], awq["speed_basis"]
    assert awq["decode_tps"][1] == pytest.approx(awq["decode_tps_uncalibrated"][1] * 0.2, rel=0.02)
    assert bf16["speed_basis"] == NO_POINT_HERE and "weight family" in bf16["speed_basis"]


def test_a_damaged_point_is_no_point():
    good = _point(7, "llama.cpp", "dense", 50.0).to_dict()
    assert SpeedPoint.from_dict(good) == _point(7, "llama.cpp", "dense", 50.0)
    for bad in ({**good, "measured_tps": "fast"}, {k: v for k, v in good.items() if k != "engine"},
                {**good, "planned_mid_tps": 0}, {**good, "measured_tps": -3}):
        assert SpeedPoint.from_dict(bad) is None


def test_a_bench_summary_makes_a_point_only_when_valid_and_the_row_has_a_band():
    row = {"engine": "llama.cpp", "model": "m", "shape_class": "dense", "decode_tps_uncalibrated": [20.0, 30.0]}
    ok = {"status": "OK", "workloads": {"a": {"decode_tps": {"mean": 40.0}}, "b": {"decode_tps": {"mean": 60.0}}}}
    assert point_from(row, ok) == {"run_id": 0, "engine": "llama.cpp", "shape": "dense", "model": "m",
                                   "measured_tps": 50.0, "planned_mid_tps": 25.0, "family": ""}
    assert point_from({**row, "quant_format": "BF16"}, ok)["family"] == "16-bit"       # type: ignore[index]
    assert point_from(row, {**ok, "status": "INVALID"}) is None
    assert point_from({**row, "decode_tps_uncalibrated": None}, ok) is None
    assert point_from({**row, "shape_class": None}, ok) is None
    assert point_from(row, {"status": "OK", "workloads": {}}) is None


def test_shape_classes_follow_the_architecture():
    cat = load_catalog()
    assert shape_class(arch_from_catalog(cat.model("qwen3.6-27b"))) == "hybrid"
    assert shape_class(arch_from_catalog(cat.model("smollm2-135m"))) == "dense"
    assert shape_class(arch_from_catalog(cat.model("qwen3.6-35b-a3b"))) == "hybrid-moe"
    gemma = arch_from_catalog(cat.model("gemma-3-270m"))
    assert LayerKind.SLIDING in gemma.kind_counts and shape_class(gemma) == "sliding"


def test_the_plan_scales_its_band_and_aggregate_and_says_from_which_runs():
    rig = parse_rig("1x3090")
    before = plan("qwen3.6-27b", rig, "balanced", engine="llama.cpp", limit=1)[0]
    assert before.decode is not None and before.decode.basis == UNCALIBRATED and before.decode.uncalibrated is None
    cal = Calibration.of("1 x NVIDIA GeForce RTX 3090", [_point(11, "llama.cpp", "hybrid", 60.0)])
    after = plan("qwen3.6-27b", rig, "balanced", engine="llama.cpp", limit=1, calibration=cal)[0]
    assert after.decode is not None and after.decode.uncalibrated == (before.decode.low, before.decode.high)
    assert after.decode.low == pytest.approx(before.decode.low * 0.6)
    assert after.decode.high == pytest.approx(before.decode.high * 0.6)
    assert after.aggregate_tps == pytest.approx(before.aggregate_tps * 0.6)
    row = plans_as_rows([after])[0]
    assert row["speed_basis"].startswith("calibrated x0.60 from 1 run of this shape class"), row["speed_basis"]
    assert "(#11)" in row["speed_basis"]
    assert row["decode_tps_uncalibrated"] == [round(before.decode.low, 1), round(before.decode.high, 1)]
    other = Calibration.of("x", [_point(12, "vllm", "hybrid", 60.0)])     # another engine's point changes nothing
    same = plan("qwen3.6-27b", rig, "balanced", engine="llama.cpp", limit=1, calibration=other)[0]
    assert same.decode is not None and (same.decode.low, same.decode.high) == (before.decode.low, before.decode.high)
    assert same.decode.basis == NO_POINT_HERE and same.aggregate_tps == before.aggregate_tps


def _stored(store: Store, host: dict, point: dict | None, status: str = "OK") -> int:
    run_id = store.start_run("bench", {"host": host})
    store.finish_run(run_id, status, {"status": status, **({POINT_KEY: point} if point else {})})
    return run_id


def test_points_are_read_for_this_machine_only_from_valid_runs(tmp_path):
    here = host_summary()
    elsewhere = {**here, "gpus": [{"name": "NVIDIA H200", "vram_bytes": 150 << 30}]}
    p = _point(0, "llama.cpp", "dense", 120.0, 30.0).to_dict()
    with Store(tmp_path / "r.sqlite") as store:
        mine = _stored(store, here, p)
        _stored(store, elsewhere, p)                        # another device's run
        _stored(store, here, p, status="INVALID")           # an invalid bench calibrates nothing
        _stored(store, here, None)                          # a bench that is not a try run
        _stored(store, here, {**p, "measured_tps": "n/a"})  # damaged
        cal = calibration_here(store)
    assert cal.device == device_of(here)
    assert [(q.run_id, q.ratio) for q in cal.points] == [(mine, 4.0)]
    assert device_of(elsewhere) == "1 x NVIDIA H200"


def test_a_store_that_cannot_be_read_never_stops_a_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path))
    assert calibration_here().points == ()                  # no store yet: none made by planning
    assert not (tmp_path / "results.sqlite").exists()
    (tmp_path / "results.sqlite").write_bytes(b"not a database, " * 64)
    assert calibration_here().points == ()                  # a damaged one: no points, no error
    assert device_of({"cpu": "AMD EPYC", "cpu_cores": 2, "gpus": []}) == "CPU AMD EPYC (2 cores)"


def test_a_setting_typed_over_the_pick_with_another_value_is_named_and_the_same_value_is_not():
    """The launch keeps these names with the plan row; a bench then makes no speed point (the row's
    band is not that launch's)."""
    from dataclasses import replace

    from engineroom.flows.picks import pick_from_plan
    from engineroom.flows.serving import _typed_over

    pick = pick_from_plan("qwen3.6-27b", priority="balanced", rig="1x3090", engine="llama.cpp")
    same = pick.request.with_user({"engine": "llama.cpp"})            # `up --priority P --engine llama.cpp`
    other = pick.request.with_user({"ctx": 1024, "engine": "llama.cpp"})
    assert _typed_over(pick, same) == [] and _typed_over(pick, other) == ["ctx"]
    assert _typed_over(pick, replace(pick.request, given=())) == [] and _typed_over(pick, None) == []


def test_a_bench_of_the_plans_pick_calibrates_the_next_plan(llama_server_binary, smollm2, tmp_path, monkeypatch):
    """`up --priority` then `bench` on the real llama-server: a valid run stores a speed point and the
    next `plan` here says it is calibrated by that run, its middle on what was measured."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    up = cli("up", "smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp", "--port", "0", "--json",
             env=env, timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        bench = cli("bench", "--warmup", "1", "--runs", "3", "--max-tokens", "32", "--json", env=env, timeout=300)
        out = json.loads(bench.stdout)
    finally:
        cli("down", env=env)
    plan = json.loads(cli("plan", "smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp", "--json",
                          env=env).stdout)["plans"][0]
    point = out["summary"].get(POINT_KEY)
    if out["summary"]["status"] != "OK":               # the machine's noise: no point, and said so
        assert point is None and plan["speed_basis"].startswith("uncalibrated"), plan["speed_basis"]
        return
    assert point["engine"] == "llama.cpp" and point["shape"] == "dense"
    assert point["planned_mid_tps"] == pytest.approx(sum(plan["decode_tps_uncalibrated"]) / 2, abs=0.06)
    assert plan["speed_basis"].startswith("calibrated") and f"(#{out['run_id']})" in plan["speed_basis"]
    assert sum(plan["decode_tps"]) / 2 == pytest.approx(point["measured_tps"], rel=0.01)


def test_a_plain_and_a_hybrid_moe_are_classes_of_their_own():
    """The H200's second try visit: the catalog's model put the plain MoE 28% under what it decoded and the
    hybrid one 11% over, so as one class each calibrated the other the wrong way (+43%, -30%)."""
    from engineroom.arch.config import arch_from_config

    plain = arch_from_config("tests/fixtures/configs/qwen3-30b-a3b.json")
    hybrid = arch_from_config("tests/fixtures/configs/qwen3.5-35b-a3b.json")
    assert (shape_class(plain), shape_class(hybrid)) == ("moe", "hybrid-moe")
    cal = Calibration.of("1 x GPU", [_point(1, "llama.cpp", "hybrid-moe", 89.0)])
    f = cal.factor("llama.cpp", "moe")
    assert f is not None and not f.same_shape and "other shapes" in f.text


def test_a_drafting_picks_try_is_set_against_the_band_without_the_drafter():
    """The 27B's pick drafts with MTP; try on random weights runs it without the drafter, so its measurement
    is set against the same pick's band without the speed-up (the band of the no-drafter plan row), and it
    makes a speed point (before, it made none: issue 19's 27B tries calibrated nothing)."""
    from engineroom.flows.picks import pick_from_plan
    from engineroom.flows.trying import random_weights_pick

    pick = pick_from_plan("qwen3.6-27b", priority="balanced", rig="h200", engine="llama.cpp", quant="Q4_K_M")
    row = pick.plan
    assert row["spec"] and row["spec_speedup"][0] > 1.2, row
    tried, left = random_weights_pick(pick)
    assert tried.request.spec_method is None and any("without the drafter" in x for x in left), left
    assert any(n.startswith("speculative decoding") for n in pick.notes)
    assert not any(n.startswith("speculative decoding") for n in tried.notes), tried.notes   # not launched so
    same = [r for r in plans_as_rows(plan("qwen3.6-27b", parse_rig("h200"), "balanced", engine="llama.cpp",
                                          quant="Q4_K_M", ctx=row["ctx"], limit=60))
            if not r["spec"] and (r["kv"], r["parallel"]) == (row["kv"], row["parallel"])]
    assert same, "no plan row of the same pick without a drafter"
    for key in ("decode_tps", "decode_tps_uncalibrated"):
        assert tried.plan[key] == pytest.approx(same[0][key], abs=0.15), key
    point = point_from(tried.plan, {"status": "OK", "workloads": {"n": {"decode_tps": {"mean": 81.0}}}})
    assert point is not None and point["planned_mid_tps"] == pytest.approx(sum(same[0]["decode_tps_uncalibrated"]) / 2,
                                                                            abs=0.1)
    assert random_weights_pick(pick_from_plan("smollm2-135m", rig="h200", engine="llama.cpp"))[0].plan[
        "spec_speedup"] == [1.0, 1.0]
