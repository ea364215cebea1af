"""verify --suite full / stress: every check against the named stand-in (tests/fixtures/standin_server.py)
that misbehaves one way per test, the stream parser fuzzed, and the full suite against the real
llama-server + SmolLM2 with the expected outcome of every check written down.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fixtures.standin_server import MISBEHAVIOURS, MODEL, StandInServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engineroom.checks.context import RecordingClient, read_dialect
from engineroom.checks.full import FULL_CHECKS
from engineroom.checks.suites import run_suite
from engineroom.client import OpenAIClient, StreamResult, ToolCallAssembler, _sse_events
from engineroom.engines.base import Capabilities, EngineTimings, ServerInfo

from conftest import cli, fuzz_examples

FULL_NAMES = [name for name, _ in FULL_CHECKS]
THINKING_TEMPLATE = "{% if enable_thinking %}<think>{% endif %}{{ messages }}"   # the stand-in's declared template


def standin_timings(raw: dict[str, Any]) -> EngineTimings | None:
    """What an adapter's normalise_timings would make of the stand-in's (llama.cpp-shaped) draft counts."""
    return EngineTimings(decode_tokens=120, draft_tokens=raw.get("draft_n"), draft_accepted=raw.get("draft_n_accepted"))


def standin_info(url: str, **caps: Any) -> ServerInfo:
    """The ServerInfo an adapter would fill for the stand-in: a reasoning, vision, tool-calling model."""
    declared = dict(tools=True, tool_choice_required=True, parallel_tool_calls=True, json_schema=True,
                    vision=True, reasons={"vision": "stand-in declares it"})
    declared.update(caps)
    return ServerInfo(url=url, engine="standin", model_id=MODEL, n_ctx=2048, chat_template=THINKING_TEMPLATE,
                      capabilities=Capabilities(**declared), normalise_timings=standin_timings)


def run_against(misbehaviour: str | None, *names: str, repeat: int = 1, **caps: Any) -> dict:
    with StandInServer(misbehaviour, reasoning_model=True) as srv:
        results = run_suite("full", RecordingClient(srv.url), standin_info(srv.url, **caps), only=names,
                            repeat=repeat)
    return {r.name: r for r in results}


# -- stand-in: the PASS path, then one misbehaviour per test ------------------------------------


@pytest.mark.slow
def test_full_suite_has_at_least_twenty_checks_and_a_conformant_standin_passes_them_all():
    assert len(FULL_NAMES) >= 20 and len(set(FULL_NAMES)) == len(FULL_NAMES)
    r = run_against(None)
    assert list(r) == FULL_NAMES
    assert {n: (x.status, x.reason) for n, x in r.items() if x.status != "PASS"} == {}
    # every result carries the request it sent and the response kept
    for x in r.values():
        assert x.details["exchanges"], x.name
        assert all({"endpoint", "request", "response"} <= set(e) for e in x.details["exchanges"])
        assert x.seconds > 0 and x.details["suite"] == "full"
    assert r["responses_api"].details["exchanges"][0]["endpoint"] == "POST /v1/responses"
    assert r["thinking_off"].reason.startswith('{"chat_template_kwargs": {"enable_thinking": false}} switched')


# (misbehaviour, the check that must FAIL, how its reason starts)
CAUGHT = [
    ("models_empty", "reachable", "/v1/models answered with an empty model list"),
    ("wrong_answer", "basic_answer", "answer lacks Paris"),
    ("one_chunk", "streaming", "only 1 text chunks / 63 chars arrived (need >= 5 / 20"),
    ("tool_markup_in_content", "tool_call", "tool-call markup leaked into content ('<tool_call>' at char 0)"),
    ("tool_markup_in_content", "tool_call_auto", "tool-call markup leaked into content ('<tool_call>' at char 0)"),
    ("split_tool_call_deltas", "tool_call_streamed", "arguments of get_weather are not JSON"),
    ("ignore_response_format", "json_schema", "200 answer is not JSON, so response_format was ignored"),
    ("stream_drop", "stream_protocol", "stream failed: stream broke after 3 chunks: RemoteProtocolError"),
    ("stream_drop", "streaming", "stream failed: stream broke after 3 chunks: RemoteProtocolError"),
    ("no_done", "stream_protocol", "the stream ended after"),
    ("invalid_json", "stream_protocol", "stream failed: chunk 3 is not valid JSON"),
    ("ignore_tools", "tool_call_auto", "no tool call (finish_reason=stop)"),
    ("tool_call_in_reasoning", "tool_call_in_reasoning",
     "the tool call was written inside the reasoning ('<tool_call>') and never parsed into tool_calls"),
    ("single_call_only", "parallel_tool_calls", "1 tool call(s) for two cities"),
    ("ignore_named_choice", "tool_choice_named", "called 'get_weather', not the named tool 'get_time'"),
    ("call_despite_none", "tool_choice_none", "tool_choice=none was not honoured: the answer calls 'get_weather'"),
    ("ignore_tool_result", "tool_round_trip", "the answer does not use the tool result's 17 °C"),
    ("reasoning_in_content", "reasoning_split", "reasoning leaked into content ('<think>' at char 0)"),
    ("thinking_ignores_switch", "thinking_off",
     '{"chat_template_kwargs": {"enable_thinking": false}} was ignored: 96 chars of reasoning came back'),
    ("schema_enum_violation", "json_schema_complex", "JSON breaks the nested schema at role: 'superuser' is not one"),
    ("usage_missing", "usage", "non-streamed: no usage object"),
    ("usage_missing", "stream_protocol", "stream_options.include_usage was sent but no chunk carried usage"),
    ("usage_wrong", "usage", "non-streamed: usage total_tokens"),
    ("ignore_stop", "stop_sequence", "the stop sequence 'delta' is in the answer at char 17: stop was ignored"),
    ("ignore_max_tokens", "max_tokens_length", "max_tokens 8 was exceeded: 60 completion tokens"),
    ("no_logprobs", "logprobs", "logprobs were requested but the answer has no choices[0].logprobs.content"),
    ("seed_ignored", "seed_reproducible", "seed 1234 at temperature 1.0 gave two different texts"),
    ("vision_wrong", "image_input", "a red image, but the answer does not say red"),
    ("responses_broken", "responses_api", "/v1/responses answered 200 without an output message text"),
    ("500_long_prompt", "long_prompt",
     "a 4,016-char prompt (~1,024 tokens of a 2,048-token context) failed: HTTP 500: internal server error"),
    ("repetitive", "output_quality", "the same line 5 times in a row: 'The bicycle is old.'"),
    ("low_acceptance", "spec_decode", "mean acceptance length 1.20 tokens per step < 2"),
]


def test_every_check_and_every_misbehaviour_is_covered():
    assert {check for _, check, _ in CAUGHT} == set(FULL_NAMES)
    assert {bad for bad, _, _ in CAUGHT} == set(MISBEHAVIOURS)


@pytest.mark.slow
@pytest.mark.parametrize(("misbehaviour", "check", "reason"), CAUGHT, ids=[f"{b}-{c}" for b, c, _ in CAUGHT])
def test_the_right_check_fails_for_the_right_reason(misbehaviour, check, reason):
    result = run_against(misbehaviour, check)[check]
    assert result.status == "FAIL", (result.status, result.reason)
    assert result.reason.startswith(reason), result.reason
    assert "\n" not in result.reason


def test_repeat_reports_flakiness_as_passes_of_runs():
    r = run_against("seed_ignored", "seed_reproducible", "basic_answer", repeat=3)
    assert r["basic_answer"].status == "PASS" and r["basic_answer"].reason.startswith("passed 3/3: ")
    assert r["basic_answer"].details["passes"] == 3 and len(r["basic_answer"].details["attempts"]) == 3
    # random texts: never equal, so 0 of 3
    assert r["seed_reproducible"].reason.startswith("failed 3/3: seed 1234 at temperature 1.0 gave two different")


@pytest.mark.slow
def test_undeclared_vision_and_unserved_responses_skip_with_the_reason():
    r = run_against(None, "image_input", "reasoning_split", vision=None, reasons={})
    assert (r["image_input"].status, r["image_input"].reason) == (
        "SKIP", "the server does not report vision (not declared)")
    with StandInServer() as srv:
        info = ServerInfo(url=srv.url, engine="standin", model_id=MODEL, n_ctx=2048, chat_template="{{ messages }}")
        r = {x.name: x for x in run_suite("full", RecordingClient(srv.url), info,
                                          only=("reasoning_split", "thinking_off", "spec_decode"))}
    assert r["reasoning_split"].status == "SKIP"
    assert r["reasoning_split"].reason == ("the model does not reason: no reasoning field came back and the served "
                                           "chat template has no thinking block nor switch")
    assert r["thinking_off"].status == "SKIP"
    assert r["spec_decode"].reason == "the engine reports no per-response timings to read drafting from"


def test_dialect_reads_the_switch_from_the_template_and_names_a_forcing_template():
    from engineroom.templates import template_path

    d = read_dialect(ServerInfo(url="http://x", engine="e", chat_template=THINKING_TEMPLATE))
    assert d.thinking_off == {"chat_template_kwargs": {"enable_thinking": False}} and d.reasons is True
    assert d.sources["thinking_off"] == "the served chat template reads 'enable_thinking'"
    forced = read_dialect(ServerInfo(url="http://x", engine="e",
                                     chat_template=template_path("smollm2-tools.jinja").read_text()))
    assert forced.forced_tools.startswith("the served chat template is engineroom's own smollm2-tools.jinja")
    assert read_dialect(ServerInfo(url="http://x", engine="e", chat_template="{{ messages }}")).forced_tools == ""


# -- the stream parser under fuzz: no crash on any byte sequence ------------------------------------

JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                           st.sampled_from(["choices", "delta", "content", "tool_calls", "function", "arguments",
                                            "name", "index", "id", "usage", "error", "finish_reason",
                                            "reasoning_content", "timings"]), inner, max_size=4),
                       max_leaves=12)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.binary(max_size=400))
def test_sse_framing_and_chunk_parsing_never_raise_on_any_bytes(data):
    result, tools = StreamResult(), ToolCallAssembler()
    lines = data.decode("utf-8", "replace").splitlines()
    for event, payload in _sse_events(iter(lines)):
        OpenAIClient._absorb(result, tools, event, payload, 0.0)
    tools.result()
    assert isinstance(result.content, str) and isinstance(result.chunks, int)


@pytest.mark.slow
@settings(max_examples=fuzz_examples(300), deadline=None)
@given(JSONISH)
def test_any_json_shaped_chunk_is_absorbed_or_recorded_never_raised(value):
    result, tools = StreamResult(), ToolCallAssembler()
    OpenAIClient._absorb(result, tools, "message", json.dumps(value), 0.0)
    calls = tools.result()
    assert all(isinstance(c.arguments, str) for c in calls)


@pytest.mark.slow
@settings(max_examples=fuzz_examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_stream_chat_over_http_returns_a_result_for_any_body(data):
    with StandInServer(raw=data) as srv:
        r = OpenAIClient(srv.url).stream_chat({"messages": [{"role": "user", "content": "x"}]}, timeout=5)
    assert r.status == 200 and (r.ok or r.error)


# -- the command: stored per check, JUnit, --repeat in the card, --baseline ---------------------------


def test_verify_full_cli_stores_checks_writes_junit_and_flags_regressions_since_a_baseline(tmp_path):
    import xml.etree.ElementTree as ET


    junit = tmp_path / "verify.xml"
    with StandInServer() as good:
        first = cli("verify", "--url", good.url, "--suite", "full", "--repeat", "2", "--fast",
                    "--junit", str(junit), "--json", timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    out = json.loads(first.stdout)
    assert [r["name"] for r in out["results"]] == FULL_NAMES
    assert all(r["details"]["repeat"] == 2 for r in out["results"])
    skipped = {r["name"]: r["reason"] for r in out["results"] if r["status"] == "SKIP"}
    # an unknown engine declares nothing: vision, context size and engine timings are unknown
    assert set(skipped) == {"image_input", "long_prompt", "reasoning_split", "thinking_off", "spec_decode"}, skipped
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(FULL_NAMES)) and suite.get("failures") == "0"
    assert suite.get("skipped") == "5" and suite.find("testcase[@name='stop_sequence']") is not None
    with StandInServer("ignore_stop") as bad:
        second = cli("verify", "--url", bad.url, "--suite", "full", "--fast", "--baseline",
                     str(out["run_id"]), timeout=300)
    assert second.returncode == 1, second.stdout[-3000:]
    assert "FAIL stop_sequence" in " ".join(second.stdout.split())
    assert "1 regressed (stop_sequence)" in second.stdout
    run_id = out["run_id"] + 1
    card = cli("report", str(run_id), check=True).stdout
    assert f"## Since run {out['run_id']}" in card and "- regressed: stop_sequence: PASS -> FAIL" in card
    first_card = cli("report", str(out["run_id"]), check=True).stdout
    assert "| check | result | passed | seconds | reason |" in first_card and "| stop_sequence | PASS | 2/2 |" \
        in first_card


def test_unknown_suite_and_bad_repeat_are_one_sentence_errors():

    with StandInServer() as srv:
        unknown = cli("verify", "--url", srv.url, "--suite", "nope")
        repeat = cli("verify", "--url", srv.url, "--suite", "full", "--repeat", "0")
    assert unknown.returncode != 0 and "unknown verify suite 'nope'" in unknown.stderr
    assert repeat.returncode != 0 and "--repeat must be at least 1, not 0." in repeat.stderr
    assert "Traceback" not in unknown.stderr + repeat.stderr


# -- stress: ceilings, walls, crashes and the restart callback (stand-in) ------------------------------


def stress_against(misbehaviour: str | None, n_ctx: int = 8192, long_chars: int = 10**9, restart: bool = False):
    with StandInServer(misbehaviour, long_chars=long_chars) as srv:
        info = ServerInfo(url=srv.url, engine="standin", model_id=MODEL, n_ctx=n_ctx, chat_template="{{ messages }}",
                          capabilities=Capabilities(tools=True))
        restarted: list[int] = []

        def again() -> ServerInfo:
            srv.dead = False
            restarted.append(1)
            return info

        results = run_suite("stress", RecordingClient(srv.url), info, fast=True, restart=again if restart else None)
    return {r.name: r for r in results}, restarted


def test_stress_climbs_to_092_of_the_context_and_reports_the_curve():
    r, _ = stress_against(None)
    assert {n: x.status for n, x in r.items()} == dict.fromkeys(r, "PASS"), {n: x.reason for n, x in r.items()}
    ceiling = r["context_ceiling"].details
    assert [rung["target_tokens"] for rung in ceiling["curve"]] == [2048, 4096, 6144, int(8192 * 0.92)]
    assert ceiling["memory_ceiling_tokens"] >= 0.85 * 0.92 * 8192 and ceiling["recall_ceiling_tokens"]
    assert ceiling["calibration"] == "usage.prompt_tokens of a calibration request (chat template included)"
    salts = {rung["chars"] for rung in ceiling["curve"]}
    assert len(salts) == 4 and all(not rung["cache_hit"] for rung in ceiling["curve"])
    big = r["big_tool_return"].details
    assert big["tool_result_chars"] < 100_000 and big["scaled"] is True


def test_stress_keeps_climbing_after_a_recall_miss_recall_and_memory_ceilings_apart():
    r, _ = stress_against("forget_needle", long_chars=12_000)
    c = r["context_ceiling"]
    assert c.status == "PASS"
    outcomes = [rung["outcome"] for rung in c.details["curve"]]
    assert outcomes == ["pass", "quality ceiling", "quality ceiling", "quality ceiling"]
    assert c.details["recall_ceiling_tokens"] < c.details["memory_ceiling_tokens"]
    assert "recall ceiling" in c.reason and "memory ceiling" in c.reason


def test_stress_memory_wall_is_a_fail_with_the_http_code():
    r, _ = stress_against("500_long_prompt", long_chars=20_000)
    c = r["context_ceiling"]
    assert c.status == "FAIL" and c.reason.startswith("memory wall at ~")
    assert [rung["outcome"] for rung in c.details["curve"]][-1] == "memory wall"


@pytest.mark.slow
def test_stress_crash_restarts_the_managed_server_through_the_callback_and_continues():
    r, restarted = stress_against("crash_long_prompt", long_chars=12_000, restart=True)
    assert len(restarted) >= 2, "the restart callback was not called after each crash"
    assert r["needle_ladder"].status == "FAIL" and r["needle_ladder"].reason.startswith("crash at ~4,096 tokens")
    assert r["big_tool_return"].status == "FAIL" and "the engine died" in r["big_tool_return"].reason
    assert r["ide_system_prompt"].status == "PASS"          # ran after the restarts
    assert r["ide_system_prompt"].details["restarts"] == ["needle_ladder", "big_tool_return"]
    r, restarted = stress_against("crash_long_prompt", long_chars=12_000, restart=False)
    assert not restarted
    assert r["big_tool_return"].reason == ("not run: the engine stopped answering during needle_ladder and "
                                             "verify restarts only the managed server")


def test_stress_skips_below_its_stated_minimum_context():
    r, _ = stress_against(None, n_ctx=900)
    assert r["needle_ladder"].reason == "needs >= 1,024 tokens of context; the server has 900"
    assert {x.status for x in r.values()} == {"SKIP"}


# -- the real engine: llama-server + SmolLM2-135M on the CPU ------------------------------------------

SLOW_CPU = 5.0      # two cores shared with engine builds: generous timeouts keep load from becoming FAILs

# What the full suite says of SmolLM2-135M behind engineroom's tool template, and why.
REAL_EXPECTED = {
    "reachable": ("PASS", "/v1/models lists 'smollm2-135m'"),
    "basic_answer": ("PASS", "answer contains Paris"),
    "streaming": ("PASS", ""),
    "tool_call": ("PASS", 'get_weather({"city": "Paris"})'),          # template nudge + llama.cpp's grammar
    "tool_call_streamed": ("PASS", 'get_weather({"city": "Paris"})'),
    "json_schema": ("PASS", "valid against the schema"),             # response_format becomes a grammar
    "stream_protocol": ("PASS", ""),
    "tool_call_auto": ("PASS", 'get_weather({"city": "Paris"})'),     # the template's nudge, not the model's choice
    "tool_call_in_reasoning": ("PASS", 'get_weather({"city": "Paris"})'),   # no reasoning: a plain streamed call
    # expected FAIL: the 135M model stops after one call though the grammar allows more
    "parallel_tool_calls": ("FAIL", "1 tool call(s) for two cities"),
    "tool_choice_named": ("PASS", 'get_time({"city": "Paris"})'),     # the grammar forces the named tool
    # expected FAIL: the template's "start with <tool_call>" nudge applies under "none" too, and without a
    # grammar llama-server leaves the markup in content (smollm2-tools.jinja says so)
    "tool_choice_none": ("FAIL",
                         "tool_choice=none answered with tool-call markup in content ('<tool_call>' at char 0)"),
    # expected FAIL: the model copies the tool result back rather than answering from it
    "tool_round_trip": ("FAIL", "the answer echoes the raw tool result instead of using it"),
    "reasoning_split": ("SKIP", "the model does not reason"),         # SmolLM2's ChatML has no thinking block
    "thinking_off": ("SKIP", "no thinking switch to test"),
    "json_schema_complex": ("PASS", "valid against the nested schema"),   # grammar-constrained
    "usage": ("PASS", "prompt "),
    "stop_sequence": ("PASS", "stopped right before"),
    "max_tokens_length": ("PASS", "finish_reason=length after 8 tokens"),
    "logprobs": ("PASS", "8 tokens with logprobs and 3 alternatives each"),
    "seed_reproducible": ("PASS", "seed 1234 gave the same"),
    "image_input": ("SKIP", "the server does not report vision (declared absent)"),   # /props modalities
    "responses_api": ("PASS", "output message: 'The capital of France is Paris.'"),   # llama-server serves it
    "long_prompt": ("PASS", ""),
    "output_quality": ("PASS", ""),
    "spec_decode": ("SKIP", "the engine reports no drafted tokens: no speculative decoding is running"),
}


def test_full_suite_on_real_smollm2_states_every_outcome(tools_server):
    from engineroom.engines import detect

    assert list(REAL_EXPECTED) == FULL_NAMES
    info = detect(tools_server)
    results = run_suite("full", RecordingClient(tools_server), info, fast=True, timeout_scale=SLOW_CPU)
    got = {r.name: (r.status, r.reason) for r in results}
    wrong = {n: got[n] for n, (status, start) in REAL_EXPECTED.items()
             if got[n][0] != status or not got[n][1].startswith(start)}
    assert not wrong, wrong
    r = {x.name: x for x in results}
    # honest about what passed: the tool PASSes carry the template that forced the format
    for name in ("tool_call", "tool_call_streamed", "tool_call_auto", "tool_choice_named"):
        assert r[name].details["forced"].startswith("the served chat template is engineroom's own "
                                                    "smollm2-tools.jinja"), name
    assert "forced" not in r["json_schema"].details and "forced" not in r["tool_choice_none"].details
    assert r["long_prompt"].details["prompt_chars"] > 3000
    ran = sum(1 for x in results if x.status != "SKIP")
    print(f"\nverify --suite full: {ran} checks ran against the real llama-server, "
          f"{len(CAUGHT)} misbehaviours against the stand-in, {len(results) - ran} skipped")



def test_a_server_that_declares_no_tool_calling_gets_no_tools_list_in_stress_or_soak():
    """vLLM launched without a tool parser answers any request carrying `tools` with HTTP 400; it
    declares tools=False. The stress tool return and the soak's tool turns then send the same
    conversation (the tool call and its result) without the tools list (stand-in: it records bodies)."""
    from engineroom.checks.soak import SoakOptions

    with StandInServer(None) as srv:
        info = ServerInfo(url=srv.url, engine="standin", model_id=MODEL, n_ctx=8192, chat_template="{{ messages }}",
                          capabilities=Capabilities(tools=False))
        results = {r.name: r for r in run_suite("stress", RecordingClient(srv.url), info, fast=True)}
        big = results["big_tool_return"]
        assert big.status == "PASS" and big.details["tools_offered"] is False, big.reason
        assert "no tools list sent: the server declares no tool calling" in big.reason
        seen: list[dict] = []
        run_suite("soak", RecordingClient(srv.url), info, fast=True, soak=SoakOptions("fresh", None, 5),
                  on_turn=seen.append)
        bodies = [r["body"] for r in srv.requests if r["path"].endswith("/chat/completions")]
    # (the IDE prompt keeps its 10 tools under tool_choice "none", which needs no tool parser)
    assert bodies and not [b for b in bodies if "tools" in b and b.get("tool_choice") != "none"]
    assert any(m.get("role") == "tool" for b in bodies for m in b["messages"])      # the tool result still went
    assert seen and not [t for t in seen if t["tools_offered"]]


def test_stress_budgets_scale_with_the_slowest_prefill_the_ladder_measured():
    """Seen on Gemma 3 270M at 32K on this 2-core VM: the ladder prefilled at ~87 tok/s, so the 26K-token
    tool return needs ~5 minutes; a fixed 240 s cut it off, and the engine, still prefilling, made the
    next probe time out too. The budget is now twice the prefill at the slowest measured rate + 60 s."""
    from engineroom.checks.context import Ctx
    from engineroom.checks.stress import _Stress

    ctx = Ctx.__new__(Ctx)
    ctx.timeout_scale = 1.0
    s = _Stress(ctx, None)
    assert s.budget(240, 26_214) == 240                  # nothing measured yet: the base
    s.saw({"prompt_tokens": 8234, "prefill_tps": 86.9})
    s.saw({"prompt_tokens": 100, "prefill_tps": 5.0})    # a tiny prompt says little of prefill: ignored
    s.saw({"prompt_tokens": 16420, "prefill_tps": 99.7})
    assert s.prefill_tps == 86.9
    assert s.budget(240, 26_214) == pytest.approx(60 + 2 * 26_214 / 86.9)
    assert s.budget(240, 1_000) == 240                   # never below the base


def test_stress_long_decode_asks_no_more_than_the_context_holds():
    """The full suite's 8,192-token decode on a 4,096-token context: vLLM answered HTTP 400 (the
    recorded CPU bakeoff); the request now asks the context less the prompt's room."""
    from engineroom.checks.stress import LONG_DECODE_PROMPT_ROOM

    with StandInServer(None) as srv:
        info = ServerInfo(url=srv.url, engine="standin", model_id=MODEL, n_ctx=4096, chat_template="{{ messages }}",
                          capabilities=Capabilities(tools=True))
        results = {r.name: r for r in run_suite("stress", RecordingClient(srv.url), info, fast=False,
                                                 only=["long_decode"])}
    details = results["long_decode"].details
    assert details["max_tokens"] == 4096 - LONG_DECODE_PROMPT_ROOM and details["http"] == 200, details
