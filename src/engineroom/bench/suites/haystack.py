"""Salted haystacks: the prompt every depth, concurrency, sweep and rate request sends.

Filler prose, deterministic per *salt*, with the salt at the very start, so no two haystacks share
a prefix an engine's prefix cache could reuse. A fresh salt is drawn for every request
(``fresh_salt``). Sized in real tokens through the engine's own tokenizer where its adapter exposes
one (``Engine.count_tokens``, passed in as a ``TokenCounter``), else by a 4-characters-per-token
estimate (the record says which: ``sized_by``).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from engineroom.errors import BadInput

__all__ = ["CHARS_PER_TOKEN_ESTIMATE", "SizedPrompt", "TokenCounter", "fresh_salt", "haystack"]

TokenCounter = Callable[[str], "int | None"]    # text -> the engine's token count (None: it cannot say)
CHARS_PER_TOKEN_ESTIMATE = 4.0     # only where the engine has no tokenizer endpoint

_FILLER = (
    "The archive room kept its ledgers in rows of grey boxes, each labelled by year and shelf.",
    "A courier crossed the river twice a week, carrying seed catalogues and letters about the weather.",
    "The lighthouse keeper logged wind speed, visibility and the names of ships that passed at dusk.",
    "In the market square the clock ran four minutes slow, and nobody had corrected it in a decade.",
    "The survey team measured the glacier's edge with stakes, tape and a notebook kept dry in oilcloth.",
    "Bakers on the north street started at three, and the smell of rye reached the station by five.",
    "The library's map drawer held coastal charts, railway plans and a sketch of a garden long gone.",
    "Every spring the orchard was pruned by hand, and the cuttings were stacked to dry for kindling.",
    "The observatory's logbook noted cloud cover, seeing conditions and the temperature of the dome.",
    "A ferry timetable from an old summer listed crossings at seven, eleven, three and half past six.",
    "The engineer checked the pump house gauges at noon and wrote the pressures on a chalk board.",
    "Along the canal the lock keeper's cottage had a blue door, a bench and a row of potted herbs.",
)


def fresh_salt() -> str:
    """A new salt: 12 hex digits from the OS's randomness, never reused within a run."""
    return secrets.token_hex(6)


@dataclass(frozen=True)
class SizedPrompt:
    text: str
    salt: str
    target_tokens: int
    counted_tokens: int | None       # the engine's count of ``text`` (None: estimated)
    sized_by: str                    # "engine tokenizer" | "estimate (4 chars/token)"


def _filler(salt: str, n_chars: int) -> str:
    rng = random.Random(salt)
    parts: list[str] = [f"Record {salt}. Read the notes below; a question about them follows.\n"]
    size = len(parts[0])
    i = 0
    while size < n_chars:
        sentence = f"({salt[:4]}-{i}) " + rng.choice(_FILLER)
        parts.append(sentence)
        size += len(sentence) + 1
        i += 1
    return " ".join(parts)


def haystack(salt: str, tokens: int, count: TokenCounter | None = None,
             question: str = "In one sentence, what is the record about?") -> SizedPrompt:
    """A salted haystack of about ``tokens`` tokens (the engine's tokenizer when ``count`` gives
    a number: the text is grown or cut until its count is within 2% below the target)."""
    if tokens < 16:
        raise BadInput(f"a haystack needs at least 16 tokens, not {tokens}.")
    tail = f"\n\n{question}"
    ratio = CHARS_PER_TOKEN_ESTIMATE
    text = _filler(salt, int(tokens * ratio)) + tail
    if count is None:
        return SizedPrompt(text, salt, tokens, None, f"estimate ({CHARS_PER_TOKEN_ESTIMATE:g} chars/token)")
    counted = count(text)
    if counted is None:
        return SizedPrompt(text, salt, tokens, None, f"estimate ({CHARS_PER_TOKEN_ESTIMATE:g} chars/token)")
    for _ in range(4):      # rescale by the measured ratio; a few rounds land within 2%
        if 0.98 * tokens <= counted <= tokens:
            break
        ratio = len(text) / max(counted, 1)
        text = _filler(salt, int(len(text) * tokens / max(counted, 1) * 0.995)) + tail
        counted = count(text)
        if counted is None:
            return SizedPrompt(text, salt, tokens, None, f"estimate ({ratio:.2f} chars/token)")
    return SizedPrompt(text, salt, tokens, counted, "engine tokenizer")
