"""The longer bench suites, as data: what each sends, sized from the context the engine reports.

``engineroom bench SUITE``, SUITE one of standard, depth, concurrency, spec, agentic, sweep, rate
(``bench`` alone, the quick suite, and ``bench long`` are ``workloads``'). Each kind has a folder
of its own under ``bench/``: the agentic conversation is ``agentic.session``'s data, the sweep's
cells and knee ``sweep.knee``'s, the Poisson schedule and goodput ``rate.arrivals``', the depths
``depth.sizes``'. Every suite is a ``SuiteSpec``: which kind of run (``suites.run`` executes it),
its prompts, lengths, repetitions and sampler. Nothing here talks to an engine;
``depth.sizes.plan_depths`` (and ``agentic.session.plan_turns``) turn a spec into concrete sizes
for one server (its context per slot); ``suites.context`` resolves its slot count.

Prompt sources:

- ``narrative`` / ``code``: the two essays of ``workloads`` (the same text, so figures compare);
- haystacks (``suites.haystack``): filler prose, salted per request so no two share a prefix an
  engine's prefix cache could reuse, sized by the engine's tokenizer where it has one;
- ``agentic``: a recorded coding-agent session (``agentic.session.SCRIPT``): realistic tool outputs,
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
from dataclasses import dataclass, field, replace
from pathlib import Path

from engineroom.bench.depth.sizes import DEPTHS
from engineroom.bench.runner import Sampler
from engineroom.bench.workloads import CODE, NARRATIVE, Workload
from engineroom.errors import BadInput, NotFound

__all__ = ["GREEDY", "REPEAT_PROMPT", "SUITE_SPECS", "SuiteSpec", "load_prompt_file", "suite_spec"]

GREEDY = Sampler(temperature=0.0, top_p=1.0, top_k=1, min_p=0.0, seed=1234)

REPEAT_PROMPT = (
    "Copy the following block exactly three times, one copy after the other, with nothing else:\n"
    + " ".join(str(i) for i in range(1, 41)) + "\n"
    + " ".join(str(i) for i in range(1, 41)) + "\n"
)


@dataclass(frozen=True)
class SuiteSpec:
    """One named suite: a kind of run and its sizes (``suites.run`` executes it)."""

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
