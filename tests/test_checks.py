"""The smoke suite against the real llama-server + SmolLM2, and against a stand-in for
misbehaviour no real engine produces on demand (leaked tool markup, ignored response_format).
"""

from __future__ import annotations

import json

from engineroom.checks import SMOKE_CHECKS, CheckResult, run_smoke
from engineroom.client import OpenAIClient
from engineroom.engines.base import Capabilities, ServerInfo

# Stand-in helpers live in test_client.py; the real servers are conftest.py fixtures.
from test_client import Reply, StandInServer, chunk, free_port

CHECK_NAMES = [name for name, _ in SMOKE_CHECKS]
# Other work shares this machine's 2 cores; generous timeouts keep a loaded CPU from
# turning into FAILs (measured: 112 tok/s idle, 2.6 tok/s under load).
SLOW_CPU = 5.0


def info_from_props(url: str, declared: bool = True) -> ServerInfo:
    """The ServerInfo the llama.cpp adapter builds from the real server's /props (what verify uses).

    ``declared=False`` builds the info of a server that says nothing (all None).
    """
    from engineroom.engines import detect

    if not declared:
        return ServerInfo(url=url, engine="unknown", model_id=OpenAIClient(url).models()[0])
    return detect(url)


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


# -- real server -----------------------------------------------------------------------------


def test_smollm2_own_template_skips_tool_checks_as_props_declares(plain_server):
    seen: list[str] = []
    results = run_smoke(OpenAIClient(plain_server), info_from_props(plain_server),
                        on_result=lambda r: seen.append(r.name), timeout_scale=SLOW_CPU)
    assert seen == CHECK_NAMES                        # reported one by one, in order
    r = by_name(results)
    for name in ("reachable", "basic_answer", "streaming", "json_schema"):
        assert r[name].status == "PASS", (name, r[name].reason)
    for name in ("tool_call", "tool_call_streamed"):
        assert r[name].status == "SKIP"
        assert r[name].reason == ("server declares no tools support "
                                  "(from /props chat_template_caps.supports_tool_calls = false)")
    assert "Paris" in r["basic_answer"].reason
    s = r["streaming"].details
    assert s["text_chunks"] >= 5 and s["chars"] >= 20 and 0 < s["ttft_s"] < s["seconds"]
    assert s["engine_timings"]["predicted_n"] == s["usage"]["completion_tokens"]
    assert json.loads(json.dumps(r["json_schema"].details["value"])) == r["json_schema"].details["value"]
    assert all(x.seconds > 0 for x in results if x.status != "SKIP")


def test_undeclared_tools_are_tested_and_fail_when_ignored(plain_server):
    """A server that does not say (None) is tested: tools ignored with a 200 is a FAIL."""
    r = by_name(run_smoke(OpenAIClient(plain_server), info_from_props(plain_server, declared=False),
                          timeout_scale=SLOW_CPU))
    for name in ("tool_call", "tool_call_streamed"):
        assert r[name].status == "FAIL"
        assert r[name].reason.startswith("200 answer without a tool call despite tool_choice=required "
                                         "(finish_reason=length)")
    assert r["json_schema"].status == "PASS"


def test_tool_template_makes_tool_checks_pass(tools_server):
    info = info_from_props(tools_server)
    assert info.capabilities.tools is True
    results = run_smoke(OpenAIClient(tools_server), info, timeout_scale=SLOW_CPU)
    assert [(x.name, x.status) for x in results] == [(n, "PASS") for n in CHECK_NAMES], \
        [(x.name, x.reason) for x in results]
    r = by_name(results)
    for name in ("tool_call", "tool_call_streamed"):
        assert r[name].details["tool_calls"][0]["name"] == "get_weather"
        assert json.loads(r[name].details["tool_calls"][0]["arguments"]) == {"city": "Paris"}
        assert r[name].reason.startswith('get_weather({"city": "Paris"}) valid against its schema')


def test_unreachable_server_fails_every_check_with_one_line_reasons():
    url = f"http://127.0.0.1:{free_port()}"
    results = run_smoke(OpenAIClient(url), ServerInfo(url=url, engine="unknown", model_id="m"))
    assert [x.status for x in results] == ["FAIL"] * len(CHECK_NAMES)
    assert results[0].reason.startswith(f"No server answers at {url}/v1/models")
    assert all("\n" not in x.reason and "ConnectError" in x.reason for x in results)


# -- stand-in: misbehaviour a real engine will not show on demand ------------------------------

LEAK = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def misbehaving_server() -> StandInServer:
    """Answers every chat with tool markup left in content and prose instead of JSON."""

    def chat(body: dict) -> Reply:
        if body.get("tools"):
            if body.get("stream"):
                return Reply(events=[chunk(LEAK[:15]), chunk(LEAK[15:], "stop"), "[DONE]"])
            text = LEAK
        elif body.get("response_format"):
            text = "The capital of France is Paris."
        else:
            text = "Paris, of course."
        if body.get("stream"):
            return Reply(events=[chunk(w + " ") for w in text.split()] + [chunk("", "stop"), "[DONE]"])
        return Reply(body={"choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": text}}]})

    return StandInServer({"/v1/models": lambda b: Reply(body={"object": "list", "data": [{"id": "m"}]}),
                          "/v1/chat/completions": chat})


def test_leaked_tool_markup_and_ignored_response_format_fail():
    with misbehaving_server() as srv:
        r = by_name(run_smoke(OpenAIClient(srv.url), ServerInfo(url=srv.url, engine="unknown", model_id="m")))
    for name in ("tool_call", "tool_call_streamed"):
        assert r[name].status == "FAIL"
        assert r[name].reason == ("tool-call markup leaked into content ('<tool_call>' at char 0): "
                                  "the server did not parse the call")
    assert r["json_schema"].status == "FAIL"
    assert r["json_schema"].reason.startswith("200 answer is not JSON, so response_format was ignored")
    assert r["reachable"].status == "PASS" and r["basic_answer"].status == "PASS"
    assert r["streaming"].status == "FAIL" and "text chunks" in r["streaming"].reason  # 3 words < 5 chunks


def test_json_that_breaks_the_schema_fails():
    bad = json.dumps({"city": "Paris"})   # 'country' missing
    reply = Reply(body={"choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": bad}}]})
    with StandInServer({"/v1/chat/completions": lambda b: reply}) as srv:
        from engineroom.checks.smoke import check_json_schema

        result = check_json_schema(OpenAIClient(srv.url), ServerInfo(url=srv.url, engine="unknown"), 5)
    assert result.status == "FAIL"
    assert result.reason == "200 answer is JSON but breaks the requested schema: 'country' is a required property"


def test_json_cut_by_max_tokens_fails_without_saying_response_format_was_ignored():
    """An answer the grammar held to JSON but max_tokens cut (random weights fill the string with noise:
    the H200 visit of 2026-12-04) fails, and says why; "ignored" is kept for prose."""
    cut = '{"city":"]),Citation repetitive critics calorie'
    reply = Reply(body={"choices": [{"index": 0, "finish_reason": "length",
                                     "message": {"role": "assistant", "content": cut}}]})
    with StandInServer({"/v1/chat/completions": lambda b: reply}) as srv:
        from engineroom.checks.smoke import check_json_schema

        result = check_json_schema(OpenAIClient(srv.url), ServerInfo(url=srv.url, engine="unknown"), 5)
    assert result.status == "FAIL"
    assert result.reason.startswith("200 answer stopped at max_tokens before its JSON closed (finish_reason=length)")


def test_declared_absent_json_schema_skips_with_its_source():
    info = ServerInfo(url="http://127.0.0.1:1", engine="x",
                      capabilities=Capabilities(json_schema=False, reasons={"json_schema": "engine catalog"}))
    from engineroom.checks.smoke import check_json_schema

    result = check_json_schema(OpenAIClient(info.url), info, 1)
    assert (result.status, result.reason) == ("SKIP", "server declares no json schema support (from engine catalog)")


def test_adapter_detects_what_the_real_server_declares(plain_server, tools_server):
    """The ServerInfo `verify` really uses comes from engines.detect() on the server itself."""
    from engineroom.engines import detect

    plain = detect(plain_server)
    assert plain.engine == "llama.cpp" and plain.model_id == "smollm2-135m"
    assert plain.capabilities.tools is False
    assert "supports_tool_calls = false" in plain.capabilities.reasons["tools"]
    assert plain.n_ctx and plain.total_slots
    tools = detect(tools_server)
    assert tools.capabilities.tools is True
    results = {r.name: r for r in run_smoke(OpenAIClient(plain_server), plain, timeout_scale=SLOW_CPU)}
    assert results["tool_call"].status == "SKIP"
    assert "supports_tool_calls = false" in results["tool_call"].reason
