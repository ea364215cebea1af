"""The CLI's short flags: one short flag means one long option in every command that has it
(issue 18 item 5: `-p` was --priority on `plan` and --port on `up`)."""

from __future__ import annotations

import typer

from engineroom.cli import app_for

app = app_for()


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


def test_each_command_is_registered_by_the_module_main_imports_for_it():
    """`main` imports only the module of the command it runs (cli._MODULE_OF): every command the
    modules register is in that table, under the module that defines it, and nothing else is."""
    import importlib

    from engineroom import cli

    registered = {}
    for module in cli._MODULES:
        importlib.import_module(f"engineroom.cli.{module}")
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        registered[name] = info.callback.__module__.rsplit(".", 1)[-1]
    for group in app.registered_groups:
        commands = [c.callback for c in group.typer_instance.registered_commands]
        modules = {cb.__module__.rsplit(".", 1)[-1] for cb in commands} | (
            {group.typer_instance.registered_callback.callback.__module__.rsplit(".", 1)[-1]}
            if group.typer_instance.registered_callback else set())
        assert len(modules) == 1, f"`{group.name}`'s subcommands come from {sorted(modules)}"
        registered[group.name] = modules.pop()
    assert registered == cli._MODULE_OF


def test_main_runs_a_command_with_only_its_module_imported(tmp_path):
    """`engineroom plan ...` in a fresh interpreter imports the planning commands and no other."""
    import json
    import os
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['engineroom', 'plan', 'smollm2-135m', '--rig', '1x3090', '--json']\n"
            "from engineroom.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n"
            "    loaded = sorted(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('engineroom.cli.'))\n"
            "    print('LOADED', ','.join(loaded), e.code, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ENGINEROOM_CACHE_DIR": str(tmp_path)})
    line = next(x for x in proc.stderr.splitlines() if x.startswith("LOADED"))
    assert line == "LOADED base,planning 0", proc.stderr
    assert json.loads(proc.stdout)["how_to_choose"], proc.stdout[:300]


def test_recipe_is_up_dry_run_with_one_option_list():
    """`recipe` is `up --dry-run` (issue 18 item 3): the same options, the same callback; an option that only
    prints (--compose, --out, --head-addr) given to a launch is refused with where it goes."""
    from conftest import cli

    root = typer.main.get_command(app)
    up, recipe = root.commands["up"], root.commands["recipe"]
    callbacks = {info.name: info.callback for info in app.registered_commands}
    assert callbacks["up"] is callbacks["recipe"]
    assert [p.opts for p in up.params] == [p.opts for p in recipe.params]
    done = cli("up", "smollm2-135m", "--compose", "--head-addr", "10.0.0.1")
    assert done.returncode == 2 and done.stderr == ("error: --compose, --head-addr print what would run: add "
                                                    "--dry-run (or use `engineroom recipe`).\n")
