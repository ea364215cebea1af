"""Bench: statistics from hand-built records, the decode-window rule, the runner against a
stand-in streaming server whose engine timings lie (or don't), and the real llama-server."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engineroom.bench import (
    DEFAULT_SUITE,
    BenchPlan,
    Sampler,
    Workload,
    bench_conditions,
    decode_rate,
    default_workloads,
    measure_request,
    run_bench,
    suite,
    summarize,
)
from engineroom.bench import statistics as st
from engineroom.client import OpenAIClient, StreamResult
from engineroom.engines.base import Capabilities, ServerInfo
from engineroom.errors import BadInput
from engineroom.store import Store

# -- statistics from hand-built records -----------------------------------------------


def rec(workload="w", *, decode=None, wall_tps=None, ttft=0.1, tokens=100, max_tokens=100,
        warmup=False, status=200, error=None, engine_pps=None, index=0, inter=None):
    """A hand-built record; ``inter`` (default: ``decode``) sets the client inter-token
    rate through last_token_s = ttft + (tokens - 1) / inter."""
    inter = decode if inter is None else inter
    last = ttft + (tokens - 1) / inter if (inter and tokens and tokens >= 2) else None
    return {
        "workload": workload, "index": index, "warmup": warmup, "max_tokens": max_tokens,
        "status": status, "error": error, "ttft_s": ttft, "wall_s": 1.0, "last_token_s": last,
        "completion_tokens": tokens, "prompt_tokens": 10, "decode_tps": decode,
        "wall_tps": wall_tps, "ignore_eos": False,
        "engine_timings": None if engine_pps is None else {"predicted_per_second": engine_pps,
                                                            "prompt_per_second": 500.0},
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
        rec("a", decode=99.0, wall_tps=1.0, warmup=True),               # warm-up: excluded
        rec("a", decode=10.0, wall_tps=8.0, ttft=0.2, engine_pps=10.0),
        rec("a", decode=12.0, wall_tps=9.0, ttft=0.4, engine_pps=12.0),
        rec("a", decode=14.0, wall_tps=10.0, ttft=0.6, engine_pps=14.0),
        rec("a", decode=50.0, wall_tps=50.0, tokens=10),                # < 25% of max: not usable
        rec("b", decode=30.0, wall_tps=20.0),
    ]
    s = summarize(records)
    a = s["workloads"]["a"]
    assert (a["n"], a["n_ok"], a["n_usable"]) == (4, 4, 3)
    assert a["decode_tps"]["mean"] == pytest.approx(12.0)
    assert a["decode_tps"]["std"] == pytest.approx(2.0)
    assert a["decode_tps"]["cv_pct"] == pytest.approx(16.6667, rel=1e-4)
    assert (a["decode_tps"]["min"], a["decode_tps"]["max"]) == (10.0, 14.0)
    assert a["wall_tps"]["mean"] == pytest.approx(9.0)
    assert a["ttft_s"]["n"] == 4                                         # TTFT over all ok requests
    assert a["engine_decode_tps"]["mean"] == pytest.approx(12.0)
    assert a["agreement"]["diff_pct"] == pytest.approx(0.0)
    assert a["agreement"]["warning"] is None
    assert s["workloads"]["b"]["agreement"]["n"] == 0                    # engine gave no timings
    assert s["status"] == "OK"
    assert s["warnings"] == []


def test_agreement_warns_above_five_percent_and_compares_same_requests():
    # engine 10% above client on the requests that have both figures
    records = [rec(decode=10.0, engine_pps=11.0), rec(decode=20.0, engine_pps=22.0),
               rec(decode=1000.0)]                       # no engine timing: not in the comparison
    a = summarize(records)["workloads"]["w"]["agreement"]
    assert a["n"] == 2
    assert a["client_inter_token_tps"] == pytest.approx(15.0)
    assert a["engine_decode_tps"] == pytest.approx(16.5)
    assert a["diff_pct"] == pytest.approx(10.0)
    assert a["warning"] and "+10.0%" in a["warning"]
    # within tolerance
    ok = summarize([rec(decode=100.0, engine_pps=104.0)])["workloads"]["w"]["agreement"]
    assert ok["diff_pct"] == pytest.approx(4.0) and ok["warning"] is None


def test_agreement_uses_the_engines_inter_token_definition():
    """24 tokens, first at 0.10 s, last at 0.33 s: 23 gaps of 10 ms. llama.cpp says
    (24 - 1) / 0.23 s = 100 tok/s; tokens / (wall - TTFT) reads 24 / 0.23 = 104.3 (+4.3%),
    a definition gap that must not count as disagreement."""
    r = rec(tokens=24, max_tokens=24, ttft=0.10, engine_pps=100.0, decode=24 / 0.23, inter=100.0)
    a = st.agreement([r], min_window_s=0.2)
    assert st.inter_token_tps(r) == pytest.approx(100.0)
    assert a["n"] == 1 and a["diff_pct"] == pytest.approx(0.0, abs=1e-9) and a["warning"] is None


def test_agreement_leaves_out_windows_too_short_to_judge():
    # 24 tokens at ~150 tok/s: a 0.15 s window, where one 20 ms late chunk is 13%
    short = rec(tokens=24, max_tokens=24, decode=160.0, inter=150.0, engine_pps=130.0)
    a = st.agreement([short, short])
    assert a["n"] == 0 and a["warning"] is None and a["diff_pct"] is None
    assert "too short" in a["not_checked"] and "0.15 s" in a["not_checked"]
    # one long request among short ones: only the long one is compared
    long = rec(tokens=200, max_tokens=200, decode=101.0, inter=100.0, engine_pps=120.0)
    b = st.agreement([short, long])
    assert b["n"] == 1 and b["diff_pct"] == pytest.approx(20.0) and b["warning"]
    # no engine timings at all: a different reason
    assert st.agreement([rec(decode=100.0)])["not_checked"] == "the engine reported no decode timings"


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


def test_measure_request_uses_client_clock_and_usage_tokens():
    result = StreamResult(status=200, content="x" * 40, finish_reason="length",
                          usage={"completion_tokens": 40, "prompt_tokens": 12},
                          timings={"predicted_per_second": 999.0, "predicted_n": 40},
                          t_request=100.0, t_first_token=100.5, t_end=102.5, chunks=42,
                          token_times=[100.5, 102.4])
    r = measure_request(result, workload=Workload("w", "p", 40), index=3, warmup=False,
                        ignore_eos=True, started_unix=0.0).to_dict()
    assert r["ttft_s"] == pytest.approx(0.5)
    assert r["wall_s"] == pytest.approx(2.5)
    assert r["decode_tps"] == pytest.approx(40 / 2.0)      # client clock, not the engine's 999
    assert r["wall_tps"] == pytest.approx(40 / 2.5)
    assert r["last_token_s"] == pytest.approx(2.4)
    assert r["engine_timings"] == {"predicted_per_second": 999.0, "predicted_n": 40}
    assert (r["index"], r["warmup"], r["ignore_eos"], r["status"], r["error"]) == (3, False, True, 200, None)

    # a 200 stream without usage: token count unknown is an error, not a silent zero
    no_usage = StreamResult(status=200, content="hi", t_request=0.0, t_first_token=0.1, t_end=1.0)
    r = measure_request(no_usage, workload=Workload("w", "p", 8), index=0, warmup=False,
                        ignore_eos=False, started_unix=0.0)
    assert r.error and "usage" in r.error and r.decode_tps is None


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
    from first to last token, multiplied by ``timings_factor`` (1.2 = the engine claims
    20% more speed than it actually streams at)."""

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
        # llama.cpp's definition: the first token is free, n - 1 decode steps
        timings = {"predicted_n": n, "predicted_ms": elapsed * 1000,
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


def stand_in_info(url, ignore_eos=True):
    return ServerInfo(url=url, engine="stand-in", engine_version="0", model_id="stand-in-model",
                      capabilities=Capabilities(ignore_eos=ignore_eos, timings=True,
                                                reasons={"ignore_eos": "test stand-in"}))


SMALL = (Workload("narrative", "tell a story", 20), Workload("code", "write code", 20))


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

    # sampler values and ignore_eos were sent explicitly on every request
    assert len(stand_in.requests) == 6
    for body in stand_in.requests:
        assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"], body["seed"]) == (0.6, 0.95, 20, 0.0, 7)
        assert body["ignore_eos"] is True and body["stream"] is True and body["model"] == "stand-in-model"
    assert conditions["bench"]["ignore_eos"] is True
    assert store.get_run(run_id)["conditions"]["bench"]["ignore_eos"] is True

    for r in result.records:
        assert r["status"] == 200 and r["error"] is None
        assert r["completion_tokens"] == 20
        assert r["ttft_s"] >= 0.05                    # stand-in prefill
        # 19 gaps of 30 ms after the first token: client decode about 20 / 0.57 s = 35
        assert 10 < r["decode_tps"] < 40
        assert r["engine_timings"]["predicted_n"] == 20

    assert result.status == "OK"
    for name in ("narrative", "code"):
        s = result.summary["workloads"][name]
        assert s["n"] == 2 and s["n_usable"] == 2
        assert s["agreement"]["n"] == 2
        assert abs(s["agreement"]["diff_pct"]) < 5.0
        assert s["agreement"]["warning"] is None
    assert result.summary["warnings"] == []
    # the stored records give the same summary
    assert summarize(store.records(run_id))["workloads"] == result.summary["workloads"]


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


def test_ignore_eos_only_when_server_supports_it():
    with TimingsStandIn(natural_tokens=3) as stand_in, OpenAIClient(stand_in.url) as client:
        plan = BenchPlan(workloads=SMALL[:1], warmup=0, measured=1, full_length=True)
        unsupported = stand_in_info(stand_in.url, ignore_eos=None)
        result = run_bench(client, unsupported, plan)
    assert "ignore_eos" not in stand_in.requests[0]
    assert result.conditions["bench"]["ignore_eos"] is False
    assert "does not say" in result.conditions["bench"]["ignore_eos_reason"]
    r = result.records[0]
    assert r["completion_tokens"] == 3 and r["finish_reason"] == "stop"
    # 3 of 20 tokens < 25%: not usable, and the summary says so
    assert result.summary["workloads"]["narrative"]["n_usable"] == 0
    assert any("25%" in w for w in result.summary["warnings"])


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
                        t_request=0.0, t_first_token=0.1, t_end=1.1, chunks=tokens)


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
    assert stored[0]["payload"]["decode_tps"] == pytest.approx(20.0)   # 20 tokens / 1.0 s window
    assert summarize(stored)["status"] == "REQ_ERRORS"


# -- the real llama-server ------------------------------------------------------------

@pytest.mark.integration
def test_bench_against_real_llama_server(plain_server, tmp_path):
    llama_server = plain_server
    with OpenAIClient(llama_server, timeout=120) as client:
        model_id = client.models()[0]
        info = ServerInfo(url=llama_server, engine="llama.cpp", model_id=model_id,
                          capabilities=Capabilities(ignore_eos=True, timings=True,
                                                    reasons={"ignore_eos": "llama-server sampling option"}))
        plan = BenchPlan(workloads=default_workloads(max_tokens=32), warmup=1, measured=2, full_length=True,
                         timeout_s=120)
        store = Store(tmp_path / "r.sqlite")
        run_id = store.start_run("bench", bench_conditions(info, plan))
        result = run_bench(client, info, plan,
                           on_record=lambda r: store.add_record(run_id, "bench_request", r))
        store.finish_run(run_id, result.status, result.summary)

    assert result.status == "OK", result.records
    assert len(store.records(run_id, kind="bench_request")) == 6
    for r in result.records:
        assert r["status"] == 200 and r["error"] is None
        assert r["completion_tokens"] == 32             # ignore_eos: full length every time
        assert r["prompt_tokens"] > 10
        assert 0 < r["ttft_s"] < r["wall_s"]
        assert r["decode_tps"] and r["decode_tps"] > 0
        assert r["wall_tps"] < r["decode_tps"]
        assert r["engine_timings"]["predicted_n"] in (31, 32)
        assert r["engine_timings"]["predicted_per_second"] > 0
    for name in ("narrative", "code"):
        s = result.summary["workloads"][name]
        assert s["n"] == 2 and s["n_usable"] == 2
        assert s["decode_tps"]["n"] == 2 and s["decode_tps"]["std"] is not None
        a = s["agreement"]
        measured = [r for r in result.records if r["workload"] == name and not r["warmup"]]
        long_enough = sum(1 for r in measured if r["last_token_s"] - r["ttft_s"] >= st.AGREEMENT_MIN_WINDOW_S)
        assert a["n"] == long_enough                    # exactly the requests with a long enough window
        if a["n"]:
            assert math.isfinite(a["diff_pct"])
            assert abs(a["diff_pct"]) < 50              # same ballpark; > 5% only warns
        else:                                           # a fast machine: 31 gaps in < 0.25 s
            assert "too short" in a["not_checked"]
    for r in result.records:
        # the engine's (n - 1) / window and the client's, same request: same ballpark
        ratio = st.inter_token_tps(r) / r["engine_timings"]["predicted_per_second"]
        assert 0.5 < ratio < 2.0, r
