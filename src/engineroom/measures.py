"""What bench and verify both read from an engine's answers: one implementation of each.

- ``cache_reuse``: the prompt tokens an answer took from the engine's prefix cache, from the
  best source given: the engine's own per-response count (as its adapter normalised it), else
  the usage's ``prompt_tokens_details.cached_tokens``, else the engine's counter delta around
  the request. ``CacheReuse.contaminated`` when it reused more than ``CACHE_ALLOWANCE_TOKENS``
  and ``CACHE_ALLOWANCE_FRACTION`` of its prompt: the chat template's preamble (tens of tokens,
  before a salt) is shared by design, anything beyond it means the prompt was not fresh.
  bench's cache guard (re-run with a fresh salt) and verify's stress ladder (a rung served from
  the cache says nothing of recall) both call it.
- ``Acceptance``: speculative decoding from drafted / accepted / generated token counts (and
  the number of draft attempts where the engine counts them): acceptance rate, tokens per
  verify step, mean acceptance length. bench's spec summary (over a run's records and counters)
  and verify's ``spec_decode`` probe (one answer) both use it.

Engine-neutral: the callers pass numbers the adapters already normalised.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CACHE_ALLOWANCE_FRACTION", "CACHE_ALLOWANCE_TOKENS", "Acceptance", "CacheReuse", "cache_reuse"]

CACHE_ALLOWANCE_TOKENS = 64          # the template preamble every request shares
CACHE_ALLOWANCE_FRACTION = 0.05


@dataclass(frozen=True)
class CacheReuse:
    cached: int | None          # prompt tokens taken from the prefix cache (None: nobody said)
    prompt: int | None          # the prompt's tokens in all
    source: str

    @property
    def contaminated(self) -> bool:
        if not self.cached:
            return False
        allowance = max(CACHE_ALLOWANCE_TOKENS, CACHE_ALLOWANCE_FRACTION * (self.prompt or 0))
        return self.cached > allowance

    def describe(self) -> str:
        of = f" of {self.prompt}" if self.prompt else ""
        return f"{self.cached}{of} prompt tokens reused ({self.source})"


def cache_reuse(*, prompt: int | None, engine_cached: int | None = None, engine_prompt: int | None = None,
                usage_cached: int | None = None, counter_cached: float | None = None) -> CacheReuse:
    """``engine_prompt``: the prompt tokens the engine computed (not from its cache), where it says;
    the prompt in all is then at least computed + cached."""
    if engine_cached is not None:
        total = prompt
        if engine_prompt is not None:
            total = max(prompt or 0, engine_prompt + engine_cached)
        return CacheReuse(engine_cached, total, "the engine's per-response cached-token count")
    if usage_cached is not None:
        return CacheReuse(usage_cached, prompt, "usage.prompt_tokens_details.cached_tokens")
    if counter_cached is not None:
        return CacheReuse(int(counter_cached), prompt, "the engine's counters around it")
    return CacheReuse(None, prompt, "not reported")


@dataclass(frozen=True)
class Acceptance:
    """Speculative decoding over one answer or a whole run.

    ``drafted``: tokens the drafter proposed; ``accepted``: of those, the ones the target kept;
    ``generated``: tokens the answer(s) carried; ``drafts``: draft attempts (verify steps that
    had a draft), where the engine counts them."""

    drafted: int
    accepted: int
    generated: int | None = None
    drafts: int | None = None

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens each target step yielded: every step makes one token of its own plus the drafts
        it accepted, so steps = generated - accepted."""
        if self.generated is None:
            return None
        return self.generated / max(1, self.generated - self.accepted)

    @property
    def mean_length(self) -> float | None:
        """Tokens a step *with a draft* yielded: 1 + accepted / drafts (only where drafts are counted)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None
