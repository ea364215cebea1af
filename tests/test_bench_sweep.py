"""The concurrency sweep (``bench sweep``) and request-rate mode (``bench rate``): the knee,
the budget, the Poisson schedule and goodput, recomputed from raw records.

Statistics are tested on hand-built records; the integration tests run tiny sweeps and rate
runs against the real llama-server + SmolLM2 (figures not asserted: a shared 2-core machine).
"""

from __future__ import annotations

import json
import statistics

import pytest

from engineroom.bench.clientside import KindClient, encode_kinds
from engineroom.bench.rate.arrivals import goodput, poisson_schedule, request_latency
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.run import run_suite
from engineroom.bench.suites.specs import SUITE_SPECS
from engineroom.bench.suites.summary import summarize_suite
from engineroom.bench.sweep.knee import estimate_cell_s, knee, recommend, stream_counts
from engineroom.engines.base import DecodeWindow, EngineTimings
from engineroom.errors import BadInput
from engineroom.records.encoding import encode_arrivals
from engineroom.report.suites import suite_section
from engineroom.store import Store

from conftest import cli


def req(*, tokens=20, ttft=0.1, tps=50.0, lag_us=0, group=None, status=200, error=None, warmup=False, **extra):
    times = [ttft + i / tps for i in range(tokens)]
    engine = EngineTimings(decode_tokens=tokens, decode_ms=max(tokens - 1, 1) / tps * 1000,
                           decode_window=DecodeWindow.FIRST_TOKEN_FREE, prompt_tokens=100, prompt_ms=50.0,
                           cached_tokens=0, source="hand-built").as_dict()
    return {"workload": "w", "index": 0, "warmup": warmup, "sent": {"max_tokens": max(tokens, 1), "body": {}},
            "sent_unix": 0.0, "status": status, "error": error,
            "end_us": round(((times[-1] if times else ttft) + 0.001) * 1e6), "arrivals_us": encode_arrivals(0.0, times),
            "completion_tokens": tokens, "prompt_tokens": 100, "cached_prompt_tokens": 0, "finish_reason": "length",
            "chunks": tokens + 2, "content_chars": 4 * tokens, "reasoning_chars": 0, "engine": engine,
            "engine_raw": None, "suite": "t", "group": group or {"rate": 2.0}, "discarded": None,
            "arrival_kinds": encode_kinds(["c"] * tokens), "scheduled_lag_us": lag_us, **extra}


LOAD_OK = {"kind": "client_load", "payload": {"cpu_s": 0.1, "wall_s": 10.0, "interval_us": 5000,
                                              "lags_us": [100] * 200}}


# -- the Poisson schedule and goodput --------------------------------------------------------


def test_poisson_schedule_is_seeded_exponential_and_bounded():
    a = poisson_schedule(4.0, 7, count=20000)
    assert a == poisson_schedule(4.0, 7, count=20000) and a != poisson_schedule(4.0, 8, count=20000)
    assert a[0] == 0.0 and all(y > x for x, y in zip(a, a[1:], strict=False))
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)           # mean gap 1/rate
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)           # exponential: std = mean
    d = poisson_schedule(4.0, 7, duration_s=10.0)
    assert d == [t for t in a if t < 10.0]
    assert len(poisson_schedule(4.0, 7, duration_s=100.0, count=5)) == 5     # whichever limit comes first
    for kwargs, match in (({"rate": 0, "count": 3}, "--rate must be a positive"), ({"rate": 1.0}, "--duration-s or"),
                          ({"rate": 1.0, "count": 0}, "--requests must be at least 1"),
                          ({"rate": 1e6, "duration_s": 3600.0}, "at most 100,000")):
        rate = kwargs.pop("rate")
        with pytest.raises(BadInput, match=match):
            poisson_schedule(rate, 1, **kwargs)


def test_goodput_counts_latency_from_the_scheduled_send():
    on_time = req(ttft=0.1, tps=50.0, scheduled_s=0.0)                     # TTFT 100 ms, TPOT 20 ms
    queued = req(ttft=0.1, tps=50.0, lag_us=3_000_000, scheduled_s=0.5)     # sent 3 s late: TTFT 3.1 s
    slow = req(ttft=0.1, tps=5.0, scheduled_s=1.0)                          # TPOT 200 ms
    failed = req(status=500, error="HTTP 500: boom", tokens=0, scheduled_s=1.5)
    silent = req(tokens=0, scheduled_s=2.0)
    warm = req(warmup=True)
    assert request_latency(queued)["ttft_s"] == pytest.approx(3.1)
    assert request_latency(slow)["tpot_s"] == pytest.approx(0.2)
    g = goodput([on_time, queued, slow, failed, silent, warm], slo_ttft_ms=2000, slo_itl_ms=100, rate=2.0)
    assert (g["requests"], g["completed"], g["good"], g["errors"], g["silent"]) == (5, 3, 1, 1, 1)
    assert (g["missed_ttft"], g["missed_itl"]) == (1, 1)
    wall = 1.0 + (0.1 + 19 / 5.0 + 0.001)                                  # schedule start -> the slow one's end
    assert g["wall_s"] == pytest.approx(wall) and g["goodput_rps"] == pytest.approx(1 / wall)
    assert g["ttft_ms"]["p50"] == pytest.approx(100, rel=0.01) and g["ttft_ms"]["p99"] > 3000   # the queued one
    loose = goodput([on_time, queued, slow], slo_ttft_ms=5000, slo_itl_ms=500)
    assert loose["good"] == 3


def test_rate_summary_and_card_from_stored_records(tmp_path):
    cond = {"host": {"gpus": []}, "bench": {"suite": "rate", "kind": "rate", "agreement_tolerance_pct": 1.0,
                                            "cv_threshold_pct": 10.0, "rate": 2.0, "slo_ttft_ms": 2000.0,
                                            "slo_itl_ms": 100.0, "requests": 3, "duration_s": None,
                                            "arrival_seed": 1234, "scheduled": 3, "schedule_span_s": 1.0,
                                            "prompt_tokens": 64, "max_inflight": 64}}
    recs = [{"kind": "bench_request", "payload": req(scheduled_s=x, arrival=i)} for i, x in enumerate((0, .4, 1))]
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", cond)
    for r in recs + [LOAD_OK]:
        store.add_record(run_id, r["kind"], r["payload"])
    s = summarize_suite(store.records(run_id), store.get_run(run_id)["conditions"])
    assert s["rate"]["good"] == 3 and s["status"] == "OK"
    assert {c["name"]: c["status"] for c in s["integrity"]}["cv"] == "SKIP"
    text = "\n".join(suite_section(store.records(run_id), cond))
    assert "Poisson arrivals at 2.00 req/s (seed 1234" in text and "| 3 | 3 | 3 | 0 / 0 |" in text


# -- the sweep: cells, budget, knee -----------------------------------------------------------


def test_stream_counts_and_the_budget_estimate():
    assert stream_counts(1) == [1] and stream_counts(4) == [1, 2, 4] and stream_counts(6) == [1, 2, 4, 6]
    assert estimate_cell_s(512, 4, 2, []) is None                            # the first cell always runs
    done = [{"ctx": 512, "streams": 1, "round_s": 2.0}, {"ctx": 512, "streams": 2, "round_s": 3.0}]
    assert estimate_cell_s(512, 4, 2, done) == pytest.approx(2 * 3.0 * 4 / 2)   # linear in N from the largest
    assert estimate_cell_s(2048, 1, 2, done) == pytest.approx(2 * 2.0 * 4)   # from N=1, linear in the prompt size


def pt(n, agg, ttft=100.0, tpot=20.0, errors=0):
    return {"streams": n, "aggregate_tps": agg, "per_stream_tps": agg / n, "ttft_p95_ms": ttft,
            "tpot_p95_ms": tpot, "errors": errors, "silent": 0}


def test_knee_is_where_an_added_stream_stops_paying_or_an_slo_breaks():
    flat = knee([pt(1, 100), pt(2, 190), pt(4, 360), pt(8, 400)], gain_pct=15)
    assert flat["knee"] == 4 and "10.0 tok/s per added stream, 10% of one stream's 100.0" in flat["reason"]
    assert [round(s["gain_pct"]) for s in flat["steps"]] == [90, 85, 10]
    slo = knee([pt(1, 100), pt(2, 190), pt(4, 360, ttft=2500)], slo_ttft_ms=2000)
    assert slo["knee"] == 2 and "breaks the TTFT SLO" in slo["reason"]
    itl = knee([pt(1, 100), pt(2, 190, tpot=150)], slo_itl_ms=100)
    assert itl["knee"] == 1 and "inter-token SLO" in itl["reason"]
    assert knee([pt(1, 100), pt(2, 190, errors=1)])["knee"] == 1
    rising = knee([pt(1, 100), pt(2, 190)])
    assert rising["knee"] == 2 and rising["reason"].startswith("throughput still rose")
    rec = recommend({512: flat, 4096: slo}, 8, "the engine's reported slot count")
    assert rec["slots"] == 2 and rec["ctx"] == 4096 and "TTFT SLO" in rec["reason"]
    more = recommend({512: rising}, 2, "the engine's reported slot count")
    assert more["slots"] == 2 and "more slots may help" in more["reason"]
    assert recommend({512: knee([])}, 2, "x")["slots"] is None
    slow = knee([pt(1, 100, ttft=5000), pt(2, 150, ttft=9000)], slo_ttft_ms=2000)
    assert slow["knee"] is None and slow["reason"].startswith("even N=1 breaks the TTFT SLO")
    none = recommend({256: slow}, 2, "x")
    assert none["slots"] is None and none["reason"].startswith("no slot count measured meets the SLOs: at 256-token")


def test_sweep_summary_from_records_names_the_cells_the_budget_skipped():
    def cell(ctx, n, rounds, tps):
        return [{"kind": "bench_request", "payload": req(group={"streams": n, "ctx": ctx}, tps=tps, round=r0 * 10 + n,
                                                         stream=i)}
                for r0 in range(rounds) for i in range(n)]
    recs = cell(256, 1, 2, 50.0) + cell(256, 2, 2, 45.0) + [
        {"kind": "sweep_cell", "payload": {"ctx": 256, "streams": 1, "status": "run", "elapsed_s": 0.0, "took_s": 3.0,
                                           "estimate_s": None, "budget_s": 10.0}},
        {"kind": "sweep_cell", "payload": {"ctx": 256, "streams": 2, "status": "run", "elapsed_s": 3.0, "took_s": 4.0,
                                           "estimate_s": 6.0, "budget_s": 10.0}},
        {"kind": "sweep_cell", "payload": {"ctx": 256, "streams": 4, "status": "skipped", "elapsed_s": 7.0,
                                           "estimate_s": 16.0, "budget_s": 10.0}}, LOAD_OK]
    cond = {"host": {"gpus": []}, "bench": {"suite": "sweep", "kind": "sweep", "agreement_tolerance_pct": 1.0,
                                            "cv_threshold_pct": 10.0, "streams_max": 4, "budget_s": 10.0,
                                            "knee_gain_pct": 15.0, "slo_ttft_ms": 2000.0, "slo_itl_ms": 100.0,
                                            "streams_source": "the engine's reported slot count"}}
    s = summarize_suite(recs, cond)
    w = s["sweep"]
    assert [(c["ctx"], c["streams"], c["rounds"]) for c in w["cells"]] == [(256, 1, 2), (256, 2, 2)]
    assert w["cells"][1]["aggregate_tps"] > w["cells"][0]["aggregate_tps"]
    assert w["recommended"]["slots"] == 2 and w["elapsed_s"] == pytest.approx(7.0)
    assert any("budget" in x and "1 cell" in x for x in s["warnings"])
    text = "\n".join(suite_section(recs, cond))
    assert "**Recommended slot count: 2**" in text and "256 tokens N=4 (estimated 16 s, 3 s left)" in text


# -- the real llama-server ------------------------------------------------------------------


def _ctx(url, store, run_id, **kw):
    from engineroom import engines

    engine = engines.adapter("llama.cpp")
    info = engines.detect(url)
    return SuiteContext(server=info, new_client=lambda: KindClient(url),
                        count_tokens=lambda text: engine.count_tokens(url, text), metrics=lambda: engine.metrics(url),
                        emit=lambda k, p: store.add_record(run_id, k, p), **kw)


def test_sweep_stops_at_the_budget_on_the_real_engine(plain_server, tmp_path):
    """A budget shorter than one cell: N=1 runs (nothing to estimate from), N=2 is skipped, and
    the decision with its estimate is stored."""
    store = Store(tmp_path / "s.sqlite")
    run_id = store.start_run("bench", {})
    spec = SUITE_SPECS["sweep"].with_(warmup=0, rounds=1, contexts=(64,), max_tokens=8, budget_s=0.01)
    result = run_suite(spec, _ctx(plain_server, store, run_id, streams=2))
    assert result.conditions["bench"]["stream_counts"] == [1, 2]
    cells = [r["payload"] for r in store.records(run_id, "sweep_cell")]
    assert [(c["streams"], c["status"]) for c in cells] == [(1, "run"), (2, "skipped")]
    assert cells[1]["estimate_s"] > 0
    reqs = [r["payload"] for r in store.records(run_id, "bench_request")]
    assert len(reqs) == 1 and reqs[0]["group"] == {"streams": 1, "ctx": 64} and reqs[0]["status"] == 200
    assert result.summary["sweep"]["skipped"] and any("budget" in w for w in result.summary["warnings"])


def test_rate_mode_on_the_real_engine(plain_server, tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", {})
    spec = SUITE_SPECS["rate"].with_(warmup=0, rate=4.0, requests=5, duration_s=None, prompt_tokens=64,
                                     max_tokens=8, arrival_seed=99)
    result = run_suite(spec, _ctx(plain_server, store, run_id))
    reqs = sorted((r["payload"] for r in store.records(run_id, "bench_request")), key=lambda r: r["arrival"])
    assert [r["scheduled_s"] for r in reqs] == poisson_schedule(4.0, 99, count=5)
    assert all(r["status"] == 200 and r["scheduled_lag_us"] >= 0 for r in reqs)
    assert len({r["salt"] for r in reqs}) == 5
    g = result.summary["rate"]
    assert g["requests"] == g["completed"] == 5 and g["errors"] == g["silent"] == 0
    assert g["goodput_rps"] is not None and 0 <= g["good"] <= 5
    assert g["ttft_ms"]["p50"] >= min(r["arrivals_us"][0] for r in reqs) / 1000.0   # from the schedule: never less


def test_cli_sweep_and_rate_json(plain_server, tmp_path):
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    proc = cli("bench", "sweep", "--url", plain_server, "--streams", "2", "--depths", "64", "--runs", "1",
               "--warmup", "0", "--max-tokens", "8", "--budget-s", "120", "--slo-ttft-ms", "600000",
               "--slo-itl-ms", "60000", "--json", env=env, timeout=300)       # SLOs this loaded CPU meets
    assert proc.returncode in (0, 1), proc.stderr                  # 1 only when an integrity check failed
    out = json.loads(proc.stdout)
    sweep = out["summary"]["sweep"]
    assert [(c["ctx"], c["streams"]) for c in sweep["cells"]] == [(64, 1), (64, 2)]
    assert sweep["recommended"]["slots"] in (1, 2) and sweep["recommended"]["reason"], sweep
    assert out["summary"]["integrity"] and sweep["slo_ttft_ms"] == 600000
    proc = cli("bench", "rate", "--url", plain_server, "--rate", "5", "--requests", "3", "--prompt-tokens", "64",
               "--max-tokens", "8", "--warmup", "0", env=env, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert "## Bench suite: rate" in proc.stdout and "goodput req/s" in proc.stdout


def test_cli_refuses_bad_mode_arguments_in_one_sentence():
    for args, says in ((("sweep", "--rate", "2"), "No such option: --rate"),
                       (("rate", "--rate", "0"), "--rate must be a positive number"),
                       (("rate",), "Missing option '--rate'"),
                       (("depth", "--turns", "3"), "No such option: --turns"),
                       (("--budget-s", "10"), "No such option: --budget-s"),
                       (("--runs", "3", "depth"), "--runs goes after the suite's name: `engineroom bench depth")):
        proc = cli("bench", *args)
        assert proc.returncode != 0 and says in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_rate_latency_counts_the_wait_for_a_free_sender():
    """One sender and requests slower than the arrivals: later requests leave late, and that wait
    is in their TTFT from the schedule (client-side queueing counted, as a user would see it)."""
    import time

    from engineroom.client import StreamResult
    from engineroom.engines.base import ServerInfo

    class Slow:
        def stream_chat(self, payload, timeout=None):
            r = StreamResult(status=200, finish_reason="length", done=True)
            r.t_request = time.perf_counter()
            time.sleep(0.2)
            r.token_times = [r.t_request + 0.1, r.t_request + 0.15, r.t_request + 0.2]
            r.t_end = time.perf_counter()
            r.usage, r.content = {"completion_tokens": 3, "prompt_tokens": 80}, "abc"
            return r

    ctx = SuiteContext(server=ServerInfo(url="http://fake", engine="fake", model_id="m", n_ctx=4096),
                       new_client=Slow)
    spec = SUITE_SPECS["rate"].with_(warmup=0, rate=50.0, requests=4, duration_s=None, prompt_tokens=32,
                                     max_tokens=3, max_inflight=1)
    result = run_suite(spec, ctx)
    reqs = sorted((r["payload"] for r in result.records if r["kind"] == "bench_request"), key=lambda r: r["arrival"])
    lags = [r["scheduled_lag_us"] for r in reqs]
    assert lags[-1] > 300_000 and lags == sorted(lags)            # each waited for the one before it
    g = result.summary["rate"]
    assert g["ttft_ms"]["p99"] > 400 and g["send_lag_ms"]["p99"] > 300
    assert g["good"] == 4 and g["goodput_rps"] == pytest.approx(4 / g["wall_s"])


def test_rate_run_interrupted_drops_the_arrivals_not_yet_sent():
    """Ctrl-C during a long schedule: what was answered is stored, the rest is not waited for."""
    import time

    from engineroom.client import StreamResult
    from engineroom.engines.base import ServerInfo

    class Quick:
        def stream_chat(self, payload, timeout=None):
            r = StreamResult(status=200, finish_reason="length", done=True)
            r.t_request = time.perf_counter()
            r.token_times = [r.t_request + 0.01, r.t_request + 0.02]
            r.t_end = r.t_request + 0.03
            r.usage, r.content = {"completion_tokens": 2, "prompt_tokens": 40}, "ab"
            return r

    def progress(done, total, label):
        if "answered" in label:
            raise KeyboardInterrupt

    stored = []
    ctx = SuiteContext(server=ServerInfo(url="http://fake", engine="fake", model_id="m", n_ctx=4096),
                       new_client=Quick, progress=progress, emit=lambda k, p: stored.append(k))
    spec = SUITE_SPECS["rate"].with_(warmup=0, rate=0.2, requests=6, duration_s=None, prompt_tokens=32, max_tokens=2)
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        run_suite(spec, ctx)
    assert time.perf_counter() - t0 < 5.0                       # the schedule ran to ~25 s; nobody waited for it
    assert stored.count("bench_request") == 1 and "client_load" in stored
