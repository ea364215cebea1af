"""The engineroom command line: parse arguments, call one stage or flow, print JSON or a view.

Tables and lines are built in views.py from the results, so the commands hold no formatting
and the views can be tested on constructed data without running a command. The commands
live in this package's modules by subject; importing them registers them on ``app``.

Every command takes ``--json``. Errors a user can cause end in one sentence on stderr and a
non-zero exit code (see ``errors.py``); nothing here branches on an engine's name.
"""

from __future__ import annotations

import sqlite3
import sys
from types import FrameType

import typer
from rich.markup import escape

from ..errors import EngineroomError
from ..output import err_console
from .base import app

# The order the command modules register in is the order --help lists them:
# isort: off
from . import serve, results, trying, bakeoff, ab, planning, machines
# isort: on

# imported for their @app.command side effect
COMMAND_MODULES = (serve, results, trying, bakeoff, ab, planning, machines)


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM behaves like Ctrl-C, so the same cleanup runs (no orphaned engine, runs kept)."""
    raise KeyboardInterrupt


def main() -> None:
    """Console entry point: one clear sentence and a non-zero exit code for user errors."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    try:
        # standalone_mode=False: click hands back typer.Exit codes instead of exiting itself.
        rc = app(standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C into Exit(130) after our cleanup handlers ran
            raise KeyboardInterrupt
        sys.exit(rc if isinstance(rc, int) else 0)
    except EngineroomError as err:
        if err.detail:   # the lines the sentence points at come first, the sentence last
            err_console.print(err.detail, markup=False, highlight=False)
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]: stopped; results measured so far are kept.")
        sys.exit(130)
    except sqlite3.Error as exc:
        from .. import paths

        err_console.print(f"[bold red]error:[/] the results database {escape(str(paths.db_path()))} failed: "
                          f"{escape(str(exc))}.")
        sys.exit(4)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted.")
        sys.exit(1)
    except typer.TyperException as exc:
        # usage errors (missing option, unknown option, a value of the wrong type): typer
        # vendors click, so these are TyperExceptions, not the click package's classes
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            err_console.print(f"[bold red]error:[/] {escape(exc.format_message())}")
        sys.exit(exc.exit_code)
