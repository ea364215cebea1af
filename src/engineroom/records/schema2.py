"""Bench records and conditions as engineroom stored them up to store schema 2, rewritten into
today's shape by the store's 2 -> 3 migration.

Why a module of its own: schema 2 named two of its keys after llama.cpp's request field
(the per-request flag and the ``bench`` conditions' flag and reason), so reading them needs
that name; keeping every such read here leaves everything outside engines/ free of engine names
(``tests/test_bench.py`` checks it, with this file as the one exception).

What a schema-2 record kept and what it becomes:

- ``ttft_s`` / ``last_token_s`` / ``wall_s`` (seconds) -> ``first_last_us`` and ``end_us``
  (integer microseconds); there were no per-chunk arrivals, so ``arrivals_us`` is None and
  the inter-token percentiles of such a run read "n/a";
- ``engine_timings`` (the engine's block as sent) -> ``engine_raw``, and ``engine`` = the
  adapter's normalisation of it (the run's conditions name the engine);
- ``max_tokens`` and the per-request flag -> ``sent`` (the flag was only ever sent as
  ``LEGACY_FULL_LENGTH_BODY``, the one body the schema-2 runner knew), with the sampler and
  extra body from the run's conditions;
- derived figures (``wall_tps``, ``decode_tps``, ``decode_window_s``, ``decode_na_reason``)
  are dropped: the statistics recompute them by the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engineroom.records.request import RECORD_VERSION

_FLAG = "ignore_eos"                       # schema 2's key, named after llama.cpp's request field
LEGACY_FULL_LENGTH_BODY = {_FLAG: True}    # what the schema-2 runner sent when the flag was set
_DERIVED = ("wall_tps", "decode_tps", "decode_window_s", "decode_na_reason")

Normaliser = Callable[[dict[str, Any]], Any]   # engines.base.TimingsNormaliser


def is_v2_payload(payload: Mapping[str, Any]) -> bool:
    """A schema-2 bench record: seconds-based times and no arrival list."""
    return "wall_s" in payload and "end_us" not in payload and "workload" in payload


def _us(seconds: Any) -> int | None:
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return round(float(seconds) * 1_000_000)
    return None


def upgrade_payload(payload: Mapping[str, Any], conditions: Mapping[str, Any],
                    normalise: Normaliser | None) -> dict[str, Any]:
    """Today's record for a schema-2 ``payload`` (anything else is returned unchanged)."""
    if not is_v2_payload(payload):
        return dict(payload)
    found = conditions.get("bench")
    bench: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    body: dict[str, Any] = dict(LEGACY_FULL_LENGTH_BODY) if payload.get(_FLAG) else {}
    if isinstance(bench.get("extra_body"), Mapping):
        body.update(bench["extra_body"])
    sampler = bench.get("sampler") if isinstance(bench.get("sampler"), Mapping) else None
    sent: dict[str, Any] = {"max_tokens": payload.get("max_tokens"), "body": body}
    if sampler is not None:
        # conditions keep the dataclass (seed None included); requests carried only set values
        sent["sampler"] = {k: v for k, v in sampler.items() if v is not None}
    ttft, last = _us(payload.get("ttft_s")), _us(payload.get("last_token_s"))
    raw = payload.get("engine_timings")
    raw = dict(raw) if isinstance(raw, Mapping) else None
    timings = None
    if raw and normalise is not None:
        try:
            timings = normalise(raw)
        except Exception:  # noqa: BLE001 - an adapter that cannot read an old block leaves it raw
            timings = None
    keep = {"workload", "index", "warmup", "status", "error", "completion_tokens", "prompt_tokens",
            "finish_reason", "chunks", "content_chars", "reasoning_chars"}
    out: dict[str, Any] = {k: payload.get(k) for k in keep}
    out.update(
        sent=sent,
        sent_unix=payload.get("started_unix"),
        end_us=_us(payload.get("wall_s")),
        arrivals_us=None,
        first_last_us=[ttft, last] if (ttft is not None and last is not None) else None,
        cached_prompt_tokens=None,
        engine=None if timings is None else timings.as_dict(),
        engine_raw=raw,
        record_version=RECORD_VERSION,
        migrated_from=2,
    )
    known = keep | {"max_tokens", _FLAG, "ttft_s", "last_token_s", "wall_s", "engine_timings", "started_unix",
                    *_DERIVED}
    for key, value in payload.items():      # anything else schema 2 held is kept as it was
        if key not in known and key not in out:
            out[key] = value
    return out


def upgrade_conditions(conditions: Mapping[str, Any]) -> dict[str, Any]:
    """The ``bench`` conditions with schema 2's flag and reason renamed to today's keys."""
    out = dict(conditions)
    bench = conditions.get("bench")
    if not isinstance(bench, Mapping) or _FLAG not in bench:
        return out
    new = {k: v for k, v in bench.items() if k not in (_FLAG, f"{_FLAG}_reason")}
    new["full_length_body"] = dict(LEGACY_FULL_LENGTH_BODY) if bench.get(_FLAG) else {}
    new["full_length_reason"] = bench.get(f"{_FLAG}_reason", "")
    out["bench"] = new
    return out
