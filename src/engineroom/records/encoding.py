"""When each chunk of a streamed answer arrived, as a record keeps it, and the readers of it.

A bench request record (``records.request``) and a soak turn (``checks.soakdriver``) keep the
same timing fields:

- ``arrivals_us``: the arrival of every chunk that carried content or reasoning text, in
  integer microseconds after the send, delta-encoded: the first entry is send -> first
  token chunk (TTFT), each later one the gap to the chunk before. ``end_us``: send -> end
  of stream. Each absolute offset is rounded before the deltas are taken, so decoding
  (a running sum) gives the rounded offsets exactly, with no drift over a long reply.

Size, measured with the real llama-server + SmolLM2 on the 2-core CI machine
(``pytest tests/test_bench.py -k compact -s``, 2026-12-01): a 1,000-token reply at 111 tok/s
(one token per chunk, gaps of about 9 ms: four digits each) stores 1,000 arrivals as 5,159
bytes of JSON, 7,904 as absolute offsets; the whole record was 6,219 bytes. The same reply
at 5 tok/s, with the machine loaded (gaps of six digits): 6,257 / 9,024 / 7,310 bytes.

One chunk usually carries one token (llama-server streams token by token), so chunk gaps
are inter-token latencies; where an engine batches tokens into a chunk, they are
inter-chunk latencies and ``len(arrivals_us)`` is below ``completion_tokens``.

Records stored before arrival times were kept (store schema 2) are rewritten by the store's
migration (``records.schema2``): they carry ``arrivals_us: None`` and ``first_last_us`` (TTFT and
last token, all that was kept), so their inter-token percentiles read "n/a".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
