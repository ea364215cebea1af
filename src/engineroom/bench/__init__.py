"""Throughput bench: workloads, a streamed runner that emits raw records (``records.request``),
the suites; every figure is recomputed from the records by ``records.statistics``."""

from engineroom.bench.runner import (
    BenchPlan,
    BenchResult,
    Sampler,
    bench_conditions,
    full_length_decision,
    measure_request,
    run_bench,
)
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
    "BenchPlan",
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
    "default_workloads",
    "full_length_decision",
    "measure_request",
    "run_bench",
    "suite",
]
