"""Throughput bench: workloads, a streamed runner that emits raw records, and statistics
recomputed from those records only."""

from engineroom.bench.runner import (
    BenchPlan,
    BenchRequest,
    BenchResult,
    Sampler,
    bench_conditions,
    decode_rate,
    ignore_eos_decision,
    measure_request,
    run_bench,
)
from engineroom.bench.statistics import BENCH_RECORD_KIND, summarize
from engineroom.bench.workloads import (
    CODE,
    DEFAULT_SUITE,
    DEFAULT_WORKLOADS,
    NARRATIVE,
    SUITES,
    Suite,
    Workload,
    default_workloads,
    suite,
)

__all__ = [
    "BENCH_RECORD_KIND",
    "BenchPlan",
    "BenchRequest",
    "BenchResult",
    "CODE",
    "DEFAULT_SUITE",
    "DEFAULT_WORKLOADS",
    "NARRATIVE",
    "SUITES",
    "Sampler",
    "Suite",
    "Workload",
    "bench_conditions",
    "decode_rate",
    "default_workloads",
    "ignore_eos_decision",
    "measure_request",
    "run_bench",
    "suite",
    "summarize",
]
