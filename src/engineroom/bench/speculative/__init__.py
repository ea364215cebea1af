"""The spec suite (``engineroom bench spec``): speculative-decoding acceptance from the records and the
engine's counters (``acceptance``); its requests are sent as the standard suite's (``suites.run``)."""
