"""The flags a ``llama-server`` binary accepts, read from its own ``--help`` (and, for a flag the
help leaves out, from its parser itself).

Flags drift between builds (llama.cpp renames and removes options from release to release; the
fork ik_llama.cpp, which imports this module, drifts from mainline), so ``recipe`` and ``up``
check every argv engineroom renders against the installed binary's parser before anything
starts. The list is read once per binary (path, size, mtime) and kept in memory and in the cache
folder, per engine.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Sequence

from ... import paths
from ...errors import NotFound
from .discovery import ENGINE, Binary

# one option line of the usage text: the flag column, from the margin (mainline b11434) or after a
# few spaces (ik_llama.cpp 0.1.5): "-np,   --parallel N"; a description's continuation is indented further
_OPTION_LINE = re.compile(r"^\s{0,16}(-{1,2}[A-Za-z].*)$")
_FLAG = re.compile(r"(?<![\w-])(-{1,2}[A-Za-z][A-Za-z0-9_-]*)")
_LOOKS_LIKE_FLAG = re.compile(r"^-{1,2}[A-Za-z]")
_MEMO: dict[str, frozenset[str]] = {}


def parse_help(text: str) -> frozenset[str]:
    """Every flag named in the option column of ``llama-server --help`` (descriptions are skipped:
    the column ends at the first run of two or more spaces after the flags)."""
    found: set[str] = set()
    for line in text.splitlines():
        m = _OPTION_LINE.match(line)
        if not m:
            continue
        column = re.split(r"\s{2,}(?=[A-Za-z(\[])", m.group(1).strip(), maxsplit=1)[0]
        found.update(f.rstrip("-") for f in _FLAG.findall(column))
    return frozenset(found)


def _key(binary: Binary) -> str | None:
    try:
        st = binary.path.stat()
    except OSError:
        return None
    raw = f"{binary.path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def known_flags(binary: Binary, timeout: float = 20, engine: str = ENGINE) -> frozenset[str] | None:
    """The flags ``binary`` accepts (cached per binary), or None when its help cannot be read."""
    if not binary.path.is_absolute():
        return None                       # a recipe's placeholder: nothing to ask
    key = _key(binary)
    if key is None:
        return None
    if key in _MEMO:
        return _MEMO[key]
    cache = paths.cache_dir() / "engines" / engine / f"flags-{key}.json"
    try:
        flags = frozenset(json.loads(cache.read_text()))
    except (OSError, ValueError, TypeError):
        try:
            proc = subprocess.run([str(binary.path), "--help"], capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, **binary.env}, errors="replace")
        except (OSError, subprocess.TimeoutExpired):
            return None
        flags = parse_help(proc.stdout + proc.stderr)
        if len(flags) < 20:               # not a usage text: do not cache a failure
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(sorted(flags)))
    _MEMO[key] = flags
    return flags


def flags_in(argv: Sequence[str]) -> list[str]:
    """The flag names among ``argv[1:]`` (``--flag=value`` counts as ``--flag``; negative numbers are values)."""
    return [a.split("=", 1)[0] for a in list(argv)[1:] if _LOOKS_LIKE_FLAG.match(a)]


_ASKED: dict[tuple[str, str], bool] = {}


def parser_accepts(binary: Binary, flag: str, value: str | None, timeout: float = 10) -> bool:
    """Ask the binary's parser itself about a flag its --help does not list (the 0.1.5 help omits
    ``-a``, ``-sm``, ``-ngl``, ``-rtr`` and more): ``llama-server FLAG [VALUE] --version`` stops
    with "unknown argument: FLAG" (mainline: "invalid argument: FLAG") when the parser lacks it, and
    prints its version once past it."""
    key = (_key(binary) or str(binary.path), f"{flag} {value or ''}")
    if key in _ASKED:
        return _ASKED[key]
    cmd = [str(binary.path), flag, *([value] if value is not None else []), "--version"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace",
                              env={**os.environ, **binary.env})
        out = proc.stdout + proc.stderr
        # ik_llama.cpp 0.1.5: "unknown argument: FLAG"; mainline b11434: "error: invalid argument: FLAG"
        ok = f"unknown argument: {flag}" not in out and f"invalid argument: {flag}" not in out
    except subprocess.TimeoutExpired:
        ok = True                          # it got past parsing and went on: the flag is the parser's
    except OSError:
        return True                        # cannot ask: leave it to the start
    _ASKED[key] = ok
    return ok


def check_flags(binary: Binary, argv: Sequence[str], engine: str = ENGINE) -> str | None:
    """One sentence naming the first flag of ``argv`` that ``binary``'s parser does not know, with
    the nearest flag it does know; None when every flag is known. Flags its --help lists pass at
    once; others are put to the parser itself (``parser_accepts``). Raises NotFound when the
    binary's help cannot be read (nothing was checked)."""
    known = known_flags(binary, engine=engine)
    if known is None:
        raise NotFound(f"{binary.path} --help does not list its flags")
    args = list(argv)
    for i, arg in enumerate(args[1:], start=1):
        if not _LOOKS_LIKE_FLAG.match(arg):
            continue
        flag, eq, inline = arg.partition("=")
        if flag in known:
            continue
        nxt = args[i + 1] if i + 1 < len(args) and not _LOOKS_LIKE_FLAG.match(args[i + 1]) else None
        if parser_accepts(binary, flag, inline if eq else nxt):
            continue
        near = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
        hint = f"; the nearest it has is {near[0]}" if near else f"; see `{binary.path} --help`"
        return f"{engine}'s llama-server ({binary.path}) has no flag {flag}{hint}."
    return None


def validate_argv(binary: Binary, argv: Sequence[str]) -> str | None:
    """``check_flags`` for mainline llama.cpp (the ``validate_argv`` hook ``recipe`` and ``up`` call)."""
    return check_flags(binary, argv)
