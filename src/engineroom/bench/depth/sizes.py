"""The depth suite's sizes: the depths it measures, those that fit one server's context per slot.

``engineroom bench depth`` measures TTFT, prefill and decode with that many tokens already in
context (a salted haystack, ``suites.haystack``); ``depth.run`` sends them. Nothing here imports
the rest of bench, so every suite may read these sizes.
"""

from __future__ import annotations

from engineroom.errors import BadInput

__all__ = ["DEPTHS", "DEPTH_HEADROOM", "plan_depths"]

# The depths the spec asks for (tokens already in context when decoding starts).
DEPTHS = (1024, 10240, 32768, 92160)
# Headroom a request keeps below the context per slot: the chat template's tokens,
# the generated tokens, and the sizing tolerance (the agentic suite keeps it too).
DEPTH_HEADROOM = 256


def plan_depths(spec_depths: tuple[int, ...], n_ctx: int | None, max_tokens: int, near_end: bool = True) -> list[int]:
    """The depths that fit ``n_ctx`` (the context per slot the engine reports) with room for the
    template and ``max_tokens``; when the largest standard depth that fits is well below the
    context (a small CI model), one more near its end. BadInput when the context is unknown."""
    if not n_ctx:
        raise BadInput("the engine does not report its context size, so depths cannot be sized; "
                       "engineroom will not guess it.")
    room = n_ctx - max_tokens - DEPTH_HEADROOM
    fit = [d for d in spec_depths if d <= room]
    end = (room // 256) * 256
    if near_end and end >= 512 and (not fit or end >= 1.5 * fit[-1]) and end < max(spec_depths):
        fit.append(end)
    if not fit:
        raise BadInput(f"the engine's context per slot ({n_ctx} tokens) holds no depth to measure with "
                       f"{max_tokens} tokens out.")
    return fit
