"""An engine's argument list, as every adapter reads and edits it: whether a flag is given, the value
it is given, and flags taken out with their values.

Engine-neutral: which flags an engine has, their aliases, and whether its parser keeps the first or
the last of a flag given twice stay in its adapter; these only find ``NAME VALUE`` or ``NAME=VALUE``.
"""

from __future__ import annotations

from collections.abc import Sequence


def has_flag(args: Sequence[str], *names: str) -> bool:
    """Whether any of ``names`` is among ``args``, alone or as ``NAME=VALUE``."""
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in args)


def flag_value(args: Sequence[str], *names: str, last: bool = False) -> str | None:
    """The value ``args`` give one of ``names`` (``NAME VALUE`` or ``NAME=VALUE``): the first one given,
    or with ``last`` the last one (an argparse parser keeps the last); None when none has a value."""
    args = list(args)
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a.split("=", 1)[1]
            else:
                continue
            if not last:
                return found
            value = found
    return value


def take_flags(args: Sequence[str], *names: str) -> tuple[list[str], dict[str, str]]:
    """``args`` without each of ``names`` and its value (``NAME VALUE`` or ``NAME=VALUE``), and the value
    each name was given (the last, where one is given twice). A name without its value (the last
    argument) is left in place, for the engine to refuse as it refuses any incomplete flag."""
    rest: list[str] = []
    taken: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in names and (eq or i + 1 < len(args)):
            if not eq:
                value = args[i + 1]
                i += 1
            taken[name] = value
        else:
            rest.append(arg)
        i += 1
    return rest, taken


__all__ = ["flag_value", "has_flag", "take_flags"]
