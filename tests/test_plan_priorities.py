"""Priorities mean what they say: for every catalog model x rig preset x priority, no
configuration the planner considered beats its pick on the priority's own rank keys.

The pick is what `engineroom plan` shows (``how_to_choose``: one plan per priority, sized
lazily in rank order); "considered" is every configuration the same planner sizes when it
is asked for all of them (``limit=None``), and the picks of the other priorities that a
priority without constraints could have chosen at its own context. A failure names the
better candidate and the key it wins on.
"""

from __future__ import annotations

import functools

import pytest

from engineroom.catalog import arch_from_catalog, load_catalog
from engineroom.fit import FitMemo
from engineroom.hardware import parse_rig
from engineroom.plan import NothingFits, Plan, how_to_choose, plan
from engineroom.plan.ranking import within_tolerance


def _rigs() -> list[str]:
    cat = load_catalog()
    specs = [f"1x{h.id}" if h.kind == "gpu" else f"{h.id}:{int(h.default_memory_gb)}GB" for h in cat.hardware]
    return specs + ["2x3090"]


CAT = load_catalog()
MODELS = [m.id for m in CAT.models]
RIGS = _rigs()


def _label(p: Plan) -> str:
    return (f"{p.engine} {p.quant} KV {p.kv_dtype}" + (f" +{p.spec}" if p.spec else "")
            + f" ({p.layout}) at {p.ctx:,} x {p.parallel}")


def _beats(a: Plan, b: Plan, keys) -> str | None:
    """The first rank key on which ``a`` is better than ``b`` beyond its tolerance (None: a
    does not beat b; the keys before it tie)."""
    for k in keys:
        x, y = a.metrics.get(k.metric), b.metrics.get(k.metric)
        if x is None or y is None:
            return None
        if within_tolerance(x, y, k.tolerance):
            continue
        better = x > y if k.goal == "max" else x < y
        return f"{k.metric} {x:,.2f} vs {y:,.2f}" if better else None
    return None


@functools.cache
def _table(model: str, rig_spec: str):
    rig = parse_rig(rig_spec, CAT)
    arch = arch_from_catalog(CAT.model(model))
    memo = FitMemo(arch, CAT.for_vendor(rig.vendor))
    picks = {c.priority: c.plan for c in how_to_choose(model, rig, catalog=CAT)}
    considered = {}
    for prio in CAT.priorities:
        try:
            considered[prio.id] = plan(model, rig, prio.id, catalog=CAT, limit=None, arch=arch, memo=memo)
        except NothingFits:
            considered[prio.id] = []
    return picks, considered


@pytest.mark.slow
@pytest.mark.parametrize("rig_spec", RIGS)
@pytest.mark.parametrize("model", MODELS)
def test_no_considered_candidate_beats_the_pick(model, rig_spec):
    picks, considered = _table(model, rig_spec)
    failures = []
    for prio in CAT.priorities:
        pick, every = picks[prio.id], considered[prio.id]
        assert (pick is None) == (not every), (f"{prio.id}: the pick and the full list disagree on whether "
                                               f"anything fits ({pick and _label(pick)}; {len(every)} considered)")
        if pick is None:
            continue
        keys = list(prio.rank)
        for other in every:
            why = _beats(other, pick, keys)
            if why:
                failures.append(f"{prio.id}: {_label(other)} beats the pick {_label(pick)} on {why}")
                break
        # a priority with no constraints could have served another priority's pick at its own context
        if prio.constraints.model_dump(exclude_defaults=True):
            continue
        target = next((p.ctx for p in every if p.ctx), pick.ctx)
        for q_id, q in picks.items():
            if q is None or q_id == prio.id or q.ctx < target or (prio.spec == "none" and q.spec):
                continue
            first = [k for k in keys if k.metric != "ctx"][:1]
            why = _beats(q, pick, first)
            if why:
                failures.append(f"{prio.id}: {q_id}'s pick {_label(q)} beats the pick {_label(pick)} on {why}")
    assert not failures, f"{model} on {rig_spec}:\n" + "\n".join(failures)


def test_concurrent_throughput_serves_a_workload_context_not_the_maximum():
    """Issue 16: the model's full 262K per stream served 22 streams and 1,036 t/s where the
    multi-tenant pick at 32K served 150 and 5,729 t/s. The default workload context is stated
    in the catalog; --ctx sets it."""
    prio = CAT.priority("concurrent-throughput")
    assert prio.ctx != "max" and "--ctx" in prio.description
    rig = parse_rig("1xH200", CAT)
    top = plan("qwen3.6-27b", rig, "concurrent-throughput", catalog=CAT, limit=1)[0]
    assert top.ctx == int(prio.ctx) and top.parallel > 1
    mt = plan("qwen3.6-27b", rig, "multi-tenant", catalog=CAT, limit=1)[0]
    assert top.aggregate_tps >= mt.aggregate_tps - 1.0
    long = plan("qwen3.6-27b", rig, "concurrent-throughput", ctx=131_072, catalog=CAT, limit=1)[0]
    assert long.ctx == 131_072 and long.parallel < top.parallel


def test_balanced_keeps_kv_precision_unless_memory_binds():
    """Issue 16: balanced picked q4_0 KV on a 140 GiB H200. Where a full-precision cache serves
    the 32K context it is kept, and the why says what it cost; where it does not, the why says
    memory binds."""
    big = plan("qwen3.6-27b", parse_rig("1xH200", CAT), "balanced", catalog=CAT, limit=1)[0]
    assert big.metrics["kv_precision"] >= 2.0, _label(big)
    assert any("KV" in r and ("precision kept" in r or "most precise" in r) for r in big.reasons), big.reasons
    small = plan("qwen3.6-27b", parse_rig("1x3090", CAT), "balanced", catalog=CAT, limit=1)[0]
    if small.metrics["kv_precision"] < 2.0:
        assert any("memory binds" in r for r in small.reasons), small.reasons
