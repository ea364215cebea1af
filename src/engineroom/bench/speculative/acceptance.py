"""Speculative-decoding acceptance, from the stored records and from the engine's counters.

Two independent sources, both engine-neutral:

- per response: ``engine.draft_tokens`` / ``engine.draft_accepted`` (the adapter's
  normalisation of the engine's own per-response fields), summed over every stored request of
  the run (warm-ups and discarded samples included: the engine counted them too);
- the engine's counters over the run (``engine_metrics`` before / after, neutral names):
  ``spec_drafted_tokens_total``, ``spec_accepted_tokens_total``, ``spec_drafts_total``.

Acceptance rate = accepted / drafted; fire rate = requests in which the drafter proposed
anything / requests (an acceptance quoted without it misleads: 0.99 acceptance while firing on
a quarter of the requests); mean acceptance length = 1 + accepted / drafts (tokens a verify
step yields, the target's own token included), from the counters where they count drafts.
``agrees`` says whether the records' sums equal the counters' deltas exactly; tokens per step
(generated / (generated - accepted)) from the records. SKIP, with the reason, when the engine
exposes neither. The arithmetic is ``engineroom.measures.Acceptance``, the one verify's
``spec_decode`` probe uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engineroom.measures import Acceptance
from engineroom.records.statistics import engine_counters, engine_timings, payloads

__all__ = ["FIRE_RATE_WARN", "acceptance"]

FIRE_RATE_WARN = 0.5


def acceptance(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    records = list(records)
    reqs = payloads(records)
    drafted = accepted = generated = 0
    fired = reported = 0
    for r in reqs:
        t = engine_timings(r)
        if t is None or t.draft_tokens is None:
            continue
        reported += 1
        drafted += int(t.draft_tokens or 0)
        accepted += int(t.draft_accepted or 0)
        generated += int(t.decode_tokens or r.get("completion_tokens") or 0)
        fired += 1 if (t.draft_tokens or 0) > 0 else 0
    counted = engine_counters(records)
    delta = counted["delta"] if counted else {}
    c_drafted = delta.get("spec_drafted_tokens_total")
    c_accepted = delta.get("spec_accepted_tokens_total")
    c_drafts = delta.get("spec_drafts_total")
    per_response = Acceptance(drafted=drafted, accepted=accepted, generated=generated if reported else None)
    counters = Acceptance(drafted=round(c_drafted or 0), accepted=round(c_accepted or 0),
                          drafts=round(c_drafts) if c_drafts else None)
    out: dict[str, Any] = {
        "requests": len(reqs), "requests_reporting": reported,
        "drafted": drafted if reported else None, "accepted": accepted if reported else None,
        "acceptance_rate": per_response.rate,
        "tokens_per_step": per_response.tokens_per_step if drafted else None,
        "fire_rate": fired / len(reqs) if reqs and reported else None,
        "counters_drafted": c_drafted, "counters_accepted": c_accepted, "counters_drafts": c_drafts,
        "counters_acceptance_rate": counters.rate if c_drafted and c_accepted is not None else None,
        "mean_acceptance_length": counters.mean_length if c_accepted is not None else None,
        "agrees": None, "skip": None, "warning": None,
    }
    if not reported and c_drafted is None:
        out["skip"] = "the engine reports no draft counts (no per-response draft fields, no speculative counters)"
        return out
    if not drafted and not c_drafted:
        out["skip"] = "speculative decoding did not draft anything in this run (not enabled, or nothing to look up)"
        return out
    if reported and c_drafted is not None:
        out["agrees"] = drafted == round(c_drafted) and accepted == round(c_accepted or 0)
    if out["fire_rate"] is not None and out["fire_rate"] < FIRE_RATE_WARN:
        out["warning"] = (f"the drafter fired on {fired} of {len(reqs)} requests ({out['fire_rate']:.0%}); "
                          "the acceptance rate covers only those")
    return out
