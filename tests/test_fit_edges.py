"""fit at the edges the plan picks (issue 16): the MoE compute term, the fork's KV-block
assert, and the `fit` options that describe real launches (repack off, full-size SWA cache,
micro-batch). The real-engine checks of the same shapes are in tests/test_fit_server.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engineroom.catalog import arch_from_catalog, load_catalog
from engineroom.fit import FitRequest, kv_refusal
from engineroom.hardware import parse_rig
from engineroom.plan.planner import Planner
from engineroom.synth import write_synthetic_gguf
from engineroom.synthshapes import SHAPES
from engineroom.units import MiB

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, measured", [
    # llama-server b11434 on this VM's CPU, -c 4096 -np 1, f16 KV (2026-12-02, issue 16): the
    # experts' down output (n_active x n_embd per token) is wider than 2 x the active FFN width
    ("moe-wide", 30.02),
    ("moe-a3b", 92.02),
    # at exactly 2 x ff it reuses the gate/up space (benchmarks/fit_vs_llamacpp.md)
    ("moe-m", 29.52),
    ("moe-s", 15.02),
])
def test_moe_compute_counts_the_experts_down_output(bench, name, measured):
    assert bench.predict(name, 4096, "f16", 1, 512, "cpu", "np-legacy")["compute"] == measured


def test_ik_llama_cpp_refuses_a_kv_block_that_does_not_divide_the_head_size():
    """The fork asserts n_embd_head % block == 0 for K and V whatever flash attention is set to
    (mainline refuses K only with flash attention on); plan never proposes it."""
    cat = load_catalog()
    arch = replace(arch_from_catalog(cat.model("llama-3.1-8b")), head_dim=112)
    for fa in (True, False):
        why = kv_refusal(arch, FitRequest(engine="ik_llama.cpp", ctx=1, kv_dtype="q4_0", flash_attn=fa), cat)
        assert why and "n_embd_head_k=112" in why and "aborts" in why
    assert kv_refusal(arch, FitRequest(engine="ik_llama.cpp", ctx=1, kv_dtype="f16"), cat) is None
    assert kv_refusal(replace(arch, head_dim=128), FitRequest(engine="ik_llama.cpp", ctx=1, kv_dtype="q4_0"),
                      cat) is None
    p = Planner(cat, cat.model("llama-3.1-8b"), arch, parse_rig("1x3090", cat), cat.priority("leanest-vram"),
                 None, "ik_llama.cpp")
    assert not [c for c in p.candidates() if c.kv.block_size > 1]
    assert not any(f"KV {kv}: ik_llama.cpp refuses it" in r for r in p.rejected for kv in ("f16", "bf16"))


def _fit_json(gguf: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "engineroom.cli", "fit", str(gguf), "--engine", "llama.cpp",
                          "--quant", "Q4_0", "--kv", "f16", "--ctx", "8192", "--rig", "cpu:16GB", "--json", *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _mib(d: dict) -> dict[str, float]:
    return {c["name"]: c["bytes"] / MiB for g in d["fit"]["per_gpu"] for c in g["components"]}


def test_fit_expresses_repack_off_full_swa_cache_and_ubatch(tmp_path):
    g = tmp_path / "swa-s.gguf"
    write_synthetic_gguf(SHAPES["swa-s"], "Q4_0", g)
    base = _fit_json(g)
    b = _mib(base)
    assert b["weights_repack"] > 0 and "--" not in base["launch"].split("--no-kv-unified")[-1]
    nr = _fit_json(g, "--no-weights-repack")
    n = _mib(nr)
    assert "weights_repack" not in n and n["weights"] > b["weights"] and "repack off" in nr["launch"]
    full = _mib(_fit_json(g, "--full-swa-cache"))
    assert full["kv_cache"] > b["kv_cache"] and full["compute"] > b["compute"]
    small = _fit_json(g, "--ubatch", "256")
    assert _mib(small)["compute"] < b["compute"] and "256-token micro-batch" in small["launch"]
    bad = subprocess.run([sys.executable, "-m", "engineroom.cli", "fit", str(g), "--engine", "llama.cpp", "--quant",
                          "Q4_0", "--kv", "f16", "--ctx", "8192", "--rig", "cpu:16GB", "--ubatch", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "must be positive" in bad.stderr and "Traceback" not in bad.stderr


def test_cpu_picks_are_sized_against_the_ram_a_user_can_give():
    """Issue 16: CPU picks were sized against the total RAM (two 'tight' picks at 98-99% of
    23.5 GiB). The RAM available now (a detected rig), less a stated margin, is the capacity."""
    from engineroom.fit import RAM_MARGIN_FRACTION, fit, usable_ram
    from engineroom.hardware import Rig
    from engineroom.synth import arch_with_tensors

    total = 24 * 1024 ** 3
    spec = Rig(gpus=(), cpu_ram_bytes=total, label="cpu:24GiB")
    busy = replace(spec, cpu_ram_available_bytes=8 * 1024 ** 3, source="detected", label="this machine")
    cap_spec, how_spec = usable_ram(spec)
    cap_busy, how_busy = usable_ram(busy)
    margin = int(total * RAM_MARGIN_FRACTION)
    assert cap_spec == total - margin and "stated" in how_spec and "margin" in how_spec
    assert cap_busy == 8 * 1024 ** 3 - margin and "available now" in how_busy
    arch = arch_with_tensors(SHAPES["dense-s"], "Q4_0")
    req = FitRequest(engine="llama.cpp", ctx=4096, kv_dtype="f16")
    f = fit(arch, req, busy)
    assert f.per_gpu[0].capacity_bytes == cap_busy and how_busy in f.notes
