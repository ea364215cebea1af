"""Throughput bench: workloads, a streamed runner that emits raw records, and statistics
recomputed from those records only."""

from engineroom.bench.records import RECORD_VERSION, decode_arrivals, encode_arrivals
from engineroom.bench.runner import (
    BenchPlan,
    BenchRequest,
    BenchResult,
    Sampler,
    bench_conditions,
    decode_rate,
    full_length_decision,
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
    "RECORD_VERSION",
    "SUITES",
    "Sampler",
    "Suite",
    "Workload",
    "bench_conditions",
    "decode_arrivals",
    "decode_rate",
    "default_workloads",
    "encode_arrivals",
    "full_length_decision",
    "measure_request",
    "run_bench",
    "suite",
    "summarize",
]
