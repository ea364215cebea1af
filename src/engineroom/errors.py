"""Errors a user can cause. The CLI prints their message as one sentence and exits non-zero."""

from __future__ import annotations


class EngineroomError(Exception):
    """A user-facing failure: ``str(err)`` is one clear sentence; ``exit_code`` is non-zero.

    ``detail`` holds optional extra lines (for example the tail of an engine log) that the
    CLI prints after the sentence.
    """

    exit_code = 2

    def __init__(self, message: str, *, detail: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.detail = detail
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(EngineroomError):
    """The user gave something we cannot use (unknown model ref, malformed file, bad spec)."""


class NotFound(EngineroomError):
    """A binary, model or server that should exist does not."""


class EngineFailed(EngineroomError):
    """The engine process died, timed out, or answered in a way that is not OpenAI-compatible."""

    exit_code = 3


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none), without the
    closing full stop, at most 200 characters: a cause quoted inside one of engineroom's sentences."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else exc.__class__.__name__
    return line.rstrip(".")[:200]


def first_sentence(exc: BaseException) -> str:
    """The first sentence of ``first_line(exc)``."""
    line = first_line(exc)
    return line.split(". ")[0]
