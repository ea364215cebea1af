"""The agentic suite (``engineroom bench agentic``): a recorded coding-agent session replayed turn by
turn; the conversation as data and its verdicts (``session``), the run (``run``)."""
