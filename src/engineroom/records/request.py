"""The raw bench request record: what was sent, when each token chunk arrived, what came back.

Why raw: every figure on a card (TTFT, decode and wall tok/s, inter-token percentiles, the
client-vs-engine cross-check) is recomputed from these records by ``statistics``, so a
better formula later re-reads old runs instead of inheriting stored conclusions. Nothing
derived is stored: no rates, no windows, no "n/a" reasons.

A record (``BenchRequest.to_dict()``, stored as a ``bench_request`` payload) holds:

- ``workload``, ``index``, ``warmup``; ``sent``: ``max_tokens``, the ``sampler`` values, the
  ``body`` fields beyond messages and sampler (the engine's full-length fields, the plan's
  extra body) and the prompt's hash;
- ``sent_unix``: the client's wall clock when the request left (ordering and drift only;
  durations come from ``time.perf_counter``);
- ``arrivals_us`` / ``end_us``: when each text chunk and the end of the stream arrived, in
  delta-encoded integer microseconds after the send (``records.encoding`` says how, and reads them);
- ``completion_tokens`` / ``prompt_tokens`` / ``cached_prompt_tokens`` (usage, as the
  server counted), ``finish_reason``, ``status``, ``error``, ``chunks`` (every SSE chunk),
  ``content_chars`` / ``reasoning_chars``;
- ``engine``: the engine's timings as its adapter normalised them
  (``engines.base.EngineTimings.as_dict()``: tokens and milliseconds, and how its decode
  window counts); ``engine_raw``: the engine's block exactly as sent, read by nothing but a
  future re-normalisation.

Records stored before arrival times were kept (store schema 2) are rewritten by the store's
migration (``records.schema2``) into this shape, with ``arrivals_us: None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

RECORD_VERSION = 3          # the store schema that introduced this shape


@dataclass
class BenchRequest:
    """One request's raw outcome; the module docstring says what each field holds and why."""

    workload: str
    index: int                      # 0-based within its phase (warm-up or measured)
    warmup: bool
    sent: dict[str, Any]            # max_tokens, sampler, body (extra request fields), prompt_sha256
    sent_unix: float
    status: int | None              # HTTP status (None: no answer)
    error: str | None
    end_us: int
    arrivals_us: list[int] | None   # None only for records migrated from before they were kept
    completion_tokens: int | None
    prompt_tokens: int | None
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    chunks: int = 0
    content_chars: int = 0
    reasoning_chars: int = 0
    engine: dict[str, Any] | None = None
    engine_raw: dict[str, Any] | None = None
    record_version: int = RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- readers: plain functions over stored dicts, so old and hand-built records read alike ---------


def max_tokens(rec: Mapping[str, Any]) -> int | None:
    sent = rec.get("sent")
    value = sent.get("max_tokens") if isinstance(sent, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
