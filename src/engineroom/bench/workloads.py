"""The prompts the bench sends.

Two shapes of generation that stress decode differently: long free prose (narrative) and
structured code with comments (code). ``max_tokens`` is part of the workload so a quick
CPU run can use 64 tokens and a real rig the full 1000 / 800.
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

    def with_max_tokens(self, max_tokens: int) -> "Workload":
        return replace(self, max_tokens=int(max_tokens))

    def describe(self) -> dict[str, object]:
        """What goes into a run's conditions (the prompt by hash, not by text)."""
        return {"name": self.name, "max_tokens": self.max_tokens, "prompt_sha256": self.prompt_sha256[:16]}


NARRATIVE = Workload("narrative", NARRATIVE_PROMPT, max_tokens=1000)
CODE = Workload("code", CODE_PROMPT, max_tokens=800)
DEFAULT_WORKLOADS: tuple[Workload, ...] = (NARRATIVE, CODE)


def default_workloads(max_tokens: int | None = None) -> tuple[Workload, ...]:
    """The standard pair; ``max_tokens`` overrides both budgets (CPU demos, tests)."""
    if max_tokens is None:
        return DEFAULT_WORKLOADS
    if max_tokens < 1:
        from engineroom.errors import BadInput

        raise BadInput(f"max_tokens must be at least 1, not {max_tokens}.")
    return tuple(w.with_max_tokens(max_tokens) for w in DEFAULT_WORKLOADS)
