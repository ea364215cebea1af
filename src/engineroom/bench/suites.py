"""The longer bench suites, as data: what each sends, sized from the context the engine reports.

``engineroom bench SUITE``, SUITE one of standard, depth, concurrency, spec, agentic, sweep, rate
(``bench`` alone, the quick suite, and ``bench long`` are ``workloads``'). The agentic
conversation is ``agentic``'s data, the sweep's cells and knee
``sweep``'s, the Poisson schedule and goodput ``arrivals``'. Every suite is a ``SuiteSpec``:
which kind of run (``suiterun`` executes it), its prompts, lengths, repetitions and sampler. Nothing here talks
to an engine; ``plan_depths`` (and ``agentic.plan_turns``) turn a spec into concrete sizes for
one server (its context per slot); ``suiterun`` resolves its slot count.

Prompt sources:

- ``narrative`` / ``code``: the two essays of ``workloads`` (the same text, so figures compare);
- haystacks (``haystack``): filler prose, deterministic per *salt*, with the salt at the very
  start, so no two haystacks share a prefix an engine's prefix cache could reuse. A fresh salt
  is drawn for every request (``fresh_salt``). Sized in real tokens through the engine's own
  tokenizer where its adapter exposes one (``Engine.count_tokens``), else by a
  4-characters-per-token estimate (the record says which: ``sized_by``);
- ``agentic``: a recorded coding-agent session (``agentic.SCRIPT``): realistic tool outputs,
  salted per session, sized by the engine's tokenizer;
- ``repeat``: a prompt that repeats itself, so a draft-free n-gram speculator has something
  to look up (spec-decode acceptance);
- user prompt files (JSONL, ``load_prompt_file``): one object per line, ``{"prompt": "...",
  "name"?: "...", "system"?: "...", "max_tokens"?: N}``.

Sampler values are always explicit (``runner.Sampler``): the suites use temperature 0 for
depth, concurrency, spec, agentic, sweep and rate (repeatable, no sampling noise in the
figures) and the quick suite's sampler for standard.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from engineroom.bench.runner import Sampler
from engineroom.bench.workloads import CODE, NARRATIVE, Workload
from engineroom.errors import BadInput, NotFound

__all__ = ["CHARS_PER_TOKEN_ESTIMATE", "DEPTHS", "SUITE_SPECS", "REPEAT_PROMPT", "SizedPrompt", "SuiteSpec",
           "TokenCounter", "fresh_salt", "haystack", "load_prompt_file", "plan_depths", "suite_spec"]

TokenCounter = Callable[[str], "int | None"]    # text -> the engine's token count (None: it cannot say)

# The depths the spec asks for (tokens already in context when decoding starts).
DEPTHS = (1024, 10240, 32768, 92160)
# Headroom a depth request keeps below the context per slot: the chat template's tokens,
# the generated tokens, and the sizing tolerance.
DEPTH_HEADROOM = 256
CHARS_PER_TOKEN_ESTIMATE = 4.0     # only where the engine has no tokenizer endpoint

GREEDY = Sampler(temperature=0.0, top_p=1.0, top_k=1, min_p=0.0, seed=1234)

REPEAT_PROMPT = (
    "Copy the following block exactly three times, one copy after the other, with nothing else:\n"
    + " ".join(str(i) for i in range(1, 41)) + "\n"
    + " ".join(str(i) for i in range(1, 41)) + "\n"
)

_FILLER = (
    "The archive room kept its ledgers in rows of grey boxes, each labelled by year and shelf.",
    "A courier crossed the river twice a week, carrying seed catalogues and letters about the weather.",
    "The lighthouse keeper logged wind speed, visibility and the names of ships that passed at dusk.",
    "In the market square the clock ran four minutes slow, and nobody had corrected it in a decade.",
    "The survey team measured the glacier's edge with stakes, tape and a notebook kept dry in oilcloth.",
    "Bakers on the north street started at three, and the smell of rye reached the station by five.",
    "The library's map drawer held coastal charts, railway plans and a sketch of a garden long gone.",
    "Every spring the orchard was pruned by hand, and the cuttings were stacked to dry for kindling.",
    "The observatory's logbook noted cloud cover, seeing conditions and the temperature of the dome.",
    "A ferry timetable from an old summer listed crossings at seven, eleven, three and half past six.",
    "The engineer checked the pump house gauges at noon and wrote the pressures on a chalk board.",
    "Along the canal the lock keeper's cottage had a blue door, a bench and a row of potted herbs.",
)


def fresh_salt() -> str:
    """A new salt: 12 hex digits from the OS's randomness, never reused within a run."""
    return secrets.token_hex(6)


@dataclass(frozen=True)
class SizedPrompt:
    text: str
    salt: str
    target_tokens: int
    counted_tokens: int | None       # the engine's count of ``text`` (None: estimated)
    sized_by: str                    # "engine tokenizer" | "estimate (4 chars/token)"


def _filler(salt: str, n_chars: int) -> str:
    rng = random.Random(salt)
    parts: list[str] = [f"Record {salt}. Read the notes below; a question about them follows.\n"]
    size = len(parts[0])
    i = 0
    while size < n_chars:
        sentence = f"({salt[:4]}-{i}) " + rng.choice(_FILLER)
        parts.append(sentence)
        size += len(sentence) + 1
        i += 1
    return " ".join(parts)


def haystack(salt: str, tokens: int, count: TokenCounter | None = None,
             question: str = "In one sentence, what is the record about?") -> SizedPrompt:
    """A salted haystack of about ``tokens`` tokens (the engine's tokenizer when ``count`` gives
    a number: the text is grown or cut until its count is within 2% below the target)."""
    if tokens < 16:
        raise BadInput(f"a haystack needs at least 16 tokens, not {tokens}.")
    tail = f"\n\n{question}"
    ratio = CHARS_PER_TOKEN_ESTIMATE
    text = _filler(salt, int(tokens * ratio)) + tail
    if count is None:
        return SizedPrompt(text, salt, tokens, None, f"estimate ({CHARS_PER_TOKEN_ESTIMATE:g} chars/token)")
    counted = count(text)
    if counted is None:
        return SizedPrompt(text, salt, tokens, None, f"estimate ({CHARS_PER_TOKEN_ESTIMATE:g} chars/token)")
    for _ in range(4):      # rescale by the measured ratio; a few rounds land within 2%
        if 0.98 * tokens <= counted <= tokens:
            break
        ratio = len(text) / max(counted, 1)
        text = _filler(salt, int(len(text) * tokens / max(counted, 1) * 0.995)) + tail
        counted = count(text)
        if counted is None:
            return SizedPrompt(text, salt, tokens, None, f"estimate ({ratio:.2f} chars/token)")
    return SizedPrompt(text, salt, tokens, counted, "engine tokenizer")


@dataclass(frozen=True)
class SuiteSpec:
    """One named suite: a kind of run and its sizes (``suiterun`` executes it)."""

    name: str
    kind: str            # "standard" | "depth" | "concurrency" | "spec" | "agentic" | "sweep" | "rate"
    about: str
    warmup: int = 1
    measured: int = 3
    max_tokens: int = 64
    sampler: Sampler = field(default_factory=lambda: GREEDY)
    depths: tuple[int, ...] = DEPTHS           # depth: the depths tried (those that fit are run)
    near_end: bool = True                      # depth: add one near the end of a small context
    rounds: int = 3                            # concurrency: rounds of N simultaneous streams
    prompt_tokens: int = 16384                 # concurrency: the uncacheable prompt (capped by the context)
    workloads: tuple[Workload, ...] = ()       # standard / spec: the prompts
    cv_threshold_pct: float = 10.0
    agreement_tolerance_pct: float = 1.0
    itl_p99_ratio: float = 5.0                 # inter-token p99 over this many p50s: the engine paused (guards)
    turns: int = 12                            # agentic: turns per session (measured = sessions)
    tool_choice: str = "auto"                  # agentic: sent with the ten tools on every turn
    contexts: tuple[int, ...] = ()             # sweep: prompt sizes (empty: prompt_tokens)
    budget_s: float = 300.0                    # sweep: no cell is started that would overrun it
    knee_gain_pct: float = 15.0                # sweep: an added stream must add this share of one stream's rate
    slo_ttft_ms: float = 2000.0                # sweep / rate: TTFT from the scheduled send
    slo_itl_ms: float = 100.0                  # sweep / rate: TPOT (mean inter-token time after the first)
    rate: float = 1.0                          # rate: Poisson arrivals per second
    duration_s: float | None = 60.0            # rate: schedule length (or requests)
    requests: int | None = None                # rate: number of arrivals (the first limit reached wins)
    arrival_seed: int = 1234                   # rate: the schedule's random seed (recorded)
    max_inflight: int = 64                     # rate: client senders; a request none is free for waits (counted)

    def with_(self, **changes: object) -> SuiteSpec:
        return replace(self, **changes)  # type: ignore[arg-type]


SUITE_SPECS: dict[str, SuiteSpec] = {
    "standard": SuiteSpec(
        "standard", "standard",
        "narrative (1000 tokens) and code (800) plus any --prompts file: 3 warm-ups + 5 measured each, "
        "with the integrity checklist, reasoning split and roofline",
        warmup=3, measured=5, max_tokens=0, sampler=Sampler(), workloads=(NARRATIVE, CODE)),
    "depth": SuiteSpec(
        "depth", "depth",
        "TTFT / prefill and decode at 1K, 10K, 32K and 90K tokens of context (those that fit the "
        "engine's context per slot, plus one near its end), on freshly salted haystacks: 1 warm-up + 3 measured "
        "each, a prefix-cache hit discarded and re-run with a fresh salt",
        warmup=1, measured=3, max_tokens=64),
    "concurrency": SuiteSpec(
        "concurrency", "concurrency",
        "N simultaneous streams, N = the engine's reported slot count (or --streams): 3 rounds of salted "
        "16K-token prompts (capped by the context), 256 tokens out, latency from the scheduled send time",
        warmup=1, measured=3, rounds=3, max_tokens=256, prompt_tokens=16384),
    "agentic": SuiteSpec(
        "agentic", "agentic",
        "multi-turn agentic replay: a coding agent's session (ten tools; file reads, grep hits, test logs, a "
        "diff) growing turn by turn toward ~50K tokens, scaled to the engine's context per slot; every turn "
        "sends the whole conversation; 1 warm-up + 2 salted sessions of 12 turns, TTFT / prefill / decode "
        "and cached tokens per turn",
        warmup=1, measured=2, max_tokens=64, prompt_tokens=50000, turns=12),
    "sweep": SuiteSpec(
        "sweep", "sweep",
        "N = 1, 2, 4, ... simultaneous streams up to the engine's slot count (or --streams) at each prompt "
        "size (--depths; default 1,024 tokens), 2 rounds a cell within a time budget (--budget-s, 300 s): "
        "aggregate and per-stream decode, TTFT p50 / p95, the knee and a recommended slot count",
        warmup=1, measured=2, rounds=2, max_tokens=64, prompt_tokens=1024),
    "rate": SuiteSpec(
        "rate", "rate",
        "request-rate mode: Poisson arrivals at --rate R per second (seeded) for --duration-s (60 s) or "
        "--requests N, salted 512-token prompts, latency from the scheduled send; goodput against "
        "--slo-ttft-ms (2,000) and --slo-itl-ms (TPOT, 100)",
        warmup=1, measured=1, max_tokens=64, prompt_tokens=512),
    "spec": SuiteSpec(
        "spec", "spec",
        "a prompt that repeats itself (what a draft-free n-gram speculator can look up): acceptance rate, "
        "mean acceptance length and fire rate from the responses and the engine's counters",
        warmup=1, measured=3, max_tokens=160, workloads=(Workload("repeat", REPEAT_PROMPT, 160),)),
}


def suite_spec(name: str) -> SuiteSpec | None:
    """The named longer suite, or None (``workloads.suite`` knows quick and long)."""
    return SUITE_SPECS.get(name.strip().lower())


def plan_depths(spec_depths: tuple[int, ...], n_ctx: int | None, max_tokens: int, near_end: bool = True) -> list[int]:
    """The depths that fit ``n_ctx`` (the context per slot the engine reports) with room for the
    template and ``max_tokens``; when the largest standard depth that fits is well below the
    context (a small CI model), one more near its end. BadInput when the context is unknown."""
    if not n_ctx:
        raise BadInput("the engine does not report its context size, so depths cannot be sized; "
                       "engineroom will not guess it.")
    room = n_ctx - max_tokens - DEPTH_HEADROOM
    fit = [d for d in spec_depths if d <= room]
    end = (room // 256) * 256
    if near_end and end >= 512 and (not fit or end >= 1.5 * fit[-1]) and end < max(spec_depths):
        fit.append(end)
    if not fit:
        raise BadInput(f"the engine's context per slot ({n_ctx} tokens) holds no depth to measure with "
                       f"{max_tokens} tokens out.")
    return fit


def load_prompt_file(path: Path, default_max_tokens: int) -> tuple[Workload, ...]:
    """User prompts, one JSON object per line (``prompt`` required; ``name``, ``system``,
    ``max_tokens`` optional). One clear sentence for the first bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise NotFound(f"there is no prompt file {path}.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read the prompt file {path} ({exc}).") from None
    out: list[Workload] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise BadInput(f"{path} line {number} is not JSON.") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise BadInput(f"{path} line {number} needs a non-empty \"prompt\" string.")
        limit = obj.get("max_tokens", default_max_tokens)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise BadInput(f"{path} line {number}: max_tokens must be a positive integer.")
        system = obj.get("system")
        if system is not None and not isinstance(system, str):
            raise BadInput(f"{path} line {number}: system must be a string.")
        name = str(obj.get("name") or f"prompt-{number}")
        out.append(Workload(name, obj["prompt"], limit, system))
    if not out:
        raise BadInput(f"the prompt file {path} holds no prompts.")
    return tuple(out)
