"""The depth suite's run: for every depth that fits the engine's context per slot (``depth.sizes``),
warm-ups then measured requests on a freshly salted haystack of that many tokens (sized by the
engine's tokenizer where it has one). After each request the prefix-cache guard
(``stats.cache_reuse``: the engine's cached-token count through its adapter, or its counters'
delta) decides: a sample that reused more than the chat template's shared preamble is stored,
marked ``discarded``, and re-run with a fresh salt (up to ``MAX_CACHE_RETRIES`` times).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engineroom.bench.stats import cache_reuse
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.haystack import haystack
from engineroom.bench.suites.request import phases, sequential_request
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.workloads import Workload

__all__ = ["MAX_CACHE_RETRIES", "run_depth"]

MAX_CACHE_RETRIES = 3


def run_depth(spec: SuiteSpec, ctx: SuiteContext, depths: Sequence[int], tick: Callable[[str], None]) -> None:
    client = ctx.new_client()
    for depth in depths:
        for warmup, index in phases(spec):
            for attempt in range(MAX_CACHE_RETRIES + 1):
                prompt = haystack(ctx.salts(), depth, ctx.count_tokens)
                workload = Workload(f"depth {depth}", prompt.text, spec.max_tokens)
                rec = sequential_request(spec, ctx, client, workload, index=index, warmup=warmup,
                                         extra={"group": {"depth": depth}, "salt": prompt.salt, "attempt": attempt,
                                                "target_tokens": prompt.target_tokens,
                                                "counted_tokens": prompt.counted_tokens, "sized_by": prompt.sized_by})
                reuse = cache_reuse(rec)
                if reuse.contaminated and attempt < MAX_CACHE_RETRIES:
                    rec["discarded"] = f"prefix cache: {reuse.describe()}; re-run with a fresh salt"
                    ctx.store("bench_request", rec)
                    continue
                ctx.store("bench_request", rec)
                break
            tick(f"depth {depth} {'warm-up' if warmup else 'measured'} {index + 1}")
