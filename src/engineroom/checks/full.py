"""``verify --suite full``: the smoke six plus the failures users hit, one check each.

Every check here follows smoke.py's rules (PASS only on evidence, FAIL with a one-line reason
naming what was wrong, SKIP only on a declared absence or when the check could not be exercised,
with the reason), and takes a ``Ctx`` (recording client, ServerInfo, Dialect). The prompts are
module constants so a test's stand-in server can answer them.

What each check catches (an engine tracker's report where one exists):

- ``stream_protocol``: every chunk JSON, finish_reason sent, ``[DONE]`` at the end, usage chunk.
- ``tool_call_auto`` / ``tool_call_in_reasoning``: tool calls left in content (vllm#46863), calls
  written inside the reasoning block and never parsed (llama.cpp#17932).
- ``parallel_tool_calls``: several calls in one turn crash or collapse to one (vllm#39584, #9451).
- ``tool_choice_named`` / ``tool_choice_none``: the named tool is called; "none" calls none.
- ``tool_round_trip``: the tool result fed back is what the answer uses.
- ``reasoning_split`` / ``thinking_off``: reasoning kept out of content; the switch really switches
  (thinking eating all of max_tokens, vllm#42548).
- ``usage``, ``stop_sequence``, ``max_tokens_length``, ``logprobs``, ``seed_reproducible``,
  ``json_schema_complex``, ``image_input``, ``responses_api``, ``long_prompt``, ``output_quality``,
  ``spec_decode``.

Where they live: ``fullbase`` (the prompts, tools, markup patterns, timeouts, shared helpers),
``fulltools`` (stream protocol, tool calls), ``fullanswers`` (reasoning, structured output,
sampling, limits, inputs, quality, spec decode); this module assembles ``FULL_CHECKS`` and
re-exports them all.
"""

from __future__ import annotations

from collections.abc import Callable

from engineroom.checks import smoke
from engineroom.checks.context import Ctx
from engineroom.checks.fullanswers import (
    check_image_input,
    check_json_schema_complex,
    check_logprobs,
    check_long_prompt,
    check_max_tokens_length,
    check_output_quality,
    check_reasoning_split,
    check_responses_api,
    check_seed_reproducible,
    check_spec_decode,
    check_stop_sequence,
    check_thinking_off,
    check_usage,
)
from engineroom.checks.fullbase import (
    COMPLEX_PROMPT,
    COMPLEX_SCHEMA,
    FILLER,
    IMAGE_PROMPT,
    LENGTH_PROMPT,
    LOGPROBS_PROMPT,
    LONG_PROMPT_QUESTION,
    NAMED_PROMPT,
    NONE_PROMPT,
    PARALLEL_PROMPT,
    QUALITY_PROMPT,
    REASONING_MARKUP,
    REASONING_PROMPT,
    RESPONSES_PROMPT,
    ROUND_TRIP_PROMPT,
    ROUND_TRIP_RESULT,
    SEED_PROMPT,
    SPEC_PROMPT,
    STOP_PROMPT,
    TIME_TOOL,
    TIMEOUTS,
    TOOL_MARKUP,
    WEATHER_PROMPT,
)
from engineroom.checks.fulltools import (
    check_parallel_tool_calls,
    check_stream_protocol,
    check_tool_call_auto,
    check_tool_call_in_reasoning,
    check_tool_choice_named,
    check_tool_choice_none,
    check_tool_round_trip,
)
from engineroom.checks.smoke import WEATHER_TOOL, CheckResult

__all__ = [
    "COMPLEX_PROMPT", "COMPLEX_SCHEMA", "FILLER", "FULL_CHECKS", "FullCheck", "IMAGE_PROMPT", "LENGTH_PROMPT",
    "LOGPROBS_PROMPT", "LONG_PROMPT_QUESTION", "NAMED_PROMPT", "NONE_PROMPT", "PARALLEL_PROMPT", "QUALITY_PROMPT",
    "REASONING_MARKUP", "REASONING_PROMPT", "RESPONSES_PROMPT", "ROUND_TRIP_PROMPT", "ROUND_TRIP_RESULT",
    "SEED_PROMPT", "SPEC_PROMPT", "STOP_PROMPT", "TIMEOUTS", "TIME_TOOL", "TOOL_CHECKS", "TOOL_MARKUP",
    "WEATHER_PROMPT", "WEATHER_TOOL", "check_image_input", "check_json_schema_complex", "check_logprobs",
    "check_long_prompt", "check_max_tokens_length", "check_output_quality", "check_parallel_tool_calls",
    "check_reasoning_split", "check_responses_api", "check_seed_reproducible", "check_spec_decode",
    "check_stop_sequence", "check_stream_protocol", "check_thinking_off", "check_tool_call_auto",
    "check_tool_call_in_reasoning", "check_tool_choice_named", "check_tool_choice_none", "check_tool_round_trip",
    "check_usage",
]

# -- the suite --------------------------------------------------------------------------

FullCheck = Callable[[Ctx], CheckResult]


def _smoke(name: str, fn: smoke.CheckFn) -> FullCheck:
    def run(ctx: Ctx) -> CheckResult:
        return fn(ctx.client, ctx.answer_info(), ctx.timeout(smoke.TIMEOUTS[name]))

    run.__doc__ = fn.__doc__
    return run


FULL_CHECKS: tuple[tuple[str, FullCheck], ...] = (
    *((name, _smoke(name, fn)) for name, fn in smoke.SMOKE_CHECKS),
    ("stream_protocol", check_stream_protocol),
    ("tool_call_auto", check_tool_call_auto),
    ("tool_call_in_reasoning", check_tool_call_in_reasoning),
    ("parallel_tool_calls", check_parallel_tool_calls),
    ("tool_choice_named", check_tool_choice_named),
    ("tool_choice_none", check_tool_choice_none),
    ("tool_round_trip", check_tool_round_trip),
    ("reasoning_split", check_reasoning_split),
    ("thinking_off", check_thinking_off),
    ("json_schema_complex", check_json_schema_complex),
    ("usage", check_usage),
    ("stop_sequence", check_stop_sequence),
    ("max_tokens_length", check_max_tokens_length),
    ("logprobs", check_logprobs),
    ("seed_reproducible", check_seed_reproducible),
    ("image_input", check_image_input),
    ("responses_api", check_responses_api),
    ("long_prompt", check_long_prompt),
    ("output_quality", check_output_quality),
    ("spec_decode", check_spec_decode),
)

# Checks whose PASS a chat template that forces the tool-call format can produce by itself.
TOOL_CHECKS = frozenset({"tool_call", "tool_call_streamed", "tool_call_auto", "tool_call_in_reasoning",
                         "parallel_tool_calls", "tool_choice_named", "tool_choice_none", "tool_round_trip"})
