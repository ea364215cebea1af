"""The bench checks beside integrity's, on stored records (no engine): host contention, other
clients on the server, inter-token outliers, a stalled or dead engine (the watchdog), and the
quick / long suites' checklist; the card shows the checklist and the errors behind failed requests.
The same rules against the real llama-server are in tests/test_bench_trust.py."""

from __future__ import annotations

import pytest
from test_bench import ScriptedClient, _ok_stream, rec, stand_in_info

from engineroom import resources
from engineroom.bench import BenchPlan, Workload, bench_conditions, run_bench
from engineroom.bench.guards import (
    contention_check,
    failed_requests,
    other_clients_check,
    outliers_check,
    summarize_bench,
)
from engineroom.bench.watchdog import (
    ABORT_KIND,
    SLOWEST_PREFILL_TPS,
    STALL_FACTOR,
    BenchAborted,
    Watchdog,
)
from engineroom.report import render_card
from engineroom.store import Store


def _sample(t, busy, engine_cpu, own=0.0, steal=0.0, cores=2, load=0.5):
    """A ResourceSampler sample: cumulative CPU seconds of the watched cores at time ``t``."""
    return {"t": t, "engine": {"cpu_s": engine_cpu} if engine_cpu is not None else None,
            "cpu": {"cores": list(range(cores)), "busy_s": busy, "steal_s": steal, "total_s": t * cores,
                    "self_cpu_s": own, "load1": load}}


def _resources(samples):
    return {"kind": "resources", "payload": {"samples": samples, "contention": resources.contention(samples)}}


def test_contention_is_what_other_processes_took_of_the_engines_cores():
    # 10 s on 2 cores: the engine used 1.5 cores, the client 0.1, everything busy 2.0 -> others 0.4 cores = 20%
    busy = [_sample(t, 2.0 * t, 1.5 * t, own=0.1 * t) for t in range(11)]
    check = contention_check([_resources(busy)])
    assert check["status"] == "FAIL"
    assert "other processes took 20% of the engine's and the client's cores 0,1 over the run" in check["detail"]
    quiet = [_sample(t, 1.62 * t, 1.5 * t, own=0.1 * t) for t in range(11)]
    assert contention_check([_resources(quiet)])["status"] == "PASS"
    # a hog for 3 of the 10 seconds: 5% over the run, but 50% in its worst window
    burst = [_sample(t, 1.6 * t + (min(max(t - 4, 0), 3) * 1.0), 1.5 * t, own=0.1 * t) for t in range(11)]
    c = resources.contention(burst)
    assert c["others_pct"] == pytest.approx(15.0) and c["others_peak_pct"] == pytest.approx(50.0)
    assert contention_check([_resources(burst)])["status"] == "FAIL"
    # steal: the hypervisor took the cores
    stolen = [_sample(t, 1.6 * t, 1.5 * t, own=0.1 * t, steal=0.5 * t) for t in range(11)]
    assert contention_check([_resources(stolen)])["status"] == "FAIL"


def test_contention_cannot_be_told_without_the_engines_process():
    samples = [_sample(t, 2.0 * t, None) for t in range(5)]
    check = contention_check([_resources(samples)])
    assert check["status"] == "SKIP" and "not visible" in check["detail"]
    assert contention_check([])["status"] == "SKIP"


def _metrics(gen_before, gen_after, prompt_before=0.0, prompt_after=0.0):
    return [{"kind": "engine_metrics", "payload": {"when": "before", "counters": {
                "generated_tokens_total": gen_before, "prompt_tokens_total": prompt_before}}},
            {"kind": "engine_metrics", "payload": {"when": "after", "counters": {
                "generated_tokens_total": gen_after, "prompt_tokens_total": prompt_after}}}]


def test_another_client_shows_in_the_engines_counters():
    reqs = [{"kind": "bench_request", "payload": rec(tokens=32, decode=100.0, index=i)} for i in range(2)]
    # the issue's card: "generated tokens 128 (the requests' usage: 64)"
    check = other_clients_check(reqs + _metrics(1000, 1128, 0, 20))
    assert check["status"] == "FAIL"
    assert "the engine generated 128 tokens during the run, the requests' usage 64" in check["detail"]
    assert "another client used the server" in check["detail"]
    assert other_clients_check(reqs + _metrics(1000, 1064, 0, 20))["status"] == "PASS"
    # prompt tokens nobody of ours sent (the requests sent 2 x 10)
    assert other_clients_check(reqs + _metrics(1000, 1064, 0, 500))["status"] == "FAIL"
    # a failed request may have been counted by the engine without a usage: cannot tell
    failed = reqs + [{"kind": "bench_request", "payload": rec(tokens=None, status=None, error="peer closed")}]
    assert other_clients_check(failed + _metrics(1000, 1128))["status"] == "SKIP"
    assert other_clients_check(reqs)["status"] == "SKIP"


def test_without_counters_the_engines_slots_tell_another_client():
    reqs = [{"kind": "bench_request", "payload": rec(tokens=32, decode=100.0, index=i)} for i in range(2)]

    def slots(samples, max_busy, overlapping):
        return [{"kind": "slot_samples", "payload": {"samples": samples, "max_busy": max_busy,
                                                     "overlapping": overlapping, "interval_s": 0.25}}]

    alone = other_clients_check(reqs + slots(12, 1, 0))
    assert alone["status"] == "PASS" and "sampled 12 times" in alone["detail"]
    shared = other_clients_check(reqs + slots(12, 2, 5))
    assert shared["status"] == "FAIL" and "5 sample(s) found another request in the engine" in shared["detail"]
    assert other_clients_check(reqs + slots(0, 0, 0))["status"] == "SKIP"       # nothing sampled: cannot tell
    # the counters, where there are some, decide
    assert other_clients_check(reqs + slots(12, 2, 5) + _metrics(1000, 1064, 0, 20))["status"] == "PASS"


def test_inter_token_outliers_beyond_the_suites_ratio():
    steady = [rec(tokens=50, gaps_ms=[10.0] * 49, index=i) for i in range(3)]
    assert outliers_check({"narrative": steady}, "quick", 5.0)["status"] == "PASS"
    paused = steady + [rec(tokens=50, gaps_ms=[10.0] * 45 + [3050.0] * 4, index=3)]
    check = outliers_check({"narrative": paused}, "quick", 5.0)
    assert check["status"] == "FAIL" and "narrative p99" in check["detail"]
    assert outliers_check({"N=4": paused}, "concurrency", 5.0)["status"] == "SKIP"


def test_watchdog_limit_from_the_runs_pace_with_a_floor():
    w = Watchdog(floor_s=5.0, timeout_s=600.0)
    assert w.limit(200) == pytest.approx(5.0 + 200 / SLOWEST_PREFILL_TPS)     # nothing finished yet
    w.observe(rec(tokens=50, gaps_ms=[20.0] * 48 + [2000.0], ttft=5.0, warmup=True))   # a cold warm-up: not learnt
    assert w.limit(200) == pytest.approx(5.0 + 200 / SLOWEST_PREFILL_TPS)
    w.observe(rec(tokens=50, gaps_ms=[20.0] * 49, ttft=0.1))
    assert w.limit(10) == pytest.approx(5.0)              # 10 x 20 ms and 10 x 0.1 s per 10 tokens: under the floor
    assert w.limit(200) == pytest.approx(STALL_FACTOR * 0.1 / 10 * 200)      # a longer prompt: its first token
    w.observe(rec(tokens=50, gaps_ms=[20.0] * 48 + [900.0], ttft=0.1))
    assert w.limit(10) == pytest.approx(STALL_FACTOR * 0.9)                   # 10 x the slowest gap
    assert Watchdog(floor_s=5.0, timeout_s=8.0).limit(10_000) == 8.0          # never over the request timeout


def test_watchdog_stops_on_a_stall_and_after_failures_in_a_row():
    w = Watchdog(floor_s=3.0)
    w.limit(10)
    with pytest.raises(BenchAborted) as stall:
        w.observe(rec(tokens=None, status=200, error="stalled: no data for 3.5 s after 12 chunks"))
    assert "the engine sent nothing for 3.5 s during a request (the stall limit: the floor 3 s" in stall.value.reason
    w = Watchdog()
    w.observe(rec(tokens=None, status=None, error="ConnectError: [Errno 111] Connection refused"))
    w.observe(rec(tokens=None, status=None, error="ConnectError: [Errno 111] Connection refused"))
    with pytest.raises(BenchAborted) as dead:
        w.observe(rec(tokens=None, status=None, error="ConnectError: [Errno 111] Connection refused"))
    assert dead.value.reason.startswith("3 requests in a row failed (last error: ConnectError")
    assert dead.value.record["after_requests"] == 3


def _quick_records(decodes, **kw):
    out = []
    for name in ("narrative", "code"):
        out.append({"kind": "bench_request", "payload": rec(name, tokens=192, max_tokens=192, decode=100.0,
                                                            warmup=True, engine_tps=100.0)})
        out += [{"kind": "bench_request", "payload": rec(name, tokens=192, max_tokens=192, decode=d, index=i,
                                                         engine_tps=d, **kw)} for i, d in enumerate(decodes)]
    return out


def _quick_conditions():
    info = stand_in_info("http://127.0.0.1:1")
    return bench_conditions(info, BenchPlan(full_length=True))


def test_quick_suite_with_a_noisy_decode_is_invalid():
    # the busy-VM demo: decode 4.95 +- 3.92 tok/s (CV 79%) was stored "OK"
    noisy = summarize_bench(_quick_records([1.5, 2.0, 4.0, 7.5, 9.75]), _quick_conditions())
    assert noisy["status"] == "INVALID" and not noisy["valid"]
    cv = next(c for c in noisy["integrity"] if c["name"] == "cv")
    assert cv["status"] == "FAIL" and "decode CV over 10%" in cv["detail"]
    steady = summarize_bench(_quick_records([100.0, 101.0, 99.0, 100.5, 100.0]), _quick_conditions())
    assert steady["status"] == "OK", steady["warnings"]
    names = [c["name"] for c in steady["integrity"]]
    assert {"requests", "cv", "full_length", "host_contention", "other_clients", "inter_token_outliers",
            "engine_stopped"} <= set(names)


def test_a_dead_engine_stops_bench_and_the_card_shows_why(tmp_path):
    refused = RuntimeError("ConnectError: [Errno 111] Connection refused")
    client = ScriptedClient([_ok_stream(), _ok_stream(), refused, refused, refused] + [_ok_stream()] * 20)
    info = stand_in_info("http://127.0.0.1:1")
    plan = BenchPlan(workloads=(Workload("narrative", "hi", 20), Workload("code", "hi", 20)), warmup=1, measured=5)
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", bench_conditions(info, plan))
    result = run_bench(client, info, plan, on_record=lambda r: store.add_record(run_id, "bench_request", r))
    assert client.calls == 5                       # not 12: it stopped after 3 failures in a row
    assert result.aborted is not None and result.aborted["why"] == "failures"
    store.add_record(run_id, ABORT_KIND, result.aborted)
    records = store.records(run_id)
    assert failed_requests(records)[0]["count"] == 3
    summary = summarize_bench(records, store.get_run(run_id)["conditions"])
    store.finish_run(run_id, summary["status"], summary)
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert "⚠ FAIL engine_stopped: 3 requests in a row failed (last error: RuntimeError: ConnectError" in card
    assert "- 3 x RuntimeError: ConnectError: [Errno 111] Connection refused (first: narrative measured 2)" in card


@pytest.mark.parametrize("argv, says", [
    (("--stall-s", "0"), "--stall-s must be a number of seconds, at least 1, not 0.0."),
    (("--stall-s", "nan"), "--stall-s must be a number of seconds, at least 1, not nan."),
    (("--quiet-wait", "-1"), "--quiet-wait must be a number of seconds, 0 or more, not -1.0."),
])
def test_bench_host_options_are_checked_before_any_request(argv, says):
    from conftest import cli

    proc = cli("bench", *argv, "--url", "http://127.0.0.1:9")
    assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
