"""Write docs/cli-reference.md from the command line itself: every command and subcommand, its
usage, its help and each option with its type, help and default, in the order `--help` lists them.

    .venv/bin/python docs/make_cli_reference.py           # rewrite docs/cli-reference.md
    .venv/bin/python docs/make_cli_reference.py --check   # exit 1 if the file is not what it writes

Read from the parser's own objects (typer's click commands), not from the rendered `--help`, so
the page does not depend on the terminal's width. tests/test_cli_reference.py runs `--check`:
a command or option changed without regenerating the page fails CI.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "cli-reference.md"
HEADER = """# Command reference

Generated from the command line's own parser by `python docs/make_cli_reference.py`; a test fails
when it is not current. [commands.md](commands.md) says what the commands are for and how they
fit together; this page lists every option.
"""


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _option_row(param: Any, ctx: Any) -> str:
    """The option as `--help` states it (names and type; help with its default), as a table row."""
    names, text = param.get_help_record(ctx) or (", ".join(param.opts), "")
    return f"| `{names}` | {_one_line(text)} |"


def _section(path: str, cmd: Any, ctx: Any) -> list[str]:
    lines = [f"## `{path}`", ""]
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    lines += [f"    {path} {usage}".rstrip(), ""]
    if cmd.help:
        lines += [cmd.help.strip(), ""]
    arguments = [p for p in cmd.params if p.param_type_name == "argument"]
    options = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    for arg in arguments:
        optional = "" if arg.required else " (optional)"
        lines.append(f"- `{arg.name.upper()}`{optional}: {_one_line(getattr(arg, 'help', ''))}")
    if arguments:
        lines.append("")
    if options:
        lines += ["| option | what it does |", "|---|---|"]
        lines += [_option_row(p, ctx) for p in options]
        lines.append("")
    return lines


def render() -> str:
    import typer.main

    from engineroom.cli import app_for

    root = typer.main.get_command(app_for())
    lines = [HEADER]

    def walk(cmd: Any, path: str, parent: Any) -> None:
        ctx = cmd.make_context(path.split()[-1], [], parent=parent, resilient_parsing=True)
        lines.extend(_section(path, cmd, ctx))
        for name in getattr(cmd, "list_commands", lambda _ctx: [])(ctx):
            walk(cmd.get_command(ctx, name), f"{path} {name}", ctx)

    walk(root, "engineroom", None)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed page instead of writing it")
    args = ap.parse_args(argv)
    text = render()
    if not args.check:
        PAGE.write_text(text, encoding="utf-8")
        print(f"wrote {PAGE} ({len(text.splitlines())} lines)")
        return 0
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if current == text:
        return 0
    diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "committed", "the parser today", lineterm="")
    print("\n".join(list(diff)[:80]))
    print(f"{PAGE.name} is not current: run `python docs/make_cli_reference.py`")
    return 1


if __name__ == "__main__":
    sys.exit(main())
