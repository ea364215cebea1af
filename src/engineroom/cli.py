"""The engineroom command line: parse arguments, call one stage or flow, render the result.

Every command takes ``--json``. Errors a user can cause end in one sentence on stderr and a
non-zero exit code (see ``errors.py``); nothing here branches on an engine's name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from . import __version__
from .errors import EngineroomError
from .output import console, err_console, print_json

app = typer.Typer(
    name="engineroom",
    help="Plan, launch, verify and benchmark local LLM engines — with measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Resolve, pull and list models.", no_args_is_help=True)
app.add_typer(models_app, name="models")

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON output.")


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"engineroom {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """engineroom: which engine, which quant, which flags, how much context, how fast."""


# --- commands: issue 2 (launch / verify / bench / results) are registered below -------------
# --- commands: issue 3 (plan / fit / hardware) are registered below --------------------------


def main() -> None:
    """Console entry point: one clear sentence and a non-zero exit code for user errors."""
    try:
        app(standalone_mode=False)
    except EngineroomError as err:
        err_console.print(f"[bold red]error:[/] {err}")
        if err.detail:
            err_console.print(err.detail, markup=False)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]: stopped; results measured so far are kept.")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted.")
        sys.exit(1)
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
