"""The longer bench suites: workloads as data, depth with the prefix-cache guard, concurrency,
reasoning split, spec-decode acceptance, the integrity checklist, roofline and A/B.

Statistics are tested on hand-built raw records; the integration tests run the real
llama-server + SmolLM2 on the CPU with tiny sizes (the figures are not asserted: this is a
noisy shared 2-core machine; what is asserted is what the records must hold).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from engineroom.bench.clientside import ClientMonitor, KindClient, encode_kinds
from engineroom.bench.compare import compare_runs, t_975
from engineroom.bench.depth.sizes import plan_depths
from engineroom.bench.roofline import roofline
from engineroom.bench.speculative.acceptance import acceptance
from engineroom.bench.stats import cache_reuse, client_load, kept, reasoning
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.haystack import haystack
from engineroom.bench.suites.run import run_suite
from engineroom.bench.suites.specs import SUITE_SPECS, load_prompt_file, suite_spec
from engineroom.bench.suites.summary import summarize_suite
from engineroom.engines.base import DecodeWindow, EngineTimings
from engineroom.errors import BadInput, NotFound
from engineroom.records.encoding import encode_arrivals
from engineroom.store import Store

from conftest import cli, real_llama_server


def rec(group, *, tokens=40, max_tokens=40, ttft=0.1, tps=100.0, prompt=300, cached=0, kinds=None,
        warmup=False, engine_tps=None, draft=None, accepted=None, round_=None, stream=None, lag_us=None,
        discarded=None, finish="length", content_chars=None):
    """A hand-built suite record: token chunks every 1/tps s after ``ttft``."""
    times = [ttft + i / tps for i in range(tokens)]
    engine = EngineTimings(decode_tokens=tokens, decode_ms=(tokens - 1) / (engine_tps or tps) * 1000,
                           decode_window=DecodeWindow.FIRST_TOKEN_FREE, prompt_tokens=prompt - cached,
                           prompt_ms=50.0, cached_tokens=cached, draft_tokens=draft, draft_accepted=accepted,
                           source="hand-built").as_dict()
    r = {"workload": group, "index": 0, "warmup": warmup, "sent": {"max_tokens": max_tokens, "body": {}},
         "sent_unix": 0.0, "status": 200, "error": None, "end_us": round((times[-1] + 0.001) * 1e6),
         "arrivals_us": encode_arrivals(0.0, times), "completion_tokens": tokens, "prompt_tokens": prompt,
         "cached_prompt_tokens": cached, "finish_reason": finish, "chunks": tokens + 2,
         "content_chars": 4 * tokens if content_chars is None else content_chars, "reasoning_chars": 0,
         "engine": engine, "engine_raw": None, "suite": "t", "group": {"workload": group},
         "arrival_kinds": encode_kinds(kinds or ["c"] * tokens), "discarded": discarded}
    if round_ is not None:
        r.update(round=round_, stream=stream, scheduled_lag_us=lag_us or 0, group={"streams": 2})
    return {"kind": "bench_request", "payload": r}


def cond(kind="standard", **bench):
    return {"bench": {"suite": kind, "kind": kind, "agreement_tolerance_pct": 1.0, "cv_threshold_pct": 10.0,
                      **bench}, "host": {"gpus": []}}


LOAD_OK = {"kind": "client_load", "payload": {"cpu_s": 0.1, "wall_s": 10.0, "interval_us": 5000,
                                              "lags_us": [100] * 200}}


# -- workloads as data ----------------------------------------------------------------------


def test_haystacks_are_salted_and_sized_by_the_engines_tokenizer():
    words = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer: one token per word
    a, b = haystack("aaaa11112222", 2000, words), haystack("bbbb33334444", 2000, words)
    assert a.text[:60] != b.text[:60]                    # different from the first token on: nothing to reuse
    assert a.text.startswith("Record aaaa11112222")
    assert 0.98 * 2000 <= words(a.text) <= 2000 and a.sized_by == "engine tokenizer"
    assert haystack("aaaa11112222", 2000, words).text == a.text   # deterministic per salt
    est = haystack("cccc", 500, None)
    assert est.counted_tokens is None and est.sized_by.startswith("estimate")
    with pytest.raises(BadInput, match="at least 16 tokens"):
        haystack("x", 4)


def test_depths_scale_from_the_context_the_engine_reports():
    assert plan_depths((1024, 10240, 32768, 92160), 131072, 64) == [1024, 10240, 32768, 92160]
    assert plan_depths((1024, 10240, 32768, 92160), 40000, 64) == [1024, 10240, 32768]
    assert plan_depths((1024, 10240, 32768, 92160), 8192, 64) == [1024, 7680]      # SmolLM2's 8K in CI
    assert plan_depths((1024, 10240, 32768, 92160), 8192, 64, near_end=False) == [1024]
    with pytest.raises(BadInput, match="does not report its context size"):
        plan_depths((1024,), None, 64)
    assert set(SUITE_SPECS) == {"standard", "depth", "concurrency", "spec", "agentic", "sweep", "rate"}
    assert suite_spec("DEPTH") is SUITE_SPECS["depth"] and suite_spec("quick") is None


def test_prompt_files_are_jsonl_with_one_sentence_per_bad_line(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "hi", "name": "greet", "max_tokens": 12}\n\n{"prompt": "bye", "system": "s"}\n')
    ws = load_prompt_file(good, 64)
    assert [(w.name, w.max_tokens, w.system) for w in ws] == [("greet", 12, None), ("prompt-3", 64, "s")]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(BadInput, match=r"line 2 needs a non-empty \"prompt\""):
        load_prompt_file(bad, 64)
    with pytest.raises(NotFound, match="no prompt file"):
        load_prompt_file(tmp_path / "missing.jsonl", 64)


# -- statistics on recorded raw data -------------------------------------------------------


def test_cache_guard_reads_the_engines_count_and_allows_the_template_preamble():
    assert not cache_reuse(rec("d", cached=30)["payload"]).contaminated       # the shared preamble
    dirty = cache_reuse(rec("d", cached=299, prompt=300)["payload"])
    assert dirty.contaminated and "299 of 300" in dirty.describe()
    recs = [rec("d", cached=299, discarded="prefix cache")["payload"], rec("d")["payload"],
            rec("d", warmup=True)["payload"]]
    assert len(kept(recs)) == 1


def test_reasoning_split_and_thinking_that_used_the_whole_budget():
    r = rec("w", tokens=8, tps=100.0, ttft=0.2, kinds=["r"] * 5 + ["c"] * 3)["payload"]
    got = reasoning(r)
    assert (got["reasoning_chunks"], got["content_chunks"]) == (5, 3)
    assert got["ttft_s"] == pytest.approx(0.2) and got["first_content_s"] == pytest.approx(0.25)
    assert not got["thinking_exhausted"]
    spent = rec("w", tokens=8, kinds=["r"] * 8, content_chars=0)["payload"]
    assert reasoning(spent)["thinking_exhausted"]
    summary = summarize_suite([rec("w"), rec("w"), {"kind": "bench_request", "payload": spent}, LOAD_OK], cond())
    g = summary["groups"]["w"]
    assert g["n_kept"] == 2 and g["reasoning"]["thinking_exhausted"] == 1     # flagged, not averaged in
    assert {c["name"]: c["status"] for c in summary["integrity"]}["thinking_budget"] == "FAIL"
    assert summary["status"] == "INVALID"


def test_spec_acceptance_from_records_equals_the_engines_counters():
    reqs = [rec("r", draft=48, accepted=39), rec("r", draft=20, accepted=5), rec("r", draft=0, accepted=0)]
    metrics = [{"kind": "engine_metrics", "payload": {"when": "before", "counters": {
        "spec_drafted_tokens_total": 10.0, "spec_accepted_tokens_total": 4.0, "spec_drafts_total": 2.0}}},
        {"kind": "engine_metrics", "payload": {"when": "after", "counters": {
            "spec_drafted_tokens_total": 78.0, "spec_accepted_tokens_total": 48.0, "spec_drafts_total": 6.0}}}]
    a = acceptance(reqs + metrics)
    assert (a["drafted"], a["accepted"], a["counters_drafted"], a["counters_accepted"]) == (68, 44, 68.0, 44.0)
    assert a["agrees"] is True and a["acceptance_rate"] == pytest.approx(44 / 68)
    assert a["fire_rate"] == pytest.approx(2 / 3) and a["mean_acceptance_length"] == pytest.approx(1 + 44 / 4)
    assert acceptance(reqs[:1] + metrics)["agrees"] is False
    assert "no draft counts" in acceptance([{"kind": "bench_request", "payload": {
        **rec("x")["payload"], "engine": None}}])["skip"]


def test_integrity_checklist_marks_a_failing_result_and_keeps_it():
    ok = [rec("w", tps=100.0, engine_tps=100.0) for _ in range(3)]
    s = summarize_suite(ok + [LOAD_OK], cond())
    checks = {c["name"]: c["status"] for c in s["integrity"]}
    assert s["valid"] and s["status"] == "OK"
    assert checks["client_vs_engine"] == checks["cv"] == checks["full_length"] == "PASS"
    assert checks["prefix_cache"] == "SKIP"          # standard repeats its prompts by design
    lying = [rec("w", tps=100.0, engine_tps=103.0) for _ in range(3)]          # 3% off: beyond 1%
    short = [rec("w", tokens=5, max_tokens=40)]
    saturated = {"kind": "client_load", "payload": {"cpu_s": 9.8, "wall_s": 10.0, "interval_us": 5000,
                                                    "lags_us": [60000] * 50}}
    bad = summarize_suite(lying + short + [saturated], cond())
    failed = {c["name"] for c in bad["integrity"] if c["status"] == "FAIL"}
    assert {"client_vs_engine", "full_length", "client_not_bottleneck"} <= failed
    assert bad["status"] == "INVALID" and not bad["valid"] and bad["groups"]["w"]["n_kept"] == 4
    dirty = summarize_suite([rec("depth", cached=290)] * 2 + [LOAD_OK], cond("depth"))
    assert {c["name"]: c["status"] for c in dirty["integrity"]}["prefix_cache"] == "FAIL"


@pytest.mark.slow
def test_client_monitor_sees_a_client_saturated_on_purpose():
    """A thread that holds the interpreter (a long C-level loop) starves the probe thread:
    its wake-ups come hundreds of ms late, so the result is marked invalid."""
    stop = threading.Event()

    def hog():
        while not stop.is_set():
            sum(range(2_000_000))        # one C call, no switch to other threads while it runs

    with ClientMonitor() as mon:
        t = threading.Thread(target=hog)
        t.start()
        threading.Event().wait(1.0)
        stop.set()
        t.join()
    load = client_load(mon.record())
    assert load["lag_ms_max"] >= 20.0
    s = summarize_suite([rec("w"), rec("w"), {"kind": "client_load", "payload": mon.record()}], cond())
    assert {c["name"]: c["status"] for c in s["integrity"]}["client_not_bottleneck"] == "FAIL"


def test_a_client_whose_threads_wait_for_a_cpu_is_the_bottleneck():
    """benchmarks/client_ceiling.md: 256 stream threads on a shared core read their tokens 0.66 s
    late while the client's CPU share (34%) and the probe's lag p99 (16 ms) looked fine. The
    threads' run-queue wait (Linux schedstat) shows it: here 30 ms per run on average."""
    load = {"cpu_s": 3.4, "wall_s": 10.0, "interval_us": 5000, "lags_us": [16000] * 100 + [100] * 1900,
            "runq_wait_s": 600.0, "runq_slices": 20_000, "threads_seen": 258}
    figures = client_load(load)
    assert figures["runq_wait_ms_per_run"] == pytest.approx(30.0) and figures["runq_waiting_threads"] == 60.0
    s = summarize_suite([rec("w"), rec("w"), {"kind": "client_load", "payload": load}], cond())
    check = {c["name"]: c for c in s["integrity"]}["client_not_bottleneck"]
    assert check["status"] == "FAIL" and "run-queue wait 30.00 ms per run" in check["detail"]
    calm = dict(load, runq_wait_s=2.0)
    s = summarize_suite([rec("w"), rec("w"), {"kind": "client_load", "payload": calm}], cond())
    assert {c["name"]: c["status"] for c in s["integrity"]}["client_not_bottleneck"] == "PASS"
    with ClientMonitor() as mon:          # on Linux the monitor records the wait of its own threads
        threading.Event().wait(0.3)
    raw = mon.record()
    if os.path.exists("/proc/self/task"):
        assert raw["runq_slices"] > 0 and raw["runq_wait_s"] >= 0 and raw["threads_seen"] >= 2


def test_concurrency_figures_count_latency_from_the_scheduled_send():
    recs = [rec("N=2", round_=r, stream=s, lag_us=2000 * s, ttft=0.1, tps=50.0) for r in range(3) for s in range(2)]
    s = summarize_suite(recs + [LOAD_OK], cond("concurrency"))
    g = s["groups"]["N=2"]
    assert len(g["rounds"]) == 3 and all(x["tokens"] == 80 for x in g["rounds"])
    assert g["ttft_from_schedule_s"]["p99"] == pytest.approx(0.102, abs=1e-4)   # queueing of stream 1 counted
    assert g["aggregate_tps"]["mean"] == pytest.approx(80 / (0.1 + 39 / 50 + 0.001 + 0.002), rel=1e-3)
    assert g["errors"] == g["silent"] == 0


def test_the_all_decoding_rate_counts_only_while_every_stream_decodes():
    """Issue 16: the aggregate mixes one stream's decode with another's prefill (the H200's 149-slot
    suite: 68.6 tok/s aggregate against a plan of pure decode). Two streams at 50 tok/s each, the
    second sent 0.5 s late: the window from its first token (0.6 s) to the first's last (0.88 s)
    holds 14 tokens of each, 100 tok/s, where the round's aggregate is 80 tokens over 1.381 s."""
    recs = [rec("N=2", round_=r, stream=s, lag_us=500_000 * s, ttft=0.1, tps=50.0) for r in range(2) for s in range(2)]
    s = summarize_suite(recs + [LOAD_OK], cond("concurrency"))
    g = s["groups"]["N=2"]
    assert [x["all_decoding_window_s"] for x in g["rounds"]] == [pytest.approx(0.28, abs=1e-6)] * 2
    assert g["all_decoding_tps"]["mean"] == pytest.approx(100.0, rel=1e-6) and g["all_decoding_why"] is None
    assert g["aggregate_tps"]["mean"] == pytest.approx(80 / 1.381, rel=1e-3)
    # a window of 0.06 s holds 3 tokens a stream: its edges would move the rate by a third
    short = [rec("N=2", round_=0, stream=s, lag_us=720_000 * s, ttft=0.1, tps=50.0) for s in range(2)]
    g = summarize_suite(short + [LOAD_OK], cond("concurrency"))["groups"]["N=2"]
    assert g["rounds"][0]["all_decoding_tps"] is None and g["rounds"][0]["all_decoding_window_s"] == \
        pytest.approx(0.06, abs=1e-6)
    assert g["all_decoding_why"].startswith("the window where every stream decoded (60 ms) held 3.0 tokens a stream, "
                                            "under 8: too short to time")
    apart = [rec("N=2", round_=0, stream=s, lag_us=2_000_000 * s, ttft=0.1, tps=50.0) for s in range(2)]
    g = summarize_suite(apart + [LOAD_OK], cond("concurrency"))["groups"]["N=2"]
    assert g["all_decoding_tps"]["n"] == 0 and g["rounds"][0]["all_decoding_tps"] is None
    assert g["all_decoding_why"].startswith("the streams never all decoded at once")
    from engineroom.report.suites import suite_section

    text = "\n".join(suite_section(apart + [LOAD_OK], cond("concurrency")))
    assert "| all streams decoding tok/s |" in text
    assert "N=2: all streams decoding n/a in 1 round(s): the streams never all decoded at once" in text


def test_streams_with_no_text_are_silent_whatever_the_engine_counted():
    """Seen on the H200 (benchmarks/gpu_bench.md): greedy decoding of a random-weight model picked a
    token that renders as nothing, so the engine reported 64 tokens per request and the streams
    carried no text. The summary once crashed on the empty median; the checklist said "none empty"."""
    empty = []
    for r in range(3):
        for s_ in range(2):
            x = rec("N=2", round_=r, stream=s_, tokens=64, max_tokens=64)
            x["payload"].update(arrivals_us=[], arrival_kinds=[], content_chars=0)
            empty.append(x)
    s = summarize_suite(empty + [LOAD_OK], cond("concurrency"))
    g = s["groups"]["N=2"]
    assert g["per_stream_decode_median"] is None and g["silent"] == 6    # 3 measured rounds x 2 streams
    requests = {c["name"]: c for c in s["integrity"]}["requests"]
    assert requests["status"] == "FAIL"
    assert "6 silent-empty of 6 requests (the engine counted 384 tokens for them" in requests["detail"]
    assert s["status"] == "INVALID"


def test_roofline_share_from_the_stored_basis():
    basis = {"weights_bytes": 100_000_000, "kv_bytes_at": [[0, 0], [1000, 1_000_000], [2000, 2_000_000]],
             "bandwidth_gbs": 10.0, "not_available": None}
    one = roofline(basis, 1000, 50.0)
    assert one["limit_tps"] == pytest.approx(10e9 / 101e6) and one["pct"] == pytest.approx(50 / (10e9 / 101e6) * 100)
    two = roofline(basis, 1500, 150.0, streams=2)
    assert two["limit_tps"] == pytest.approx(2 * 10e9 / (100e6 + 2 * 1.5e6))
    assert roofline({"not_available": "no bandwidth"}, 10, 1.0)["not_available"] == "no bandwidth"


def test_compare_says_whether_a_difference_is_real():
    def run(i, rates):
        return ({"id": i, "conditions": cond()}, [rec("w", tps=x) for x in rates])

    a, b = run(1, [100, 102, 98, 101, 99]), run(2, [101, 99, 100, 102, 98])
    same = compare_runs(*a, *b)
    assert [r["verdict"] for r in same["rows"] if r["metric"] == "decode_tps"] == ["not real"]
    faster = compare_runs(*a, *run(3, [150, 152, 148, 151, 149]))
    row = next(r for r in faster["rows"] if r["metric"] == "decode_tps")
    assert row["verdict"] == "real" and row["delta_pct"] == pytest.approx(50, abs=1.5)
    assert row["band"] < abs(row["delta"])
    assert t_975(4) == pytest.approx(2.776) and t_975(100) == 1.96


def test_compare_judges_stored_runs_one_each_or_boots_as_ab_does(tmp_path, monkeypatch):
    """`engineroom compare A B`: two stored runs (the Welch band); `compare 1,3 2,4`: boots per arm,
    ab's verdict (pairings and the boot band); a run that is not a bench run is one sentence."""
    from engineroom.store import Store

    from conftest import cli

    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path))
    with Store() as store:
        ids = []
        for rates in ([100, 102, 98, 101, 99], [150, 152, 148, 151, 149], [101, 99, 100, 102, 98],
                      [149, 151, 150, 152, 148]):
            run_id = store.start_run("bench", cond())
            for r in [rec("w", tps=x) for x in rates]:
                store.add_record(run_id, r["kind"], r["payload"])
            store.finish_run(run_id, "OK", {})
            ids.append(run_id)
        other = store.start_run("verify", {})
    done = cli("compare", str(ids[0]), str(ids[1]), "--json")
    one = json.loads(done.stdout)
    assert done.returncode == 0 and (one["run_a"], one["run_b"]) == (ids[0], ids[1])
    assert next(r for r in one["rows"] if r["metric"] == "decode_tps")["verdict"] == "real"
    done = cli("compare", f"{ids[0]},{ids[2]}", f"{ids[1]},{ids[3]}", "--json")
    boots = json.loads(done.stdout)
    assert done.returncode == 0 and boots["runs_a"] == [ids[0], ids[2]] and boots["runs_b"] == [ids[1], ids[3]]
    row = next(r for r in boots["rows"] if r["metric"] == "decode_tps")
    assert row["verdict"] == "real" and len(row["boots_a"]) == 2 and row["why"].startswith("beyond the noise band"), row
    done = cli("compare", str(ids[0]), str(other))
    assert done.returncode == 2 and done.stderr == f"error: run #{other} is a verify run, not a bench run.\n"


def test_summary_recomputes_identically_from_the_store(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    run_id = store.start_run("bench", cond())
    for r in [rec("w"), rec("w", tps=90.0), LOAD_OK]:
        store.add_record(run_id, r["kind"], r["payload"])
    direct = summarize_suite([rec("w"), rec("w", tps=90.0), LOAD_OK], cond())
    again = summarize_suite(store.records(run_id), store.get_run(run_id)["conditions"])
    assert json.dumps(direct, sort_keys=True, default=str) == json.dumps(again, sort_keys=True, default=str)


def test_cli_refuses_bad_suite_arguments_in_one_sentence():
    proc = cli("bench", "depth", "--depths", "1k,2k")
    assert proc.returncode != 0 and "--depths takes whole numbers" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("compare", "99998", "99999")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    proc = cli("compare", "12,x", "13")
    assert proc.returncode == 2 and "RUNS_A takes run ids separated by commas" in proc.stderr


# -- the real llama-server ------------------------------------------------------------------

THINK_TEMPLATE = """{%- for message in messages -%}
{%- if message['role'] == 'assistant' and message.get('reasoning_content') -%}
<|im_start|>assistant
<think>
{{ message['reasoning_content'] }}
</think>

{{ message['content'] }}<|im_end|>
{% else -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
<think>
{% endif -%}
"""


def _ctx(url, store, run_id, **kw):
    from engineroom import engines

    engine = engines.adapter("llama.cpp")
    info = engines.detect(url)
    return info, SuiteContext(server=info, new_client=lambda: KindClient(url),
                              count_tokens=lambda text: engine.count_tokens(url, text),
                              metrics=lambda: engine.metrics(url),
                              emit=lambda k, p: store.add_record(run_id, k, p), **kw)


@pytest.fixture(scope="module")
def spec_server(llama_server_binary, smollm2, tmp_path_factory):
    """Two slots and llama.cpp's draft-free n-gram speculation (flags from its --help)."""
    log = tmp_path_factory.mktemp("suites") / "spec.log"
    with real_llama_server(llama_server_binary, smollm2, "-np", "2", "--spec-type", "ngram-simple",
                           log_path=log, ctx=4096) as url:
        yield url


def test_depth_discards_a_cache_hit_and_reruns_with_a_fresh_salt(spec_server, tmp_path):
    salts = iter(["aaaa00000001", "aaaa00000001", "bbbb00000002", "cccc00000003", "dddd00000004"])
    store = Store(tmp_path / "d.sqlite")
    run_id = store.start_run("bench", cond("depth"))
    info, ctx = _ctx(spec_server, store, run_id, salts=lambda: next(salts))
    assert info.n_ctx and info.total_slots == 2
    spec = SUITE_SPECS["depth"].with_(depths=(256,), near_end=False, warmup=0, measured=3, max_tokens=12)
    result = run_suite(spec, ctx)
    reqs = [r["payload"] for r in store.records(run_id, "bench_request")]
    assert [r["salt"] for r in reqs] == ["aaaa00000001", "aaaa00000001", "bbbb00000002", "cccc00000003"]
    assert reqs[1]["discarded"] and "prefix cache" in reqs[1]["discarded"]
    assert [bool(r["discarded"]) for r in reqs] == [False, True, False, False]
    assert all(r["sized_by"] == "engine tokenizer" and r["prompt_tokens"] > 256 for r in reqs)
    g = result.summary["groups"]["depth 256"]
    assert (g["n_kept"], g["n_discarded"]) == (3, 1)
    checks = {c["name"]: c for c in result.summary["integrity"]}
    assert checks["prefix_cache"]["status"] == "PASS" and "1 contaminated sample" in checks["prefix_cache"]["detail"]
    assert g["prefill_tps"]["n"] == 3 and g["decode_tps"]["n"] == 3


def test_concurrency_uses_the_engines_slot_count(spec_server, tmp_path):
    store = Store(tmp_path / "c.sqlite")
    run_id = store.start_run("bench", cond("concurrency"))
    _, ctx = _ctx(spec_server, store, run_id)
    spec = SUITE_SPECS["concurrency"].with_(warmup=0, rounds=2, prompt_tokens=128, max_tokens=12)
    result = run_suite(spec, ctx)
    assert result.conditions["bench"]["streams"] == 2
    assert result.conditions["bench"]["streams_source"] == "the engine's reported slot count"
    reqs = [r["payload"] for r in store.records(run_id, "bench_request")]
    assert sorted((r["round"], r["stream"]) for r in reqs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["scheduled_lag_us"] >= 0 and r["status"] == 200 for r in reqs)
    g = result.summary["groups"]["N=2"]
    assert g["errors"] == 0 and g["silent"] == 0 and len(g["rounds"]) == 2
    assert g["ttft_from_schedule_s"]["p50"] >= g["ttft_s"]["min"]
    assert g["aggregate_tps"]["n"] == 2 and g["inter_token_ms"]["p99"] is not None


def test_ngram_speculation_acceptance_matches_the_engines_counters(spec_server, tmp_path):
    store = Store(tmp_path / "s.sqlite")
    run_id = store.start_run("bench", cond("spec"))
    _, ctx = _ctx(spec_server, store, run_id)
    spec = SUITE_SPECS["spec"].with_(warmup=0, measured=1)
    result = run_suite(spec, ctx)
    a = summarize_suite(store.records(run_id), cond("spec"))["speculative"]
    assert a["drafted"] > 0 and a["accepted"] > 0, a
    assert a["agrees"] is True and a["counters_drafted"] == a["drafted"]
    assert a["acceptance_rate"] == pytest.approx(a["counters_acceptance_rate"])
    assert result.summary["speculative"]["fire_rate"] == 1.0


def test_reasoning_split_on_the_real_engine(llama_server_binary, smollm2, tmp_path):
    """A template that opens a <think> block makes llama-server's own parser send SmolLM2's
    output as reasoning; with no </think> before max_tokens, the run is flagged."""
    template = tmp_path / "think.jinja"
    template.write_text(THINK_TEMPLATE)
    with real_llama_server(llama_server_binary, smollm2, "-np", "1", log_path=tmp_path / "think.log",
                           ctx=2048, template=template) as url:
        store = Store(tmp_path / "r.sqlite")
        run_id = store.start_run("bench", cond("standard"))
        _, ctx = _ctx(url, store, run_id)
        spec = SUITE_SPECS["spec"].with_(kind="standard", warmup=0, measured=1, max_tokens=24)
        result = run_suite(spec, ctx)
    r = [x["payload"] for x in store.records(run_id, "bench_request")][0]
    split = reasoning(r)
    assert split["reasoning_chunks"] > 0 and split["kinds_recorded"]
    assert r["reasoning_chars"] > 0
    if split["content_chunks"] == 0:        # thinking ran to max_tokens: flagged, not averaged in
        assert split["thinking_exhausted"] and result.summary["groups"]["repeat"]["n_kept"] == 0
    else:
        assert split["first_content_s"] > split["ttft_s"]


def test_cli_depth_suite_card(spec_server):
    proc = cli("bench", "depth", "--url", spec_server, "--depths", "256", "--runs", "3",
               "--warmup", "0", "--max-tokens", "12", timeout=300)
    out = proc.stdout
    assert "## Bench suite: depth" in out and "Integrity checklist:" in out, proc.stderr
    assert "| depth 256 |" in out and "roofline" in out.lower()
    assert proc.returncode in (0, 1)          # 1 only when an integrity check failed on this noisy machine
    assert ("Status: **OK**" in out) == (proc.returncode == 0)


def test_depths_option_is_only_for_suites():
    proc = cli("bench", "--depths", "256")
    assert proc.returncode == 2 and "No such option: --depths" in proc.stderr      # the quick suite takes none


def test_prompt_file_path(tmp_path):
    p = Path(tmp_path / "x.jsonl")
    p.write_text("not json\n")
    with pytest.raises(BadInput, match="line 1 is not JSON"):
        load_prompt_file(p, 8)


def test_the_roofline_uses_the_kv_type_the_server_was_launched_with(tmp_path, monkeypatch):
    """issue 16 item 4: a managed launch with a q4_0 cache is rooflined at q4_0's bytes per token, not
    f16's (the KV type comes from the launch's fit request, and the card says where it came from)."""
    from dataclasses import replace

    from engineroom import launch
    from engineroom.engines.base import ServerInfo
    from engineroom.flows.runs import _roofline_basis
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    model = write_synthetic_gguf(replace(SHAPES["dense-s"], vocab_size=1024), "Q4_0", tmp_path / "d.gguf")
    info = ServerInfo(url="http://127.0.0.1:8123", engine="llama.cpp", n_ctx=4096)

    def basis(kv: str | None) -> dict:
        memory = {"fit_request": {"kv_dtype": kv}} if kv else {}
        launch._write_state(launch.ServerState(pid=1, port=8123, host="127.0.0.1", engine="llama.cpp", argv=[],
                                               model="d", model_path=str(model), log_path="l", started_at=0.0,
                                               memory=memory))
        return _roofline_basis(info, depths=(1024,))

    q4, f16, unknown = basis("q4_0"), basis("f16"), basis(None)
    assert q4["kv_dtype"] == "q4_0" and q4["kv_source"] == "the launch's (its fit request)"
    assert f16["kv_dtype"] == "f16"
    kv_q4 = dict(q4["kv_bytes_at"])
    kv_f16 = dict(f16["kv_bytes_at"])
    assert all(kv_q4[d] < 0.35 * kv_f16[d] for d in kv_q4 if d)      # q4_0: 4.5 bits against f16's 16
    assert unknown["kv_source"].startswith("assumed")
