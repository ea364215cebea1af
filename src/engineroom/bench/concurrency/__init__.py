"""The concurrency suite (``engineroom bench concurrency``): N streams at once from the engine's slot
count, latency from one scheduled send per round (``run``)."""
