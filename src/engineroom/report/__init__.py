"""Reports rendered from stored runs: the markdown run card, and redaction for anything shared."""

from engineroom.report.card import render_card
from engineroom.report.redaction import redact

__all__ = ["redact", "render_card"]
