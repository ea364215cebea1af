"""A run's watchdog: how long a request may go without a token before the engine counts as
stalled, and when bench stops sending.

The stall limit is derived from what the run expects, with a floor (``--stall-s``, default
``STALL_FLOOR_S``): before any request has finished, the floor plus the time the request's
prompt takes at ``SLOWEST_PREFILL_TPS``; after that, ``STALL_FACTOR`` times the slowest the run has
been so far (its longest gap between two token chunks, and its time to first token per prompt
token times this prompt; warm-ups, which pay the cold costs, are not learnt from), never under the
floor and never over the request timeout. The client
applies it as the read timeout of the stream: no byte for that long ends the request with
"stalled".

Bench stops sending (``BenchAborted``, stored as a ``bench_abort`` record with the reason) when a
request stalled (every later request would wait the limit again: a hung engine), or when
``MAX_FAILURES_IN_A_ROW`` requests in a row failed (a dead engine: connection refused, peer
closed). The figures of the requests that finished are kept; ``guards.stopped`` marks the run.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engineroom.records.encoding import gaps_us, ttft_s

__all__ = ["ABORT_KIND", "MAX_FAILURES_IN_A_ROW", "SLOWEST_PREFILL_TPS", "STALL_FACTOR", "STALL_FLOOR_S",
           "STALL_MARK", "BenchAborted", "Watchdog", "stream"]

ABORT_KIND = "bench_abort"
STALL_FLOOR_S = 30.0
STALL_FACTOR = 10.0
SLOWEST_PREFILL_TPS = 20.0        # tokens/s: the slowest prefill a first request is allowed before it is "stalled"
MAX_FAILURES_IN_A_ROW = 3
STALL_MARK = "stalled"            # the word the client's error starts with when the read timeout fired


class BenchAborted(Exception):
    """Bench stopped sending; ``reason`` is the sentence the card shows."""

    def __init__(self, reason: str, record: Mapping[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.record = dict(record)


def _is_stall(error: Any) -> bool:
    text = str(error or "")
    return STALL_MARK in text or "no answer within" in text


@dataclass
class Watchdog:
    """Per run: ``limit(prompt_tokens)`` before each request, ``observe(record)`` after it."""

    floor_s: float = STALL_FLOOR_S
    timeout_s: float = 600.0
    max_failures: int = MAX_FAILURES_IN_A_ROW
    worst_gap_s: float = 0.0
    worst_ttft_per_token_s: float = 0.0
    successes: int = 0
    failures_in_a_row: int = 0
    sent: int = 0
    last_limit_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def limit(self, prompt_tokens: int | None = None) -> float:
        tokens = max(1, int(prompt_tokens or 1))
        if not self.successes:
            limit = self.floor_s + tokens / SLOWEST_PREFILL_TPS
        else:
            limit = max(self.floor_s, STALL_FACTOR * self.worst_gap_s,
                        STALL_FACTOR * self.worst_ttft_per_token_s * tokens)
        self.last_limit_s = min(limit, self.timeout_s)
        return self.last_limit_s

    def how(self) -> str:
        """How the last limit was derived (for the abort's sentence)."""
        if not self.successes:
            return (f"the floor {self.floor_s:g} s plus the prompt at {SLOWEST_PREFILL_TPS:g} tok/s, before any "
                    "measured request had finished")
        return (f"{STALL_FACTOR:g}x the slowest the run had been (longest token gap {self.worst_gap_s * 1000:.0f} ms, "
                f"time to first token {self.worst_ttft_per_token_s * 1000:.2f} ms per prompt token), at least the "
                f"floor {self.floor_s:g} s")

    def observe(self, rec: Mapping[str, Any], *, stall_s: float | None = None) -> None:
        """Learn from a finished request; raise ``BenchAborted`` when bench should stop sending."""
        self.sent += 1
        error = rec.get("error")
        if not error and rec.get("status") == 200:
            self.failures_in_a_row = 0
            if rec.get("warmup"):
                return                      # a warm-up pays the cold costs: the run's pace is the measured ones'
            self.successes += 1
            gaps = gaps_us(rec) or []
            if gaps:
                self.worst_gap_s = max(self.worst_gap_s, max(gaps) / 1e6)
            first, prompt = ttft_s(rec), rec.get("prompt_tokens")
            if first is not None and isinstance(prompt, int) and prompt > 0:
                self.worst_ttft_per_token_s = max(self.worst_ttft_per_token_s, first / prompt)
            return
        self.failures_in_a_row += 1
        self.errors.append(str(error or f"HTTP {rec.get('status')}"))
        limit = stall_s if stall_s is not None else self.last_limit_s
        if _is_stall(error):
            reason = (f"the engine sent nothing for {limit:.1f} s during a request (the stall limit: {self.how()}); "
                      f"bench stopped sending after {self.sent} request(s)")
            raise BenchAborted(reason, self._record("stall", reason, limit))
        if self.failures_in_a_row >= self.max_failures:
            reason = (f"{self.failures_in_a_row} requests in a row failed (last error: {self.errors[-1]}); bench "
                      f"stopped sending after {self.sent} request(s)")
            raise BenchAborted(reason, self._record("failures", reason, limit))

    def _record(self, why: str, reason: str, limit: float) -> dict[str, Any]:
        return {"why": why, "reason": reason, "stall_limit_s": limit, "floor_s": self.floor_s,
                "after_requests": self.sent, "failures_in_a_row": self.failures_in_a_row,
                "last_errors": self.errors[-self.max_failures:]}


def _takes_stall(client: Any) -> bool:
    try:
        return "stall_s" in inspect.signature(client.stream_chat).parameters
    except (TypeError, ValueError):
        return False


def stream(client: Any, payload: dict[str, Any], timeout: float, stall_s: float | None) -> Any:
    """``client.stream_chat`` with the stall limit where the client takes one (a test's stand-in
    client may not: it gets the request timeout only)."""
    if stall_s is not None and _takes_stall(client):
        return client.stream_chat(payload, timeout=timeout, stall_s=stall_s)
    return client.stream_chat(payload, timeout=timeout)
