"""The code names ARCHITECTURE.md, docs/where-things-live.md and docs/testing.md mention are the tree's
(issue 18 item 6: the architecture accurate, its claims checked): every dotted name (`flows.pick_of`,
`plan/candidates.held_on_cpu`), path (`flows/stages.py`, `tests/conftest.py::console_command`), module
file named in a room of the table (`bench/`'s `runner.py`) and code identifier (`StageLog`, `open_run`) in a
code span or in the architecture's diagram resolves; the Layers block is pyproject's import-linter layers."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from functools import cache
from pathlib import Path

import engineroom

SRC = Path(engineroom.__file__).resolve().parent
ROOT = SRC.parent.parent
DOCS = ("ARCHITECTURE.md", "docs/where-things-live.md", "docs/testing.md")
# other programs' names the docs cite (vLLM's, SGLang's, CPython's, Python's, a CPU flag), environment
# variables of other tools, and placeholders
OUTSIDE = frozenset({"make_arg_parser", "ServerArgs", "CacheDType", "run_eval_code_obj", "TYPE_CHECKING",
                     "HF_HUB_OFFLINE", "PIP_CACHE_DIR", "COLUMNS", "PATH", "NORMAL", "DIR", "avx512_fp16",
                     "amx_fp16"})


@cache
def _words_in_the_tree() -> frozenset[str]:
    """Every name src/engineroom and tests define (functions, classes, assignments, fields, arguments), every
    identifier-like string literal of src/engineroom (record kinds, check names, variables) and catalog key."""
    words: set[str] = set()
    tests = [p for p in (ROOT / "tests").glob("*.py") if p.name != Path(__file__).name]
    for path in [*SRC.rglob("*.py"), *tests]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                words.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                words.add(node.id)
            elif isinstance(node, ast.arg):
                words.add(node.arg)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                words.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and path.is_relative_to(SRC):
                words.update(re.findall(r"[A-Za-z_][\w.]*", node.value))
    for path in SRC.rglob("*.yaml"):
        words.update(re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8")))
    return frozenset(words)


def _dotted_resolves(name: str) -> bool:
    """``a.b.c`` as engineroom's module ``a.b`` (or ``a``) and attributes after it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("engineroom." + ".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _is_module(first: str) -> bool:
    return (SRC / f"{first}.py").is_file() or (SRC / first / "__init__.py").is_file()


def _path_resolves(text: str, room: str | None) -> bool:
    """``dir/file.py``, ``pkg/``, ``pkg/module.name``, ``tests/x.py::name`` under the repository, the package
    or the room's package; a bare folder (``llamacpp/``) anywhere in the package."""
    path, _, member = text.partition("::")
    bases = [ROOT, SRC] + ([SRC / room] if room else [])
    if not member and not any((b / path).exists() for b in bases) and re.fullmatch(r"[\w/]+\.[A-Za-z_]\w*", path):
        stem, _, member = path.rpartition(".")  # plan/candidates.held_on_cpu
        path = stem + ".py"
    found = any((b / path).exists() for b in bases)
    if not found and re.fullmatch(r"\w+/", path):
        found = any(p.is_dir() for p in SRC.rglob(path.rstrip("/")))
    return found and (not member or member in _words_in_the_tree())


def unresolved(text: str) -> list[str]:
    """The code spans (and diagram names) of one markdown page that name nothing in the tree."""
    bad: list[str] = []
    for block in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        if block[0] == "":                     # a diagram or a command block: its dotted module names, its files
            for n in re.findall(r"\b[a-z_]+(?:\.[A-Za-z_]\w*)+", block[1]):
                if n.endswith(".py"):
                    bad += [] if any(SRC.rglob(n)) else [n]
                elif _is_module(n.split(".")[0]) and not _dotted_resolves(n):
                    bad.append(n)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for line in text.splitlines():
        first = re.match(r"\| `(\w+)/` \|", line)              # a room of the table: its files are under it
        room = first.group(1) if first else None
        for span in re.findall(r"`([^`\n]+)`", line):
            name = re.sub(r"\(.*\)$", "", span.strip())           # `find_binary(explicit)`
            name = name.removeprefix("engineroom.")                 # `engineroom.cli.run`
            if not re.fullmatch(r"[A-Za-z_][\w./:-]*", name) or name in OUTSIDE:   # <id>: a placeholder
                continue
            if "/" in name or "::" in name:
                ok = _path_resolves(name, room)
            elif name.endswith(".py"):
                under = SRC / room if room else SRC
                ok = any(under.rglob(name)) or (ROOT / name).exists()
            elif "." in name:
                head = name.split(".")[0]
                if _is_module(head):
                    ok = _dotted_resolves(name)
                elif head == "conftest":
                    ok = name.split(".", 1)[1] in _words_in_the_tree()
                elif head[:1].isupper():                       # Class.member
                    ok = name.rsplit(".", 1)[1] in _words_in_the_tree()
                else:
                    continue                                   # a file name (server.json), llama.cpp
            elif "_" in name or (name[:1].isupper() and not name.isupper()) or name != name.lower():
                ok = name in _words_in_the_tree()
            else:
                continue                                       # a plain word: a command, a field, a value
            if not ok:
                bad.append(span)
    return bad


def test_the_checker_finds_names_that_are_not_in_the_tree():
    page = ("| `bench/` | `runner.py`, `nosuchfile.py`, `compare_arms` |\n"
            "`flows.pick_of`, `flows.pick_of_old`, `flows/stages.py`, `flows/gone.py`, `plan/candidates.held_on_cpu`,"
            " `plan/candidates.no_such_name`, `tests/conftest.py::console_command`, `NoSuchClass`, `no_such_function`,"
            " `StageLog`, `Catalog.engine`, `conftest.fuzz_examples`, `conftest.no_such_helper`, `up`, `server.json`,"
            " `engineroom.cli.run`, `engineroom.cli.walk`\n"
            "```\n flows.prepare ──► engines.Engine.render ──► flows.options_from_plan\n refs.py  gone.py\n```\n")
    assert unresolved(page) == ["flows.options_from_plan", "gone.py", "nosuchfile.py", "flows.pick_of_old",
                                "flows/gone.py", "plan/candidates.no_such_name", "NoSuchClass", "no_such_function",
                                "conftest.no_such_helper", "engineroom.cli.walk"]
    # a room's files are looked for in its own package: records/'s request.py is not bench/'s runner.py
    assert unresolved("| `records/` | `runner.py` |") == ["runner.py"]


def test_every_code_name_the_architecture_and_the_contributor_docs_mention_exists():
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        if doc == "docs/testing.md":        # its measured log names what the tree held then
            text = text.split("\n## Measured")[0]
        assert not unresolved(text), f"{doc} names what the tree does not hold: {unresolved(text)}"


def test_the_layers_drawn_are_the_import_contract():
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c["layers"] for c in contract["contracts"] if c["type"] == "layers")
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    drawn = re.search(r"## Layers.*?```\n(.*?)```", text, flags=re.S)
    assert drawn, "ARCHITECTURE.md has no Layers block"
    assert [" ".join(layer.split()) for layer in " ".join(drawn.group(1).split()).split(" > ")] == \
        [" ".join(layer.split()) for layer in layers]
