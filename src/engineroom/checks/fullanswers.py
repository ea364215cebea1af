"""The full suite's reasoning, structured-output, sampling, limits, input and quality checks (``checks.full``)."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from typing import Any

import jsonschema

from engineroom.checks import smoke
from engineroom.checks.context import Ctx, pretty
from engineroom.checks.fullbase import (
    COMPLEX_PROMPT,
    COMPLEX_SCHEMA,
    FILLER,
    IMAGE_PROMPT,
    LENGTH_PROMPT,
    LOGPROBS_PROMPT,
    LONG_PROMPT_QUESTION,
    QUALITY_PROMPT,
    REASONING_MARKUP,
    REASONING_PROMPT,
    RESPONSES_PROMPT,
    SEED_PROMPT,
    SPEC_PROMPT,
    STOP_PROMPT,
    TIMEOUTS,
    TOOL_MARKUP,
    repeated_run,
    request_body,
    verdict,
)
from engineroom.checks.smoke import CheckResult, chat_details, stream_details
from engineroom.measures import Acceptance

# -- reasoning --------------------------------------------------------------------------


def check_reasoning_split(ctx: Ctx) -> CheckResult:
    """Thinking ON: reasoning arrives in its own field, none in content; content answers (or finish=length)."""
    # a template that shows no thinking block: 64 tokens are enough to see a <think> the model opens itself
    budget = 64 if ctx.dialect.reasons is False else 160 if ctx.fast else 4000
    body = request_body(ctx, REASONING_PROMPT, budget, thinking="on")
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["reasoning_split"]))
    d = chat_details(r)
    d["reasoning_chars"] = len(r.reasoning)
    if not r.ok:
        return verdict("reasoning_split", "FAIL", f"request failed: {r.error}", d)
    leak = REASONING_MARKUP.search(r.content)
    if leak:
        return verdict("reasoning_split", "FAIL", f"reasoning leaked into content ({leak.group(0)!r} at char "
                                                  f"{leak.start()}): the server did not split it out", d)
    if not r.reasoning:
        if ctx.dialect.reasons:
            return verdict("reasoning_split", "FAIL",
                           f"no reasoning came back although {ctx.dialect.sources.get('reasons', 'the model reasons')} "
                           f"(finish_reason={r.finish_reason})", d)
        return verdict("reasoning_split", "SKIP",
                       f"the model does not reason: no reasoning field came back and "
                       f"{ctx.dialect.sources.get('reasons', 'nothing declares reasoning')}", d)
    if len(r.reasoning) < 50:
        return verdict("reasoning_split", "FAIL", f"only {len(r.reasoning)} chars of reasoning (need >= 50)", d)
    if not r.content.strip():
        if r.finish_reason == "length":
            return verdict("reasoning_split", "PASS", f"{len(r.reasoning)} chars of reasoning used all {budget} tokens "
                                                      "(finish_reason=length, content empty as it should be)",
                           {**d, **_forced_reasoning(ctx)})
        return verdict("reasoning_split", "FAIL", f"{len(r.reasoning)} chars of reasoning but empty content "
                                                  f"(finish_reason={r.finish_reason})", d)
    d.update(_forced_reasoning(ctx))
    return verdict("reasoning_split", "PASS", f"{len(r.reasoning)} chars of reasoning, separate content "
                                              f"{pretty(r.content, 40)}", d)


def _forced_reasoning(ctx: Ctx) -> dict[str, str]:
    """A reasoning PASS's note that a template engineroom ships opened the block (``Dialect.forced_reasoning``)."""
    return {"forced": ctx.dialect.forced_reasoning} if ctx.dialect.forced_reasoning else {}


def check_thinking_off(ctx: Ctx) -> CheckResult:
    """The thinking switch found for this server really switches: no reasoning, the answer in content."""
    if not ctx.dialect.thinking_off:
        if ctx.dialect.reasons:
            return verdict("thinking_off", "FAIL",
                           "the model reasons but no thinking switch was found "
                           f"({ctx.dialect.sources.get('thinking_off', 'none in the template')})")
        return verdict("thinking_off", "SKIP",
                       "no thinking switch to test: "
                       f"{ctx.dialect.sources.get('reasons', 'the model is not known to reason')}")
    body = request_body(ctx, "What is the capital of France? Answer in one sentence.", 30)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["thinking_off"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("thinking_off", "FAIL", f"request failed: {r.error}", d)
    switch = json.dumps(ctx.dialect.thinking_off)
    if r.reasoning:
        return verdict("thinking_off", "FAIL", f"{switch} was ignored: {len(r.reasoning)} chars of reasoning came back "
                                               f"(finish_reason={r.finish_reason}, content {len(r.content)} chars)", d)
    if REASONING_MARKUP.search(r.content):
        return verdict("thinking_off", "FAIL", f"{switch} was ignored: reasoning markup in content", d)
    if not r.content.strip():
        return verdict("thinking_off", "FAIL", f"empty answer with {switch} (finish_reason={r.finish_reason})", d)
    return verdict("thinking_off", "PASS", f"{switch} switched reasoning off: {pretty(r.content, 50)}", d)


# -- structured output, sampling, limits -----------------------------------------------------


def check_json_schema_complex(ctx: Ctx) -> CheckResult:
    """response_format with a nested schema (enums, arrays of objects, bounds): the answer validates."""
    if why := smoke.declared_absent(ctx.info, "json_schema"):
        return verdict("json_schema_complex", "SKIP", why)
    body = request_body(ctx, COMPLEX_PROMPT, 300, response_format={
        "type": "json_schema", "json_schema": {"name": "profile", "strict": True, "schema": COMPLEX_SCHEMA}})
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["json_schema_complex"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("json_schema_complex", "FAIL", f"request failed: {r.error}", d)
    try:
        value = json.loads(r.content)
    except ValueError:
        return verdict("json_schema_complex", "FAIL", f"200 answer is not JSON (finish_reason={r.finish_reason}): "
                                                      f"{pretty(r.content)}", d)
    try:
        jsonschema.validate(value, COMPLEX_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        return verdict("json_schema_complex", "FAIL", f"JSON breaks the nested schema at {where}: {exc.message}", d)
    d["value"] = value
    return verdict("json_schema_complex", "PASS", f"valid against the nested schema: {pretty(value, 60)}", d)


def _usage_problem(usage: Any, max_tokens: int) -> str | None:
    if not isinstance(usage, dict):
        return "no usage object"
    try:
        prompt, completion = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        total = int(usage["total_tokens"])
    except (KeyError, TypeError, ValueError):
        return f"usage lacks prompt/completion/total token counts: {pretty(usage)}"
    if prompt <= 0 or completion <= 0:
        return f"usage counts {prompt} prompt / {completion} completion tokens for a non-empty exchange"
    if total != prompt + completion:
        return f"usage total_tokens {total} != prompt {prompt} + completion {completion}"
    if completion > max_tokens:
        return f"usage completion_tokens {completion} > max_tokens {max_tokens}"
    return None


def check_usage(ctx: Ctx) -> CheckResult:
    """usage present and consistent, non-streamed and streamed (include_usage), and the two agree."""
    body = request_body(ctx, "Write two sentences about rivers.", 40)
    limit = ctx.timeout(TIMEOUTS["usage"]) / 2
    r = ctx.client.chat(body, timeout=limit)
    d: dict[str, Any] = {"plain": chat_details(r)}
    if not r.ok:
        return verdict("usage", "FAIL", f"request failed: {r.error}", d)
    if why := _usage_problem(r.usage, 40):
        return verdict("usage", "FAIL", f"non-streamed: {why}", d)
    if r.finish_reason == "length" and r.usage and r.usage["completion_tokens"] != 40:
        return verdict("usage", "FAIL", f"finish_reason=length at max_tokens 40 but usage says "
                                        f"{r.usage['completion_tokens']} completion tokens", d)
    s = ctx.client.stream_chat(body, timeout=limit)
    d["stream"] = stream_details(s)
    if not s.ok:
        return verdict("usage", "FAIL", f"stream failed: {s.error}", d)
    if why := _usage_problem(s.usage, 40):
        return verdict("usage", "FAIL", f"streamed (include_usage): {why}", d)
    assert r.usage is not None and s.usage is not None
    if r.usage["prompt_tokens"] != s.usage["prompt_tokens"]:
        return verdict("usage", "FAIL", f"the same prompt counts {r.usage['prompt_tokens']} tokens plain and "
                                        f"{s.usage['prompt_tokens']} streamed", d)
    if len(s.token_times) > s.usage["completion_tokens"] + 1:
        return verdict("usage", "FAIL", f"{len(s.token_times)} text chunks arrived but usage counts only "
                                        f"{s.usage['completion_tokens']} completion tokens", d)
    return verdict("usage", "PASS", f"prompt {r.usage['prompt_tokens']}, completion {r.usage['completion_tokens']} / "
                                    f"{s.usage['completion_tokens']} (plain / streamed), totals add up", d)


def _stop_word(text: str) -> str | None:
    """A word of ``text`` (4+ letters, from the 4th word on) whose first occurrence is where it stands."""
    words = text.split()
    for i, word in enumerate(words[3:], start=3):
        if len(word) >= 4 and word.isalpha() and word not in words[:i] and text.count(word) == 1:
            return word
    return None


def check_stop_sequence(ctx: Ctx) -> CheckResult:
    """stop=[a word the control answer writes]: the same request ends right before it, finish_reason stop.

    The stop word is taken from a control run of the same greedy request without ``stop``, so the
    check is exercised whatever the model writes.
    """
    limit = ctx.timeout(TIMEOUTS["stop_sequence"]) / 2
    control = ctx.client.chat(request_body(ctx, STOP_PROMPT, 40), timeout=limit)
    d: dict[str, Any] = {"control": chat_details(control)}
    if not control.ok:
        return verdict("stop_sequence", "FAIL", f"control request failed: {control.error}", d)
    word = _stop_word(control.content)
    if word is None:
        return verdict("stop_sequence", "SKIP", f"not exercised: the control answer has no word to stop at "
                                                f"({pretty(control.content, 50)})", d)
    d["stop"] = word
    r = ctx.client.chat(request_body(ctx, STOP_PROMPT, 40, stop=[word]), timeout=limit)
    d["stopped"] = chat_details(r)
    if not r.ok:
        return verdict("stop_sequence", "FAIL", f"request with stop failed: {r.error}", d)
    if word in r.content:
        return verdict("stop_sequence", "FAIL", f"the stop sequence {word!r} is in the answer at char "
                                                f"{r.content.index(word)}: stop was ignored", d)
    if r.finish_reason != "stop":
        return verdict("stop_sequence", "FAIL",
                       f"finish_reason is {r.finish_reason!r} after the stop sequence, not 'stop'", d)
    expected = control.content[: control.content.index(word)]
    if r.content.strip() != expected.strip():
        return verdict("stop_sequence", "FAIL", f"the answer does not end where {word!r} began in the control: "
                                                f"{pretty(r.content, 40)} vs {pretty(expected, 40)}", d)
    return verdict("stop_sequence", "PASS", f"stopped right before {word!r}: {pretty(r.content, 40)}", d)


def check_max_tokens_length(ctx: Ctx) -> CheckResult:
    """max_tokens 8 on a long story: finish_reason "length" and no more than 8 tokens."""
    body = request_body(ctx, LENGTH_PROMPT, 8)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["max_tokens_length"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("max_tokens_length", "FAIL", f"request failed: {r.error}", d)
    used = (r.usage or {}).get("completion_tokens")
    if isinstance(used, int) and used > 8:
        return verdict("max_tokens_length", "FAIL", f"max_tokens 8 was exceeded: {used} completion tokens", d)
    if r.finish_reason != "length":
        return verdict("max_tokens_length", "FAIL", f"finish_reason is {r.finish_reason!r} at max_tokens 8 on a long "
                                                    f"story, not 'length' ({used} tokens)", d)
    return verdict("max_tokens_length", "PASS", f"finish_reason=length after {used} tokens", d)


def check_logprobs(ctx: Ctx) -> CheckResult:
    """logprobs + top_logprobs 3: one entry per token, logprob <= 0, three alternatives each."""
    body = request_body(ctx, LOGPROBS_PROMPT, 8, logprobs=True, top_logprobs=3)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["logprobs"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("logprobs", "FAIL", f"request failed: {r.error}", d)
    choice = (r.raw or {}).get("choices", [{}])[0]
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    entries = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(entries, list) or not entries:
        return verdict("logprobs", "FAIL",
                       "logprobs were requested but the answer has no choices[0].logprobs.content", d)
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("logprob"), (int, float)) or e["logprob"] > 1e-6:
            return verdict("logprobs", "FAIL", f"token {i} has no valid logprob (<= 0): {pretty(e)}", d)
        tops = e.get("top_logprobs")
        if not isinstance(tops, list) or len(tops) < 3:
            return verdict("logprobs", "FAIL",
                           f"token {i} has {len(tops) if isinstance(tops, list) else 0} top_logprobs, "
                           "3 were requested", d)
    d["logprobs"] = entries[:3]
    return verdict("logprobs", "PASS", f"{len(entries)} tokens with logprobs and 3 alternatives each", d)


def check_seed_reproducible(ctx: Ctx) -> CheckResult:
    """The same seed at temperature 1.0 twice: the same text both times."""
    body = request_body(ctx, SEED_PROMPT, 30, temperature=1.0, seed=1234)
    limit = ctx.timeout(TIMEOUTS["seed_reproducible"]) / 2
    a = ctx.client.chat(body, timeout=limit)
    b = ctx.client.chat(body, timeout=limit)
    d = {"first": chat_details(a), "second": chat_details(b), "texts": [a.content, b.content]}
    if not (a.ok and b.ok):
        return verdict("seed_reproducible", "FAIL", f"request failed: {a.error or b.error}", d)
    if a.content != b.content:
        at = next((i for i, (x, y) in enumerate(zip(a.content, b.content, strict=False)) if x != y),
                  min(len(a.content), len(b.content)))
        return verdict("seed_reproducible", "FAIL", f"seed 1234 at temperature 1.0 gave two different texts "
                                                    f"(they part at char {at})", d)
    return verdict("seed_reproducible", "PASS", f"seed 1234 gave the same {len(a.content)} chars twice", d)


def _png(rgb: tuple[int, int, int], size: int = 32) -> bytes:
    """A plain PNG of one colour (no imaging library needed)."""
    row = b"\x00" + bytes(rgb) * size
    raw = zlib.compress(row * size)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def check_image_input(ctx: Ctx) -> CheckResult:
    """An image_url part (a red PNG): the model names the colour. Only when the server declares vision."""
    caps = ctx.info.capabilities
    if caps.vision is not True:
        said = caps.reasons.get("vision") or ("declared absent" if caps.vision is False else "not declared")
        return verdict("image_input", "SKIP", f"the server does not report vision ({said})")
    url = "data:image/png;base64," + base64.b64encode(_png((220, 20, 20))).decode()
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": IMAGE_PROMPT},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    r = ctx.client.chat(request_body(ctx, messages, 20), timeout=ctx.timeout(TIMEOUTS["image_input"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("image_input", "FAIL", f"request with an image failed: {r.error}", d)
    if "red" in r.content.lower():
        return verdict("image_input", "PASS", f"names the colour: {pretty(r.content, 40)}", d)
    return verdict("image_input", "FAIL", f"a red image, but the answer does not say red: {pretty(r.content, 40)}", d)


def check_responses_api(ctx: Ctx) -> CheckResult:
    """POST /v1/responses (where served): an output message with text containing Paris."""
    body = {**ctx.model, "input": RESPONSES_PROMPT, "max_output_tokens": 40, "temperature": 0.0,
            **ctx.dialect.thinking_off}
    status, data, error = ctx.client.post_json("/v1/responses", body, timeout=ctx.timeout(TIMEOUTS["responses_api"]))
    d: dict[str, Any] = {"status": status, "error": error or None}
    if status in (404, 405, 501):
        return verdict("responses_api", "SKIP", f"the server does not serve /v1/responses (HTTP {status})", d)
    if status is None:
        return verdict("responses_api", "FAIL", f"request failed: {error}", d)
    if status != 200:
        return verdict("responses_api", "FAIL", f"/v1/responses answered HTTP {status}", d)
    if not isinstance(data, dict):
        return verdict("responses_api", "FAIL", "/v1/responses answered 200 with a body that is not a JSON object", d)
    texts = [part.get("text", "") for item in data.get("output") or [] if isinstance(item, dict)
             and item.get("type") == "message" for part in item.get("content") or [] if isinstance(part, dict)]
    text = "".join(t for t in texts if isinstance(t, str)) or str(data.get("output_text") or "")
    d["text"] = text
    if not text:
        return verdict("responses_api", "FAIL", "/v1/responses answered 200 without an output message text", d)
    if "paris" not in text.lower():
        return verdict("responses_api", "FAIL", f"the output text lacks Paris: {pretty(text, 50)}", d)
    return verdict("responses_api", "PASS", f"output message: {pretty(text, 50)}", d)


def check_long_prompt(ctx: Ctx) -> CheckResult:
    """A prompt of about half the context (from the server; --fast: at most 1,024 tokens): 200, counted in full."""
    n_ctx = ctx.info.n_ctx
    if not n_ctx:
        return verdict("long_prompt", "SKIP", "the server reports no context size to scale the prompt from")
    target = min(int(n_ctx * 0.5), 1024) if ctx.fast else int(n_ctx * 0.5)
    if target < 256:
        return verdict("long_prompt", "SKIP", f"the context ({n_ctx} tokens) is below the 512-token minimum")
    filler = FILLER * max(1, (target * 4) // len(FILLER))        # ~4 chars a token: calibrated below
    body = request_body(ctx, filler + LONG_PROMPT_QUESTION, 10)
    r = ctx.client.chat(body, timeout=ctx.timeout(TIMEOUTS["long_prompt"]))
    d = chat_details(r)
    d["prompt_chars"] = len(filler)
    if not r.ok:
        return verdict("long_prompt", "FAIL", f"a {len(filler):,}-char prompt (~{target:,} tokens of a {n_ctx:,}-token "
                                              f"context) failed: {r.error}", d)
    prompt_tokens = (r.usage or {}).get("prompt_tokens")
    if isinstance(prompt_tokens, int) and prompt_tokens < len(filler) / 12:
        return verdict("long_prompt", "FAIL", f"only {prompt_tokens} prompt tokens counted for {len(filler):,} chars: "
                                              "the prompt was truncated", d)
    if not (r.content.strip() or r.reasoning.strip()):
        return verdict("long_prompt", "FAIL", f"200 but an empty answer to a {prompt_tokens}-token prompt", d)
    return verdict("long_prompt", "PASS", f"{prompt_tokens} prompt tokens ({len(filler):,} chars) of a {n_ctx:,}-token "
                                          "context answered", d)


def check_output_quality(ctx: Ctx) -> CheckResult:
    """A long essay: non-empty, no tool markup, no line 5x in a row, distinct words >= 30% of the first 200."""
    budget = 200 if ctx.fast else 2000
    r = ctx.client.chat(request_body(ctx, QUALITY_PROMPT, budget, temperature=0.6),
                        timeout=ctx.timeout(TIMEOUTS["output_quality"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("output_quality", "FAIL", f"request failed: {r.error}", d)
    text = r.content
    if not text.strip():
        return verdict("output_quality", "FAIL", f"empty essay (finish_reason={r.finish_reason})", d)
    if leak := TOOL_MARKUP.search(text):
        return verdict("output_quality", "FAIL", f"tool-call markup in a plain essay ({leak.group(0)!r})", d)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if line := repeated_run(lines):
        return verdict("output_quality", "FAIL", f"the same line 5 times in a row: {pretty(line, 50)}", d)
    words = re.findall(r"\w+", text.lower())[:200]
    ratio = len(set(words)) / len(words) if words else 0.0
    d["distinct_ratio"] = round(ratio, 3)
    if len(words) >= 50 and ratio < 0.30:
        return verdict("output_quality", "FAIL",
                       f"degenerate text: {len(set(words))} distinct of the first {len(words)} "
                       f"words ({ratio:.0%} < 30%)", d)
    return verdict("output_quality", "PASS", f"{len(words)}+ words, {ratio:.0%} distinct, no repeated lines", d)


def check_spec_decode(ctx: Ctx, min_length: float = 2.0) -> CheckResult:
    """Speculative decoding, where the engine reports drafted tokens: tokens per step >= ``min_length``."""
    r = ctx.client.chat(request_body(ctx, SPEC_PROMPT, 60 if ctx.fast else 200),
                        timeout=ctx.timeout(TIMEOUTS["spec_decode"]))
    d = chat_details(r)
    if not r.ok:
        return verdict("spec_decode", "FAIL", f"request failed: {r.error}", d)
    norm = ctx.info.normalise_timings
    timings = norm(r.timings) if (norm is not None and r.timings) else None
    if timings is None or not timings.draft_tokens:
        return verdict("spec_decode", "SKIP",
                       "the engine reports no drafted tokens: no speculative decoding is running"
                       if timings is not None
                       else "the engine reports no per-response timings to read drafting from", d)
    acc = Acceptance(drafted=timings.draft_tokens, accepted=timings.draft_accepted or 0,
                     generated=timings.decode_tokens or (r.usage or {}).get("completion_tokens") or 0)
    length, accepted = acc.tokens_per_step or 0.0, acc.accepted
    d.update(draft_tokens=acc.drafted, draft_accepted=accepted, acceptance_length=round(length, 3),
             acceptance_rate=round(acc.rate or 0.0, 3))
    if length < min_length:
        return verdict("spec_decode", "FAIL", f"mean acceptance length {length:.2f} tokens per step < {min_length:g} "
                                              f"({accepted}/{timings.draft_tokens} drafted tokens accepted)", d)
    return verdict("spec_decode", "PASS", f"mean acceptance length {length:.2f} tokens per step "
                                          f"({accepted}/{timings.draft_tokens} drafted tokens accepted)", d)


