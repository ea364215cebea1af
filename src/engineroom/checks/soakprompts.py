"""What the soak sends: its tools, system prompts, steps, the synthetic attachments, each turn's expectation."""

from __future__ import annotations

import random
import re
import secrets
import string
from collections.abc import Callable
from typing import Any

SOAK_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "grep", "description": "Search the repository for a pattern; prints file:line:text.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                       "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run pytest on a path and print its log.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]

FRESH_SYSTEM = "You are a helpful coding assistant working in a Python repository."
CONTINUOUS_SYSTEM = ("You are a coding agent debugging a failing test in a Python repository. Use the tools to read "
                     "code, search and run tests, then explain the cause and the fix.")
FRESH_STEPS: tuple[tuple[str, str], ...] = (
    ("checklist", "Give me a short checklist, five items, for reviewing a pull request."),
    ("repo_question", "Where is the command-line entry point of this repository defined? Use the tools to look."),
    ("grep_output", ""),           # the grep output comes back as the tool's result
    ("write_parser", "Write a Python function parse_kv(text) that parses key=value lines into a dict, and a pytest "
                     "test for it."),
    ("arithmetic", "What is 17 * 23 + 9? Think it through, then give the number."),
)
CONTINUOUS_STEPS: tuple[tuple[str, str], ...] = (
    ("bug_report", "tests/test_parser.py::test_roundtrip fails since yesterday's merge. Find out why: start by "
                   "reading src/parser/core.py."),
    ("code_core", "read_file"), ("code_tokens", "read_file"), ("grep_roundtrip", "grep"), ("pytest_log", "run_tests"),
)
CONTINUOUS_CALLS = {"code_core": ("read_file", {"path": "src/parser/core.py"}),
                    "code_tokens": ("read_file", {"path": "src/parser/tokens.py"}),
                    "grep_roundtrip": ("grep", {"pattern": "roundtrip", "path": "src"}),
                    "pytest_log": ("run_tests", {"path": "tests/test_parser.py"})}
FRESH_CALL = ("grep", {"pattern": "def main", "path": "."})
ENTRY_POINT = "src/app/cli/main.py"


def random_salt() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))


_WORDS = ("parse", "token", "buffer", "state", "value", "index", "line", "record", "field", "sep", "chunk", "offset",
          "reader", "writer", "cache", "limit", "scope", "node", "entry", "table")


def _ident(rng: random.Random) -> str:
    return "_".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def code_text(chars: int, rng: random.Random, module: str) -> str:
    """Python-looking source of about ``chars`` characters (varied, so it tokenizes like code)."""
    out = [f"# {module}\n\"\"\"Parser internals.\"\"\"\n\nfrom __future__ import annotations\n\n"]
    size = len(out[0])
    n = 0
    while size < chars:
        n += 1
        name, arg, other = _ident(rng), _ident(rng), _ident(rng)
        block = (f"def {name}_{n}({arg}: str, {other}: int = {rng.randint(0, 99)}) -> dict:\n"
                 f"    \"\"\"Return the {arg.replace('_', ' ')} split by {other.replace('_', ' ')}.\"\"\"\n"
                 f"    result = {{}}\n"
                 f"    for i, part in enumerate({arg}.split({rng.choice(['sep', repr('='), repr(':')])})):\n"
                 f"        if i > {other}:\n"
                 f"            break\n"
                 f"        result[part.strip()] = {rng.choice(['i', 'len(part)', 'part.lower()'])}\n"
                 f"    return result\n\n\n")
        out.append(block)
        size += len(block)
    return "".join(out)[:chars]


def grep_text(chars: int, rng: random.Random, pattern: str, hit: str | None = None) -> str:
    """``grep -rn`` output of about ``chars`` characters; ``hit`` is one line placed in the middle."""
    lines, size = [], 0
    while size < chars:
        path = f"src/{rng.choice(['app', 'parser', 'util', 'io'])}/{_ident(rng)}.py"
        line = f"{path}:{rng.randint(1, 900)}:    {_ident(rng)} = {pattern}({_ident(rng)}, {rng.randint(0, 9)})"
        lines.append(line)
        size += len(line) + 1
    if hit:
        lines.insert(len(lines) // 2, hit)
    return "\n".join(lines)[:chars]


def pytest_text(chars: int, rng: random.Random) -> str:
    """A pytest log of about ``chars`` characters, ending in the failing test's KeyError."""
    head = "============================= test session starts ==============================\n"
    lines, size = [head], len(head)
    tail = ("_________________________________ test_roundtrip _________________________________\n"
            "    def test_roundtrip():\n>       assert parse(dump(RECORD)) == RECORD\n"
            "src/parser/core.py:211: in parse\n    sep = options['sep']\nE   KeyError: 'sep'\n"
            "=========================== 1 failed, 212 passed ============================\n")
    while size < chars - len(tail):
        line = f"tests/test_{_ident(rng)}.py::test_{_ident(rng)}_{rng.randint(1, 99)} PASSED" \
               f"{' ' * rng.randint(1, 20)}[{rng.randint(1, 99):3d}%]\n"
        lines.append(line)
        size += len(line)
    return ("".join(lines) + tail)[-chars:] if chars > len(tail) else tail


EXPECT: dict[str, Callable[[str], bool]] = {
    "checklist": lambda t: sum(1 for line in t.splitlines() if re.match(r"\s*([-*•]|\d+[.)])\s+\S", line)) >= 3,
    "repo_question": lambda t: "cli" in t.lower() or "main" in t.lower(),
    "grep_output": lambda t: "cli" in t.lower() or "main.py" in t.lower(),
    "write_parser": lambda t: "def parse_kv" in t and "assert" in t,
    "arithmetic": lambda t: "400" in t,
    "bug_report": lambda t: bool(t.strip()),
    "code_core": lambda t: bool(t.strip()),
    "code_tokens": lambda t: bool(t.strip()),
    "grep_roundtrip": lambda t: bool(t.strip()),
    "pytest_log": lambda t: "sep" in t.lower() or "keyerror" in t.lower(),
}
