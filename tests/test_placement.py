"""A pick runs as planned, or the user is told exactly how it differs (issue 16, item 1).

Unit tests read real llama-server logs: the CUDA logs of an H200 launch
(benchmarks/data/gpu_launch_memory/server-*.log, with the prediction stored beside them in
runs.json), the ik_llama.cpp CPU log (tests/fixtures/ik_llamacpp/server.log). The refitted CUDA
log is that real log with the lines llama.cpp b11434 prints when its own fitting moves layers
(common/fit.cpp, llama-model.cpp's "offloaded N/M layers") put in, each substitution visible
below: no real engine refits a 7 MiB model on a 140 GiB GPU on demand.

The real tests launch llama-server on the CPU through the `engineroom` command: with
``--fit-target`` far beyond this machine's memory llama.cpp's own fitting cuts the context the
plan sized (8,192 cells for SmolLM2-135M's 4 default slots) to its 4,096 minimum, which `up`
must refuse in one sentence and stop, or keep and record with ``--accept-placement``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engineroom import placement
from engineroom.bench.integrity import checklist
from engineroom.engines import adapter
from engineroom.engines.base import LaunchOptions
from engineroom.engines.llamacpp import Binary, render

from conftest import cli

ROOT = Path(__file__).resolve().parent.parent
GPU_LOGS = ROOT / "benchmarks" / "data" / "gpu_launch_memory"
IK_LOG = ROOT / "tests" / "fixtures" / "ik_llamacpp" / "server.log"
MiB = 1024 * 1024


def _stored_plan(ctx: int) -> tuple[dict, dict]:
    """The prediction and FitRequest recorded with the H200 launch at ``ctx`` per sequence."""
    runs = json.loads((GPU_LOGS / "runs.json").read_text())
    run = next(r for r in runs if r["kind"] == "launch" and r["conditions"]["fit_request"]["ctx"] == ctx)
    rows = run["summary"]["memory"]
    predicted = {r["component"]: r["predicted_bytes"] for r in rows if r["predicted_bytes"] is not None}
    request = run["conditions"]["fit_request"]
    return predicted, {("parallel" if k == "n_seqs" else k): v for k, v in request.items()}   # recorded: old name


def _refitted(text: str) -> str:
    """The real H200 log as llama.cpp prints it when -fit moves 2 of its 5 layers to the host."""
    fit = ("common_params_fit_impl: cannot meet free memory target of 1024 MiB, need to reduce device memory "
           "by 512 MiB\n"
           "common_params_fit_impl:   - CUDA0 (NVIDIA H200): 3 layers ( 0 overflowing), 140000 MiB used, "
           "1024 MiB free\n")
    text = text.replace("common_params_fit_impl: will leave", fit + "common_params_fit_impl: was going to leave")
    text = text.replace("offloaded 5/5 layers to GPU", "offloaded 3/5 layers to GPU")
    text = text.replace("CPU_Mapped model buffer size =     3.38 MiB", "CPU_Mapped model buffer size =   203.38 MiB")
    return text


def test_real_h200_logs_are_placed_as_their_plans():
    eng = adapter("llama.cpp")
    for ctx, log in ((32768, "server-32768.log"), (4096, "server-4096.log")):
        actual = eng.placement_report((GPU_LOGS / log).read_text())
        assert actual is not None
        assert (actual.device, actual.layers_on_gpu, actual.layers_total, actual.slots) == ("gpu", 5, 5, 4)
        assert actual.ctx_total == ctx * 4 and actual.ctx_per_slot == ctx * 4   # unified: a slot may hold all
        assert actual.host_weights_bytes == round(3.38 * MiB) and actual.host_kv_bytes == 0
        predicted, request = _stored_plan(ctx)
        plan = placement.planned(predicted, request)
        assert plan is not None and plan.device == "gpu" and plan.ctx_total == ctx * 4
        verdict = placement.check("llama.cpp", plan, actual)
        assert verdict.status == "as_planned", verdict.detail
        assert placement.differences(plan, actual) == []


def test_layers_the_engine_moved_to_the_host_fail_with_one_sentence_naming_them_and_their_cost():
    text = _refitted((GPU_LOGS / "server-32768.log").read_text())
    actual = adapter("llama.cpp").placement_report(text)
    assert actual is not None and (actual.layers_on_gpu, actual.layers_total) == (3, 5)
    assert actual.engine_changes and actual.engine_changes[0].startswith("cannot meet free memory target of 1024 MiB")
    predicted, request = _stored_plan(32768)
    verdict = placement.check("llama.cpp", placement.planned(predicted, request), actual)
    assert verdict.status == "differs"
    assert [d.what for d in verdict.diffs] == ["layers", "host_weights"]
    sentence = verdict.detail
    assert sentence.count(". ") == 0 and sentence.endswith(".")          # one sentence
    assert "2 of 5 layers on the CPU, not the GPU" in sentence
    assert "203 MiB of weights in host memory, not the planned 3 MiB (GPU 4 MiB, plan 0 MiB)" in sentence
    assert "host-memory speed" in sentence and "every token reads 200 MiB more from host memory" in sentence
    assert "its own fitting said: cannot meet free memory target of 1024 MiB" in sentence
    assert "--accept-placement" in sentence
    accepted = placement.check("llama.cpp", placement.planned(predicted, request), actual, accept=True)
    assert accepted.status == "accepted" and "kept because --accept-placement was given" in accepted.detail
    # bench: moved layers stay a FAIL even when accepted (its figures are not the plan's)
    assert placement.check_record(accepted.as_dict())[0] == "FAIL"
    assert placement.check_record(verdict.as_dict())[0] == "FAIL"


def test_a_smaller_context_or_fewer_slots_than_planned_is_a_difference():
    actual = adapter("llama.cpp").placement_report((GPU_LOGS / "server-4096.log").read_text())
    assert actual is not None
    predicted, request = _stored_plan(4096)
    plan = placement.planned(predicted, {**request, "ctx": 8192, "parallel": 6})
    diffs = placement.differences(plan, actual)
    assert {d.what: (d.planned, d.actual) for d in diffs} == {"ctx_total": (49152, 16384), "slots": (6, 4)}
    text = placement.sentence("llama.cpp", diffs, actual)
    assert "a cache of 16,384 tokens, not the planned 49,152" in text
    assert "4 slots, not the planned 6 (only 4 requests run at once; the others wait)" in text
    # accepted and only context/slots: bench's placement check passes, naming what was accepted
    status, why = placement.check_record(placement.check("llama.cpp", plan, actual, accept=True).as_dict())
    assert status == "PASS" and "accepted with --accept-placement" in why and "16,384 tokens" in why


def test_ik_llamacpp_cpu_log_gives_context_per_slot_and_slots():
    actual = adapter("ik_llama.cpp").placement_report(IK_LOG.read_text())
    assert actual is not None
    assert (actual.device, actual.ctx_total, actual.ctx_per_slot, actual.slots) == ("cpu", 2048, 1024, 2)
    plan = placement.planned({"weights": 1, "kv_cache": 1}, {"ctx": 1024, "parallel": 2})
    assert placement.check("ik_llama.cpp", plan, actual).status == "as_planned"
    short = placement.planned({"weights": 1}, {"ctx": 2048, "parallel": 2})
    diffs = placement.differences(short, actual)
    assert [d.what for d in diffs] == ["ctx_total", "ctx_per_slot"]
    assert "a request longer than 1,024 tokens fails" in placement.sentence("ik_llama.cpp", diffs, actual)


def test_vllm_kv_pool_smaller_than_the_plan_is_fewer_sequences_at_full_length():
    """vLLM's real CPU log (2 GiB KV space: 93,184 tokens at max_model_len 2,048)."""
    actual = adapter("vllm").placement_report((ROOT / "tests" / "fixtures" / "vllm" / "start_2gib.log").read_text())
    assert actual is not None and (actual.ctx_total, actual.ctx_per_slot) == (93184, 2048)
    fits = placement.planned({"kv_pool": 1}, {"ctx": 2048, "parallel": 45})
    assert placement.check("vllm", fits, actual).status == "as_planned"
    more = placement.planned({"kv_pool": 1}, {"ctx": 2048, "parallel": 64})
    diffs = placement.differences(more, actual)
    assert [(d.what, d.planned, d.actual) for d in diffs] == [("ctx_total", 131072, 93184)]


def test_no_log_or_no_plan_is_unknown_not_a_pass():
    assert adapter("llama.cpp").placement_report("no buffers here\n") is None
    plan = placement.planned({"weights": 1}, {"ctx": 1024, "parallel": 1})
    assert placement.check("llama.cpp", plan, None).status == "unknown"
    assert placement.check("llama.cpp", None, placement.Placement()).status == "unknown"
    assert placement.check_record(None)[0] == "SKIP"
    assert placement.check_record({"status": "unknown", "detail": "x"}) == ("SKIP", "x")


def _no_cpu_fallback(conditions: dict) -> dict:
    checks = checklist({}, {}, {}, {}, conditions, "depth")
    return next(c for c in checks if c["name"] == "no_cpu_fallback")


def test_bench_integrity_reads_the_placement_stored_with_the_launch():
    h200 = {"gpus": [{"name": "NVIDIA H200"}]}
    text = _refitted((GPU_LOGS / "server-32768.log").read_text())
    predicted, request = _stored_plan(32768)
    plan = placement.planned(predicted, request)
    moved = placement.check("llama.cpp", plan, adapter("llama.cpp").placement_report(text), accept=True)
    # the old check passed such a launch: its memory rows name a GPU device
    rows = [{"component": "GPU0"}, {"component": "weights"}]
    check = _no_cpu_fallback({"host": h200, "memory": {"rows": rows, "placement": moved.as_dict()}})
    assert check["status"] == "FAIL" and "2 of 5 layers on the CPU" in check["detail"]
    fine = placement.check("llama.cpp", plan,
                           adapter("llama.cpp").placement_report((GPU_LOGS / "server-32768.log").read_text()))
    check = _no_cpu_fallback({"host": h200, "memory": {"rows": rows, "placement": fine.as_dict()}})
    assert check["status"] == "PASS" and "as planned" in check["detail"]
    assert _no_cpu_fallback({"host": h200, "memory": {"rows": rows}})["status"] == "SKIP"
    assert _no_cpu_fallback({"host": {"gpus": []}})["status"] == "PASS"


def test_llama_server_fitting_is_turned_off_unless_the_user_asks_for_it(tmp_path):
    binary = Binary(path=Path("/usr/bin/llama-server"), origin="test", env={})
    spec = render(binary, LaunchOptions(model_path=tmp_path / "m.gguf", port=8080, ctx=4096))
    assert spec.argv[-2:] == ("-fit", "off")
    assert spec.notes and "llama.cpp's own fitting" in spec.notes[0]
    mine = render(binary, LaunchOptions(model_path=tmp_path / "m.gguf", port=8080, ctx=4096,
                                        extra_args=("--fit-target", "4096")))
    assert "off" not in mine.argv and mine.argv[-2:] == ("--fit-target", "4096") and not mine.notes


def test_many_slots_do_not_copy_every_idle_slot_to_host_ram_on_each_request(tmp_path):
    """--no-cache-idle-slots where each slot keeps its own KV cache (the H200's 150-slot launch made
    9,081 idle-slot saves and a 32-stream suite timed out); one slot, a unified cache or the user's
    own flag: left to llama-server."""
    binary = Binary(path=Path("/usr/bin/llama-server"), origin="test", env={})
    many = render(binary, LaunchOptions(model_path=tmp_path / "m.gguf", port=8080, ctx=4096, parallel=8))
    assert "--no-kv-unified" in many.argv and many.argv[-1] == "--no-cache-idle-slots"
    assert any("duplicates it" in n for n in many.notes)
    one = render(binary, LaunchOptions(model_path=tmp_path / "m.gguf", port=8080, ctx=4096))
    shared = render(binary, LaunchOptions(model_path=tmp_path / "m.gguf", port=8080, ctx=4096, parallel=8,
                                          kv_unified=True))
    mine = render(binary, LaunchOptions(model_path=tmp_path / "m.gguf", port=8080, ctx=4096, parallel=8,
                                        extra_args=("--cache-idle-slots",)))
    for spec in (one, shared, mine):
        assert "--no-cache-idle-slots" not in spec.argv
    assert mine.argv[-1] == "--cache-idle-slots"


def test_the_prompt_cache_is_capped_at_what_the_launch_leaves_of_the_host():
    """llama-server grows its host prompt cache to --cache-ram MiB (8,192 by default) as requests come,
    memory the plan does not hold: below that much spare host memory the launch caps it there (0: off);
    a user's own flag wins; the fork has the same flag; an engine without such a cache adds nothing."""
    from engineroom.engines.llamacpp import host_cache_change

    change = host_cache_change(3 << 30)
    assert change is not None and change.args == ("--cache-ram", "3072") and change.source == "host memory"
    assert "capped at 3,072 MiB" in change.why and "8,192 MiB by default" in change.why
    assert host_cache_change(8192 << 20) is None and host_cache_change(1 << 40) is None
    off = host_cache_change(-(1 << 30))
    assert off is not None and off.args == ("--cache-ram", "0") and "turned off" in off.why
    assert host_cache_change(1 << 20, ("-cram", "512")) is None and host_cache_change(0, ("--cache-ram", "-1")) is None
    assert adapter("ik_llama.cpp").host_cache_change(1 << 30).args == ("--cache-ram", "1024")
    assert adapter("vllm").host_cache_change(0) is None


@pytest.mark.parametrize(("available_gib", "capped"), [(3, True), (64, False)])
def test_a_launch_on_this_machine_renders_the_prompt_cache_cap_its_prediction_leaves(monkeypatch, tmp_path,
                                                                                     available_gib, capped):
    """`up` (and `recipe`) on a machine whose usable RAM leaves under 8,192 MiB beside the launch: the
    argv carries --cache-ram at exactly what fit's prediction leaves, recorded as a change with its
    reason; with room to spare, llama-server's default stands (no flag)."""
    from dataclasses import replace

    from engineroom import flows, hardware
    from engineroom.hardware import Rig
    from engineroom.launchargs import LaunchArgs
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    rig = Rig(gpus=(), cpu_ram_bytes=max(16, available_gib) << 30, cpu_ram_available_bytes=available_gib << 30,
              cpu_cores=2, cpu_threads=2, label="test machine", source="detected")
    monkeypatch.setattr(hardware, "detect_rig", lambda *a, **k: rig)
    path = write_synthetic_gguf(replace(SHAPES["dense-s"], vocab_size=1024), "Q4_0", tmp_path / "m.gguf")
    prepared = flows.prepare(str(path), LaunchArgs(engine="llama.cpp", ctx=4096, parallel=2), require_binary=False)
    argv, spare = list(prepared.spec.argv), prepared.prediction.host_spare_bytes
    assert spare is not None and 0 < spare, prepared.prediction
    if capped:
        assert spare < 8192 << 20 and argv[argv.index("--cache-ram") + 1] == str(spare // 2**20)
        (change,) = [c for c in prepared.spec.changes if c["source"] == "host memory"]
        assert change["args"] == ["--cache-ram", str(spare // 2**20)] and "prompt cache" in change["why"]
    else:
        assert spare >= 8192 << 20 and "--cache-ram" not in argv


# --------------------------------------------------------------------------- real llama-server (CPU)
@pytest.fixture
def own_state_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path_factory.mktemp("placement-state")))


# llama.cpp's fitting with a free-memory target far beyond any machine's memory: on the CPU build it
# can change only an automatic context (no --ctx), which it cuts to its minimum (--fit-ctx, 4096)
REFIT = ("--", "--fit-target", "100000000")


def test_real_launch_the_engine_refits_is_refused_and_stopped(llama_server_binary, smollm2, own_state_dir):
    proc = cli("up", "smollm2-135m", "--port", "0", "-t", "2", *REFIT, timeout=300)
    try:
        assert proc.returncode != 0, proc.stdout
        said = " ".join(proc.stderr.split())
        assert "llama.cpp did not place this launch as planned: a cache of 4,096 tokens, not the planned 8,192" in said
        assert "its own fitting said: cannot meet free memory target of 100000000 MiB" in said
        assert "stopped it" in said and "Traceback" not in proc.stderr
        status = json.loads(cli("status", "--json").stdout)
        assert not status.get("running"), status
    finally:
        cli("down")


def test_real_launch_the_engine_refits_runs_with_accept_placement_and_is_recorded(llama_server_binary, smollm2,
                                                                                 own_state_dir):
    proc = cli("up", "smollm2-135m", "--port", "0", "-t", "2", "--accept-placement", "--json", *REFIT,
               timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        placed = json.loads(proc.stdout)["memory"]["placement"]
        assert placed["status"] == "accepted"
        assert [d["what"] for d in placed["differences"]] == ["ctx_total"]
        assert placed["actual"]["ctx_total"] == 4096 and placed["planned"]["ctx_total"] == 8192
        assert "kept because --accept-placement was given" in placed["detail"]
    finally:
        cli("down")


def test_real_launch_as_planned_says_so(llama_server_binary, smollm2, own_state_dir):
    proc = cli("up", "smollm2-135m", "--port", "0", "-t", "2", "--ctx", "1024", "--parallel", "2", "--json",
               timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        state = json.loads(proc.stdout)
        assert "-fit" in state["argv"] and state["argv"][state["argv"].index("-fit") + 1] == "off"
        placed = state["memory"]["placement"]
        assert placed["status"] == "as_planned", placed
        assert placed["actual"]["slots"] == 2 and placed["actual"]["ctx_total"] == 2048
    finally:
        cli("down")


def test_real_slot_context_the_engine_caps_at_the_trained_length_is_refused(llama_server_binary, smollm2,
                                                                            own_state_dir):
    """`--rope-scaling yarn` without a factor leaves llama-server's trained length (8,192 for SmolLM2)
    in place, and b11434 caps every slot there (server-context.cpp n_ctx_slot): a launch planned at
    16,384 tokens per slot is refused after the launch, or before it where the RoPE check knows."""
    proc = cli("up", "smollm2-135m", "--port", "0", "-t", "2", "--ctx", "16384", "--parallel", "1",
               "--", "--rope-scaling", "yarn", timeout=300)
    try:
        said = " ".join(proc.stderr.split())
        assert proc.returncode != 0, proc.stdout
        assert "Traceback" not in proc.stderr
        assert ("8,192 tokens per slot, not the planned 16,384 (a request longer than 8,192 tokens fails)" in said
                or "8,192" in said and "--rope-scale" in said), said
        assert not json.loads(cli("status", "--json").stdout).get("running")
    finally:
        cli("down")
