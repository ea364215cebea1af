"""fit's searches (max context, max concurrency) and the memo the planner sizes through.

The searches guess from the margins and then gallop and bisect; the answer must be the one a
plain scan of ``fit`` gives: the largest servable value (memory grows with context and with
sequences). The memo must answer exactly what ``fit`` answers.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engineroom.catalog import arch_from_catalog, load_catalog
from engineroom.fit import FitMemo, FitRequest, fit, max_concurrency, max_context
from engineroom.hardware import parse_rig

CASES = [  # (rig, model, engine, quant, kv)
    ("1x3090", "qwen3.6-27b", "llama.cpp", "Q4_K_M", "q4_0"),
    ("1x3090", "qwen3.6-27b", "llama.cpp", "Q4_K_M", "f16"),
    ("2x3090", "qwen3.6-27b", "llama.cpp", "Q4_K_M", "q8_0"),
    ("1x3090", "qwen3.6-35b-a3b", "ik_llama.cpp", "Q4_K_M", "q8_0"),
    ("1xH200", "qwen3.6-27b", "vllm", "fp8", "fp8"),
    ("1x4090", "llama-3.1-8b", "vllm", "fp8", "auto"),
    ("cpu:32GB", "llama-3.1-8b", "llama.cpp", "Q4_K_M", "q8_0"),
]


def _case(rig_spec: str, model: str, engine: str, quant: str, kv: str):
    cat = load_catalog()
    rig = parse_rig(rig_spec, cat)
    cat = cat.for_vendor(rig.vendor)
    m = cat.model(model)
    q = m.quant(quant) if m else None
    if m is None or q is None or engine not in q.engines:
        pytest.skip(f"the catalog has no {model} {quant} for {engine} (catalog changed)")
    e = cat.engine(engine)
    req = FitRequest(engine=engine, ctx=4096, quant=q.id, weight_bytes=q.weight_bytes, kv_dtype=kv,
                     mem_fraction=e.default_mem_fraction)
    return arch_from_catalog(m), req, rig, cat


def _scan_ctx(arch, req, rig, cat) -> int:
    """The reference: the largest step whose fit is servable, by bisection over ``fit`` only
    (the search's answer before it guessed from margins)."""
    step = cat.engine(req.engine).max_context_step
    lo, hi = 0, (arch.max_position or (1 << 21)) // step + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fit(arch, replace(req, ctx=mid * step), rig, catalog=cat).servable:
            lo = mid
        else:
            hi = mid
    return lo * step


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_max_context_is_the_largest_servable_context(case):
    arch, req, rig, cat = _case(*case)
    for parallel in (1, 3):
        r = replace(req, parallel=parallel)
        got = max_context(arch, r, rig, catalog=cat)
        assert got == _scan_ctx(arch, r, rig, cat)
        if got:
            assert fit(arch, replace(r, ctx=got), rig, catalog=cat).servable
        if got and got < (arch.max_position or 0):
            step = cat.engine(req.engine).max_context_step
            assert not fit(arch, replace(r, ctx=got + step), rig, catalog=cat).servable


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_max_concurrency_is_the_largest_servable_count(case):
    arch, req, rig, cat = _case(*case)
    for ctx in (4096, 32768):
        r = replace(req, ctx=ctx)
        got = max_concurrency(arch, r, rig, limit=256, catalog=cat)
        ok = [n for n in range(1, 257) if fit(arch, replace(r, parallel=n), rig, catalog=cat).servable]
        assert got == (max(ok) if ok else 0)
        assert ok == list(range(1, got + 1)), "servable counts are not a prefix: the search's premise fails"


def test_memo_answers_what_fit_answers_and_counts_its_work():
    arch, req, rig, cat = _case(*CASES[0])
    memo = FitMemo(arch, cat)
    a = max_context(arch, req, rig, catalog=cat, fitter=memo)
    computed = memo.computed
    assert computed >= 2 and memo.calls == computed
    assert max_context(arch, req, rig, catalog=cat, fitter=memo) == a
    assert memo.computed == computed and memo.calls == 2 * computed   # the second search computed nothing
    assert memo.fit(req, rig) == fit(arch, req, rig, catalog=cat)
    other = replace(req, kv_dtype="q8_0")
    assert memo.fit(other, rig) == fit(arch, other, rig, catalog=cat)   # a different request is sized anew
