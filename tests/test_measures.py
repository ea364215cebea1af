"""engineroom.measures: the one reading of prefix-cache reuse and spec-decode acceptance that
bench (records) and verify (the stress ladder, the spec_decode probe) share."""

from __future__ import annotations

import pytest

from engineroom.bench.stats import cache_reuse as bench_cache_reuse
from engineroom.measures import Acceptance, cache_reuse


def test_the_engines_own_count_wins_then_usage_then_counters():
    both = cache_reuse(prompt=1000, engine_cached=10, engine_prompt=990, usage_cached=500, counter_cached=700)
    assert (both.cached, both.prompt, both.source) == (10, 1000, "the engine's per-response cached-token count")
    assert cache_reuse(prompt=1000, usage_cached=500, counter_cached=700).source.startswith("usage.")
    assert cache_reuse(prompt=1000, counter_cached=700.0).cached == 700
    assert cache_reuse(prompt=1000).cached is None and cache_reuse(prompt=1000).source == "not reported"
    # the prompt in all is at least what the engine computed plus what it took from the cache
    assert cache_reuse(prompt=None, engine_cached=300, engine_prompt=200).prompt == 500


@pytest.mark.parametrize(("cached", "prompt", "dirty"), [(0, 100, False), (64, 100, False), (65, 100, True),
                                                          (400, 10_000, False), (501, 10_000, True)])
def test_contaminated_beyond_the_template_preamble(cached, prompt, dirty):
    assert cache_reuse(prompt=prompt, usage_cached=cached).contaminated is dirty


def test_bench_reads_a_record_through_the_same_rule():
    rec = {"prompt_tokens": 1000, "cached_prompt_tokens": 60,
           "engine": {"cached_tokens": None, "prompt_tokens": None}}
    got = bench_cache_reuse(rec)
    assert got == cache_reuse(prompt=1000, usage_cached=60) and not got.contaminated


def test_acceptance_rate_tokens_per_step_and_mean_length():
    a = Acceptance(drafted=40, accepted=30, generated=60, drafts=10)
    assert a.rate == 0.75 and a.tokens_per_step == 2.0 and a.mean_length == 4.0
    assert Acceptance(drafted=0, accepted=0).rate is None and Acceptance(drafted=5, accepted=1).tokens_per_step is None
    assert Acceptance(drafted=5, accepted=0, generated=0).tokens_per_step == 0.0
    assert Acceptance(drafted=5, accepted=5, generated=5).tokens_per_step == 5.0    # never divides by zero
