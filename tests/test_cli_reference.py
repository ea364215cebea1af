"""docs/cli-reference.md is what the command line's parser says today (issue 18 item 6: a command
reference generated from the parser, checked in CI)."""

from __future__ import annotations

from conftest import benchmark_script

ref = benchmark_script("make_cli_reference", folder="docs")


def test_the_committed_reference_is_what_the_parser_says_today(capsys):
    code = ref.main(["--check"])
    assert code == 0, "docs/cli-reference.md has drifted:\n" + capsys.readouterr().out[-4000:]


def test_the_reference_names_every_command_and_every_option():
    import typer.main

    from engineroom.cli import app_for

    text = ref.render()
    root = typer.main.get_command(app_for())
    for name, cmd in root.commands.items():
        assert f"## `engineroom {name}`" in text
        for param in cmd.params:
            if param.param_type_name == "option" and not param.hidden:
                assert param.opts[0] in text, f"{name} {param.opts[0]}"
    assert "## `engineroom engines install`" in text and "## `engineroom models pull`" in text


def test_a_changed_option_is_caught(tmp_path, monkeypatch, capsys):
    page = tmp_path / "cli-reference.md"
    page.write_text(ref.render().replace("Machine-readable JSON output.", "JSON.", 1))
    monkeypatch.setattr(ref, "PAGE", page)
    assert ref.main(["--check"]) == 1
    assert "is not current" in capsys.readouterr().out
