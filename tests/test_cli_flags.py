"""The CLI's short flags: one short flag means one long option in every command that has it
(issue 18 item 5: `-p` was --priority on `plan` and --port on `up`)."""

from __future__ import annotations

import typer

from engineroom.cli import app


def _commands(cmd, path: str = "engineroom"):
    """Every command under ``cmd`` (typer's own click: duck-typed, not isinstance)."""
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


COUNTS = {"--top", "--limit", "--lines"}


def test_each_short_flag_means_one_long_option_everywhere():
    meaning: dict[str, dict[str, list[str]]] = {}
    for path, cmd in _commands(typer.main.get_command(app)):
        for param in cmd.params:
            if param.param_type_name != "option":
                continue
            names = [*param.opts, *param.secondary_opts]
            longs = sorted(n for n in names if n.startswith("--"))
            for short in (n for n in names if not n.startswith("--")):
                meaning.setdefault(short, {}).setdefault(longs[0] if longs else short, []).append(path)
    assert meaning, "no options found"
    # -n is "how many are shown" wherever it appears (plan --top, runs --limit, logs --lines), as
    # head and tail use it: one meaning under three names that each say what is counted
    clashes = {s: m for s, m in meaning.items() if len(m) > 1 and not (s == "-n" and set(m) <= COUNTS)}
    assert not clashes, clashes
    assert set(meaning["-p"]) == {"--port"} and set(meaning["-c"]) == {"--ctx"}
