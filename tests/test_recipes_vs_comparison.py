"""docs/recipes-vs-comparison.md is what benchmarks/recipes_vs_comparison.py writes today (issue 15
item 3): the recipes engineroom renders for Qwen3.6-27B on 1x3090 and 2x3090, flag by flag against
the comparison's tested configurations. Recipes start nothing and need no engine (a second: the slow unit tier)."""

from __future__ import annotations

import pytest

from conftest import benchmark_script

rvc = benchmark_script("recipes_vs_comparison")


@pytest.mark.slow
def test_the_committed_table_is_what_the_script_writes_today(capsys):
    code = rvc.main(["--check"])
    assert code == 0, "docs/recipes-vs-comparison.md has drifted:\n" + capsys.readouterr().out[-4000:]


def test_a_command_line_is_read_in_the_comparisons_terms():
    vllm = ["python", "-m", "x", "--model", "Lorbus/Qwen3.6-27B-int4-AutoRound", "--max-model-len", "49152",
            "--max-num-seqs", "1", "--kv-cache-dtype", "turboquant_3bit_nc", "--tensor-parallel-size", "2",
            "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}', "--tool-call-parser",
            "qwen3_coder", "--language-model-only"]
    got = rvc.facts("vllm", vllm)
    assert got["ctx"] == 49152 and got["tp"] == 2 and got["parallel"] == 1 and got["vision"] is False
    assert got["spec"] == {"method": "mtp", "tokens": 3} and got["tools"] == "qwen3_coder" and got["reasoning"] is False
    ik = ["llama-server", "-m", "/m/Qwen3.6-27B-IQ4_KS.gguf", "-c", "524288", "-np", "2", "-ctk", "q4_0",
          "--mmproj", "/m/mmproj.gguf", "--jinja", "-khad", "-vhad", "-mqkv", "--spec-type", "draft-mtp",
          "--draft-max", "2"]
    got = rvc.facts("ik_llama.cpp", ik)
    assert got["ctx"] == 262144 and got["parallel"] == 2 and got["kv"] == "q4_0" and got["vision"] and got["tools"]
    assert got["spec"] == {"method": "mtp", "tokens": 2}
    assert rvc.same("fork_flags", ["-khad", "-vhad", "--merge-qkv"], got["fork_flags"])
    assert not rvc.same("fork_flags", ["--parallel-tool-calls"], got["fork_flags"])


def test_the_comparisons_k_is_read_either_way_and_nothing_else_passes():
    assert rvc.same("ctx", 214000, 219136) and rvc.same("ctx", 262144, 262144)
    assert not rvc.same("ctx", 214000, 91136) and not rvc.same("ctx", 49152, None)
    assert rvc.same("weights", "(?i)iq4_ks", "hf:ubergarm/Qwen3.6-27B-GGUF/Qwen3.6-27B-IQ4_KS.gguf")
    assert not rvc.same("weights", "(?i)lorbus/.*autoround", "Qwen/Qwen3.6-27B")
    assert rvc.same("spec", "none", "none") and not rvc.same("spec", "none", {"method": "mtp", "tokens": 3})
    assert rvc.reason("ctx", ["priority max-context does not promise vision: served text-only"]).startswith(
        "engineroom states no reason")
