"""The rate suite (``engineroom bench rate``): requests at the times of a seeded Poisson process; the
schedule, per-request latency and goodput (``arrivals``), the run (``run``)."""
