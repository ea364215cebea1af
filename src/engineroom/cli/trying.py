"""`engineroom try`: the plan's pick measured here on a random-weight file, before any download."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import views
from ..output import err_console, print_json, print_text
from .base import BusyOkOpt, JsonOpt, QuietWaitOpt, app

_FOLDER = typer.Option(None, "--folder", help="Where to write the file (default: the temp folder).")


@app.command("try")
def try_cmd(
    model: str = typer.Argument(..., help="A catalog model id, a .gguf file (its header) or a config.json."),
    priority: str | None = typer.Option(None, "--priority", help="The plan's priority (default: balanced)."),
    engine: str | None = typer.Option(None, "--engine", "-e", help="Only this engine (llama.cpp, ik_llama.cpp)."),
    ctx: int | None = typer.Option(None, "--ctx", "-c", help="Context per slot (default: the priority's)."),
    parallel: int | None = typer.Option(None, "--parallel", help="Server slots (default: the priority's)."),
    threads: int | None = typer.Option(None, "--threads", "-t", help="CPU threads."),
    keep: bool = typer.Option(False, "--keep", help="Keep the random-weight file (its path is printed)."),
    folder: Path | None = _FOLDER,
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens per bench request."),
    warmup: int = typer.Option(1, "--warmup", help="Unscored requests."),
    runs: int = typer.Option(3, "--runs", help="Measured requests."),
    quiet_wait: float = QuietWaitOpt,
    busy_ok: bool = BusyOkOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Plan MODEL for this machine, write a random-weight file of its exact architecture and quant,
    launch the pick on it, bench it, and set measured memory and decode beside the plan's."""
    from dataclasses import asdict

    from ..flows.trying import try_model
    from ..report.trying import try_text
    from ..store import Store

    with Store() as store, views.request_progress(err_console) as bar:
        task = bar.add_task("try", total=None)
        outcome = try_model(
            store, model, priority=priority, engine=engine, ctx=ctx, parallel=parallel, threads=threads,
            keep=keep, folder=folder, max_tokens=max_tokens, warmup=warmup, measured=runs,
            quiet_wait=quiet_wait, busy_ok=busy_ok,
            say=lambda msg: bar.update(task, description=msg),
            on_wait=lambda phase, t: bar.update(task, description=f"{model}: {phase} ({t:.0f} s)"),
            progress=lambda done, total, label: bar.update(task, completed=done, total=total, description=label))
    result = asdict(outcome)
    if json_out:
        print_json(result)
    else:
        print_text(try_text(result))
    raise typer.Exit(0 if outcome.bench_status == "OK" else 1)
