"""The full suite's prompts, tools, markup patterns, timeouts and shared helpers (``checks.full``)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from engineroom.checks import smoke
from engineroom.checks.context import Ctx, pretty
from engineroom.checks.smoke import CheckResult
from engineroom.client import ToolCall

TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# The prompts (constants, so a stand-in can recognise them).
WEATHER_PROMPT = "What is the weather in Paris?"
PARALLEL_PROMPT = "What is the weather in Paris and what is the weather in Tokyo? Call the tool once for each city."
NAMED_PROMPT = "What time is it in Paris?"
NONE_PROMPT = "In one sentence, what is a weather forecast?"
ROUND_TRIP_PROMPT = "What is the weather in Paris?"
ROUND_TRIP_RESULT = {"city": "Paris", "temperature_c": 17, "sky": "light rain", "station": "PX-4417"}
REASONING_PROMPT = "What is 2+2? Think it through, then give the number."
STOP_PROMPT = "Repeat these words exactly, nothing else: alpha beta gamma delta epsilon zeta"
LENGTH_PROMPT = "Write a long story about a lighthouse keeper."
LOGPROBS_PROMPT = "Name a colour."
SEED_PROMPT = "Write one sentence about a cat."
IMAGE_PROMPT = "What colour is this image? Answer with one word."
RESPONSES_PROMPT = "What is the capital of France? Answer in one sentence."
QUALITY_PROMPT = "Write an essay about the history of the bicycle, with several paragraphs."
SPEC_PROMPT = "Count from 1 to 80, separated by commas."
LONG_PROMPT_QUESTION = "\n\nIn one word: what colour is the sky in the text above?"
FILLER = ("The sky over the old harbour was blue that morning, and the fishermen mended their nets while gulls "
          "circled the masts. Carts rolled over the cobbles toward the market, where bread, cheese and apples "
          "were sold from wooden stalls under striped awnings. ")

COMPLEX_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
        "projects": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string"},
                               "status": {"type": "string", "enum": ["active", "done"]}},
                "required": ["title", "status"],
                "additionalProperties": False,
            },
            "maxItems": 3,
        },
    },
    "required": ["name", "role", "age", "address", "tags", "projects"],
    "additionalProperties": False,
}
COMPLEX_PROMPT = ("Make up a user profile for an editor named Ana who lives in Lisbon, as JSON with name, role, age, "
                  "address (city, zip), tags and projects (title, status).")

# Markup that only appears in content (or reasoning) when the server failed to parse a tool call.
TOOL_MARKUP = re.compile(
    r"<tool_call>|</tool_call>|<\|tool_call|<tool_calls>|<function=|<\|python_tag\|>"
    r"|\[TOOL_CALLS\]|<｜tool▁call|<\|START_ACTION\|>|<\|channel\|>commentary"
    r"|\"name\"\s*:\s*\"get_(weather|time)\"",
)
REASONING_MARKUP = re.compile(r"<think>|</think>|<\|channel\|>analysis|\[THINK\]|\[/THINK\]|<\|begin_of_thought\|>"
                              r"|<seed:think>|</seed:think>")

# Seconds each check may take (all its requests), before ``timeout_scale``.
TIMEOUTS: dict[str, float] = {
    "stream_protocol": 45, "tool_call_auto": 60, "tool_call_in_reasoning": 120, "parallel_tool_calls": 60,
    "tool_choice_named": 60, "tool_choice_none": 60, "tool_round_trip": 60, "reasoning_split": 120,
    "thinking_off": 30, "json_schema_complex": 90, "usage": 45, "stop_sequence": 45, "max_tokens_length": 30,
    "logprobs": 30, "seed_reproducible": 60, "image_input": 60, "responses_api": 30, "long_prompt": 120,
    "output_quality": 180, "spec_decode": 60,
}


def verdict(name: str, status: smoke.Status, reason: str, details: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult(name, status, reason, details=details or {})


def request_body(ctx: Ctx, prompt: str | list[dict[str, Any]], max_tokens: int, *, thinking: str = "off",
                 temperature: float = 0.0, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body: dict[str, Any] = {**ctx.model, "messages": messages, "max_tokens": max_tokens,
                            "temperature": temperature, "top_p": 1.0, "seed": 42}
    body.update(ctx.dialect.thinking_off if thinking == "off" else ctx.dialect.thinking_on if thinking == "on" else {})
    body.update(extra)
    return body


def calls_detail(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]


def tool_skip(ctx: Ctx, *features: str) -> CheckResult | None:
    return None if not (why := smoke.declared_absent(ctx.info, *features)) else verdict("", "SKIP", why)


def invalid_call_reason(call: ToolCall, tools: list[dict[str, Any]]) -> str | None:
    """Why ``call`` is not a valid call of one of ``tools`` (None when it is)."""
    offered = {t["function"]["name"]: t["function"] for t in tools}
    if call.name not in offered:
        return f"called unknown tool {call.name!r} (offered: {', '.join(offered)})"
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        return f"arguments of {call.name} are not JSON ({exc}): {pretty(call.arguments)}"
    try:
        jsonschema.validate(arguments, offered[call.name]["parameters"])
    except jsonschema.ValidationError as exc:
        return f"arguments of {call.name} break its parameter schema: {exc.message}"
    return None



def repeated_run(lines: list[str], n: int = 5) -> str | None:
    run, prev = 0, None
    for line in lines:
        run = run + 1 if line == prev and line else 1
        prev = line
        if run >= n:
            return line
    return None

