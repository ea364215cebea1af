"""arch_from_gguf: tiny GGUFs written with gguf.GGUFWriter, the real SmolLM2 file, remote
range reads against a local HTTP server, and a fuzz test of the header parser."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engineroom.arch import (
    GGUFHeader,
    LayerKind,
    arch_from_gguf,
    load_arch,
    parse_gguf_header,
)
from engineroom.errors import BadInput

from conftest import fuzz_examples

T = gguf.GGMLQuantizationType


def write_gguf(path: Path, arch: str, kv: dict, tensors: dict[str, tuple[int, ...]],
               file_type: int = 0, qtypes: dict[str, T] | None = None) -> Path:
    """A GGUF with zero tensors of the given ne-shapes (ggml order: ne0 first)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_file_type(file_type)
    for k, v in kv.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)
    for name, ne in tensors.items():
        qt = (qtypes or {}).get(name)
        if qt is None:
            w.add_tensor(name, np.zeros(tuple(reversed(ne)), dtype=np.float32))
        else:
            block, size = gguf.GGML_QUANT_SIZES[qt]
            byte_shape = (*reversed(ne[1:]), ne[0] // block * size)
            w.add_tensor(name, np.zeros(byte_shape, dtype=np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_tensors(n_layers: int, e: int = 64, ff: int = 128, vocab: int = 96,
                  heads: int = 4, kv: int = 2, hd: int = 16) -> dict[str, tuple[int, ...]]:
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (e, vocab), "output_norm.weight": (e,),
                                     "output.weight": (e, vocab)}
    for i in range(n_layers):
        t |= {f"blk.{i}.attn_norm.weight": (e,), f"blk.{i}.attn_q.weight": (e, heads * hd),
              f"blk.{i}.attn_k.weight": (e, kv * hd), f"blk.{i}.attn_v.weight": (e, kv * hd),
              f"blk.{i}.attn_output.weight": (heads * hd, e), f"blk.{i}.ffn_norm.weight": (e,),
              f"blk.{i}.ffn_gate.weight": (e, ff), f"blk.{i}.ffn_up.weight": (e, ff),
              f"blk.{i}.ffn_down.weight": (ff, e)}
    return t


def llama_kv(a: str, n_layers: int, e: int = 64, heads: int = 4, kv: int = 2) -> dict:
    return {f"{a}.block_count": n_layers, f"{a}.embedding_length": e, f"{a}.feed_forward_length": 128,
            f"{a}.attention.head_count": heads, f"{a}.attention.head_count_kv": kv,
            f"{a}.context_length": 4096, f"{a}.vocab_size": 96}


@pytest.fixture
def tiny_llama(tmp_path: Path) -> Path:
    tensors = llama_tensors(2)
    return write_gguf(tmp_path / "tiny.gguf", "llama", llama_kv("llama", 2), tensors,
                      file_type=int(gguf.LlamaFileType.MOSTLY_Q8_0),
                      qtypes={"blk.0.ffn_up.weight": T.Q8_0, "blk.1.ffn_up.weight": T.Q8_0})


def test_dense_llama_exact_bytes(tiny_llama: Path):
    a = arch_from_gguf(tiny_llama)
    assert a.source == "gguf" and a.architecture == "llama"
    assert a.layer_kinds == (LayerKind.FULL,) * 2
    assert (a.hidden_size, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) == (64, 4, 2, 16, 96)
    assert a.file_type == "Q8_0" and not a.tie_embeddings
    assert a.tensor_types["blk.0.ffn_up.weight"] == "Q8_0"
    assert a.tensor_bytes["blk.0.ffn_up.weight"] == 64 * 128 // 32 * 34
    assert a.tensor_bytes["blk.0.ffn_gate.weight"] == 64 * 128 * 4
    reader = gguf.GGUFReader(tiny_llama)
    assert {t.name: int(t.n_bytes) for t in reader.tensors} == a.tensor_bytes
    assert a.param_count == sum(int(t.n_elements) for t in reader.tensors)


def test_qwen35_hybrid_with_mtp(tmp_path: Path):
    e, ff, vocab, heads, kvh, hd = 64, 128, 96, 4, 2, 16
    kh, vh, kd, vd, conv = 2, 4, 8, 8, 4
    conv_dim = 2 * kh * kd + vh * vd
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (e, vocab), "output_norm.weight": (e,),
                                     "output.weight": (e, vocab)}
    for i in range(8):
        t |= {f"blk.{i}.attn_norm.weight": (e,), f"blk.{i}.post_attention_norm.weight": (e,),
              f"blk.{i}.ffn_gate.weight": (e, ff), f"blk.{i}.ffn_up.weight": (e, ff),
              f"blk.{i}.ffn_down.weight": (ff, e)}
        if (i + 1) % 4 == 0:
            t |= {f"blk.{i}.attn_q.weight": (e, 2 * heads * hd), f"blk.{i}.attn_k.weight": (e, kvh * hd),
                  f"blk.{i}.attn_v.weight": (e, kvh * hd), f"blk.{i}.attn_output.weight": (heads * hd, e),
                  f"blk.{i}.attn_q_norm.weight": (hd,), f"blk.{i}.attn_k_norm.weight": (hd,)}
        else:
            t |= {f"blk.{i}.attn_qkv.weight": (e, conv_dim), f"blk.{i}.attn_gate.weight": (e, vh * vd),
                  f"blk.{i}.ssm_conv1d.weight": (conv, conv_dim), f"blk.{i}.ssm_dt.bias": (vh,),
                  f"blk.{i}.ssm_a": (vh,), f"blk.{i}.ssm_beta.weight": (e, vh),
                  f"blk.{i}.ssm_alpha.weight": (e, vh), f"blk.{i}.ssm_norm.weight": (vd,),
                  f"blk.{i}.ssm_out.weight": (vh * vd, e)}
    mtp = {"blk.8.nextn.eh_proj.weight": (2 * e, e), "blk.8.nextn.enorm.weight": (e,),
           "blk.8.nextn.hnorm.weight": (e,), "blk.8.attn_q.weight": (e, 2 * heads * hd)}
    t |= mtp
    kv = llama_kv("qwen35", 9, e, heads, kvh) | {
        "qwen35.attention.key_length": hd, "qwen35.attention.value_length": hd,
        "qwen35.rope.dimension_count": hd // 4, "qwen35.full_attention_interval": 4,
        "qwen35.nextn_predict_layers": 1, "qwen35.ssm.conv_kernel": conv, "qwen35.ssm.state_size": kd,
        "qwen35.ssm.group_count": kh, "qwen35.ssm.time_step_rank": vh, "qwen35.ssm.inner_size": vh * vd,
    }
    a = arch_from_gguf(write_gguf(tmp_path / "q35.gguf", "qwen35", kv, t))
    assert a.n_layers == 8 and a.mtp_layers == 1
    assert a.layer_indices(LayerKind.FULL) == (3, 7) and a.count(LayerKind.LINEAR) == 6
    assert a.linear is not None
    assert (a.linear.n_key_heads, a.linear.n_value_heads, a.linear.key_head_dim,
            a.linear.value_head_dim, a.linear.conv_kernel) == (kh, vh, kd, vd, conv)
    assert a.linear.conv_dim == conv_dim and a.rope_dim == hd // 4
    mtp_elems = sum(int(np.prod(s)) for s in mtp.values())
    assert a.mtp_param_count == mtp_elems
    assert a.param_count == sum(int(np.prod(s)) for s in t.values()) - mtp_elems


def test_gemma3_every_sixth_layer_global(tmp_path: Path):
    kv = llama_kv("gemma3", 12) | {"gemma3.attention.sliding_window": 512,
                                   "gemma3.attention.key_length": 16}
    t = llama_tensors(12)
    del t["output.weight"]
    a = arch_from_gguf(write_gguf(tmp_path / "g3.gguf", "gemma3", kv, t))
    assert a.layer_indices(LayerKind.FULL) == (5, 11) and a.count(LayerKind.SLIDING) == 10
    assert a.sliding_window == 512 and a.tie_embeddings


def test_gemma2_alternates_and_explicit_pattern_key(tmp_path: Path):
    kv = llama_kv("gemma2", 4) | {"gemma2.attention.sliding_window": 4096}
    a = arch_from_gguf(write_gguf(tmp_path / "g2.gguf", "gemma2", kv, llama_tensors(4)))
    assert a.layer_kinds == (LayerKind.SLIDING, LayerKind.FULL) * 2
    kv = llama_kv("gemma4", 4) | {"gemma4.attention.sliding_window": 1024,
                                  "gemma4.attention.sliding_window_pattern": [True, False, True, True]}
    a = arch_from_gguf(write_gguf(tmp_path / "g4.gguf", "gemma4", kv, llama_tensors(4)))
    assert a.layer_indices(LayerKind.FULL) == (1,)


def test_deepseek2_mla_moe(tmp_path: Path):
    e, vocab, heads, kvr, qr, rope, nope, v = 64, 96, 4, 32, 48, 8, 16, 16
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (e, vocab), "output_norm.weight": (e,),
                                     "output.weight": (e, vocab)}
    for i in range(3):
        t |= {f"blk.{i}.attn_norm.weight": (e,), f"blk.{i}.attn_q_a.weight": (e, qr),
              f"blk.{i}.attn_q_b.weight": (qr, heads * (nope + rope)),
              f"blk.{i}.attn_kv_a_mqa.weight": (e, kvr + rope), f"blk.{i}.attn_kv_b.weight": (kvr, heads * (nope + v)),
              f"blk.{i}.attn_output.weight": (heads * v, e), f"blk.{i}.ffn_norm.weight": (e,)}
        if i == 0:
            t |= {f"blk.{i}.ffn_up.weight": (e, 128), f"blk.{i}.ffn_gate.weight": (e, 128),
                  f"blk.{i}.ffn_down.weight": (128, e)}
        else:
            t |= {f"blk.{i}.ffn_gate_inp.weight": (e, 8), f"blk.{i}.ffn_up_exps.weight": (e, 32, 8),
                  f"blk.{i}.ffn_gate_exps.weight": (e, 32, 8), f"blk.{i}.ffn_down_exps.weight": (32, e, 8),
                  f"blk.{i}.ffn_up_shexp.weight": (e, 32)}
    kv = llama_kv("deepseek2", 3, e, heads, 1) | {
        "deepseek2.attention.kv_lora_rank": kvr, "deepseek2.attention.q_lora_rank": qr,
        "deepseek2.rope.dimension_count": rope, "deepseek2.attention.key_length": kvr + rope,
        "deepseek2.attention.key_length_mla": nope + rope, "deepseek2.attention.value_length_mla": v,
        "deepseek2.expert_count": 8, "deepseek2.expert_used_count": 2,
        "deepseek2.expert_feed_forward_length": 32, "deepseek2.expert_shared_count": 1,
        "deepseek2.leading_dense_block_count": 1,
    }
    a = arch_from_gguf(write_gguf(tmp_path / "ds.gguf", "deepseek2", kv, t))
    assert a.layer_kinds == (LayerKind.MLA,) * 3
    assert a.mla is not None
    assert (a.mla.kv_lora_rank, a.mla.qk_rope_head_dim, a.mla.qk_nope_head_dim, a.mla.v_head_dim,
            a.mla.q_lora_rank) == (kvr, rope, nope, v, qr)
    assert a.moe is not None
    assert (a.moe.n_experts, a.moe.n_experts_active, a.moe.expert_intermediate_size,
            a.moe.n_shared_experts, a.moe.first_dense_layers) == (8, 2, 32, 1, 1)


def test_jamba_style_mamba_blocks(tmp_path: Path):
    e = 64
    t = llama_tensors(4)
    for i in (0, 1, 3):   # blocks 0, 1, 3 are Mamba: drop attention, add ssm tensors
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            del t[f"blk.{i}.{n}.weight"]
        t |= {f"blk.{i}.ssm_in.weight": (e, 256), f"blk.{i}.ssm_conv1d.weight": (4, 128),
              f"blk.{i}.ssm_out.weight": (128, e), f"blk.{i}.ssm_a": (16, 128)}
    kv = llama_kv("jamba", 4) | {"jamba.attention.head_count_kv": [0, 0, 2, 0],
                                 "jamba.ssm.conv_kernel": 4, "jamba.ssm.state_size": 16,
                                 "jamba.ssm.inner_size": 128, "jamba.ssm.time_step_rank": 8}
    a = arch_from_gguf(write_gguf(tmp_path / "jamba.gguf", "jamba", kv, t))
    assert a.layer_kinds == (LayerKind.MAMBA, LayerKind.MAMBA, LayerKind.FULL, LayerKind.MAMBA)
    assert a.n_kv_heads == 2 and a.mamba is not None and a.mamba.d_inner == 128 and a.mamba.d_state == 16


def test_real_smollm2_gguf(smollm2):
    SMOLLM2 = smollm2
    a = arch_from_gguf(SMOLLM2)
    assert a.architecture == "llama" and a.file_type == "Q4_1"
    assert (a.n_layers, a.hidden_size, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) == (30, 576, 9, 3, 64, 49152)
    assert a.tie_embeddings and a.layer_kinds == (LayerKind.FULL,) * 30
    assert a.param_count == 134_515_008   # same as the safetensors count of SmolLM2-135M
    reader = gguf.GGUFReader(SMOLLM2)
    assert {t.name: int(t.n_bytes) for t in reader.tensors} == a.tensor_bytes
    assert load_arch(str(SMOLLM2)).param_count == a.param_count


def test_not_a_gguf_and_truncated(tmp_path: Path, tiny_llama: Path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(BadInput, match="is not a GGUF file"):
        arch_from_gguf(p)
    p.write_bytes(b"")
    with pytest.raises(BadInput, match="is not a GGUF file"):
        arch_from_gguf(p)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_llama.read_bytes()[:200])
    with pytest.raises(BadInput, match="truncated"):
        arch_from_gguf(cut)
    with pytest.raises(BadInput, match="does not exist"):
        arch_from_gguf(tmp_path / "missing.gguf")


# ---- remote reads ---------------------------------------------------------------------

class _RangeHandler(http.server.BaseHTTPRequestHandler):
    root: Path
    sent: dict[str, int]
    honour_range = True

    def log_message(self, *args: object) -> None:   # keep pytest output clean
        pass

    def do_GET(self) -> None:
        path = self.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        rng = self.headers.get("Range")
        if rng and self.honour_range:
            start, end = rng.removeprefix("bytes=").split("-")
            lo, hi = int(start), min(int(end), len(data) - 1)
            body = data[lo:hi + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # counted before writing: the client may hang up as soon as it has what it needs
        self.sent[self.path] = self.sent.get(self.path, 0) + len(body)
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, dict[str, int], type[_RangeHandler]]]:
    handler = type("H", (_RangeHandler,), {"root": tmp_path, "sent": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler.sent, handler
    httpd.shutdown()
    httpd.server_close()


def test_remote_gguf_reads_only_a_prefix(tmp_path: Path, server):
    base, sent, _ = server
    t = llama_tensors(2) | {"big.weight": (1024, 8192)}   # 32 MiB of f32 weights
    path = write_gguf(tmp_path / "big.gguf", "llama", llama_kv("llama", 2), t)
    size = path.stat().st_size
    a = arch_from_gguf(f"{base}/big.gguf")
    assert a.tensor_bytes == arch_from_gguf(path).tensor_bytes
    assert a.name == "big.gguf"
    assert sent["/big.gguf"] <= 2 << 20 and sent["/big.gguf"] < size / 10


@pytest.mark.slow
def test_remote_header_larger_than_first_prefix_grows(tmp_path: Path, server):
    base, sent, _ = server
    kv = llama_kv("llama", 2) | {"tokenizer.ggml.tokens": [f"tok{i:06d}" * 4 for i in range(100_000)]}
    t = llama_tensors(2) | {"big.weight": (1024, 8192)}
    path = write_gguf(tmp_path / "vocab.gguf", "llama", kv, t)
    a = arch_from_gguf(f"{base}/vocab.gguf")
    assert a.n_layers == 2
    assert 2 << 20 < sent["/vocab.gguf"] < path.stat().st_size / 2


def test_remote_server_without_range_support(tmp_path: Path, server):
    base, _, handler = server
    handler.honour_range = False
    write_gguf(tmp_path / "small.gguf", "llama", llama_kv("llama", 2), llama_tensors(2))
    assert arch_from_gguf(f"{base}/small.gguf").n_layers == 2
    assert load_arch(f"{base}/small.gguf").n_layers == 2


def test_remote_errors(server):
    base, _, _ = server
    with pytest.raises(Exception, match="does not exist"):
        arch_from_gguf(f"{base}/missing.gguf")
    with pytest.raises(Exception, match="Could not read"):
        arch_from_gguf("http://127.0.0.1:9/none.gguf")


# ---- fuzz -----------------------------------------------------------------------------

def _valid_header_bytes(tmp: Path) -> bytes:
    kv = llama_kv("llama", 2) | {"general.name": "fuzz", "some.array": [1, 2, 3],
                                 "tokenizer.ggml.tokens": ["a", "bb", "ccc"]}
    path = write_gguf(tmp / "fuzz.gguf", "llama", kv, llama_tensors(2))
    data = path.read_bytes()
    header = parse_gguf_header(data)
    return data[: header.header_bytes]


@pytest.fixture(scope="module")
def valid_header(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _valid_header_bytes(tmp_path_factory.mktemp("fuzz"))


def _check(buf: bytes) -> None:
    try:
        result = parse_gguf_header(buf, complete=True)
    except BadInput as exc:
        assert str(exc)
        return
    assert isinstance(result, GGUFHeader)


@settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_header_never_crashes(valid_header: bytes, data: st.DataObject):
    buf = bytearray(valid_header)
    mode = data.draw(st.sampled_from(["truncate", "flip", "overwrite", "random"]))
    if mode == "truncate":
        buf = buf[: data.draw(st.integers(0, len(buf)))]
    elif mode == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
    elif mode == "overwrite":
        i = data.draw(st.integers(0, len(buf) - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=16))
        buf[i:i + len(chunk)] = chunk
    else:
        buf = bytearray(b"GGUF" + data.draw(st.binary(max_size=256)))
    _check(bytes(buf))


@settings(max_examples=fuzz_examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 4000), flips=st.lists(st.tuples(st.integers(0, 3999), st.integers(0, 7)), max_size=4))
def test_fuzz_arch_from_gguf_file(tmp_path: Path, valid_header: bytes, cut: int, flips: list[tuple[int, int]]):
    buf = bytearray(valid_header)
    for i, bit in flips:
        if i < len(buf):
            buf[i] ^= 1 << bit
    p = tmp_path / "f.gguf"
    p.write_bytes(bytes(buf[:cut]) if cut < len(buf) else bytes(buf))
    try:
        arch_from_gguf(p)
    except BadInput as exc:
        assert str(exc).endswith((".", ")")) and "\n" not in str(exc)
