"""The full suite's streaming-protocol and tool-call checks (``checks.full``)."""

from __future__ import annotations

import json
from typing import Any

from engineroom.checks.context import Ctx, pretty
from engineroom.checks.fullbase import (
    NAMED_PROMPT,
    NONE_PROMPT,
    PARALLEL_PROMPT,
    ROUND_TRIP_PROMPT,
    ROUND_TRIP_RESULT,
    TIME_TOOL,
    TIMEOUTS,
    TOOL_MARKUP,
    WEATHER_PROMPT,
    calls_detail,
    invalid_call_reason,
    request_body,
    tool_skip,
    verdict,
)
from engineroom.checks.smoke import WEATHER_TOOL, CheckResult, chat_details, stream_details
from engineroom.client import ToolCall

# -- streaming protocol -------------------------------------------------------------------


def check_stream_protocol(ctx: Ctx) -> CheckResult:
    """The SSE stream itself: JSON chunks, a finish_reason, a usage chunk, and [DONE] last."""
    body = request_body(ctx, "Write three short sentences about the sea.", 60)
    r = ctx.client.stream_chat(body, timeout=ctx.timeout(TIMEOUTS["stream_protocol"]))
    d = stream_details(r)
    if r.error:
        return verdict("stream_protocol", "FAIL", f"stream failed: {r.error}", d)
    if not r.done:
        return verdict("stream_protocol", "FAIL",
                       f"the stream ended after {r.chunks} chunks without the [DONE] sentinel "
                       f"(finish_reason={r.finish_reason})", d)
    if r.finish_reason is None:
        return verdict("stream_protocol", "FAIL",
                       f"{r.chunks} chunks and [DONE] but no chunk carried a finish_reason", d)
    if not r.usage:
        return verdict("stream_protocol", "FAIL",
                       "stream_options.include_usage was sent but no chunk carried usage", d)
    return verdict("stream_protocol", "PASS",
                   f"{r.chunks} JSON chunks, finish_reason={r.finish_reason}, usage chunk, [DONE] last", d)


# -- tool calls ------------------------------------------------------------------------


def _judge_calls(name: str, calls: list[ToolCall], content: str, reasoning: str, finish: str | None,
                 tools: list[dict[str, Any]], details: dict[str, Any], *, expect: str | None = None,
                 streamed: bool = False) -> CheckResult:
    details["tool_calls"] = calls_detail(calls)
    leak = TOOL_MARKUP.search(content or "")
    if leak:
        return verdict(name, "FAIL",
                       f"tool-call markup leaked into content ({leak.group(0)!r} at char {leak.start()}): "
                       "the server did not parse the call", details)
    if not calls:
        inside = TOOL_MARKUP.search(reasoning or "")
        if inside:
            return verdict(name, "FAIL", f"the tool call was written inside the reasoning ({inside.group(0)!r}) and "
                                         "never parsed into tool_calls", details)
        return verdict(name, "FAIL", f"no tool call (finish_reason={finish}); content: {pretty(content)}", details)
    for call in calls:
        why = invalid_call_reason(call, tools)
        if why:
            return verdict(name, "FAIL", why, details)
    if expect and calls[0].name != expect:
        return verdict(name, "FAIL", f"called {calls[0].name!r}, not the named tool {expect!r}", details)
    if streamed and finish != "tool_calls":
        return verdict(name, "FAIL", f"the call arrived but finish_reason is {finish!r}, not 'tool_calls'", details)
    first = calls[0]
    return verdict(name, "PASS", f"{first.name}({json.dumps(first.parsed_arguments())}) valid against its schema "
                                 f"(finish_reason={finish})", details)


def check_tool_call_auto(ctx: Ctx) -> CheckResult:
    """tool_choice "auto" on a question the tool answers: a parsed call, no markup in content."""
    if skip := tool_skip(ctx, "tools"):
        return verdict("tool_call_auto", "SKIP", skip.reason)
    body = request_body(ctx, WEATHER_PROMPT, 200, temperature=0.3, tools=[WEATHER_TOOL], tool_choice="auto")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_call_auto"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("tool_call_auto", "FAIL", f"request failed: {r.error}", d)
    return _judge_calls("tool_call_auto", r.tool_calls, r.content, r.reasoning, r.finish_reason, [WEATHER_TOOL], d)


def check_tool_call_in_reasoning(ctx: Ctx) -> CheckResult:
    """Streamed, thinking ON, tool_choice auto: the call is parsed even when the model thinks first."""
    if skip := tool_skip(ctx, "tools"):
        return verdict("tool_call_in_reasoning", "SKIP", skip.reason)
    body = request_body(ctx, WEATHER_PROMPT, 256, thinking="on", temperature=0.3, tools=[WEATHER_TOOL],
                        tool_choice="auto")
    r = ctx.client.stream_chat(body, timeout=ctx.timeout(TIMEOUTS["tool_call_in_reasoning"]))
    d = stream_details(r)
    if not r.ok:
        return verdict("tool_call_in_reasoning", "FAIL", f"stream failed: {r.error}", d)
    return _judge_calls("tool_call_in_reasoning", r.tool_calls, r.content, r.reasoning, r.finish_reason,
                        [WEATHER_TOOL], d, streamed=True)


def check_parallel_tool_calls(ctx: Ctx) -> CheckResult:
    """Two cities, parallel_tool_calls true: two valid get_weather calls, one per city."""
    if skip := tool_skip(ctx, "tools", "parallel_tool_calls"):
        return verdict("parallel_tool_calls", "SKIP", skip.reason)
    body = request_body(ctx, PARALLEL_PROMPT, 200, tools=[WEATHER_TOOL], tool_choice="required",
                        parallel_tool_calls=True)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["parallel_tool_calls"]))
    d = chat_details(r)
    d["tool_calls"] = calls_detail(r.tool_calls)
    if not r.ok:
        return verdict("parallel_tool_calls", "FAIL", f"request failed: {r.error}", d)
    leak = TOOL_MARKUP.search(r.content or "")
    if leak:
        return verdict("parallel_tool_calls", "FAIL", f"tool-call markup leaked into content ({leak.group(0)!r})", d)
    for call in r.tool_calls:
        if why := invalid_call_reason(call, [WEATHER_TOOL]):
            return verdict("parallel_tool_calls", "FAIL", why, d)
    cities = {str(c.parsed_arguments().get("city", "")).strip().lower() for c in r.tool_calls}
    if len(r.tool_calls) < 2:
        return verdict("parallel_tool_calls", "FAIL",
                       f"{len(r.tool_calls)} tool call(s) for two cities (finish_reason={r.finish_reason})", d)
    if not {"paris", "tokyo"} <= cities:
        return verdict("parallel_tool_calls", "FAIL", f"{len(r.tool_calls)} calls, but for {sorted(cities)}, "
                                                      "not Paris and Tokyo", d)
    ids = [c.id for c in r.tool_calls]
    if any(ids) and len(set(ids)) != len(ids):
        return verdict("parallel_tool_calls", "FAIL", f"parallel calls share an id ({ids})", d)
    return verdict("parallel_tool_calls", "PASS", f"{len(r.tool_calls)} valid calls: {sorted(cities)}", d)


def check_tool_choice_named(ctx: Ctx) -> CheckResult:
    """tool_choice naming get_time, with get_weather also offered: get_time is what is called."""
    if skip := tool_skip(ctx, "tools"):
        return verdict("tool_choice_named", "SKIP", skip.reason)
    body = request_body(ctx, NAMED_PROMPT, 120, tools=[WEATHER_TOOL, TIME_TOOL],
                        tool_choice={"type": "function", "function": {"name": "get_time"}})
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_choice_named"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("tool_choice_named", "FAIL", f"request failed: {r.error}", d)
    return _judge_calls("tool_choice_named", r.tool_calls, r.content, r.reasoning, r.finish_reason,
                        [WEATHER_TOOL, TIME_TOOL], d, expect="get_time")


def check_tool_choice_none(ctx: Ctx) -> CheckResult:
    """tool_choice "none" with tools offered: a prose answer, no call, no call markup."""
    if skip := tool_skip(ctx, "tools"):
        return verdict("tool_choice_none", "SKIP", skip.reason)
    body = request_body(ctx, NONE_PROMPT, 80, tools=[WEATHER_TOOL], tool_choice="none")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_choice_none"]))
    d = chat_details(r)
    d["tool_calls"] = calls_detail(r.tool_calls)
    if not r.ok:
        return verdict("tool_choice_none", "FAIL", f"request failed: {r.error}", d)
    if r.tool_calls:
        return verdict("tool_choice_none", "FAIL", f"tool_choice=none was not honoured: the answer calls "
                                                   f"{r.tool_calls[0].name!r}", d)
    leak = TOOL_MARKUP.search(r.content)
    if leak:
        return verdict("tool_choice_none", "FAIL", f"tool_choice=none answered with tool-call markup in content "
                                                   f"({leak.group(0)!r} at char {leak.start()})", d)
    if not r.content.strip():
        return verdict("tool_choice_none", "FAIL", f"empty answer (finish_reason={r.finish_reason})", d)
    return verdict("tool_choice_none", "PASS", f"prose, no call: {pretty(r.content, 60)}", d)


def check_tool_round_trip(ctx: Ctx) -> CheckResult:
    """A tool result fed back (assistant tool_calls + tool message): the answer uses its figure."""
    if skip := tool_skip(ctx, "tools"):
        return verdict("tool_round_trip", "SKIP", skip.reason)
    call_id = "call_er_0001"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": ROUND_TRIP_PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(ROUND_TRIP_RESULT)},
    ]
    body = request_body(ctx, messages, 120, tools=[WEATHER_TOOL], tool_choice="auto")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["tool_round_trip"]))
    d = chat_details(r)
    d["tool_calls"] = calls_detail(r.tool_calls)
    if not r.ok:
        return verdict("tool_round_trip", "FAIL", f"request with the tool result failed: {r.error}", d)
    text = r.content
    if "temperature_c" in text or "<tool_response>" in text:
        return verdict("tool_round_trip", "FAIL", f"the answer echoes the raw tool result instead of using it: "
                                                  f"{pretty(text, 60)}", d)
    if "17" in text:
        return verdict("tool_round_trip", "PASS", f"the answer uses the tool's 17 °C: {pretty(text, 60)}", d)
    if r.tool_calls:
        return verdict("tool_round_trip", "FAIL",
                       f"called {r.tool_calls[0].name!r} again instead of answering from the tool result", d)
    return verdict("tool_round_trip", "FAIL", f"the answer does not use the tool result's 17 °C "
                                              f"(finish_reason={r.finish_reason}): {pretty(text, 60)}", d)


