"""fit() against the REAL llama-server on shapes outside the other fixtures (issue 6): the
buffers llama-server logs at startup must match fit's components within 1%, at the engine's
default launch (no -np: 4 slots, unified KV) and at an explicit -np; a KV type whose block
does not divide the head size must be refused by both, with the same sentence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engineroom.synth import write_synthetic_gguf
from engineroom.synthshapes import SHAPES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(llama_server_binary) -> str:
    os.environ.update(llama_server_binary.env)
    return str(llama_server_binary.path)


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory, smollm2) -> Path:
    os.environ["ENGINEROOM_TOKENIZER_GGUF"] = str(smollm2)
    return tmp_path_factory.mktemp("fitsrv")


def _check(bench, server, gguf_dir, name, ctx, kv, parallel, launch):
    g = gguf_dir / f"{name}-{bench.QUANT}.gguf"
    if not g.exists():
        write_synthetic_gguf(SHAPES[name], bench.QUANT, g)
    meas, cmd, refusal = bench.measure(server, g, ctx, kv, parallel, None, launch=launch)
    assert not refusal
    pred = bench.predict(name, ctx, kv, parallel, 512, "cpu", launch)
    for k, m in meas.items():
        assert abs(bench.err(pred[k], m)) <= 1.0, (name, launch, k, pred[k], m, " ".join(cmd))
    return meas


@pytest.mark.parametrize("name, ctx, kv", [
    ("narrow-ff", 5000, "q8_0"),     # FFN narrower than hidden (llama graph, allocator replay)
    ("swa-s", 4096, "f16"),          # gemma3 SWA: unified window x 4 slots + ubatch
    ("hybrid-s", 4096, "q4_0"),      # qwen35: recurrent state for 4 slots
    ("dsv2-noq", 4096, "f16"),       # DeepSeek-V2 MLA + 2 shared experts, no q_lora_rank
])
def test_default_launch_buffers_match(bench, server, gguf_dir, name, ctx, kv):
    meas = _check(bench, server, gguf_dir, name, ctx, kv, None, "default")
    assert meas["output"] > 0 and meas["compute"] > 0


@pytest.mark.parametrize("name, parallel, launch", [
    ("mqa", 2, "np"),
    ("swa-s", 2, "np-kvu"),
    ("dsv2", 2, "np+nr"),            # -nr: every weight stays in CPU_Mapped
    ("moe-a3b", 1, "np"),            # issue 16: the experts' down output, wider than 2 x the active FFN
    ("moe-wide", 2, "np"),           # the same with an FFN no wider than n_embd
])
def test_explicit_slots_buffers_match(bench, server, gguf_dir, name, parallel, launch):
    meas = _check(bench, server, gguf_dir, name, 4096, "q8_0" if launch != "np+nr" else "f16", parallel, launch)
    if launch.endswith("+nr"):
        assert meas["weights_repack"] == 0


def test_refused_kv_type_has_the_engines_reason(bench, server, gguf_dir):
    g = gguf_dir / f"hd80-{bench.QUANT}.gguf"
    write_synthetic_gguf(SHAPES["hd80"], bench.QUANT, g)
    _, _, refusal = bench.measure(server, g, 4096, "q4_0", None, None, launch="default", expect_refusal=True)
    assert refusal == "K cache type q4_0 with block size 32 does not divide n_embd_head_k=80"
    assert bench.predict_refusal("hd80", 4096, "q4_0", None, 512, "default") == refusal
