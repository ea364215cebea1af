"""The source tree's shape: no module under src/engineroom much over 500 lines, no private name imported
across modules."""

from __future__ import annotations

import ast
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
    src = ("from engineroom.bench.suiterun import _payload, request_record\n"
           "from .gguf import (\n    GGUFArray,\n    _first_sentence as first,\n)\n"
           "from .. import _hidden\n"
           "import engineroom.fit._secret\n"
           "from engineroom.values import int_or_none as _int\n"
           "from engineroom import __version__\n"
           "from collections import _private_stdlib\n")
    assert private_imports(src, "engineroom.arch") == [
        (1, "engineroom.bench.suiterun", "_payload"), (2, "engineroom.arch.gguf", "_first_sentence"),
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
