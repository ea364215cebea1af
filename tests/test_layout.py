"""The source tree's shape: no module under src/engineroom much over 500 lines, no private name imported
across modules, no import cycle, no block of six lines repeated among the engine adapters."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import engineroom

MAX_LINES = 500
SRC = Path(engineroom.__file__).resolve().parent


def test_every_module_has_at_most_500_lines():
    modules = sorted(SRC.rglob("*.py"))
    assert modules, f"no module found under {SRC}"
    counts = {p.relative_to(SRC.parent).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in modules}
    over = {name: n for name, n in counts.items() if n > MAX_LINES}
    listing = ", ".join(f"{name} ({n} lines)" for name, n in sorted(over.items(), key=lambda kv: -kv[1]))
    assert not over, f"{len(over)} module(s) over {MAX_LINES} lines: {listing}"


# -- no private name imported across modules ------------------------------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, package: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of every private name ``source`` (a module of ``package``) imports from an
    engineroom module: ``from engineroom.x import _y`` or ``from .x import _y`` (``as`` changes nothing), and
    ``import engineroom.x._y``. A public name imported ``as _alias`` is not one."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "engineroom"):
            if node.level:
                parts = package.split(".")
                module = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = str(node.module)
            found += [(node.lineno, module, a.name) for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.rpartition(".")[0], a.name.rpartition(".")[2]) for a in node.names
                      if a.name.split(".")[0] == "engineroom" and any(_is_private(p) for p in a.name.split("."))]
    return found


def test_the_private_import_finder_sees_every_form():
    src = ("from engineroom.bench.suites.run import _payload, request_record\n"
           "from .gguf import (\n    GGUFArray,\n    _first_sentence as first,\n)\n"
           "from .. import _hidden\n"
           "import engineroom.fit._secret\n"
           "from engineroom.values import int_or_none as _int\n"
           "from engineroom import __version__\n"
           "from collections import _private_stdlib\n")
    assert private_imports(src, "engineroom.arch") == [
        (1, "engineroom.bench.suites.run", "_payload"), (2, "engineroom.arch.gguf", "_first_sentence"),
        (6, "engineroom", "_hidden"), (7, "engineroom.fit", "_secret")]


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its module's own; one that another module needs is public
    (named for what it is) or lives in the module whose concept it is."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        package = ".".join(["engineroom", *rel.parent.parts])
        for line, module, name in private_imports(path.read_text(encoding="utf-8"), package):
            offenders.append(f"src/engineroom/{rel.as_posix()}:{line} imports {name} from {module}")
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


# -- no import cycle --------------------------------------------------------------------------------


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module in ``imports`` (module -> the modules it
    imports): each is at least one cycle. A module importing itself is not a cycle between modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(imports.get(v, ())):
            if w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(imports):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"c"}}) == []


def test_no_import_cycle_between_modules():
    """No module of engineroom reaches itself through its imports, as grimp reads them: module-level,
    inside functions (lazy) and under ``if TYPE_CHECKING:`` alike; a package's ``__init__`` is a module too.
    A piece two modules both need lives below both (or in a module of its own)."""
    import grimp

    graph = grimp.build_graph("engineroom", include_external_packages=False)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = import_cycles(imports)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(" <-> ".join(component) + ":")
        for importer in component:
            for imported in sorted(imports[importer] & members - {importer}):
                for d in graph.get_import_details(importer=importer, imported=imported):
                    lines.append(f"  {importer}:{d['line_number']} {d['line_contents']}")
    assert not cycles, "import cycles:\n" + "\n".join(lines)


# -- no block repeated among the adapters -----------------------------------------------------------

MIN_REPEAT = 6
ENGINES = SRC / "engines"


def code_lines(source: str) -> list[tuple[int, str]]:
    """(line number, text) of the lines of ``source`` that count as code: white space stripped, comments
    cut off; blank and comment-only lines, imports and docstrings (a module's, class's or function's
    first string) left out."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        elif isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                skipped.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return [(n, text.strip()) for n, text in enumerate(lines, start=1) if n not in skipped and text.strip()]


def repeated_blocks(sources: dict[str, str], least: int = MIN_REPEAT) -> list[tuple[str, int, int, str, int, int]]:
    """Every run of ``least`` or more consecutive code lines (``code_lines``) that stands twice among
    ``sources`` (name -> text), in two files or twice in one: (file, first line, last line) of each
    place, each pair once, its longest run."""
    coded = {name: code_lines(text) for name, text in sorted(sources.items())}
    seen: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for name, lines in coded.items():
        for i in range(len(lines) - least + 1):
            seen.setdefault(tuple(t for _, t in lines[i:i + least]), []).append((name, i))
    starts = {(a, b) for places in seen.values() for k, a in enumerate(places) for b in places[k + 1:]}
    found = []
    for (fa, ia), (fb, ib) in sorted(starts):
        if ((fa, ia - 1), (fb, ib - 1)) in starts:
            continue                    # inside a longer run that starts earlier
        n = least
        while ((fa, ia + n - least + 1), (fb, ib + n - least + 1)) in starts:
            n += 1
        a, b = coded[fa], coded[fb]
        found.append((fa, a[ia][0], a[ia + n - 1][0], fb, b[ib][0], b[ib + n - 1][0]))
    return found


def test_the_repeat_finder_sees_a_block_again_whatever_its_spacing_and_comments():
    block = ("def f(x):\n    '''Doc.'''\n    import os\n    a = x + 1\n    b = a * 2\n    c = b - 3\n"
             "    d = c / 4\n    e = d ** 5\n    return e\n")
    # the same lines with other blank lines, comments and indentation, no docstring, no import
    again = ("# a comment\n\ndef f(x):\n    a = x + 1   # why\n\n    b = a * 2\n    c = b - 3\n"
             "        # more\n    d = c / 4\n    e = d ** 5\n    return e\n")
    assert repeated_blocks({"one.py": block, "two.py": again}) == [("one.py", 1, 9, "two.py", 3, 11)]
    # twice in one file (its first line renamed), and in three places: each pair named
    assert repeated_blocks({"one.py": block + "\n\n" + block.replace("f(x)", "g(x)")}) == [
        ("one.py", 4, 9, "one.py", 15, 20)]
    assert repeated_blocks({"a.py": block, "b.py": block, "c.py": block}) == [
        ("a.py", 1, 9, "b.py", 1, 9), ("a.py", 1, 9, "c.py", 1, 9), ("b.py", 1, 9, "c.py", 1, 9)]
    # six lines alike are a block; a change in the middle leaves two runs of three, none
    assert repeated_blocks({"one.py": block, "two.py": block.replace("return e", "return -e")}) == [
        ("one.py", 1, 8, "two.py", 1, 8)]
    assert repeated_blocks({"one.py": block, "two.py": block.replace("c = b - 3", "c = b - 4")}) == []
    # imports and docstrings do not count
    imports = "import a\nimport b\nfrom c import (\n    d,\n    e,\n    f,\n    g,\n)\n"
    doc = 'def h():\n    """One.\n    two\n    three\n    four\n    five\n    six\n    """\n    return 1\n'
    assert repeated_blocks({"one.py": imports + doc, "two.py": imports + doc.replace("h()", "k()")}) == []


def test_no_block_of_six_lines_stands_twice_among_the_adapters():
    """What two adapters (or one adapter twice) both need is one helper: an engine-neutral one in
    engines/ (argv: flags in an argument list; running: health, failure patterns, probes, /metrics;
    installs and build: manifests, the program named, source builds), a llama.cpp-family one in the
    llamacpp package, which the fork imports. Lines compared as text, white space and comments aside;
    imports and docstrings left out. One engine's own facts (its flags, patterns, tables) stay in its
    adapter: a table of another engine's values is not a repeat."""
    sources = {f"src/{p.relative_to(SRC.parent).as_posix()}": p.read_text(encoding="utf-8")
               for p in sorted(ENGINES.rglob("*.py"))}
    assert len(sources) > 20, f"too few modules under {ENGINES}"
    found = repeated_blocks(sources)
    listing = "\n".join(f"  {fa}:{a1}-{a2} ~ {fb}:{b1}-{b2}" for fa, a1, a2, fb, b1, b2 in found)
    assert not found, (f"{len(found)} block(s) of {MIN_REPEAT} or more lines stand twice among the adapters; "
                       f"move each into one helper both call:\n{listing}")
