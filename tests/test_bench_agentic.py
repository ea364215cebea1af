"""The agentic replay (``bench agentic``): the conversation as data, sized from the
context the engine reports, salted per session, with its own cache rule and per-turn curve.

Statistics are tested on hand-built raw records; the integration test replays a few turns
against the real llama-server + SmolLM2 (tool-capable template) and asserts what the records
must hold (the conversation grows, each turn reuses its own session's prompt, turn 1 does not).
"""

from __future__ import annotations

import json

import pytest

from engineroom.bench.agentic.session import (
    CONTEXT_FILL,
    MIN_OUTPUT_TOKENS,
    SCRIPT,
    TOOLS,
    SessionBuilder,
    ToolKindClient,
    content_only,
    plan_turns,
    size_text,
    ttft_verdict,
)
from engineroom.bench.clientside import encode_kinds
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.run import run_suite
from engineroom.bench.suites.specs import SUITE_SPECS
from engineroom.bench.suites.summary import summarize_suite
from engineroom.client import StreamResult
from engineroom.engines.base import DecodeWindow, EngineTimings
from engineroom.errors import BadInput
from engineroom.records.encoding import encode_arrivals
from engineroom.report.suites import suite_section
from engineroom.store import Store


def words(text: str) -> int:       # a stand-in tokenizer: one token per whitespace-separated word
    return len(text.split())


def turn_rec(turn, session, *, prompt, cached, previous, ttft=0.5, tokens=16, tps=50.0, kinds=None, warmup=False):
    times = [ttft + i / tps for i in range(tokens)]
    engine = EngineTimings(decode_tokens=tokens, decode_ms=(tokens - 1) / tps * 1000,
                           decode_window=DecodeWindow.FIRST_TOKEN_FREE, prompt_tokens=prompt - cached,
                           prompt_ms=ttft * 900, cached_tokens=cached, source="hand-built").as_dict()
    return {"kind": "bench_request", "payload": {
        "workload": f"agentic turn {turn}", "index": session, "warmup": warmup,
        "sent": {"max_tokens": tokens, "body": {}}, "sent_unix": 0.0, "status": 200, "error": None,
        "end_us": round((times[-1] + 0.001) * 1e6), "arrivals_us": encode_arrivals(0.0, times),
        "completion_tokens": tokens, "prompt_tokens": prompt, "cached_prompt_tokens": cached,
        "finish_reason": "length", "chunks": tokens + 2, "content_chars": 4 * tokens, "reasoning_chars": 0,
        "engine": engine, "engine_raw": None, "suite": "agentic", "group": {"turn": turn}, "session": session,
        "turn": turn, "previous_prompt_tokens": previous, "discarded": None,
        "arrival_kinds": encode_kinds(kinds or ["c"] * tokens), "step": {"output_counted_tokens": 100}}}


LOAD_OK = {"kind": "client_load", "payload": {"cpu_s": 0.1, "wall_s": 10.0, "interval_us": 5000,
                                              "lags_us": [100] * 200}}


def cond(**bench):
    return {"n_ctx": 8192, "host": {"gpus": []},
            "bench": {"suite": "agentic", "kind": "agentic", "agreement_tolerance_pct": 1.0,
                      "cv_threshold_pct": 10.0, "turns": 3, "tools": [t["function"]["name"] for t in TOOLS],
                      "tool_choice": "auto", "scale": 0.1, "context_fill": CONTEXT_FILL, "target_tokens": 50000,
                      **bench}}


# -- the conversation as data ---------------------------------------------------------------


def test_plan_scales_the_script_to_the_context_the_engine_reports():
    full, scale = plan_turns(131072, 64)
    assert scale == 1.0 and len(full) == 12 and 45_000 < full[-1].context_tokens < 52_000   # ~50K by turn 12
    assert [t.output_tokens for t in full[1:]] == [e.tokens for e in SCRIPT[:11]]
    for n_ctx in (4096, 8192, 32768):
        plan, scale = plan_turns(n_ctx, 64)
        assert scale < 1.0 and plan[-1].context_tokens <= CONTEXT_FILL * n_ctx - 64       # headroom kept
        assert all(t.output_tokens >= MIN_OUTPUT_TOKENS for t in plan[1:])
        growing = [t.context_tokens for t in plan]
        assert growing == sorted(growing) and len(set(growing)) == len(growing)
    small, _ = plan_turns(2048, 64)                 # a small context: fewer turns, each at its floor
    assert 2 <= len(small) < 12 and small[-1].context_tokens <= CONTEXT_FILL * 2048 - 64
    assert len(plan_turns(131072, 64, turns=3)[0]) == 3
    assert plan_turns(131072, 64, target_tokens=10_000)[0][-1].context_tokens <= 10_000
    with pytest.raises(BadInput, match="does not report its context size"):
        plan_turns(None, 64)
    with pytest.raises(BadInput, match="leaves no room for an agentic turn"):
        plan_turns(1024, 64)


def test_sessions_are_salted_and_each_turn_extends_the_last():
    plan, _ = plan_turns(8192, 64, turns=5)
    a, b = SessionBuilder("aaaa11112222", words), SessionBuilder("bbbb33334444", words)
    assert a.messages[0]["content"].startswith("[session aaaa11112222]")       # the salt comes first
    assert a.messages[0]["content"][:20] != b.messages[0]["content"][:20]
    seen = []
    for turn in plan:
        before = json.dumps(a.messages)
        step = a.add(turn)
        b.add(turn)
        assert json.dumps(a.messages).startswith(before[:-1])       # the previous turn's messages, unchanged
        seen.append(step)
    assert seen[0] == {}                                             # turn 1 sends the system prompt and task only
    for step, turn in zip(seen[1:], plan[1:], strict=True):
        assert step["tool"] == turn.exchange.tool
        assert 0.97 * turn.output_tokens <= step["output_counted_tokens"] <= turn.output_tokens
    tool_msgs = [m for m in a.messages if m["role"] == "tool"]
    calls = [m["tool_calls"][0] for m in a.messages if m["role"] == "assistant"]
    assert len(tool_msgs) == len(calls) == len(plan) - 1
    assert [c["id"] for c in calls] == [m["tool_call_id"] for m in tool_msgs]
    assert "proj_aaaa11" in tool_msgs[0]["content"]                 # the salt seeds the outputs' names too
    assert tool_msgs[0]["content"] != [m for m in b.messages if m["role"] == "tool"][0]["content"]
    text, counted = size_text("pytest", "cccc", 400, None)
    assert counted is None and "test session starts" in text and "FAILED" in size_text("pytest", "c", 4000, None)[0]


def test_tool_call_chunks_are_timed_and_left_out_of_the_per_token_cross_check():
    result = StreamResult()
    chunk = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "grep", "arguments": "{"}}]}}]}
    ToolKindClient._absorb(result, _Tools(), "", json.dumps(chunk), 1.25)
    ToolKindClient._absorb(result, _Tools(), "", json.dumps({"choices": [{"delta": {"content": "ok"}}]}), 1.5)
    assert result.token_times == [1.25, 1.5] and result.__dict__["token_kinds"] == ["t", "c"]
    assert result.t_first_token == 1.25
    assert not content_only({"arrival_kinds": [["t", 3], ["c", 1]]})
    one_each = {"arrival_kinds": [["c", 4]], "arrivals_us": [5, 1, 1, 1], "completion_tokens": 4}
    assert content_only(one_each) and not content_only({**one_each, "completion_tokens": 9})   # text held back


class _Tools:
    def add(self, deltas):
        pass


# -- statistics on recorded raw data -------------------------------------------------------


def test_turn_one_reusing_the_cache_is_contamination_later_turns_by_design():
    clean = [turn_rec(1, 0, prompt=900, cached=5, previous=None), turn_rec(2, 0, prompt=1200, cached=898, previous=900),
             turn_rec(3, 0, prompt=2000, cached=1200, previous=1200), LOAD_OK]
    s = summarize_suite(clean, cond())
    checks = {c["name"]: c for c in s["integrity"]}
    assert checks["prefix_cache"]["status"] == "PASS" and "100%" in checks["prefix_cache"]["detail"]
    curve = s["agentic"]["curve"]
    assert [p["turn"] for p in curve] == [1, 2, 3]
    assert curve[1]["new_tokens"] == 302 and curve[1]["reused_pct"] == pytest.approx(898 / 900 * 100)
    assert curve[2]["reused_pct"] == 100.0 and s["agentic"]["totals"]["cached_tokens"] == 5 + 898 + 1200
    assert s["status"] == "OK" and s["agentic"]["verdict"]["verdict"] == "stable"
    dirty = summarize_suite([turn_rec(1, 0, prompt=900, cached=880, previous=None)] + clean[1:], cond())
    assert {c["name"]: c["status"] for c in dirty["integrity"]}["prefix_cache"] == "FAIL"
    assert dirty["status"] == "INVALID"


def test_agentic_cross_check_uses_the_turns_answered_in_text():
    calls = [turn_rec(t, 0, prompt=900 + t, cached=0, previous=None, kinds=["t"] * 16) for t in (1, 2)]
    s = summarize_suite(calls + [LOAD_OK], cond())
    check = {c["name"]: c for c in s["integrity"]}["client_vs_engine"]
    assert check["status"] == "SKIP" and "tool-call chunk" in check["detail"]
    mixed = summarize_suite(calls + [turn_rec(3, 0, prompt=1000, cached=0, previous=None), LOAD_OK], cond())
    check = {c["name"]: c for c in mixed["integrity"]}["client_vs_engine"]
    assert check["status"] == "PASS" and "turn 3" in check["detail"]
    assert "not compared: turn 1, turn 2" in check["detail"]


def test_ttft_growth_verdict_and_the_cache_behind_it():
    assert ttft_verdict([(1, 900, 2.0), (2, 1000, 0.2), (3, 5000, 0.25)], 99.0)["verdict"] == "stable"
    assert ttft_verdict([(2, 1000, 0.2), (3, 5000, 0.45)], 99.0)["verdict"] == "rising"
    assert ttft_verdict([(2, 1000, 0.2), (3, 10000, 0.7)], 99.0)["verdict"] == "sub-linear"
    linear = ttft_verdict([(2, 1000, 0.2), (3, 5000, 1.0)], 10.0)
    assert linear["verdict"] == "linear in context (prefix cache not working)" and "only 10%" in linear["cache"]
    assert ttft_verdict([(2, 1000, 0.2), (3, 5000, 1.0)], 99.0)["verdict"] == "linear in context"
    assert ttft_verdict([(1, 900, 1.0), (2, 1000, 0.2)])["verdict"] is None


def test_agentic_card_shows_the_curve_and_totals():
    recs = [turn_rec(1, 0, prompt=900, cached=0, previous=None), turn_rec(2, 0, prompt=1200, cached=900, previous=900),
            LOAD_OK, {"kind": "agentic_stop", "payload": {"session": 0, "turn": 3, "previous_prompt_tokens": 1200,
                                                          "adding_tokens": 9000, "n_ctx": 8192, "why": "no room"}}]
    text = "\n".join(suite_section(recs, cond()))
    assert "| turn | sessions | context tokens |" in text and "| 2 | 1 | 1,200 | 900 (100%) | 300 |" in text
    assert "TTFT growth:" in text and "Session 1 stopped before turn 3" in text
    assert "900 came from the prefix cache" in text


# -- the real llama-server ------------------------------------------------------------------


def test_agentic_replay_on_the_real_engine(tools_server, tmp_path):
    """Three turns of one session on SmolLM2 with the tool-capable template: every turn sends the
    whole conversation and the ten tools; turn k reuses turn k-1's prompt from the engine's cache,
    turn 1 (salted) does not; the card's curve is recomputed from the stored records."""
    from engineroom import engines

    engine = engines.adapter("llama.cpp")
    info = engines.detect(tools_server)
    store = Store(tmp_path / "a.sqlite")
    run_id = store.start_run("bench", cond())
    ctx = SuiteContext(server=info, new_client=lambda: ToolKindClient(tools_server),
                       count_tokens=lambda text: engine.count_tokens(tools_server, text),
                       metrics=lambda: engine.metrics(tools_server),
                       emit=lambda k, p: store.add_record(run_id, k, p))
    spec = SUITE_SPECS["agentic"].with_(turns=3, measured=1, warmup=1, max_tokens=8)
    result = run_suite(spec, ctx)
    bench = result.conditions["bench"]
    assert bench["turns"] == 3 and bench["scale"] < 1.0 and len(bench["plan"]) == 3
    reqs = [r["payload"] for r in store.records(run_id, "bench_request")]
    assert [(r["warmup"], r["turn"]) for r in reqs] == [(True, 1), (False, 1), (False, 2), (False, 3)]
    assert len({r["salt"] for r in reqs}) == 2 and all(r["status"] == 200 for r in reqs)
    measured = reqs[1:]
    assert [r["sent"]["messages"] for r in measured] == [2, 4, 6]
    assert measured[0]["sent"]["request"]["tools"] == [t["function"]["name"] for t in TOOLS]
    prompts = [r["prompt_tokens"] for r in measured]
    assert prompts == sorted(prompts) and prompts[-1] < info.n_ctx
    first = measured[0]["engine"]["cached_tokens"]
    assert first <= 64                                            # the template preamble at most, not the warm-up
    for prev, cur in zip(measured, measured[1:], strict=False):
        assert cur["previous_prompt_tokens"] == prev["prompt_tokens"]
        assert cur["engine"]["cached_tokens"] >= 0.8 * prev["prompt_tokens"], (prev["prompt_tokens"], cur["engine"])
    s = summarize_suite(store.records(run_id), cond(turns=3))
    assert [p["turn"] for p in s["agentic"]["curve"]] == [1, 2, 3]
    assert {c["name"]: c["status"] for c in s["integrity"]}["prefix_cache"] == "PASS"
    assert s["agentic"]["totals"]["cached_tokens"] > 0 and s["agentic"]["verdict"]["cache"].startswith("working")


class FakeClient:
    """A stand-in engine: every answer is 4 tokens 10 ms apart; the prompt size it reports is
    ``prompts[i]`` for the i-th request (what a real engine's usage would say)."""

    def __init__(self, prompts):
        self.prompts, self.payloads = list(prompts), []

    def stream_chat(self, payload, timeout=None):
        import time

        self.payloads.append(payload)
        r = StreamResult(status=200, finish_reason="length", done=True)
        r.t_request = time.perf_counter()
        r.token_times = [r.t_request + 0.05 + i * 0.01 for i in range(4)]
        r.t_end = r.token_times[-1] + 0.001
        r.usage = {"completion_tokens": 4, "prompt_tokens": self.prompts.pop(0)}
        r.content = "abcd"
        return r


def test_a_session_stops_before_a_turn_that_would_not_fit_the_context():
    """The engine reports a bigger prompt than planned (another tokenizer, a verbose template):
    the replay stops before overrunning the context and stores why."""
    from engineroom.engines.base import ServerInfo

    client = FakeClient([900, 7600, 7700, 7800])
    salts = iter(["aaaa00000001", "bbbb00000002"])
    ctx = SuiteContext(server=ServerInfo(url="http://fake", engine="fake", model_id="m", n_ctx=8192),
                       new_client=lambda: client, salts=lambda: next(salts))
    result = run_suite(SUITE_SPECS["agentic"].with_(turns=5, measured=1, warmup=0, max_tokens=8), ctx)
    reqs = [r["payload"] for r in result.records if r["kind"] == "bench_request"]
    stops = [r["payload"] for r in result.records if r["kind"] == "agentic_stop"]
    assert [r["turn"] for r in reqs] == [1, 2] and stops and stops[0]["turn"] == 3
    assert stops[0]["previous_prompt_tokens"] == 7600
    assert all(p["tools"] == TOOLS and p["tool_choice"] == "auto" and p["temperature"] == 0.0
               for p in client.payloads)                                  # tools and the sampler on every turn
    assert [len(p["messages"]) for p in client.payloads] == [2, 4]
    assert result.summary["agentic"]["stops"] and any("stopped" in w for w in result.summary["warnings"])
