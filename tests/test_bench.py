"""Bench: statistics recomputed from hand-built raw records, the decode-window rule, the runner
against a stand-in streaming server whose engine timings lie (or don't), and the real llama-server."""

from __future__ import annotations

import ast
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engineroom.bench import (
    DEFAULT_SUITE,
    BenchPlan,
    Sampler,
    Workload,
    bench_conditions,
    default_workloads,
    measure_request,
    run_bench,
    suite,
)
from engineroom.bench.workloads import NARRATIVE_PROMPT
from engineroom.client import OpenAIClient, StreamResult
from engineroom.engines import llamacpp
from engineroom.engines.base import (
    Capabilities,
    DecodeWindow,
    EngineTimings,
    ServerInfo,
)
from engineroom.errors import BadInput
from engineroom.records import encoding
from engineroom.records import statistics as st
from engineroom.records.encoding import decode_arrivals, encode_arrivals
from engineroom.records.statistics import decode_rate, summarize
from engineroom.store import Store

SRC = Path(__file__).resolve().parents[1] / "src" / "engineroom"

# -- statistics from hand-built records -----------------------------------------------


def rec(workload="w", *, tokens=100, max_tokens=100, ttft=0.1, inter=None, decode=None, wall=None,
        gaps_ms=None, warmup=False, status=200, error=None, engine_tps=None,
        window=DecodeWindow.FIRST_TOKEN_FREE, index=0, body=None):
    """A hand-built raw record as the runner writes it.

    Token chunks arrive at ``ttft`` and then every 1 / ``inter`` s (default: ``decode``), or
    after the gaps ``gaps_ms``; the stream ends at ``wall``, or where tokens / (wall - TTFT)
    equals ``decode``, or 1 ms after the last chunk. ``engine_tps`` sets the engine's own
    counts so its rate by ``window`` is that figure.
    """
    inter = decode if inter is None else inter
    times = [ttft]
    if gaps_ms is not None:
        for g in gaps_ms:
            times.append(times[-1] + g / 1000)
    elif inter and tokens and tokens >= 2:
        times += [ttft + i / inter for i in range(1, tokens)]
    if wall is None:
        wall = ttft + tokens / decode if (decode and tokens) else times[-1] + 0.001
    engine = None
    if engine_tps is not None:
        steps = tokens - 1 if window is DecodeWindow.FIRST_TOKEN_FREE else tokens
        engine = EngineTimings(decode_tokens=tokens, decode_ms=steps / engine_tps * 1000, decode_window=window,
                               prompt_tokens=10, prompt_ms=20.0, source="hand-built").as_dict()
    return {
        "workload": workload, "index": index, "warmup": warmup,
        "sent": {"max_tokens": max_tokens, "sampler": {"temperature": 0.6}, "body": body or {}},
        "sent_unix": 0.0, "status": status, "error": error,
        "end_us": round(wall * 1e6), "arrivals_us": encode_arrivals(0.0, times) if tokens else [],
        "completion_tokens": tokens, "prompt_tokens": 10, "cached_prompt_tokens": None,
        "finish_reason": "length", "chunks": (tokens or 0) + 2, "content_chars": 5 * (tokens or 0),
        "reasoning_chars": 0, "engine": engine, "engine_raw": None, "record_version": 3,
    }


def test_describe_known_answers():
    d = st.describe([10.0, 12.0, 14.0])
    assert d["n"] == 3
    assert d["mean"] == pytest.approx(12.0)
    assert d["std"] == pytest.approx(2.0)            # sample std (n - 1)
    assert d["cv_pct"] == pytest.approx(100 * 2 / 12)
    assert (d["min"], d["max"]) == (10.0, 14.0)
    one = st.describe([5.0, None])
    assert one["n"] == 1 and one["mean"] == 5.0 and one["std"] is None and one["cv_pct"] is None
    assert st.describe([])["mean"] is None


def test_summary_per_workload_from_records_only():
    records = [
        rec("a", decode=99.0, warmup=True),                             # warm-up: excluded
        rec("a", decode=10.0, ttft=0.2, engine_tps=10.0),
        rec("a", decode=12.0, ttft=0.4, engine_tps=12.0),
        rec("a", decode=14.0, ttft=0.6, engine_tps=14.0),
        rec("a", decode=50.0, tokens=10),                               # < 25% of max: not usable
        rec("b", decode=30.0),
    ]
    s = summarize(records)
    a = s["workloads"]["a"]
    assert (a["n"], a["n_ok"], a["n_usable"]) == (4, 4, 3)
    assert a["decode_tps"]["mean"] == pytest.approx(12.0)
    assert a["decode_tps"]["std"] == pytest.approx(2.0)
    assert a["decode_tps"]["cv_pct"] == pytest.approx(16.6667, rel=1e-4)
    assert a["decode_tps"]["min"] == pytest.approx(10.0) and a["decode_tps"]["max"] == pytest.approx(14.0)
    # wall tok/s recomputed: 100 tokens / (TTFT + 100 / decode)
    assert a["wall_tps"]["mean"] == pytest.approx(st.describe(
        [100 / (0.2 + 10.0), 100 / (0.4 + 100 / 12), 100 / (0.6 + 100 / 14)])["mean"])
    assert a["ttft_s"]["n"] == 4                                         # TTFT over all ok requests
    assert a["ttft_s"]["mean"] == pytest.approx((0.2 + 0.4 + 0.6 + 0.1) / 4)
    assert a["engine_decode_tps"]["mean"] == pytest.approx(12.0)
    assert a["engine_prompt_tps"]["mean"] == pytest.approx(500.0)        # 10 prompt tokens in 20 ms
    assert a["agreement"]["diff_pct"] == pytest.approx(0.0, abs=1e-6)
    assert a["agreement"]["warning"] is None
    assert s["workloads"]["b"]["agreement"]["n"] == 0                    # engine gave no timings
    assert s["status"] == "OK"
    assert s["warnings"] == []


def test_inter_token_percentiles_recomputed_from_stored_arrivals(tmp_path):
    """Two requests' gaps, pooled: 10, 20, ... 100 ms. Linear interpolation between closest ranks
    (numpy's default): p50 = 55, p95 = 90 + 0.55 x 10 = 95.5, p99 = 90 + 0.91 x 10 = 99.1 ms."""
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", {})
    store.add_record(run_id, "bench_request", rec(tokens=6, max_tokens=6, ttft=0.25, wall=1.0,
                                                  gaps_ms=[10, 30, 50, 70, 90]))
    store.add_record(run_id, "bench_request", rec(tokens=6, max_tokens=6, ttft=0.125, wall=0.5, index=1,
                                                  gaps_ms=[100, 80, 60, 40, 20]))
    stored = store.records(run_id)
    assert stored[0]["payload"]["arrivals_us"] == [250_000, 10_000, 30_000, 50_000, 70_000, 90_000]
    w = summarize(stored)["workloads"]["w"]
    itl = w["inter_token_ms"]
    assert (itl["n_gaps"], itl["n_requests"], itl["not_available"]) == (10, 2, None)
    assert itl["p50"] == pytest.approx(55.0, abs=1e-9)
    assert itl["p95"] == pytest.approx(95.5, abs=1e-9)
    assert itl["p99"] == pytest.approx(99.1, abs=1e-9)
    # every other client figure comes from the same offsets
    first, second = (r["payload"] for r in stored)
    assert encoding.ttft_s(first) == 0.25 and encoding.last_token_s(first) == 0.5 and encoding.wall_s(first) == 1.0
    assert st.decode_tps(first) == pytest.approx(6 / 0.75) and st.wall_tps(first) == pytest.approx(6.0)
    assert st.inter_token_tps(second) == pytest.approx(5 / 0.3)
    assert w["ttft_s"]["mean"] == pytest.approx(0.1875)


def test_arrivals_are_delta_encoded_microseconds_without_drift():
    t0 = 123_456.789_012_3                      # perf_counter values are large; offsets are not
    times = [t0 + 0.0123454, t0 + 0.0223456, t0 + 0.0323455, t0 + 7.5]
    deltas = encode_arrivals(t0, times)
    assert all(isinstance(d, int) for d in deltas)
    assert decode_arrivals(deltas) == [round((t - t0) * 1e6) for t in times]   # each offset rounded once
    # 2,000 gaps of 9,123.4567 us: rounding each gap would lose 0.4567 us a gap, 913 us in all
    offsets = decode_arrivals(encode_arrivals(0.0, [i * 0.0091234567 for i in range(1, 2001)]))
    assert offsets[-1] == 18_246_913


def test_agreement_warns_above_five_percent_and_compares_same_requests():
    # engine 10% above client on the requests that have both figures
    records = [rec(decode=10.0, engine_tps=11.0), rec(decode=20.0, engine_tps=22.0),
               rec(decode=1000.0)]                       # no engine timing: not in the comparison
    a = summarize(records)["workloads"]["w"]["agreement"]
    assert a["n"] == 2
    assert a["client_inter_token_tps"] == pytest.approx(15.0)
    assert a["engine_decode_tps"] == pytest.approx(16.5)
    assert a["diff_pct"] == pytest.approx(10.0)
    assert a["warning"] and "+10.0%" in a["warning"]
    # within tolerance
    ok = summarize([rec(decode=100.0, engine_tps=104.0)])["workloads"]["w"]["agreement"]
    assert ok["diff_pct"] == pytest.approx(4.0) and ok["warning"] is None


def test_agreement_uses_the_engines_own_window_definition():
    """24 tokens, first at 0.10 s, last at 0.33 s: 23 gaps of 10 ms. An engine whose window leaves
    the first token out (llama.cpp) says 23 steps / 0.23 s = 100 tok/s; tokens / (wall - TTFT)
    reads 24 / 0.23 = 104.3 (+4.3%), a definition gap that must not count as disagreement."""
    r = rec(tokens=24, max_tokens=24, ttft=0.10, inter=100.0, wall=0.33, engine_tps=100.0)
    assert r["engine"]["decode_tokens"] == 24 and r["engine"]["decode_ms"] == pytest.approx(230.0)
    assert st.inter_token_tps(r) == pytest.approx(100.0)
    assert st.engine_decode_tps(r) == pytest.approx(100.0)
    a = st.agreement([r], min_window_s=0.2)
    assert a["n"] == 1 and a["diff_pct"] == pytest.approx(0.0, abs=1e-6) and a["warning"] is None
    # the same counts from an engine that counts every token in its window: 24 / 0.23 s
    r["engine"]["decode_window"] = DecodeWindow.EVERY_TOKEN.value
    assert st.engine_decode_tps(r) == pytest.approx(24 / 0.23)
    assert st.agreement([r], min_window_s=0.2)["diff_pct"] == pytest.approx(100 * (24 / 23 - 1))


def test_agreement_measures_a_held_start_from_its_end():
    """The arrivals seen on this VM (benchmarks/bench_agreement.md): 128 tokens every 8 ms, the
    first five held back 35 ms and flushed together. First-to-last reads +4%; from the end of
    the held start the client agrees with the engine. A stream that is bursty throughout is not
    trimmed, and an engine that is 10% off still warns with a held start."""
    steady = [8.0] * 127
    held = [0.0, 0.0, 0.0, 0.0, 1.2] + [8.0] * 122
    on_time = rec(tokens=128, max_tokens=128, gaps_ms=steady, engine_tps=125.0)
    late = rec(tokens=128, max_tokens=128, gaps_ms=held, engine_tps=125.0)
    assert st.held_start(encoding.gaps_us(on_time)) == 0 and st.held_start(encoding.gaps_us(late)) == 5
    assert st.inter_token_tps(late) == pytest.approx(127 / 0.9772)          # reads +4% high
    rate, trimmed = st.steady_inter_token_tps(late)
    assert trimmed == 5 and rate == pytest.approx(125.0, rel=1e-3)
    a = st.agreement([late, late])
    assert a["n"] == 2 and a["n_held_starts"] == 2 and abs(a["diff_pct"]) < 0.1 and a["warning"] is None
    assert st.agreement([on_time])["n_held_starts"] == 0
    # spec-decode-like bursts all along (three tokens per step): more than half the gaps ~0 -> no trim
    bursty = rec(tokens=129, max_tokens=129, gaps_ms=[0.0, 0.0, 24.0] * 42 + [0.0, 0.0], engine_tps=125.0)
    assert st.held_start(encoding.gaps_us(bursty)) == 0
    # an engine 10% high is still caught on a held-start request
    off = rec(tokens=128, max_tokens=128, gaps_ms=held, engine_tps=137.5)
    b = st.agreement([off])
    assert b["diff_pct"] == pytest.approx(10.0, abs=0.2) and b["warning"]


def test_agreement_leaves_out_windows_too_short_to_judge():
    # 24 tokens at ~150 tok/s: a 0.15 s window, where one 20 ms late chunk is 13%
    short = rec(tokens=24, max_tokens=24, decode=160.0, inter=150.0, engine_tps=130.0)
    a = st.agreement([short, short])
    assert a["n"] == 0 and a["warning"] is None and a["diff_pct"] is None
    assert "too short" in a["not_checked"] and "0.15 s" in a["not_checked"]
    # one long request among short ones: only the long one is compared
    long = rec(tokens=200, max_tokens=200, decode=101.0, inter=100.0, engine_tps=120.0)
    b = st.agreement([short, long])
    assert b["n"] == 1 and b["diff_pct"] == pytest.approx(20.0) and b["warning"]
    # no engine timings at all: a different reason; timings no adapter read: another
    assert st.agreement([rec(decode=100.0)])["not_checked"] == "the engine reported no decode timings"
    unread = {**rec(decode=100.0), "engine_raw": {"tokens_per_sec": 99.0}}
    assert st.agreement([unread])["not_checked"] == "the engine sent timings that no adapter normalises"


def test_run_status_rules():
    assert st.run_status([rec(decode=1.0)]) == "OK"
    assert st.run_status([rec(decode=1.0), rec(status=500, error="HTTP 500: boom")]) == "REQ_ERRORS"
    assert st.run_status([rec(warmup=True, status=None, error="timeout"), rec(decode=1.0)]) == "REQ_ERRORS"
    assert st.run_status([rec(tokens=0), rec(tokens=None)]) == "NO_TOKENS"
    assert summarize([])["status"] == "NO_TOKENS"


def test_summarize_accepts_store_records(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", {})
    for value in (10.0, 20.0):
        store.add_record(run_id, "bench_request", rec(decode=value))
    store.add_record(run_id, "check", {"name": "reachable", "status": "PASS"})
    s = summarize(store.records(run_id))
    assert list(s["workloads"]) == ["w"]
    assert s["workloads"]["w"]["decode_tps"]["mean"] == pytest.approx(15.0)


def _code_strings_and_names(path: Path) -> set[str]:
    """Identifiers and string constants of a module's code, its docstrings and comments left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.add(id(first.value))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.add(node.value)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return found


# llama.cpp's timing fields and its full-length request field: the adapter's to know.
LLAMACPP_NAMES = ("predicted_per_second", "prompt_per_second", "predicted_n", "predicted_ms", "cache_n",
                  "ignore_eos")
# The one exception, and why: schema-2 records named their keys after llama.cpp's request field,
# and the migration that rewrites them has to read those keys.
READS_OLD_RECORDS = {"records/schema2.py"}


def test_llamacpp_field_names_occur_only_in_its_adapter():
    """Code, not docs: docstrings and comments may explain what an engine calls things."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("engines/") or rel in READS_OLD_RECORDS:
            continue
        words = _code_strings_and_names(path)
        offenders += [f"{rel}: {name}" for name in LLAMACPP_NAMES if any(name in w for w in words)]
    assert offenders == []
    assert "ignore_eos" in _code_strings_and_names(SRC / "records" / "schema2.py")   # the exception is real


# -- the decode window rule -----------------------------------------------------------


def test_decode_window_rule():
    tps, window, why = decode_rate(100, wall_s=2.0, ttft_s=0.5)
    assert tps == pytest.approx(100 / 1.5) and window == pytest.approx(1.5) and why is None
    # window 4% of wall -> n/a, not a huge number
    tps, window, why = decode_rate(100, wall_s=1.0, ttft_s=0.96)
    assert tps is None and window == pytest.approx(0.04) and "5%" in why
    # exactly 5% is still usable
    assert decode_rate(10, wall_s=1.0, ttft_s=0.95)[0] == pytest.approx(10 / 0.05)
    assert decode_rate(1, wall_s=2.0, ttft_s=0.5)[0] is None           # one token: no rate
    assert decode_rate(0, wall_s=2.0, ttft_s=0.5)[0] is None
    assert decode_rate(50, wall_s=2.0, ttft_s=None) == (None, None, "no token arrived")


def test_measure_request_keeps_raw_arrivals_and_the_adapters_timings():
    result = StreamResult(status=200, content="x" * 40, finish_reason="length",
                          usage={"completion_tokens": 40, "prompt_tokens": 12,
                                 "prompt_tokens_details": {"cached_tokens": 8}},
                          timings={"predicted_per_second": 999.0, "predicted_n": 40, "predicted_ms": 1900.0,
                                   "prompt_n": 4, "prompt_ms": 50.0, "cache_n": 8},
                          t_request=100.0, t_first_token=100.5, t_end=102.5, chunks=42,
                          token_times=[100.5, 101.0, 102.4])
    server = ServerInfo(url="http://127.0.0.1:1", engine="llama.cpp", normalise_timings=llamacpp.normalise_timings)
    sent = {"max_tokens": 40, "sampler": {"temperature": 0.6}, "body": {"x": 1}}
    r = measure_request(result, workload=Workload("w", "p", 40), index=3, warmup=False, sent=sent,
                        sent_unix=1.5, server=server).to_dict()
    assert r["arrivals_us"] == [500_000, 500_000, 1_400_000] and r["end_us"] == 2_500_000
    assert (r["completion_tokens"], r["prompt_tokens"], r["cached_prompt_tokens"]) == (40, 12, 8)
    assert r["sent"] == sent and r["sent_unix"] == 1.5
    for derived in ("decode_tps", "wall_tps", "ttft_s", "wall_s", "decode_window_s", "last_token_s"):
        assert derived not in r                              # recomputed, never stored
    assert r["engine_raw"]["predicted_per_second"] == 999.0     # kept as sent, read by nothing
    assert r["engine"] == EngineTimings(decode_tokens=40, decode_ms=1900.0, decode_window=DecodeWindow.FIRST_TOKEN_FREE,
                                        prompt_tokens=4, prompt_ms=50.0, cached_tokens=8,
                                        source=r["engine"]["source"]).as_dict()
    assert encoding.ttft_s(r) == pytest.approx(0.5) and encoding.wall_s(r) == pytest.approx(2.5)
    assert st.decode_tps(r) == pytest.approx(40 / 2.0)      # client clock, not the engine's 999
    assert st.wall_tps(r) == pytest.approx(40 / 2.5)
    assert encoding.last_token_s(r) == pytest.approx(2.4)
    assert st.engine_decode_tps(r) == pytest.approx(39 / 1.9)   # recomputed by the adapter's definition
    assert (r["index"], r["warmup"], r["status"], r["error"]) == (3, False, 200, None)

    # no normaliser (an engine no adapter knows): the block is kept raw, no neutral fields invented
    bare = measure_request(result, workload=Workload("w", "p", 40), index=0, warmup=False, sent=sent,
                           sent_unix=0.0, server=ServerInfo(url="u", engine="unknown"))
    assert bare.engine is None and bare.engine_raw == result.timings

    # a 200 stream without usage: token count unknown is an error, not a silent zero
    no_usage = StreamResult(status=200, content="hi", t_request=0.0, t_first_token=0.1, t_end=1.0)
    r2 = measure_request(no_usage, workload=Workload("w", "p", 8), index=0, warmup=False, sent=sent,
                         sent_unix=0.0).to_dict()
    assert r2["error"] and "usage" in r2["error"] and st.decode_tps(r2) is None


def test_plan_validation_and_workloads():
    with pytest.raises(BadInput):
        BenchPlan(measured=0)
    with pytest.raises(BadInput):
        BenchPlan(workloads=())
    with pytest.raises(BadInput):
        default_workloads(max_tokens=0)
    narrative, code = default_workloads()
    assert (narrative.name, narrative.max_tokens, code.name, code.max_tokens) == ("narrative", 192, "code", 192)
    assert "800 words" in narrative.prompt and "quicksort" in code.prompt
    assert [w.max_tokens for w in default_workloads(64)] == [64, 64]
    long_narrative, long_code = default_workloads(suite_name="long")
    assert (long_narrative.max_tokens, long_code.max_tokens) == (1000, 800)
    assert long_narrative.prompt == narrative.prompt          # same prompts, only the length differs


def test_suites_default_is_quick_and_long_is_the_old_default():
    """The default bench ran 6 min 55 s on the CPU default (14,400 tokens); quick is 12 requests of
    192 tokens, 16% of that."""
    quick, long_ = suite(), suite("LONG")
    assert quick.name == DEFAULT_SUITE == "quick"
    assert (quick.warmup, quick.measured, quick.requests) == (1, 5, 12)
    assert (long_.warmup, long_.measured, long_.requests) == (3, 5, 16)
    plan = BenchPlan()
    assert (plan.warmup, plan.measured, plan.workloads) == (1, 5, quick.workloads)
    tokens = lambda s: sum(w.max_tokens for w in s.workloads) * (s.warmup + s.measured)  # noqa: E731
    assert (tokens(quick), tokens(long_)) == (2304, 14400)
    assert tokens(quick) / tokens(long_) < 0.17         # 6 min 55 s x 0.16 = about a minute
    assert quick.measured >= 3                          # enough for a sample std and a CV
    with pytest.raises(BadInput, match="no bench suite 'huge'; choose quick or long"):
        suite("huge")


# -- a stand-in streaming server -------------------------------------------------------


class TimingsStandIn:
    """A tiny OpenAI-compatible *stand-in* (not an engine): streams one word per token,
    paced with sleeps, and reports llama.cpp-style ``timings`` measured on its own clock
    from first to last token, its window divided by ``timings_factor`` (1.2 = the engine
    claims 20% more speed than it actually streams at)."""

    def __init__(self, *, token_interval_s=0.03, prefill_s=0.05, natural_tokens=1000,
                 timings_factor=1.0, fail_every=0, send_usage=True):
        self.token_interval_s = token_interval_s
        self.prefill_s = prefill_s
        self.natural_tokens = natural_tokens     # where the "model" stops without ignore_eos
        self.timings_factor = timings_factor
        self.fail_every = fail_every             # every n-th request answers HTTP 500
        self.send_usage = send_usage
        self.requests: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append(body)
                if stand_in.fail_every and len(stand_in.requests) % stand_in.fail_every == 0:
                    data = b'{"error": {"message": "stand-in failure"}}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                stand_in._stream(self.wfile, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _stream(self, out, body):
        def send(obj):
            out.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            out.flush()

        n = body["max_tokens"] if body.get("ignore_eos") else min(body["max_tokens"], self.natural_tokens)
        time.sleep(self.prefill_s)
        send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
        t_first = t_last = time.perf_counter()
        for i in range(n):
            if i:
                time.sleep(self.token_interval_s)
            send({"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]})
            t_last = time.perf_counter()
            if i == 0:
                t_first = t_last
        elapsed = max(t_last - t_first, 1e-9)
        # llama.cpp's definition: the first token is free, n - 1 decode steps; a lying engine
        # claims a window shorter by timings_factor (and the rate that goes with it)
        timings = {"predicted_n": n, "predicted_ms": elapsed * 1000 / self.timings_factor,
                   "predicted_per_second": (n - 1) / elapsed * self.timings_factor,
                   "prompt_n": 12, "prompt_ms": self.prefill_s * 1000,
                   "prompt_per_second": 12 / self.prefill_s}
        finish = "length" if n == body["max_tokens"] else "stop"
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "timings": timings})
        if self.send_usage:
            send({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": n,
                                           "total_tokens": 12 + n}})
        out.write(b"data: [DONE]\n\n")
        out.flush()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def stand_in_info(url, full_length=True):
    """The stand-in speaks llama.cpp's dialect, so llama.cpp's adapter declares what it takes."""
    return ServerInfo(url=url, engine="stand-in", engine_version="0", model_id="stand-in-model",
                      capabilities=Capabilities(timings=True,
                                                full_length_body=dict(llamacpp.FULL_LENGTH_BODY) if full_length else {},
                                                reasons={"full_length": "test stand-in"} if full_length else {}),
                      normalise_timings=llamacpp.normalise_timings)


SMALL = (Workload("narrative", "tell a story", 20), Workload("code", "write code", 20))


@pytest.mark.slow
def test_runner_against_honest_stand_in_streams_records_and_agrees(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    progress_calls = []
    with TimingsStandIn(timings_factor=1.0) as stand_in, OpenAIClient(stand_in.url) as client:
        plan = BenchPlan(workloads=SMALL, warmup=1, measured=2, full_length=True,
                         sampler=Sampler(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0, seed=7))
        info = stand_in_info(stand_in.url)
        conditions = bench_conditions(info, plan)
        run_id = store.start_run("bench", conditions)
        seen_in_store = []

        def on_record(r):
            store.add_record(run_id, "bench_request", r)
            seen_in_store.append(len(store.records(run_id)))   # stored as each request finishes

        result = run_bench(client, info, plan, on_record=on_record,
                           progress=lambda done, total, label: progress_calls.append((done, total)))
        store.finish_run(run_id, result.status, result.summary)

    assert seen_in_store == list(range(1, 7))
    assert progress_calls[0] == (0, 6) and progress_calls[-1] == (6, 6)
    assert len(result.records) == 6
    assert sum(r["warmup"] for r in result.records) == 2

    # sampler values and the adapter's full-length field were sent explicitly on every request
    assert len(stand_in.requests) == 6
    for body in stand_in.requests:
        sampling = (body["temperature"], body["top_p"], body["top_k"], body["min_p"], body["seed"])
        assert sampling == (0.6, 0.95, 20, 0.0, 7)
        assert body["ignore_eos"] is True and body["stream"] is True and body["model"] == "stand-in-model"
    assert conditions["bench"]["full_length_body"] == {"ignore_eos": True}
    assert conditions["bench"]["full_length_reason"] == "test stand-in"
    assert store.get_run(run_id)["conditions"]["bench"]["full_length_body"] == {"ignore_eos": True}

    for r in result.records:
        assert r["status"] == 200 and r["error"] is None
        assert r["completion_tokens"] == 20 and len(r["arrivals_us"]) == 20   # one chunk per token
        assert r["sent"]["body"] == {"ignore_eos": True} and r["sent"]["max_tokens"] == 20
        assert encoding.ttft_s(r) >= 0.05                   # stand-in prefill
        gaps = sorted(r["arrivals_us"][1:])                                   # paced 30 ms apart
        assert gaps[len(gaps) // 2] >= 29_000 and sum(gaps) >= 19 * 29_000
        # 19 gaps of 30 ms after the first token: client decode about 20 / 0.57 s = 35
        assert 10 < st.decode_tps(r) < 40
        assert r["engine"]["decode_tokens"] == 20

    assert result.status == "OK"
    for name in ("narrative", "code"):
        s = result.summary["workloads"][name]
        assert s["n"] == 2 and s["n_usable"] == 2
        assert s["agreement"]["n"] == 2
        assert abs(s["agreement"]["diff_pct"]) < 5.0
        assert s["agreement"]["warning"] is None
        assert 30.0 <= s["inter_token_ms"]["p50"] <= s["inter_token_ms"]["p99"] < 300.0
    assert result.summary["warnings"] == []
    # the stored records give the same summary
    assert summarize(store.records(run_id))["workloads"] == result.summary["workloads"]


@pytest.mark.slow
def test_runner_flags_engine_timings_20_percent_too_fast():
    with TimingsStandIn(timings_factor=1.2) as stand_in, OpenAIClient(stand_in.url) as client:
        result = run_bench(client, stand_in_info(stand_in.url),
                           BenchPlan(workloads=SMALL[:1], warmup=0, measured=2, full_length=True))
    a = result.summary["workloads"]["narrative"]["agreement"]
    assert a["n"] == 2
    assert 12.0 < a["diff_pct"] < 40.0                # engine claims ~+20%
    assert a["warning"] is not None
    assert any("differs from the client-measured" in w for w in result.summary["warnings"])
    # the client figure is still the client's own: near the paced 20 tokens / 0.57 s, not the claim
    client = result.summary["workloads"]["narrative"]["decode_tps"]["mean"]
    assert 10 < client < 40
    # ...and the comparison used the client's inter-token rate, 19 gaps over the same window
    assert a["client_inter_token_tps"] == pytest.approx(client * 19 / 20, rel=0.02)


def test_full_length_only_when_the_adapter_declares_how():
    with TimingsStandIn(natural_tokens=3) as stand_in, OpenAIClient(stand_in.url) as client:
        plan = BenchPlan(workloads=SMALL[:1], warmup=0, measured=1, full_length=True)
        undeclared = stand_in_info(stand_in.url, full_length=False)
        result = run_bench(client, undeclared, plan)
    assert "ignore_eos" not in stand_in.requests[0]
    assert result.conditions["bench"]["full_length_body"] == {}
    assert "declares no way to ask for it" in result.conditions["bench"]["full_length_reason"]
    r = result.records[0]
    assert r["completion_tokens"] == 3 and r["finish_reason"] == "stop" and r["sent"]["body"] == {}
    # 3 of 20 tokens < 25%: not usable, and the summary says so
    assert result.summary["workloads"]["narrative"]["n_usable"] == 0
    assert any("25%" in w for w in result.summary["warnings"])


@pytest.mark.slow
def test_request_errors_are_recorded_not_raised():
    with TimingsStandIn(fail_every=2) as stand_in, OpenAIClient(stand_in.url) as client:
        result = run_bench(client, stand_in_info(stand_in.url),
                           BenchPlan(workloads=SMALL[:1], warmup=0, measured=4))
    failed = [r for r in result.records if r["error"]]
    assert len(failed) == 2
    assert all(r["status"] == 500 and "stand-in failure" in r["error"] for r in failed)
    assert result.status == "REQ_ERRORS"
    assert result.summary["workloads"]["narrative"]["n_errors"] == 2


def test_unreachable_server_gives_req_errors():
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with OpenAIClient(url, timeout=5) as client:
        result = run_bench(client, stand_in_info(url), BenchPlan(workloads=SMALL[:1], warmup=0, measured=1))
    assert result.status == "REQ_ERRORS"
    assert result.records[0]["status"] is None and result.records[0]["error"]


class ScriptedClient:
    """A fake client (no network): replays a script of StreamResults and exceptions."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = 0

    def stream_chat(self, payload, timeout=None):
        self.calls += 1
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


def _ok_stream(tokens=20):
    return StreamResult(status=200, content="x" * tokens, finish_reason="length",
                        usage={"completion_tokens": tokens, "prompt_tokens": 5},
                        t_request=0.0, t_first_token=0.1, t_end=1.1, chunks=tokens,
                        token_times=[0.1 + i * 0.05 for i in range(tokens)])


def test_interrupted_bench_keeps_what_it_measured(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    info = stand_in_info("http://127.0.0.1:1")
    plan = BenchPlan(workloads=SMALL[:1], warmup=0, measured=5)
    run_id = store.start_run("bench", bench_conditions(info, plan))
    client = ScriptedClient([_ok_stream(), RuntimeError("socket exploded"), _ok_stream(),
                             KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        run_bench(client, info, plan, on_record=lambda r: store.add_record(run_id, "bench_request", r))
    # no finish_run: a fresh Store on the same file still sees the three finished requests
    stored = Store(tmp_path / "r.sqlite").records(run_id)
    assert [r["payload"]["index"] for r in stored] == [0, 1, 2]
    assert stored[1]["payload"]["error"] == "RuntimeError: socket exploded"
    assert st.decode_tps(stored[0]["payload"]) == pytest.approx(20.0)   # 20 tokens / 1.0 s window
    assert summarize(stored)["status"] == "REQ_ERRORS"


# -- the real llama-server ------------------------------------------------------------


def _real_info(client, url):
    """What llama.cpp's probe says of the real server: its full-length field and timings normaliser."""
    info = llamacpp.probe(url)
    assert info is not None and info.normalise_timings is not None
    assert info.capabilities.full_length_body == llamacpp.FULL_LENGTH_BODY
    return info


@pytest.mark.integration
def test_bench_against_real_llama_server_cross_checks_the_engine(plain_server, tmp_path):
    """The client's inter-token rate and llama-server's own rate agree within the tolerance.

    max_tokens is chosen from this machine's speed (a first request) so each first-to-last
    token window is about 1 s, four times the cross-check's minimum: the check runs on a fast
    machine and a loaded one alike, and is asserted, never skipped.
    """
    with OpenAIClient(plain_server, timeout=300) as client:
        info = _real_info(client, plain_server)
        probe = run_bench(client, info, BenchPlan(workloads=(Workload("probe", NARRATIVE_PROMPT, 64),),
                                                  warmup=0, measured=1, full_length=True, timeout_s=300))
        rate = probe.summary["workloads"]["probe"]["decode_tps"]["mean"]
        assert rate and rate > 0, probe.records
        tokens = max(64, math.ceil(rate * 4 * st.AGREEMENT_MIN_WINDOW_S) + 1)
        plan = BenchPlan(workloads=default_workloads(max_tokens=tokens), warmup=1, measured=2, full_length=True,
                         timeout_s=300)
        store = Store(tmp_path / "r.sqlite")
        run_id = store.start_run("bench", bench_conditions(info, plan))
        result = run_bench(client, info, plan,
                           on_record=lambda r: store.add_record(run_id, "bench_request", r))
        store.finish_run(run_id, result.status, result.summary)

    assert result.status == "OK", result.records
    stored = store.records(run_id, kind="bench_request")
    assert len(stored) == 6
    assert summarize(stored)["workloads"] == result.summary["workloads"]   # the store gives the same figures
    for r in result.records:
        assert r["status"] == 200 and r["error"] is None
        assert r["completion_tokens"] == tokens          # full length every time
        assert r["sent"]["body"] == llamacpp.FULL_LENGTH_BODY
        assert r["prompt_tokens"] > 10
        assert 0 < encoding.ttft_s(r) < encoding.wall_s(r)
        assert st.wall_tps(r) < st.decode_tps(r)
        assert r["engine"]["decode_tokens"] == tokens and r["engine"]["decode_ms"] > 0
        assert tokens * 0.9 <= len(r["arrivals_us"]) <= tokens
    for name in ("narrative", "code"):
        s = result.summary["workloads"][name]
        assert s["n"] == 2 and s["n_usable"] == 2
        assert s["decode_tps"]["n"] == 2 and s["decode_tps"]["std"] is not None
        itl = s["inter_token_ms"]
        assert 0 < itl["p50"] <= itl["p95"] <= itl["p99"] and itl["n_gaps"] >= 2 * (tokens * 0.9 - 1)
        a = s["agreement"]
        assert a["n"] == 2, a                            # every measured window was long enough
        assert abs(a["diff_pct"]) <= st.AGREEMENT_TOLERANCE_PCT and a["warning"] is None, a


@pytest.mark.integration
def test_arrivals_of_a_long_real_reply_stay_compact(plain_server, tmp_path):
    """The size the records docstring states: a 1,000-token reply's arrival list, as stored."""
    with OpenAIClient(plain_server, timeout=600) as client:
        info = _real_info(client, plain_server)
        result = run_bench(client, info, BenchPlan(workloads=(Workload("long", NARRATIVE_PROMPT, 1000),),
                                                   warmup=0, measured=1, full_length=True, timeout_s=600))
    [r] = result.records
    assert r["error"] is None and r["completion_tokens"] == 1000, r["error"]
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", {})
    store.add_record(run_id, "bench_request", r)
    stored_bytes = store._db.execute("SELECT length(payload) FROM records").fetchone()[0]
    compact = json.dumps(r["arrivals_us"], separators=(",", ":"))
    absolute = json.dumps(decode_arrivals(r["arrivals_us"]), separators=(",", ":"))
    print(f"\n{len(r['arrivals_us'])} arrivals: {len(compact)} bytes delta-encoded, {len(absolute)} absolute; "
          f"record {stored_bytes} bytes; {st.decode_tps(r):.0f} tok/s")
    assert len(compact) < len(absolute)
    assert stored_bytes < 10 * 1000                      # under 10 bytes a token, whole record
