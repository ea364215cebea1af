"""``verify --suite stress``: long contexts, big tool returns, long decodes, and the real context ceiling.

Sizes scale from the context the server reports (``ServerInfo.n_ctx``, per sequence), never beyond
it; a probe is SKIPped only below its stated minimum context. Characters per token are calibrated
with the engine's own tokenizer (``Ctx.count_tokens``, handed in by the caller), else from the
``usage.prompt_tokens`` of a calibration request, and the card says which.

Every rung's outcome is one of ``pass`` / ``quality ceiling`` (200, but the needle was not
recalled) / ``memory wall`` (HTTP 500 or an out-of-memory error) / ``crash`` (no answer: the engine
died) / ``harness error`` (HTTP 400 below the context: the prompt was sized wrong). The context
ladder keeps climbing after a recall miss, so the recall ceiling and the memory ceiling are
reported separately. Haystacks are salted (``SESSION-<32 random>`` first) and each rung's cached
prompt tokens are read as bench reads them (``engineroom.measures.cache_reuse``: the engine's
timings, usage ``prompt_tokens_details.cached_tokens``, or its counters): a rung that took more
than the template's preamble from the prefix cache is flagged, since its prefill figure would lie.
When the engine dies and the caller gave a ``restart`` callback (the managed server), it is
restarted and the remaining probes continue; otherwise they are FAILed as not run.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from engineroom.checks.context import Ctx
from engineroom.checks.full import FILLER, TOOL_MARKUP, WEATHER_TOOL
from engineroom.checks.smoke import CheckResult
from engineroom.checks.soakprompts import random_salt
from engineroom.client import StreamResult
from engineroom.engines.base import ServerInfo
from engineroom.measures import CacheReuse, cache_reuse

COLOURS = ("amber", "cobalt", "crimson", "jade", "ivory", "violet", "scarlet", "teal")
ANIMALS = ("falcon", "otter", "lynx", "heron", "badger", "marmot", "ibis", "gecko")
NEEDLE_QUESTION = "\n\nWhat is the hidden phrase in the text above? Reply with the phrase only."
BIG_TOOL_CHARS = 100_000
OUTCOMES = ("pass", "quality ceiling", "memory wall", "crash", "harness error")
MIN_CTX = {"needle_ladder": 1024, "context_ceiling": 1024, "big_tool_return": 2048, "ide_system_prompt": 4096,
           "long_decode": 1024}
LONG_DECODE_PROMPT_ROOM = 256    # the question and the chat template around it, with room to spare


def _salt() -> str:
    return "SESSION-" + random_salt()


def _phrase(rng: random.Random) -> str:
    return f"{rng.choice(COLOURS)} {rng.choice(ANIMALS)} {rng.randint(10, 99)}"


class Calibration:
    """Characters per token of the filler, measured with the engine's tokenizer or a request's usage."""

    def __init__(self, ctx: Ctx):
        self.source = ""
        self.chars_per_token = 4.0
        sample = FILLER * 20
        counted = ctx.count_tokens(sample) if ctx.count_tokens else None
        if counted:
            self.chars_per_token = len(sample) / counted
            self.source = "the engine's tokenizer"
            return
        body = {**ctx.model, "messages": [{"role": "user", "content": sample}], "max_tokens": 1, "temperature": 0.0,
                **ctx.dialect.thinking_off}
        r = ctx.client.chat(body, timeout=ctx.timeout(120))
        used = (r.usage or {}).get("prompt_tokens")
        if r.ok and isinstance(used, int) and used > 20:
            self.chars_per_token = len(sample) / used
            self.source = "usage.prompt_tokens of a calibration request (chat template included)"
        else:
            self.source = "an assumed 4 chars a token (no tokenizer, no usage)"

    def chars(self, tokens: int) -> int:
        return int(tokens * self.chars_per_token)


def _cache_reuse(ctx: Ctx, r: StreamResult, before: dict[str, float] | None) -> CacheReuse:
    """bench's reading of the prefix cache (``engineroom.measures.cache_reuse``); the engine's
    counters are asked only when the answer itself says nothing."""
    prompt = (r.usage or {}).get("prompt_tokens")
    prompt = prompt if isinstance(prompt, int) else None
    details = (r.usage or {}).get("prompt_tokens_details")
    usage_cached = details.get("cached_tokens") if isinstance(details, dict) else None
    norm = ctx.info.normalise_timings
    timings = norm(r.timings) if norm is not None and r.timings else None
    found = cache_reuse(prompt=prompt, engine_cached=timings.cached_tokens if timings is not None else None,
                        engine_prompt=timings.prompt_tokens if timings is not None else None,
                        usage_cached=usage_cached if isinstance(usage_cached, int) else None)
    if found.cached is None and before is not None and ctx.metrics is not None:
        after = ctx.metrics() or {}
        key = "prompt_cached_tokens_total"
        if key in after and key in before:
            found = cache_reuse(prompt=prompt, counter_cached=after[key] - before[key])
    return found


def classify(r: StreamResult) -> str:
    """The outcome of one request, before recall is judged."""
    if r.status is None:
        return "crash"
    if r.status == 400:
        return "harness error"
    if r.status >= 500 or (r.error and "memory" in r.error.lower()):
        return "memory wall"
    if r.error:
        return "crash" if "broke" in r.error or "stalled" in r.error else "harness error"
    return "pass"


def needle_request(ctx: Ctx, target_tokens: int, cal: Calibration, rng: random.Random,
                   timeout: float) -> dict[str, Any]:
    """One salted needle rung of ``target_tokens``: its record for the JSON curve."""
    phrase = _phrase(rng)
    room = max(200, cal.chars(target_tokens) - len(NEEDLE_QUESTION) - 60)
    half = (FILLER * (room // len(FILLER) + 2))[: room // 2]
    haystack = f"{_salt()}\n{half}\nThe hidden phrase is '{phrase}'.\n{half}"
    body = {**ctx.model, "messages": [{"role": "user", "content": haystack + NEEDLE_QUESTION}], "max_tokens": 30,
            "temperature": 0.0, "top_p": 1.0, "seed": 42, **ctx.dialect.thinking_off}
    before = ctx.metrics() if ctx.metrics else None
    r = ctx.client.stream_chat(body, timeout=timeout)
    outcome = classify(r)
    answer = (r.content + " " + r.reasoning).lower()
    recalled = outcome == "pass" and all(w in answer for w in phrase.split())
    if outcome == "pass" and not recalled:
        outcome = "quality ceiling"
    prompt_tokens = (r.usage or {}).get("prompt_tokens")
    reuse = _cache_reuse(ctx, r, before) if outcome != "crash" else None
    ttft = r.ttft
    return {"target_tokens": target_tokens, "prompt_tokens": prompt_tokens, "chars": len(haystack),
            "http": r.status, "outcome": outcome, "recalled": recalled, "needle": phrase,
            "answer": r.content[:80], "ttft_s": None if ttft is None else round(ttft, 3),
            "prefill_tps": round(prompt_tokens / ttft, 1) if isinstance(prompt_tokens, int) and ttft else None,
            "prefill_source": "client clock: prompt_tokens / TTFT",
            "cached_tokens": reuse.cached if reuse is not None else None,
            "cache_hit": bool(reuse is not None and reuse.contaminated),
            "error": r.error}


class _Stress:
    def __init__(self, ctx: Ctx, restart: Callable[[], ServerInfo] | None):
        self.ctx, self.restart = ctx, restart
        self.dead_since: str | None = None     # the probe during which the engine died, not restarted
        self.restarts: list[str] = []
        self.prefill_tps: float | None = None   # the slowest prefill seen (client clock), for later budgets

    def saw(self, rung: dict[str, Any]) -> None:
        rate = rung.get("prefill_tps")
        if isinstance(rate, (int, float)) and rate > 0 and (rung.get("prompt_tokens") or 0) >= 256:
            self.prefill_tps = rate if self.prefill_tps is None else min(self.prefill_tps, rate)

    def budget(self, base_s: float, prompt_tokens: int) -> float:
        """A probe's timeout: its base, or twice the prefill of ``prompt_tokens`` at the slowest rate the
        ladder measured plus a minute, whichever is longer (a slow CPU at 32K prefills for minutes; a
        probe cut off while the engine still prefills leaves it busy for the next one)."""
        seconds = self.ctx.timeout(base_s)
        if self.prefill_tps:
            seconds = max(seconds, self.ctx.timeout(60) + 2.0 * prompt_tokens / self.prefill_tps)
        return seconds

    def died(self, probe: str) -> None:
        if self.restart is None:
            self.dead_since = probe
            return
        try:
            info = self.restart()
        except Exception as exc:  # noqa: BLE001 - a failed restart ends the suite, with its reason
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.dead_since = f"{probe} (restart failed: {why})"
            return
        self.ctx.info = info
        self.restarts.append(probe)

    @property
    def n_ctx(self) -> int | None:
        return self.ctx.info.n_ctx


def _skip_small(name: str, n_ctx: int | None) -> CheckResult | None:
    if not n_ctx:
        return CheckResult(name, "SKIP", "the server reports no context size to scale from")
    if n_ctx < MIN_CTX[name]:
        return CheckResult(name, "SKIP", f"needs >= {MIN_CTX[name]:,} tokens of context; the server has {n_ctx:,}")
    return None


def probe_needle_ladder(s: _Stress, cal: Calibration) -> CheckResult:
    """Salted needles at ~10K / ~30K tokens (fast: 1/4 and 1/2 of the context), never beyond 0.9 of it."""
    n_ctx = s.n_ctx
    if skip := _skip_small("needle_ladder", n_ctx):
        return skip
    assert n_ctx is not None
    targets = [int(n_ctx * 0.25), int(n_ctx * 0.5)] if s.ctx.fast else [10_000, 30_000, 60_000, 90_000]
    targets = [t for t in targets if t <= 0.9 * n_ctx] or [int(n_ctx * 0.5)]
    rng, rungs = random.Random(), []
    for target in targets:
        rung = needle_request(s.ctx, target, cal, rng, s.budget(300, target))
        s.saw(rung)
        rungs.append(rung)
        if rung["outcome"] == "crash":
            s.died("needle_ladder")
        if rung["outcome"] != "pass":
            break
    details = {"curve": rungs, "calibration": cal.source, "chars_per_token": round(cal.chars_per_token, 3)}
    last = rungs[-1]
    flagged = [r["target_tokens"] for r in rungs if r["cache_hit"]]
    note = f"; rungs served from the prefix cache: {flagged}" if flagged else ""
    if last["outcome"] in ("memory wall", "crash"):
        return CheckResult("needle_ladder", "FAIL", f"{last['outcome']} at ~{last['target_tokens']:,} tokens "
                                                    f"(HTTP {last['http']}: {last['error']}){note}", details=details)
    if last["outcome"] == "harness error":
        return CheckResult("needle_ladder", "FAIL", f"HTTP {last['http']} at ~{last['target_tokens']:,} tokens of a "
                                                    f"{n_ctx:,}-token context: the prompt was sized wrong{note}",
                           details=details)
    if last["outcome"] == "quality ceiling":
        return CheckResult("needle_ladder", "PASS", f"served every rung; recall missed at ~{last['target_tokens']:,} "
                                                    f"tokens (quality ceiling, the model's not the server's){note}",
                           details=details)
    return CheckResult("needle_ladder", "PASS", f"recalled every needle up to ~{last['target_tokens']:,} tokens"
                                                f"{note}", details=details)


def probe_context_ceiling(s: _Stress, cal: Calibration) -> CheckResult:
    """Climb to 0.92 of the real context; the recall ceiling and the memory ceiling are kept apart."""
    n_ctx = s.n_ctx
    if skip := _skip_small("context_ceiling", n_ctx):
        return skip
    assert n_ctx is not None
    top = int(n_ctx * 0.92)
    if s.ctx.fast or n_ctx < 120_000:
        targets = sorted({int(n_ctx * f) for f in (0.25, 0.5, 0.75)} | {top})
    else:
        targets = [*range(95_000, top, 30_000), top]
    rng, rungs = random.Random(), []
    recall_ceiling = memory_ceiling = None
    for target in targets:
        rung = needle_request(s.ctx, target, cal, rng, s.budget(600, target))
        s.saw(rung)
        rungs.append(rung)
        if rung["outcome"] in ("pass", "quality ceiling"):
            memory_ceiling = rung["prompt_tokens"] or target
            if rung["outcome"] == "pass":
                recall_ceiling = rung["prompt_tokens"] or target
            continue
        if rung["outcome"] == "crash":
            s.died("context_ceiling")
        break
    deepest = max((r["prompt_tokens"] or 0 for r in rungs if r["outcome"] in ("pass", "quality ceiling")), default=0)
    details = {"curve": rungs, "n_ctx": n_ctx, "top_target": top, "recall_ceiling_tokens": recall_ceiling,
               "memory_ceiling_tokens": memory_ceiling, "calibration": cal.source,
               "chars_per_token": round(cal.chars_per_token, 3)}
    last = rungs[-1]
    ceilings = (f"recall ceiling {recall_ceiling or 'none'}, memory ceiling {memory_ceiling or 'none'} "
                f"(prompt tokens) of {n_ctx:,}")
    if last["outcome"] in ("memory wall", "crash"):
        return CheckResult("context_ceiling", "FAIL", f"{last['outcome']} at ~{last['target_tokens']:,} of {n_ctx:,} "
                                                      f"tokens (HTTP {last['http']}): a false context ceiling; "
                                                      f"{ceilings}", details=details)
    if last["outcome"] == "harness error":
        return CheckResult("context_ceiling", "FAIL", f"HTTP 400 at ~{last['target_tokens']:,} of {n_ctx:,} tokens: "
                                                      f"the harness sized the prompt wrong ({last['error']})",
                           details=details)
    if deepest < 0.85 * top:
        return CheckResult("context_ceiling", "FAIL", f"the deepest rung reached only {deepest:,} prompt tokens of the "
                                                      f"{top:,} aimed at: calibration off ({cal.source})",
                           details=details)
    return CheckResult("context_ceiling", "PASS", f"filled to {deepest:,} prompt tokens (0.92 of {n_ctx:,}); "
                                                  f"{ceilings}", details=details)


def probe_big_tool_return(s: _Stress, cal: Calibration) -> CheckResult:
    """A tool call answered with a 100,000-char result (cut to 0.8 of the context), then "summarise 3 themes"."""
    n_ctx = s.n_ctx
    if skip := _skip_small("big_tool_return", n_ctx):
        return skip
    assert n_ctx is not None
    size = min(BIG_TOOL_CHARS, cal.chars(int(n_ctx * 0.8) - 400))
    lines = [f"{i:05d} " + FILLER for i in range(size // (len(FILLER) + 6) + 1)]
    result = "\n".join(lines)[:size]
    messages = [{"role": "user", "content": "Read the harbour log with get_weather for Paris, then summarise it."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_big_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
                {"role": "tool", "tool_call_id": "call_big_1", "content": result},
                {"role": "user", "content": "Summarise three themes of that tool result."}]
    body = {**s.ctx.model, "messages": messages, "max_tokens": 200 if s.ctx.fast else 500,
            "temperature": 0.0, "seed": 42, **s.ctx.dialect.thinking_off}
    # a server that declares no tool calling (vLLM without a tool parser: a tools list is HTTP 400)
    # still gets the tool call and its result in the conversation, without the tools list
    offered = s.ctx.info.capabilities.tools is not False
    if offered:
        body["tools"] = [WEATHER_TOOL]
    timeout = s.budget(240, int(n_ctx * 0.8))
    r = s.ctx.client.stream_chat(body, timeout=timeout)
    outcome = classify(r)
    details = {"tool_result_chars": size, "timeout_s": round(timeout, 1),
               "prompt_tokens": (r.usage or {}).get("prompt_tokens"), "outcome": outcome,
               "http": r.status, "error": r.error, "scaled": size < BIG_TOOL_CHARS, "tools_offered": offered}
    scaled = f" (scaled from 100,000 to the {n_ctx:,}-token context)" if size < BIG_TOOL_CHARS else ""
    if not offered:
        scaled += "; no tools list sent: the server declares no tool calling"
    if outcome == "crash":
        s.died("big_tool_return")
        return CheckResult("big_tool_return", "FAIL", f"no answer to a {size:,}-char tool result{scaled}: the engine "
                                                      f"died ({r.error})", details=details)
    if outcome != "pass":
        return CheckResult("big_tool_return", "FAIL", f"{outcome} on a {size:,}-char tool result{scaled}: HTTP "
                                                      f"{r.status} ({r.error})", details=details)
    if len(r.content.strip()) < 50 and not r.tool_calls:
        return CheckResult("big_tool_return", "FAIL", f"200 but {len(r.content.strip())} chars of answer to a "
                                                      f"{size:,}-char tool result{scaled}: silent truncation",
                           details=details)
    return CheckResult("big_tool_return", "PASS", f"{len(r.content)} chars of answer to a {size:,}-char tool "
                                                  f"result ({details['prompt_tokens']} prompt tokens){scaled}",
                       details=details)


IDE_TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name.replace('_', ' ')} in the workspace.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                   "required": ["path"]}}}
    for name in ("read_file", "write_file", "list_dir", "grep", "run_tests", "git_diff", "git_commit",
                 "open_url", "rename_symbol", "format_file")]
IDE_SYSTEM = ("You are a coding agent inside an IDE. Follow the workspace rules. " * 80)[:5000]


def probe_ide_system_prompt(s: _Stress, cal: Calibration) -> CheckResult:
    """A ~5K-char IDE system prompt, 10 tool schemas, tool_choice none, a refactor request: HTTP 200."""
    if skip := _skip_small("ide_system_prompt", s.n_ctx):
        return skip
    body = {**s.ctx.model, "messages": [{"role": "system", "content": IDE_SYSTEM},
                                        {"role": "user", "content": "Refactor utils.py: split parse() in two."}],
            "tools": IDE_TOOLS, "tool_choice": "none", "max_tokens": 200 if s.ctx.fast else 2000, "temperature": 0.0,
            **s.ctx.dialect.thinking_off}
    timeout = s.budget(180, int(len(IDE_SYSTEM) / cal.chars_per_token) + 1500)     # + 10 tool schemas
    r = s.ctx.client.stream_chat(body, timeout=timeout)
    outcome = classify(r)
    details = {"outcome": outcome, "http": r.status, "prompt_tokens": (r.usage or {}).get("prompt_tokens"),
               "error": r.error, "timeout_s": round(timeout, 1)}
    if outcome == "crash":
        s.died("ide_system_prompt")
    if outcome != "pass":
        return CheckResult("ide_system_prompt", "FAIL", f"{outcome}: HTTP {r.status} ({r.error})", details=details)
    leak = TOOL_MARKUP.search(r.content)
    return CheckResult("ide_system_prompt", "PASS", f"HTTP 200, {details['prompt_tokens']} prompt tokens"
                       + (f" (note: {leak.group(0)!r} in content under tool_choice none)" if leak else ""),
                       details=details)


def probe_long_decode(s: _Stress, cal: Calibration) -> CheckResult:
    """A long derivation (max 8192; fast 600; never past the context, less a prompt's room) at full
    length where the engine allows: >= 500 tokens, no crash."""
    if skip := _skip_small("long_decode", s.n_ctx):
        return skip
    assert s.n_ctx is not None
    # prompt + max_tokens must fit the context: vLLM answers HTTP 400 to more, llama.cpp stops there
    budget = min(600 if s.ctx.fast else 8192, s.n_ctx - LONG_DECODE_PROMPT_ROOM)
    full = dict(s.ctx.info.capabilities.full_length_body)
    body = {**s.ctx.model, "messages": [{"role": "user", "content":
            "Prove by induction the formula for the sum of k^3, then derive the sum of k^4 step by step."}],
            "max_tokens": budget, "temperature": 0.0, "seed": 42, **full, **s.ctx.dialect.thinking_off}
    r = s.ctx.client.stream_chat(body, timeout=s.ctx.timeout(600))
    outcome = classify(r)
    tokens = (r.usage or {}).get("completion_tokens")
    details = {"outcome": outcome, "http": r.status, "max_tokens": budget, "completion_tokens": tokens,
               "full_length_body": bool(full), "error": r.error}
    if outcome == "crash":
        s.died("long_decode")
    if outcome != "pass":
        return CheckResult("long_decode", "FAIL", f"{outcome} during a {budget}-token decode: HTTP {r.status} "
                                                  f"({r.error})", details=details)
    if not isinstance(tokens, int) or tokens < 500:
        why = "the engine declares no way to ignore end-of-sequence" if not full else "it stopped early"
        return CheckResult("long_decode", "FAIL", f"only {tokens} completion tokens (need >= 500; {why})",
                           details=details)
    return CheckResult("long_decode", "PASS", f"{tokens} tokens decoded without a crash", details=details)


PROBES: tuple[tuple[str, Callable[[_Stress, Calibration], CheckResult]], ...] = (
    ("needle_ladder", probe_needle_ladder),
    ("big_tool_return", probe_big_tool_return),
    ("ide_system_prompt", probe_ide_system_prompt),
    ("long_decode", probe_long_decode),
    ("context_ceiling", probe_context_ceiling),
)


def run_stress(ctx: Ctx, on_result: Callable[[CheckResult], None] | None = None,
               restart: Callable[[], ServerInfo] | None = None) -> list[CheckResult]:
    """The stress probes in order; one that finds the engine dead restarts it (``restart``) or ends the rest."""
    s = _Stress(ctx, restart)
    cal = Calibration(ctx)
    ctx.client.take()
    results = []
    for name, probe in PROBES:
        t0 = time.perf_counter()
        if s.dead_since is not None:
            result = CheckResult(name, "FAIL", f"not run: the engine stopped answering during {s.dead_since} and "
                                               "verify restarts only the managed server")
        else:
            try:
                result = probe(s, cal)
            except Exception as exc:  # noqa: BLE001 - one probe must not stop the suite
                message = str(exc).splitlines()[0] if str(exc) else ""
                result = CheckResult(name, "FAIL", f"probe crashed: {type(exc).__name__}: {message}")
        result.name = name
        result.seconds = time.perf_counter() - t0
        result.details.update(suite="stress", exchanges=ctx.client.take(), restarts=list(s.restarts),
                              calibration=cal.source)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
