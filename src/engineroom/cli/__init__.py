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

# The modules that define the commands, in the order --help lists them, and the module of each
# command: `main` imports only the module of the command it runs, so a `plan` does not build the
# other commands' parsers (a test keeps the table equal to what the modules register).
_MODULES = ("serve", "results", "benching", "trying", "bakeoff", "ab", "planning", "machines")
_MODULE_OF = {
    "up": "serve", "switch": "serve", "recipe": "serve", "down": "serve", "status": "serve", "logs": "serve",
    "verify": "results", "runs": "results", "report": "results", "demo": "results",
    "bench": "benching", "compare": "benching",
    "try": "trying", "tune": "trying", "bakeoff": "bakeoff", "ab": "ab", "plan": "planning", "fit": "planning",
    "engines": "machines", "models": "machines", "hardware": "machines",
}


def app_for(command: str | None = None) -> typer.Typer:
    """The command line with COMMAND's module registered; every command when COMMAND is None or
    not one of them (``--help``, a typo: click then lists them all or names the closest)."""
    import importlib

    from .base import app

    for module in (_MODULE_OF[command],) if command in _MODULE_OF else _MODULES:
        importlib.import_module(f"{__name__}.{module}")     # registers its commands on ``app``
    return app


def _command_in(argv: list[str]) -> str | None:
    """The command word of a command line: the first argument that is not an option (the root
    takes no option with a value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM behaves like Ctrl-C, so the same cleanup runs (no orphaned engine, runs kept)."""
    raise KeyboardInterrupt


def main() -> None:
    """Console entry point: one clear sentence and a non-zero exit code for user errors."""
    import gc
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    try:
        run()
    finally:
        # The process ends here. Its last garbage collections would walk and free every object
        # the run made (modules, the catalog, pydantic's schemas: ~30 ms of a 0.3 s `plan`) for
        # memory the OS takes back anyway; frozen objects are left alone. atexit handlers and
        # the flush of stdout and stderr still run; files and databases are closed where used.
        gc.freeze()


def run(argv: list[str] | None = None) -> None:
    """The command line's command (``argv``, default ``sys.argv[1:]``), its user errors as one sentence
    each and an exit code: always ends in ``SystemExit`` (the tests run commands in-process through it)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        # standalone_mode=False: click hands back typer.Exit codes instead of exiting itself.
        rc = app_for(_command_in(args))(args=args, prog_name="engineroom" if argv is not None else None,
                                        standalone_mode=False)
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
