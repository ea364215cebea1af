"""The flags an ik_llama.cpp ``llama-server`` binary accepts, read from its own ``--help``.

Flags drift between builds of the fork (the 0.1.5 package still takes ``-mtp`` and
``--draft-max``, which newer ik_llama.cpp rejects), so every argv engineroom renders is checked
against the installed binary's parser before anything starts: mainline's reading of the help
(``llamacpp.flags``), cached under the fork's name.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import NotFound
from ..llamacpp.discovery import Binary
from ..llamacpp.flags import check_flags, parse_help
from ..llamacpp.flags import known_flags as mainline_known_flags
from .discovery import ENGINE


def known_flags(binary: Binary, timeout: float = 20) -> frozenset[str] | None:
    """The flags the fork's ``binary`` accepts (cached per binary), or None when its help cannot be read."""
    return mainline_known_flags(binary, timeout, engine=ENGINE)


def validate_argv(binary: Binary, argv: Sequence[str]) -> str | None:
    """One sentence naming the first flag of ``argv`` that ``binary``'s parser does not know, with
    the nearest flag it does know; None when every flag is known or the help cannot be read (a
    recipe's placeholder program: ``render`` calls this too)."""
    try:
        return check_flags(binary, argv, engine=ENGINE)
    except NotFound:
        return None


__all__ = ["known_flags", "parse_help", "validate_argv"]
