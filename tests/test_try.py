"""engineroom try: the plan's pick measured on this machine on a random-weight file of the model's
exact architecture and quant, before any download (issue 19): the llama.cpp family on the file's weights,
vLLM on weights it makes itself (its dummy loading) from the file's shape and tokenizer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engineroom.errors import BadInput, NotFound

from conftest import MACHINE_CHECKS, cli

SMOLLM2_CONFIG = Path(__file__).parent / "fixtures" / "configs" / "smollm2-135m.json"   # a model by its config.json


def test_try_measures_the_plans_pick_on_a_random_weight_file(llama_server_binary, smollm2, tmp_path, monkeypatch):
    """The real llama-server on a random SmolLM2-shaped Q4_1 file: fit's prediction against the
    engine's own buffers, placement as planned, a decode measured beside the plan's band, the file
    deleted, the run stored with what try did and what random weights cannot say."""
    from engineroom.store import Store

    files = tmp_path / "files"
    # a store of its own: the speed point this run makes must calibrate this test's plan alone
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = cli("try", "smollm2-135m", "--engine", "llama.cpp", "--ctx", "1024", "--folder", str(files), "--json",
               env=env, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["bench_status"]) in ((0, "OK"), (1, "INVALID")), out
    assert {f.split(":")[0] for f in out["bench_failed"]} <= MACHINE_CHECKS, out["bench_failed"]
    assert (out["pick"]["engine"], out["pick"]["quant"], out["pick"]["ctx"]) == ("llama.cpp", "Q4_1", 1024)
    rows = {r["component"]: r for r in out["memory_rows"]}
    for component in ("weights", "kv_cache", "compute", "total"):
        assert abs(rows[component]["error_pct"]) < 1.0, rows[component]
    assert out["placement"]["status"] == "as_planned", out["placement"]
    low, high = out["decode_band"]
    assert 0 < low < high and out["decode_tps"] > 0
    assert out["kept"] is None and not list(files.rglob("*.gguf"))         # the file is gone
    assert any("answer quality" in x for x in out["not_meaningful"])
    assert "write smollm2-135m-Q4_1-random.gguf" in proc.stderr             # progress, with --json too
    assert [(s["stage"], s["outcome"]) for s in out["stages"]] == [
        ("plan", "done"), ("write", "done"), ("launch", "done"), ("bench", "done"), ("down", "done")]
    with Store() as store:
        run = store.get_run(out["run_id"])
    conditions = run["conditions"] if isinstance(run["conditions"], dict) else json.loads(run["conditions"])
    assert conditions["try"]["quant"] == "Q4_1" and conditions["try"]["file_bytes"] == out["file_bytes"]
    # the run calibrates the next plan here (issue 19 item 2) when its bench was valid, and only then
    again = cli("plan", "smollm2-135m", "--engine", "llama.cpp", "--ctx", "1024", "--priority", "balanced",
                "--json", env=env)
    row = json.loads(again.stdout)["plans"][0]
    assert (row["quant"], row["kv"]) == (out["pick"]["quant"], out["pick"]["kv"])
    point = out["calibrated_by"]
    if out["bench_status"] != "OK":
        assert point is None and row["speed_basis"].startswith("uncalibrated"), (point, row["speed_basis"])
        return
    assert point["engine"] == "llama.cpp" and point["shape"] == "dense" and point["measured_tps"] > 0
    assert point["run_id"] == out["run_id"]         # this run's id (it said 0 on the H200 visit of 2026-12-04)
    assert row["speed_basis"].startswith("calibrated") and f"#{out['run_id']}" in row["speed_basis"], row["speed_basis"]
    middle = sum(row["decode_tps"]) / 2             # the same launch: its band now centres on what was measured
    assert abs(middle - out["decode_tps"]) / out["decode_tps"] < 0.02, (row["decode_tps"], out["decode_tps"])
    assert row["decode_tps_uncalibrated"] == out["decode_band"]


@pytest.mark.integration
def test_engine_arguments_after_the_double_dash_reach_the_engine_and_make_no_speed_point(
        llama_server_binary, smollm2, tmp_path, monkeypatch):
    """`try MODEL -- ARGS` launches the pick with the engine's own ARGS after its own (vLLM on the H200 needed
    `--gdn-prefill-backend triton` where FlashInfer was not installed), records them, and, since the launch is
    no longer the pick's, stores no speed point: the next plan stays uncalibrated and says so."""
    from engineroom.store import Store

    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = cli("try", "smollm2-135m", "--engine", "llama.cpp", "--ctx", "1024", "--folder", str(tmp_path / "files"),
               "--runs", "1", "--json", "--", "-ub", "256", env=env, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["pick"]["engine_args"] == ["-ub", "256"] and out["calibrated_by"] is None, out
    assert "calibration: none from this run (engine arguments typed after --: -ub 256)" in out["left_out"]
    with Store() as store:
        launch = store.runs(5, kind="launch")[0]["conditions"]
        conditions = store.get_run(out["run_id"])["conditions"]
    argv = launch["argv"]
    assert argv[len(argv) - 1 - argv[::-1].index("-ub") + 1] == "256", argv     # the last -ub: the one typed
    assert conditions["try"]["engine_args"] == ["-ub", "256"] and launch["plan"]["typed"] == ["engine_args"]
    again = json.loads(cli("plan", "smollm2-135m", "--engine", "llama.cpp", "--ctx", "1024", "--priority",
                           "balanced", "--json", env=env).stdout)["plans"][0]
    assert again["speed_basis"].startswith("uncalibrated"), again["speed_basis"]


def test_try_refuses_a_pick_it_cannot_make_random_weights_for_in_one_sentence(tmp_path, monkeypatch):
    """vLLM's dummy loading makes 16-bit and 4-bit packed (AWQ, GPTQ, AutoRound) weights; an fp8 vLLM pick (the H200's
    plan: this machine's vLLM build runs no fp8) would be measured at another size, so it is refused."""
    from engineroom.flows import picks, trying

    real = picks.pick_from_plan
    monkeypatch.setattr(trying, "pick_from_plan", lambda model, **kw: real(model, **{**kw, "rig": "h200"}))
    with pytest.raises(BadInput, match=r"vllm fp8 \(fp8 weights\).*--quant awq-int4 \(or bf16\) for vLLM"):
        trying.try_model(None, str(SMOLLM2_CONFIG), engine="vllm", quant="fp8", folder=tmp_path)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())                                       # nothing written
    from engineroom import engines

    assert engines.adapter("vllm").random_weights_loading("fp8") is None
    assert "--load-format dummy" in (engines.adapter("vllm").random_weights_loading("autoround") or "")
    assert engines.adapter("llama.cpp").random_weights_loading("bf16") is None     # it serves the file's own


def test_a_shape_only_file_says_it_is_random_and_vllm_serves_it_with_its_own_weights(tmp_path):
    """synth marks every file it writes; without tensors it is the shape and tokenizer alone. vLLM's folder of such a
    file says dummy weights, and its command line asks vLLM to make them (a converted folder's does not)."""
    from engineroom.arch.gguf import read_gguf_header_local
    from engineroom.catalog import arch_from_catalog, load_catalog
    from engineroom.engines import vllm
    from engineroom.engines.base import LaunchOptions
    from engineroom.engines.hffolder import SOURCE_FILE
    from engineroom.synth import RANDOM_WEIGHTS_KEY, write_synthetic_gguf

    arch = arch_from_catalog(load_catalog().model("smollm2-135m"))
    shape = read_gguf_header_local(write_synthetic_gguf(arch, "F16", tmp_path / "s.gguf", tensors=False))
    full = read_gguf_header_local(write_synthetic_gguf(arch, "Q4_1", tmp_path / "f.gguf"))
    assert shape.kv[RANDOM_WEIGHTS_KEY] is True and full.kv[RANDOM_WEIGHTS_KEY] is True
    assert not shape.tensors and full.tensors and shape.kv["llama.vocab_size"] == arch.vocab_size
    for weights, dummy in (("dummy", True), ("converted", False)):
        folder = tmp_path / weights
        folder.mkdir()
        (folder / SOURCE_FILE).write_text(json.dumps({"dtype": "float16", "weights": weights}))
        argv = list(vllm.render(vllm.placeholder_binary(), LaunchOptions(model_path=folder, ctx=1024)).argv)
        assert ("--load-format" in argv and argv[argv.index("--load-format") + 1] == "dummy") is dummy, argv


def test_try_checks_the_disk_before_writing(tmp_path, monkeypatch):
    import shutil

    from engineroom.flows.trying import try_model

    monkeypatch.setattr(shutil, "disk_usage", lambda _p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    with pytest.raises(BadInput, match=r"takes 0\.\d+ GiB and .* has 0\.0 GiB free; give --folder"):
        try_model(None, "smollm2-135m", engine="llama.cpp", ctx=1024, folder=tmp_path)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


def test_try_says_a_missing_engine_before_writing_anything(tmp_path, monkeypatch):
    from engineroom.flows.trying import try_model

    monkeypatch.setenv("ENGINEROOM_LLAMA_SERVER", str(tmp_path / "no-llama-server"))
    with pytest.raises(NotFound, match=r"is not an executable file; try writes its random-weight file only once"):
        try_model(None, "smollm2-135m", engine="llama.cpp", ctx=1024, folder=tmp_path)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "vocab_size": 1024,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def test_a_model_given_by_its_absolute_path_keeps_its_folder(tmp_path, monkeypatch):
    """try of a config.json (or .gguf) by absolute path: the random file goes into try's own scratch folder
    and only that folder is removed. Found on the H200 visit of 2026-12-04 (a CPU dry run first): the
    file's name was the model's id, an absolute path, so the file landed beside the model and the
    clean-up deleted the model's folder with everything in it."""
    from engineroom import synth
    from engineroom.flows import trying

    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    config = model_dir / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    (model_dir / "weights.safetensors").write_bytes(b"the user's weights")
    files = tmp_path / "files"
    written = []

    def write(_arch, _quant, path, **_kw):
        written.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"random")
        return path

    class Found:
        def find_binary(self, _explicit):
            return "llama-server"

    def no_launch(*_a, **_kw):
        raise RuntimeError("the launch failed")

    monkeypatch.setattr(synth, "write_synthetic_gguf", write)
    monkeypatch.setattr(trying.engines, "adapter", lambda _name: Found())
    monkeypatch.setattr(trying, "served", no_launch)
    with pytest.raises(RuntimeError, match="the launch failed"):
        trying.try_model(None, str(config), engine="llama.cpp", ctx=1024, folder=files)  # type: ignore[arg-type]
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json", "weights.safetensors"]
    assert len(written) == 1 and written[0].parent.parent == files, written
    assert written[0].name == "config.json-Q4_K_M-random.gguf" or written[0].name.startswith("config.json-")
    assert not list(files.iterdir())                                          # the scratch folder is gone


def test_the_random_files_name_is_the_models_last_path_part():
    from engineroom.flows.trying import random_file_name

    assert random_file_name("qwen3.6-27b", "Q4_K_M") == "qwen3.6-27b-Q4_K_M-random.gguf"
    assert random_file_name("/models/qwen/config.json", "Q4_K_M") == "config.json-Q4_K_M-random.gguf"
    assert random_file_name("tests/fixtures/configs/qwen3.5-35b-a3b.json", "Q8_0") == \
        "qwen3.5-35b-a3b.json-Q8_0-random.gguf"
    assert random_file_name("hf:org/repo/Model Q4.gguf", "Q4_0") == "Model-Q4.gguf-Q4_0-random.gguf"
    assert random_file_name("C:\\models\\m.gguf", "Q4_0") == "m.gguf-Q4_0-random.gguf"


def test_the_card_says_a_vision_tower_the_engine_built_anyway_was_sized_not_left_out():
    """A pick with vision is tried text-only where the engine serves it so (llama.cpp: no projector; vLLM:
    --language-model-only); SGLang builds Qwen3.6's tower whatever the pick's vision, and its launch's fit request
    says so: the card then says the tower was sized and measured, and no longer that it was left out."""
    from engineroom.flows.trying import vision_said

    left = ["spec-decode (mtp): acceptance against random weights means nothing",
            "vision: the random-weight file carries no projector; tried text-only"]
    assert vision_said(left, "vllm", {"fit_request": {"vision": False}}) == left
    assert vision_said(left, "llama.cpp", {}) == left
    built = vision_said(left, "sglang", {"fit_request": {"vision": True}})
    assert built[0] == left[0] and len(built) == 2
    assert built[1].startswith("vision: sglang builds the model's vision tower") and "sized and measured" in built[1]
    assert vision_said([], "sglang", {"fit_request": {"vision": True}})[0].startswith("vision: sglang builds")


def test_the_speed_point_try_reports_carries_its_runs_id():
    from engineroom.flows.trying import _point_of

    stored = {"run_id": 0, "engine": "llama.cpp", "shape": "moe", "measured_tps": 230.56, "planned_mid_tps": 235.15}
    assert _point_of(21, stored) == {**stored, "run_id": 21}
    assert _point_of(21, None) is None


# a small Qwen3-MoE (16 experts, 4 active) with SmolLM2's vocabulary, so the random file takes its tokenizer whole
TINY_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512,
            "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "vocab_size": 49152,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_try_and_tune_a_moe_shape_on_the_real_llama_server(llama_server_binary, smollm2, tmp_path, monkeypatch):
    """Issue 19's CI shapes, the MoE one: `try` of a small Qwen3-MoE config.json (its random Q4_K_M file
    written here) placed as planned with fit's weights and KV exact, then `tune --random` of the same
    config for one stream's decode over the threads knob (4 boots of the real llama-server)."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "tiny-moe" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_MOE))
    files = tmp_path / "files"
    proc = cli("try", str(config), "--engine", "llama.cpp", "--ctx", "1024", "--folder", str(files), "--json",
               env=env, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert {f.split(":")[0] for f in out["bench_failed"]} <= MACHINE_CHECKS, out["bench_failed"]
    assert out["pick"]["engine"] == "llama.cpp" and out["placement"]["status"] == "as_planned", out["placement"]
    rows = {r["component"]: r for r in out["memory_rows"]}
    for component in ("weights", "kv_cache"):
        assert abs(rows[component]["error_pct"]) < 1.0, rows[component]
    assert out["decode_tps"] > 0 and out["kept"] is None and not list(files.rglob("*.gguf"))
    tuned = cli("tune", str(config), "--random", "--engine", "llama.cpp", "--ctx", "1024", "--knob", "threads",
                "--max-tokens", "128", "--folder", str(files), "--json", env=env, timeout=600)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    result = json.loads(tuned.stdout)
    [trial] = result["trials"]
    assert trial["knob"] == "threads (-t)" and trial["outcome"] in ("kept", "not kept", "not measured"), trial
    assert result["random_weights"] and result["pick"]["weights"]["quant"] == out["pick"]["quant"]
    if trial["outcome"] != "not measured":
        assert len(trial["runs_a"]) == len(trial["runs_b"]) == 2 and trial["a_mean"] > 0 and trial["b_mean"] > 0
    assert not list(files.rglob("*.gguf"))


@pytest.mark.integration
def test_try_of_a_vllm_awq_pick_serves_vllms_own_packed_random_weights(vllm_python, smollm2, tmp_path, monkeypatch):
    """The real vLLM (CPU build) on SmolLM2's shape given by its config.json, planned at awq-int4: try writes the
    shape and tokenizer alone (a few MB, not the weights); the folder's quantization_config names AWQ at the largest
    group that divides the shape (576 = 9 x 64); vLLM builds its packed layers and makes their weights
    (--load-format dummy) at float16 (it refuses float32 for AWQ); fit sizes the weights packed and its KV pool
    against vLLM's own, placement as planned, a decode measured, the file deleted. (vLLM's 16-bit random weights
    run in tests/test_bakeoff.py's --random bakeoff.)"""
    from engineroom import paths
    from engineroom.store import Store

    files = tmp_path / "files"
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", env["ENGINEROOM_STATE_DIR"])
    proc = cli("try", str(SMOLLM2_CONFIG), "--engine", "vllm", "--quant", "awq-int4", "--ctx", "2048", "--folder",
               str(files), "--busy-ok", "--json", env=env, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["bench_status"]) in ((0, "OK"), (1, "INVALID")), out
    assert {f.split(":")[0] for f in out["bench_failed"]} <= MACHINE_CHECKS, out["bench_failed"]
    assert (out["pick"]["engine"], out["pick"]["quant"]) == ("vllm", "awq-int4")
    assert "awq 4-bit weights" in proc.stderr and out["decode_tps"] > 0 and not list(files.rglob("*.gguf"))
    assert out["file_bytes"] < 20 * 2**20 and "shape and tokenizer" in proc.stderr, out["file_bytes"]
    rows = {r["component"]: r for r in out["memory_rows"]}
    assert rows["weights"]["predicted_bytes"] < 0.4 * 134_515_008 * 2, rows["weights"]     # packed, not 16-bit
    assert rows["kv_pool"]["measured_bytes"] and abs(rows["kv_pool"]["error_pct"]) < 1.0, rows["kv_pool"]
    assert out["placement"]["status"] == "as_planned", out["placement"]
    folders = sorted((paths.cache_dir() / "vllm-models").glob("*-dummy-awq"), key=lambda f: f.stat().st_mtime)
    config = json.loads((folders[-1] / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["bits"], config["group_size"]) == ("awq", 4, 64), config
    with Store() as store:
        launch = [r for r in store.runs(20, kind="launch") if r.get("status") == "OK"]
    argv = launch[0]["conditions"]["argv"] if launch else []
    assert argv[argv.index("--load-format") + 1] == "dummy" and argv[argv.index("--dtype") + 1] == "float16", argv
    if out["bench_status"] == "OK":           # a valid run is a speed point of AWQ weights, for AWQ picks alone
        assert (out["calibrated_by"]["engine"], out["calibrated_by"]["family"]) == ("vllm", "awq"), out["calibrated_by"]


def test_the_try_card_says_where_the_decode_fell_and_which_weights_its_point_calibrates():
    from engineroom.report.trying import try_text

    point = {"engine": "vllm", "shape": "dense", "family": "awq", "measured_tps": 31.8, "planned_mid_tps": 91.15}
    text = try_text({"model": "m", "pick": {"engine": "vllm", "quant": "awq-int4"}, "decode_band": [37.9, 144.4],
                     "decode_tps": 31.8, "speed_basis": "uncalibrated", "calibrated_by": point, "bench_status": "OK"})
    assert "decode: 31.8 tok/s measured, below the plan's band 37.9-144.4 tok/s" in text
    assert "speed point for vllm (dense shapes, awq weights) on this machine: measured / planned middle = 0.35" in text


@pytest.mark.integration
def test_the_folder_vllm_makes_random_weights_from_keeps_an_untied_head_untied(vllm_python, tmp_path, monkeypatch):
    """A file of the metadata alone has no output.weight, so transformers read it as a tied head: Qwen3.6-27B's
    dummy folder was tied, and vLLM would have made 2.5 GB less of weights (its 248,320 x 5,120 head) and read
    them less per token than the model it stands for. The file says whether the head is tied
    (synth.TIED_KEY), and the folder written in vLLM's own environment says it as the model does, with the pick's
    packed quantization_config. A shape given by its config.json travels whole (synth.HF_CONFIG_KEY): the folder
    is that config (its architecture class, the vision tower's config that vLLM 0.26's Qwen3.5 class reads even
    text-only: the GGUF's reading, Qwen3_5ForCausalLM, failed on the H200 on 2026-12-05), at float16.
    Its tokenizer reads whatever architecture the shape file has: transformers reads a GGUF's tokenizer only for the
    architectures its GGUF reader knows (SGLang 0.5.16's transformers 5.12.1 refused qwen35, vLLM's 5.19 refuses
    DeepSeek-V3's deepseek2), so the folder's tokenizer comes from the shape file's vocabulary alone, filed under
    the architecture that vocabulary comes from (SmolLM2's llama), once per vocabulary and environment."""
    from engineroom.arch import arch_from_gguf
    from engineroom.arch.config import arch_from_config, read_config
    from engineroom.engines import hffolder
    from engineroom.flows.serving import served_arch
    from engineroom.synth import write_synthetic_gguf

    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    root = Path(__file__).parent / "fixtures" / "configs"
    vision_left_at_16_bits: list[dict] = []
    for name, fmt, tied in (("qwen3.6-27b.json", "gptq", False), ("smollm2-135m.json", "autoround", True)):
        arch = arch_from_config(root / name)
        assert arch.tie_embeddings is tied
        for carried in (None, read_config(root / name)[0]):
            gguf = write_synthetic_gguf(arch, "F16", tmp_path / f"{name}-{bool(carried)}-F16-random.gguf",
                                        tensors=False, hf_config=carried)
            folder = hffolder.folder_of(gguf, engine="vllm", python=lambda: vllm_python.path, weights_format=fmt)
            config = json.loads((folder / "config.json").read_text())
            text = config.get("text_config") or config
            assert text["tie_word_embeddings"] is tied, (name, carried is not None)
            assert text["vocab_size"] == arch.vocab_size and text["num_hidden_layers"] == arch.n_layers
            assert config["quantization_config"]["quant_method"] == {"gptq": "gptq", "autoround": "auto-round"}[fmt]
            assert hffolder.dummy_weights(folder) and hffolder.source_of(folder)["quant_format"] == fmt
            if carried is not None:
                # what fit sizes the launch by: the folder's config (the shape file has no tensors to tell the
                # layer kinds or the head from: it sized the 27B's gptq pick as 23.1B parameters, H100 2026-12-05)
                sized = served_arch(arch_from_gguf(gguf), gguf, folder)
                assert sized is not None and (sized.param_count, sized.layer_kinds, sized.tie_embeddings) == (
                    arch.param_count, arch.layer_kinds, tied), name
                assert config["architectures"] == carried["architectures"] and config["torch_dtype"] == "float16"
                assert ("vision_config" in config) == ("vision_config" in carried)
                processor = hffolder.source_of(folder).get("processor")
                if "vision_config" in carried:
                    vision_left_at_16_bits.append({"folder": str(folder), "config": config["quantization_config"]})
                    # the processor's files where this environment can build it (vLLM's CPU one has no
                    # torchvision: said, and vLLM serves text-only without one), the tower's geometry always
                    assert processor == "written" or processor.startswith("not written: "), processor
                    assert json.loads((folder / "preprocessor_config.json").read_text())["patch_size"] == 16
                else:
                    assert processor is None and not list(folder.glob("*processor_config.json"))
    assert "vision_config" in read_config(root / "qwen3.6-27b.json")[0]
    deepseek = arch_from_config(root / "deepseek-v3.json")
    gguf = write_synthetic_gguf(deepseek, "F16", tmp_path / "deepseek-v3-F16-random.gguf", tensors=False,
                                hf_config=read_config(root / "deepseek-v3.json")[0])
    mla = hffolder.folder_of(gguf, engine="vllm", python=lambda: vllm_python.path)
    assert json.loads((mla / "config.json").read_text())["architectures"] == ["DeepseekV3ForCausalLM"]
    assert not list(mla.parent.glob("*-tokenizer")), "the tokenizer file is removed after use"
    # each vocabulary is read by the environment's transformers once (32 s for the 27B's 248,320 tokens here), then
    # copied: the five folders of three vocabularies made three readings
    saved = sorted(p.name for p in (tmp_path / "cache" / "vllm-models" / "tokenizers").iterdir())
    assert len(saved) == 3 and not [n for n in saved if n.endswith(".partial")], saved
    # the vision tower stays at 16 bits, as published checkpoints leave it (its 4,304-wide MLP divides no group of
    # 128: vLLM 0.26 found no int4 kernel for it on the H100), said the way vLLM's own GPTQ config reads it; and the
    # decoder blocks are quantized although the folder has no safetensors for vLLM to read the quantized modules
    # from (without modules_in_block_to_quantize it quantized nothing: 50.2 GiB of 16-bit weights, H100 2026-12-05)
    (gptq,) = vision_left_at_16_bits
    check = ("import json, sys\n"
             "from vllm.model_executor.layers.quantization import get_quantization_config\n"
             "from vllm.model_executor.layers.quantization.utils.gptq_utils import get_dynamic_override, "
             "is_layer_gptq_quantized\n"
             "c = get_quantization_config('gptq').from_config(json.loads(sys.argv[1]))\n"
             "c.maybe_update_config(sys.argv[2])\n"
             "names = ('visual.blocks.0.mlp.linear_fc1', 'language_model.model.layers.0.mlp.down_proj')\n"
             "print(json.dumps([get_dynamic_override(c, n) for n in names] + [is_layer_gptq_quantized(n, "
             "c.modules_in_block_to_quantize) for n in names[1:] + ('language_model.lm_head',)]))\n"
             "from transformers import AutoTokenizer\n"
             "t = AutoTokenizer.from_pretrained(sys.argv[3])\n"
             "ids = t('The capital of France is Paris.', add_special_tokens=False)['input_ids']\n"
             "print(json.dumps([len(t), len(ids), t.decode(ids)]))\n")
    proc = subprocess.run([str(vllm_python.path), "-c", check, json.dumps(gptq["config"]), gptq["folder"], str(mla)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the tower skipped; a block's layer as configured and quantized; the head not
    assert json.loads(proc.stdout.strip().splitlines()[-2]) == [False, None, True, False]
    # DeepSeek-V3's folder: the shape's vocabulary size, and text that encodes and decodes as itself
    size, n_ids, text = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (size, text) == (deepseek.vocab_size, "The capital of France is Paris.") and n_ids >= 5


def test_a_4bit_folder_of_a_model_with_vision_leaves_the_tower_at_16_bits_by_each_methods_convention():
    from engineroom.engines import hffolder

    text = {f: hffolder.quantization_config(f) for f in ("awq", "gptq", "autoround")}
    seen = {f: hffolder.quantization_config(f, vision=True) for f in ("awq", "gptq", "autoround")}
    restrictions = {"modules_to_not_convert", "dynamic", "block_name_to_quantize"}
    assert all(not restrictions & set(c or {}) for c in text.values())
    assert "visual" in seen["awq"]["modules_to_not_convert"]
    (rule,) = seen["gptq"]["dynamic"]
    assert rule.startswith("-:") and "visual" in rule
    assert seen["autoround"]["block_name_to_quantize"] == "model.language_model.layers"
    assert all(c["group_size"] == hffolder.INT4_GROUP and c["bits"] == 4 for c in seen.values())
    assert hffolder.quantization_config("fp8", vision=True) is None


def test_a_catalog_model_tried_on_an_engine_that_builds_it_gets_its_own_config_from_the_hub_cache(tmp_path,
                                                                                                  monkeypatch):
    """vLLM and SGLang build the model from the folder's config.json; for a catalog id, try takes the model's own
    (the catalog's hf_config repo, through huggingface_hub: its cached copy when the hub is unreachable, as here).
    Without one it says so and falls back to transformers' reading of the shape file, which vLLM 0.26 does not
    build for Qwen3.6-27B (Qwen3_5ForCausalLM: the H200 try by catalog id, 2026-12-05)."""
    from huggingface_hub import constants

    from engineroom.arch.config import read_config
    from engineroom.flows.trying import model_config

    said: list[str] = []
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert model_config("qwen3.6-27b", "Qwen/Qwen3.6-27B", said.append) is None
    assert len(said) == 1 and "no cached copy exists" in said[0] and "Qwen/Qwen3.6-27B" in said[0], said
    # huggingface_hub's cache layout: refs/main names the snapshot holding the file
    repo = tmp_path / "hub" / "models--Qwen--Qwen3.6-27B"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    published = Path(__file__).parent / "fixtures" / "configs" / "qwen3.6-27b.json"
    (repo / "snapshots" / commit / "config.json").write_text(published.read_text())
    got = model_config("qwen3.6-27b", "Qwen/Qwen3.6-27B", said.append)
    assert got == read_config(published)[0] and got["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert len(said) == 1
    # a config.json given by path is read as it is, whatever the catalog says
    assert model_config(str(published), None, said.append) == got


def test_a_composite_config_giving_its_text_model_the_whole_models_type_is_refused_before_any_engine_starts(
        tmp_path, monkeypatch):
    """Intel's MLX re-upload of Qwen3.6-27B's config names the text model "qwen3_5", the whole model's type (Qwen's
    own: "qwen3_5_text"): vLLM 0.26 picked the text class by it and failed 80 s into the launch on an H100
    ("Invalid model_type qwen3_5"). vLLM and SGLang refuse such a folder with one sentence, and a random-weight
    folder is not written from such a config; the published layout passes."""
    from engineroom.arch.config import arch_from_config, read_config
    from engineroom.engines import hffolder
    from engineroom.engines.sglang import command as sglang_command
    from engineroom.engines.vllm import command as vllm_command
    from engineroom.synth import write_synthetic_gguf

    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    published = Path(__file__).parent / "fixtures" / "configs" / "qwen3.6-27b.json"
    config = read_config(published)[0]
    mlx = json.loads(json.dumps(config))
    mlx["text_config"]["model_type"] = mlx["model_type"]
    good, bad = tmp_path / "published", tmp_path / "mlx"
    for folder, data in ((good, config), (bad, mlx)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(data))
    for refusal, name in ((vllm_command.loads_refusal, "vLLM"), (sglang_command.loads_refusal, "SGLang")):
        assert refusal(good) is None
        why = refusal(bad)
        assert why and "text model the whole model's type ('qwen3_5')" in why and f"{name} picks" in why, why
        assert why.count(".") <= 3 and "\n" not in why
    # the shape file carries the config whole: its folder is refused before the engine's Python is asked for
    arch = arch_from_config(published)
    gguf = write_synthetic_gguf(arch, "F16", tmp_path / "mlx-F16-random.gguf", tensors=False, hf_config=mlx)

    def no_engine() -> Path:
        raise AssertionError("the engine's environment was asked for")

    with pytest.raises(BadInput, match="use the config.json of the model's own repository"):
        hffolder.folder_of(gguf, engine="vllm", python=no_engine)
