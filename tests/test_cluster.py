"""Rigs of several nodes: the spec grammar, fit's TP x PP per pipeline stage, and plan's layouts."""

from __future__ import annotations

import pytest

from engineroom.catalog import arch_from_catalog, find_model, load_catalog
from engineroom.errors import BadInput
from engineroom.fit import FitRequest, Verdict, fit
from engineroom.fit.pool import stage_layers
from engineroom.hardware import parse_rig
from engineroom.plan import plan

CAT = load_catalog()
QWEN = arch_from_catalog(find_model(CAT, "qwen3.6-27b"))


def test_node_spec_is_one_nodes_gpus_times_nodes():
    rig = parse_rig("2x(8xH100)")
    assert rig.nodes == 2 and rig.n_gpus == 8 and rig.label == "2x(8xH100)"
    assert parse_rig("8xH100").nodes == 1
    for bad, why in [("2x(cpu:64GB)", "without discrete GPUs"), ("0x(8xh100)", "0 nodes"),
                     ("2x(2x(1xh100))", "nests nodes"), ("2x(8xnope)", "unknown hardware class")]:
        with pytest.raises(BadInput, match=why):
            parse_rig(bad)


def test_stage_layers_split_contiguously_and_evenly():
    assert [list(r) for r in stage_layers(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [len(r) for r in stage_layers(65, 4)] == [17, 16, 16, 16]
    assert sum(len(r) for r in stage_layers(64, 8)) == 64


def test_pipeline_stages_hold_their_layers_and_the_ends_their_extras():
    """bf16 Qwen3.6-27B does not fit one 48 GB card; TP=1 x PP=2 over two one-card nodes does.
    Stage 0 holds the embedding, the last stage the output head; every stage's weights and KV
    add up to the one-GPU figures."""
    one = fit(QWEN, FitRequest(engine="vllm", ctx=32768, quant="bf16", kv_dtype="fp8"), parse_rig("1xh200"))
    assert one.verdict is not Verdict.DOES_NOT_FIT
    small = fit(QWEN, FitRequest(engine="vllm", ctx=32768, quant="bf16", kv_dtype="fp8"), parse_rig("1xa6000"))
    assert small.verdict is Verdict.DOES_NOT_FIT
    two = fit(QWEN, FitRequest(engine="vllm", ctx=32768, quant="bf16", kv_dtype="fp8", pp=2),
              parse_rig("2x(1xa6000)"))
    assert two.verdict is Verdict.FITS and [g.index for g in two.per_gpu] == [0, 1]

    def comp(g, name):
        return next(c for c in g.components if c.name == name)

    w = [comp(g, "weights") for g in two.per_gpu]
    assert "embedding" in w[0].note and "output head" in w[1].note
    assert sum(c.bytes for c in w) == pytest.approx(comp(one.per_gpu[0], "weights").bytes, abs=2)
    kv = sum(comp(g, "kv_cache").bytes for g in two.per_gpu)
    assert kv == pytest.approx(comp(one.per_gpu[0], "kv_cache").bytes, rel=1e-3)
    # TP 8 x PP 2 on two 8-GPU nodes: 16 GPUs, each a sixteenth of the weights (within the stage split)
    big = fit(QWEN, FitRequest(engine="vllm", ctx=32768, quant="bf16", tp=8, pp=2), parse_rig("2x(8xh100)"))
    assert len(big.per_gpu) == 16
    assert sum(comp(g, "weights").bytes for g in big.per_gpu) == pytest.approx(
        comp(one.per_gpu[0], "weights").bytes, rel=1e-6)
    assert any("TP 8 x PP 2 = 16 GPUs on 2 node(s)" in n for n in big.notes)


def test_pipeline_requests_the_rig_cannot_hold_are_refused():
    with pytest.raises(BadInput, match="needs 2 GPUs but the rig 1xh100 has 1"):
        fit(QWEN, FitRequest(engine="vllm", ctx=4096, quant="bf16", pp=2), parse_rig("1xh100"))
    with pytest.raises(BadInput, match="per node"):
        fit(QWEN, FitRequest(engine="vllm", ctx=4096, quant="bf16", tp=8), parse_rig("2x(4xh100)"))
    with pytest.raises(BadInput, match="does not run pipeline-parallel stages"):
        fit(QWEN, FitRequest(engine="llama.cpp", ctx=4096, quant="Q4_K_M", kv_dtype="f16", pp=2),
            parse_rig("2x(1xh100)"))
    with pytest.raises(BadInput, match="more pipeline stages than"):
        fit(QWEN, FitRequest(engine="vllm", ctx=4096, quant="bf16", pp=65), parse_rig("5x(16xh100)"))


def test_plan_on_a_cluster_offers_tp_by_node_x_pp_by_nodes():
    """Two one-card A6000 nodes: bf16 fits only as a pipeline over both nodes; the per-node
    replicas (2 instances) of a smaller quant are offered too; llama.cpp gets only replicas."""
    plans = plan("qwen3.6-27b", parse_rig("2x(1xa6000)"), "max-context", engine="vllm", limit=20)
    layouts = {(p.quant, p.tp, p.pp, p.instances) for p in plans}
    assert ("bf16", 1, 2, 1) in layouts
    assert any(pp == 1 and inst == 2 for _, _, pp, inst in layouts)
    piped = next(p for p in plans if p.pp == 2)
    assert piped.layout == "TP=1 x PP=2" and len(piped.per_gpu_bytes) == 2
    cpp = plan("qwen3.6-27b", parse_rig("2x(1xa6000)"), "balanced", engine="llama.cpp", limit=20)
    assert cpp and all(p.pp == 1 and p.instances == 2 for p in cpp)


# --------------------------------------------------------------------------- recipes of a cluster pick
def _cluster_recipe(engine: str, *extra: str) -> dict:
    import json

    from conftest import cli

    proc = cli("recipe", "qwen3.6-27b", "--priority", "max-context", "--rig", "2x(1xa6000)", "--engine", engine,
               *extra, "--json", check=True)
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_vllm_cluster_recipe_is_ray_then_one_server_on_the_head():
    out = _cluster_recipe("vllm", "--head-addr", "10.1.2.3")
    assert out["cluster"] == {"nodes": 2, "gpus_per_node": 1, "pp": 2} and out["head_addr_given"]
    steps = out["steps"]
    assert [(s["node"], s["role"]) for s in steps] == [(0, "ray head"), (1, "ray worker"),
                                                       (0, "serve (after every node joined Ray)")]
    assert steps[0]["argv"][1:4] == ["start", "--head", "--port=6379"]
    assert "--node-ip-address=10.1.2.3" in steps[0]["argv"]
    assert "--address=10.1.2.3:6379" in steps[1]["argv"]
    serve = steps[2]["argv"]
    for flag, value in [("--tensor-parallel-size", "1"), ("--pipeline-parallel-size", "2"),
                        ("--distributed-executor-backend", "ray"), ("--host", "127.0.0.1")]:
        assert serve[serve.index(flag) + 1] == value


@pytest.mark.slow
def test_sglang_cluster_recipe_is_one_rank_per_node():
    out = _cluster_recipe("sglang", "--head-addr", "10.1.2.3")
    steps = out["steps"]
    assert [s["node"] for s in steps] == [0, 1]
    for rank, step in enumerate(steps):
        argv = step["argv"]
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--pp-size") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == "10.1.2.3:20000"


def test_cluster_picks_are_recipes_not_launches_and_need_a_reachable_head():
    from conftest import cli

    up = cli("up", "qwen3.6-27b", "--priority", "max-context", "--rig", "2x(1xa6000)", "--engine", "vllm")
    assert up.returncode != 0 and "spans 2 machines" in up.stderr and "Traceback" not in up.stderr
    bad = cli("recipe", "qwen3.6-27b", "--priority", "max-context", "--rig", "2x(1xa6000)", "--engine", "vllm",
              "--head-addr", "127.0.0.1")
    assert bad.returncode != 0 and "loopback" in bad.stderr and "Traceback" not in bad.stderr
    # without --head-addr the printed recipe names the placeholder and says so
    text = cli("recipe", "qwen3.6-27b", "--priority", "max-context", "--rig", "2x(1xa6000)", "--engine", "sglang",
               check=True).stdout
    assert "head-node:20000" in text and "replace head-node" in text
