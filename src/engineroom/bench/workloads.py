"""The prompts the bench sends.

Two shapes of generation that stress decode differently: long free prose (narrative) and
structured code with comments (code). ``max_tokens`` is part of the workload so a quick
CPU run can use 64 tokens and a real rig the full 1000 / 800.

A ``Suite`` is a named bench shape (workloads, warm-ups, measured requests):

- ``quick`` (the default): both prompts at 192 tokens, 1 warm-up + 5 measured each: 12
  requests, 2,304 tokens, 16% of ``long``'s 14,400 (``long`` took 6 min 55 s with
  SmolLM2-135M on the 2-core CPU default, ~35 tok/s overall: ``quick`` is about a minute
  there). Five measured requests give a mean, a sample std and the CV per workload;
  192 tokens keep the decode window at >= 0.25 s up to ~770 tok/s, long enough for the
  client-vs-engine cross-check (faster servers get "not cross-checked: raise max_tokens").
  One warm-up per workload is enough: it pays the first request's costs (pages of the
  mmapped model, a cold prompt cache); decode figures are flat after it.
- ``long``: the full 1000 / 800-token essays, 3 warm-ups + 5 measured (the old default;
  16 requests). Use it where decode at depth matters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

NARRATIVE_PROMPT = (
    "Write an essay of about 800 words explaining how attention works in transformer "
    "language models: queries, keys and values, why the scores are scaled, what multiple "
    "heads add, how a causal mask keeps generation left to right, and why the key-value "
    "cache makes generating each new token cheap. Use plain prose in several paragraphs, "
    "no lists and no code."
)

CODE_PROMPT = (
    "Write a Python implementation of quicksort. Include a docstring, type hints, a "
    "comment on every non-trivial line explaining why it is there, an in-place variant "
    "using Lomuto partitioning, and a short example under if __name__ == '__main__'."
)


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str
    max_tokens: int
    system: str | None = None

    def messages(self) -> list[dict[str, str]]:
        msgs: list[dict[str, str]] = []
        if self.system:
            msgs.append({"role": "system", "content": self.system})
        msgs.append({"role": "user", "content": self.prompt})
        return msgs

    @property
    def prompt_sha256(self) -> str:
        text = (self.system or "") + "\x00" + self.prompt
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def with_max_tokens(self, max_tokens: int) -> Workload:
        return replace(self, max_tokens=int(max_tokens))

    def describe(self) -> dict[str, object]:
        """What goes into a run's conditions (the prompt by hash, not by text)."""
        return {"name": self.name, "max_tokens": self.max_tokens, "prompt_sha256": self.prompt_sha256[:16]}


NARRATIVE = Workload("narrative", NARRATIVE_PROMPT, max_tokens=1000)
CODE = Workload("code", CODE_PROMPT, max_tokens=800)
LONG_WORKLOADS: tuple[Workload, ...] = (NARRATIVE, CODE)
QUICK_MAX_TOKENS = 192


@dataclass(frozen=True)
class Suite:
    name: str
    workloads: tuple[Workload, ...]
    warmup: int
    measured: int
    about: str

    @property
    def requests(self) -> int:
        return len(self.workloads) * (self.warmup + self.measured)


SUITES: dict[str, Suite] = {
    "quick": Suite("quick", tuple(w.with_max_tokens(QUICK_MAX_TOKENS) for w in LONG_WORKLOADS),
                   warmup=1, measured=5,
                   about=f"{QUICK_MAX_TOKENS} tokens per request, 1 warm-up + 5 measured per workload"),
    "long": Suite("long", LONG_WORKLOADS, warmup=3, measured=5,
                  about="1000 / 800 tokens per request, 3 warm-ups + 5 measured per workload"),
}
DEFAULT_SUITE = "quick"
DEFAULT_WORKLOADS: tuple[Workload, ...] = SUITES[DEFAULT_SUITE].workloads


def suite(name: str | None = None) -> Suite:
    """The named suite (default: ``quick``); an unknown name is BadInput."""
    key = (name or DEFAULT_SUITE).strip().lower()
    if key not in SUITES:
        from engineroom.errors import BadInput

        raise BadInput(f"There is no bench suite {name!r}; choose {' or '.join(SUITES)}.")
    return SUITES[key]


def default_workloads(max_tokens: int | None = None, suite_name: str | None = None) -> tuple[Workload, ...]:
    """The standard pair of a suite (default: quick); ``max_tokens`` overrides both budgets."""
    workloads = suite(suite_name).workloads
    if max_tokens is None:
        return workloads
    if max_tokens < 1:
        from engineroom.errors import BadInput

        raise BadInput(f"max_tokens must be at least 1, not {max_tokens}.")
    return tuple(w.with_max_tokens(max_tokens) for w in workloads)
