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
- ``arrivals_us``: the arrival of every chunk that carried content or reasoning text, in
  integer microseconds after the send, delta-encoded: the first entry is send -> first
  token chunk (TTFT), each later one the gap to the chunk before. ``end_us``: send -> end
  of stream. Each absolute offset is rounded before the deltas are taken, so decoding
  (a running sum) gives the rounded offsets exactly, with no drift over a long reply;
- ``completion_tokens`` / ``prompt_tokens`` / ``cached_prompt_tokens`` (usage, as the
  server counted), ``finish_reason``, ``status``, ``error``, ``chunks`` (every SSE chunk),
  ``content_chars`` / ``reasoning_chars``;
- ``engine``: the engine's timings as its adapter normalised them
  (``engines.base.EngineTimings.as_dict()``: tokens and milliseconds, and how its decode
  window counts); ``engine_raw``: the engine's block exactly as sent, read by nothing but a
  future re-normalisation.

Size, measured with the real llama-server + SmolLM2 on the 2-core CI machine
(``pytest tests/test_bench.py -k compact -s``, 2026-12-01): a 1,000-token reply at 111 tok/s
(one token per chunk, gaps of about 9 ms: four digits each) stores 1,000 arrivals as 5,159
bytes of JSON, 7,904 as absolute offsets; the whole record was 6,219 bytes. The same reply
at 5 tok/s, with the machine loaded (gaps of six digits): 6,257 / 9,024 / 7,310 bytes.

One chunk usually carries one token (llama-server streams token by token), so chunk gaps
are inter-token latencies; where an engine batches tokens into a chunk, they are
inter-chunk latencies and ``len(arrivals_us)`` is below ``completion_tokens``.

Records stored before arrival times were kept (store schema 2) are rewritten by the store's
migration (``bench.legacy``): they carry ``arrivals_us: None`` and ``first_last_us`` (TTFT and
last token, all that was kept), so their inter-token percentiles read "n/a".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RECORD_VERSION = 3          # the store schema that introduced this shape


def encode_arrivals(t_send: float, times: Sequence[float]) -> list[int]:
    """Delta-encoded integer microseconds of ``times`` after ``t_send`` (perf_counter seconds)."""
    out: list[int] = []
    previous = 0
    for t in times:
        offset = round((t - t_send) * 1_000_000)
        out.append(offset - previous)
        previous = offset
    return out


def decode_arrivals(deltas: Sequence[int]) -> list[int]:
    """Absolute microsecond offsets from ``encode_arrivals``' deltas."""
    out: list[int] = []
    total = 0
    for d in deltas:
        total += int(d)
        out.append(total)
    return out


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


def arrivals_us(rec: Mapping[str, Any]) -> list[int] | None:
    """Absolute token-chunk arrival offsets (µs after the send), or None when not recorded."""
    deltas = rec.get("arrivals_us")
    if not isinstance(deltas, list):
        return None
    return decode_arrivals(deltas)


def first_last_us(rec: Mapping[str, Any]) -> tuple[int, int] | None:
    """(first, last) token-chunk offsets in µs; from the arrivals, or a migrated record's pair."""
    offsets = arrivals_us(rec)
    if offsets:
        return offsets[0], offsets[-1]
    if offsets is None:
        pair = rec.get("first_last_us")
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) for x in pair):
            return pair[0], pair[1]
    return None


def ttft_s(rec: Mapping[str, Any]) -> float | None:
    """Send -> first content/reasoning chunk, seconds on the client clock."""
    pair = first_last_us(rec)
    return None if pair is None else pair[0] / 1e6


def last_token_s(rec: Mapping[str, Any]) -> float | None:
    pair = first_last_us(rec)
    return None if pair is None else pair[1] / 1e6


def wall_s(rec: Mapping[str, Any]) -> float | None:
    """Send -> end of stream, seconds on the client clock."""
    end = rec.get("end_us")
    return end / 1e6 if isinstance(end, (int, float)) and not isinstance(end, bool) else None


def gaps_us(rec: Mapping[str, Any]) -> list[int] | None:
    """Gaps between consecutive token chunks (µs); None when arrivals were not recorded."""
    deltas = rec.get("arrivals_us")
    if not isinstance(deltas, list):
        return None
    return [int(d) for d in deltas[1:]]


def max_tokens(rec: Mapping[str, Any]) -> int | None:
    sent = rec.get("sent")
    value = sent.get("max_tokens") if isinstance(sent, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sent_body(rec: Mapping[str, Any]) -> dict[str, Any]:
    sent = rec.get("sent")
    body = sent.get("body") if isinstance(sent, Mapping) else None
    return dict(body) if isinstance(body, Mapping) else {}
