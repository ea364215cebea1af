"""The smoke suite of ``verify``: a handful of fast checks that any chat server must pass.

Rules every check here follows:

- PASS only on evidence; FAIL with a one-line reason that names what was wrong.
- SKIP only when the server *declares* the feature absent (``Capabilities`` field is
  ``False``), and the reason says where that declaration came from. A server that does not
  say (``None``) is tested; a 200 answer that silently lacks the feature is a FAIL.
- Every request carries its own timeout and explicit sampler values (engine defaults
  differ), and transport errors become FAILs, never exceptions.
- Timing comes from the client's clock (``engineroom.client``); engine figures such as
  llama.cpp ``timings`` are kept in ``details`` under their own names.

``ServerInfo.extra["thinking_off"]``, when the caller found one, is a dict merged into the
answer-style requests (e.g. ``{"chat_template_kwargs": {"enable_thinking": False}}``) so
that a reasoning model answers within the small token budgets used here.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from engineroom.client import ChatResult, OpenAIClient, StreamResult, ToolCall
from engineroom.engines.base import ServerInfo
from engineroom.errors import EngineroomError

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass
class CheckResult:
    name: str
    status: Status
    reason: str
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


# Seconds each check may take (one request each), before ``timeout_scale``.
TIMEOUTS = {
    "reachable": 5.0,
    "basic_answer": 30.0,
    "streaming": 45.0,
    "tool_call": 60.0,
    "tool_call_streamed": 60.0,
    "json_schema": 60.0,
}

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
            "required": ["city"],
        },
    },
}

CAPITAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}

# Text that only appears in content when a server failed to parse a tool call out of it.
_TOOL_MARKUP = re.compile(
    r"<tool_call>|</tool_call>|<\|tool_call|<tool_calls>|<function=|<\|python_tag\|>"
    r"|\[TOOL_CALLS\]|<｜tool▁call|<\|START_ACTION\|>|<\|channel\|>commentary"
    r"|\"name\"\s*:\s*\"get_weather\"",
)


def _model(info: ServerInfo) -> dict[str, Any]:
    return {"model": info.model_id} if info.model_id else {}


def _thinking_off(info: ServerInfo) -> dict[str, Any]:
    extra = info.extra.get("thinking_off") if info.extra else None
    return dict(extra) if isinstance(extra, dict) else {}


def _snippet(text: str, n: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat[:n] + ("..." if len(flat) > n else ""))


def declared_absent(info: ServerInfo, *features: str) -> str | None:
    """A SKIP reason when the server declared one of ``features`` absent, else None."""
    caps = info.capabilities
    for feature in features:
        if getattr(caps, feature, None) is False:
            source = caps.reasons.get(feature) or "the server's declared capabilities"
            return f"server declares no {feature.replace('_', ' ')} support (from {source})"
    return None


# -- checks ---------------------------------------------------------------------------


def check_reachable(client: OpenAIClient, info: ServerInfo, timeout: float) -> CheckResult:
    """GET /v1/models answers and lists the model under test."""
    ids = client.models(timeout=timeout)
    details = {"models": ids}
    if not ids:
        return CheckResult("reachable", "FAIL", "/v1/models answered with an empty model list", details=details)
    if info.model_id and info.model_id not in ids:
        return CheckResult("reachable", "FAIL",
                           f"model {info.model_id!r} is not among /v1/models ids {ids[:5]}", details=details)
    return CheckResult("reachable", "PASS", f"/v1/models lists {info.model_id or ids[0]!r}", details=details)


def check_basic_answer(client: OpenAIClient, info: ServerInfo, timeout: float) -> CheckResult:
    """A one-sentence factual answer: the capital of France contains "Paris"."""
    payload = {
        **_model(info),
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        "max_tokens": 30, "temperature": 0.0, "top_p": 1.0, "seed": 42,
        **_thinking_off(info),
    }
    r = client.chat(payload, timeout=timeout)
    details = chat_details(r)
    if not r.ok:
        return CheckResult("basic_answer", "FAIL", f"request failed: {r.error}", details=details)
    if "paris" in r.content.lower():
        return CheckResult("basic_answer", "PASS", f"answer contains Paris: {_snippet(r.content)}", details=details)
    if not r.content and "paris" in r.reasoning.lower():
        return CheckResult("basic_answer", "FAIL",
                           f"Paris only appears in reasoning, content is empty (finish_reason={r.finish_reason}); "
                           "thinking was not switched off", details=details)
    return CheckResult("basic_answer", "FAIL",
                       f"answer lacks Paris (finish_reason={r.finish_reason}): {_snippet(r.content)}", details=details)


def check_streaming(client: OpenAIClient, info: ServerInfo, timeout: float,
                    min_chunks: int = 5, min_chars: int = 20) -> CheckResult:
    """A streamed answer arrives in >= ``min_chunks`` chunks and >= ``min_chars`` chars."""
    payload = {
        **_model(info),
        "messages": [{"role": "user", "content": "Write three short sentences about the sea."}],
        "max_tokens": 120, "temperature": 0.0, "top_p": 1.0, "seed": 42,
        **_thinking_off(info),
    }
    r = client.stream_chat(payload, timeout=timeout)
    details = stream_details(r)
    if not r.ok:
        return CheckResult("streaming", "FAIL", f"stream failed: {r.error}", details=details)
    text_chunks = len(r.token_times)
    chars = len(r.content) + len(r.reasoning)
    if text_chunks < min_chunks or chars < min_chars:
        return CheckResult("streaming", "FAIL",
                           f"only {text_chunks} text chunks / {chars} chars arrived "
                           f"(need >= {min_chunks} / {min_chars}; finish_reason={r.finish_reason})",
                           details=details)
    ttft = "?" if r.ttft is None else f"{r.ttft * 1000:.0f}"     # text chunks came: it is known
    return CheckResult("streaming", "PASS", f"{text_chunks} text chunks, {chars} chars, TTFT {ttft} ms (client clock)",
                       details=details)


def check_tool_call(client: OpenAIClient, info: ServerInfo, timeout: float) -> CheckResult:
    """tool_choice "required" yields a valid get_weather call (non-streamed)."""
    skip = declared_absent(info, "tools", "tool_choice_required")
    if skip:
        return CheckResult("tool_call", "SKIP", skip)
    r = client.chat(_tool_payload(info), timeout=timeout)
    return _judge_tool_call("tool_call", r.ok, r.error, r.tool_calls, r.content, r.finish_reason,
                            chat_details(r))


def check_tool_call_streamed(client: OpenAIClient, info: ServerInfo, timeout: float) -> CheckResult:
    """The same call streamed: it must be assembled from deltas, with no markup in content."""
    skip = declared_absent(info, "tools", "tool_choice_required")
    if skip:
        return CheckResult("tool_call_streamed", "SKIP", skip)
    r = client.stream_chat(_tool_payload(info), timeout=timeout)
    return _judge_tool_call("tool_call_streamed", r.ok, r.error, r.tool_calls, r.content, r.finish_reason,
                            stream_details(r))


def check_json_schema(client: OpenAIClient, info: ServerInfo, timeout: float) -> CheckResult:
    """response_format json_schema: the content parses as JSON and validates against the schema."""
    skip = declared_absent(info, "json_schema")
    if skip:
        return CheckResult("json_schema", "SKIP", skip)
    payload = {
        **_model(info),
        "messages": [{"role": "user", "content":
                      "What is the capital of France? Reply with JSON with the keys city and country."}],
        "max_tokens": 100, "temperature": 0.0, "top_p": 1.0, "seed": 42,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "capital", "strict": True, "schema": CAPITAL_SCHEMA}},
        **_thinking_off(info),
    }
    r = client.chat(payload, timeout=timeout)
    details = chat_details(r)
    if not r.ok:
        return CheckResult("json_schema", "FAIL", f"request failed: {r.error}", details=details)
    try:
        value = json.loads(r.content)
    except ValueError:
        # a JSON object cut by max_tokens was constrained, not ignored (random weights on the H200 filled the
        # string value with noise until the limit); prose, or JSON that never began, means it was ignored
        if r.finish_reason == "length" and r.content.lstrip().startswith("{"):
            why = "200 answer stopped at max_tokens before its JSON closed (finish_reason=length)"
        else:
            why = f"200 answer is not JSON, so response_format was ignored (finish_reason={r.finish_reason})"
        return CheckResult("json_schema", "FAIL", f"{why}: {_snippet(r.content)}", details=details)
    try:
        jsonschema.validate(value, CAPITAL_SCHEMA)
    except jsonschema.ValidationError as exc:
        return CheckResult("json_schema", "FAIL",
                           f"200 answer is JSON but breaks the requested schema: {exc.message}", details=details)
    details["value"] = value
    return CheckResult("json_schema", "PASS", f"valid against the schema: {json.dumps(value)[:80]}",
                       details=details)


# -- shared judgement -------------------------------------------------------------------


def _tool_payload(info: ServerInfo) -> dict[str, Any]:
    return {
        **_model(info),
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        # a get_weather call is ~30-40 tokens; 120 leaves room without making an ignored
        # `tools` (the server writing prose to the limit) slow to detect
        "max_tokens": 120, "temperature": 0.0, "top_p": 1.0, "seed": 42,
        **_thinking_off(info),
    }


def _judge_tool_call(name: str, ok: bool, error: str | None, calls: list[ToolCall], content: str,
                     finish_reason: str | None, details: dict[str, Any]) -> CheckResult:
    details["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
    if not ok:
        return CheckResult(name, "FAIL", f"request failed: {error}", details=details)
    leak = _TOOL_MARKUP.search(content or "")
    if leak:
        return CheckResult(name, "FAIL",
                           f"tool-call markup leaked into content ({leak.group(0)!r} at char {leak.start()}): "
                           "the server did not parse the call", details=details)
    if not calls:
        return CheckResult(name, "FAIL",
                           f"200 answer without a tool call despite tool_choice=required "
                           f"(finish_reason={finish_reason}); content: {_snippet(content)}", details=details)
    expected = WEATHER_TOOL["function"]
    for call in calls:
        if call.name != expected["name"]:
            return CheckResult(name, "FAIL", f"called unknown tool {call.name!r} (offered: {expected['name']})",
                               details=details)
        try:
            arguments = call.parsed_arguments()
        except ValueError as exc:
            return CheckResult(name, "FAIL", f"arguments of {call.name} are not JSON ({exc}): "
                                             f"{_snippet(call.arguments)}", details=details)
        try:
            jsonschema.validate(arguments, expected["parameters"])
        except jsonschema.ValidationError as exc:
            return CheckResult(name, "FAIL", f"arguments of {call.name} break its parameter schema: {exc.message}",
                               details=details)
    first = calls[0]
    return CheckResult(name, "PASS",
                       f"{first.name}({json.dumps(first.parsed_arguments())}) "
                       f"valid against its schema (finish_reason={finish_reason})", details=details)


def chat_details(r: ChatResult) -> dict[str, Any]:
    return {"status": r.status, "seconds": round(r.seconds, 4), "finish_reason": r.finish_reason,
            "usage": r.usage, "engine_timings": r.timings, "error": r.error}


def stream_details(r: StreamResult) -> dict[str, Any]:
    spread = (r.token_times[-1] - r.token_times[0]) if len(r.token_times) > 1 else None
    return {
        "status": r.status, "seconds": round(r.seconds, 4),
        "ttft_s": None if r.ttft is None else round(r.ttft, 4),   # client clock
        "chunks": r.chunks, "text_chunks": len(r.token_times),
        "text_spread_s": None if spread is None else round(spread, 4),  # first to last text chunk
        "chars": len(r.content) + len(r.reasoning), "finish_reason": r.finish_reason,
        "usage": r.usage, "engine_timings": r.timings, "done": r.done, "error": r.error,
    }


# -- the suite ------------------------------------------------------------------------

CheckFn = Callable[[OpenAIClient, ServerInfo, float], CheckResult]

SMOKE_CHECKS: tuple[tuple[str, CheckFn], ...] = (
    ("reachable", check_reachable),
    ("basic_answer", check_basic_answer),
    ("streaming", check_streaming),
    ("tool_call", check_tool_call),
    ("tool_call_streamed", check_tool_call_streamed),
    ("json_schema", check_json_schema),
)


def run_smoke(client: OpenAIClient, info: ServerInfo,
              on_result: Callable[[CheckResult], None] | None = None,
              timeout_scale: float = 1.0) -> list[CheckResult]:
    """Run every smoke check in order; ``on_result`` sees each result as it finishes.

    A check that raises (the server answered something unusable, or a bug) becomes a
    FAIL with the exception's one-line message, so the suite always completes.
    """
    results = []
    for name, check in SMOKE_CHECKS:
        t0 = time.perf_counter()
        try:
            result = check(client, info, TIMEOUTS[name] * timeout_scale)
        except EngineroomError as exc:      # a one-sentence, user-facing failure
            result = CheckResult(name, "FAIL", str(exc))
        except Exception as exc:  # noqa: BLE001 - one check must not stop the suite
            message = str(exc).splitlines()[0] if str(exc) else ""
            result = CheckResult(name, "FAIL", f"check crashed: {type(exc).__name__}: {message}")
        result.seconds = time.perf_counter() - t0
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
