"""The source tree's shape: no module under src/engineroom much over 500 lines."""

from __future__ import annotations

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
