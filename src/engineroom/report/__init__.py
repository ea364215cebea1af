"""Reports rendered from stored runs: the markdown run card, and redaction for anything shared."""

from engineroom.redaction import redact
from engineroom.report.card import render_card

__all__ = ["redact", "render_card"]
