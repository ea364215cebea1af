"""`engineroom try`: the plan's pick measured here on a random-weight file, before any download."""

from __future__ import annotations

from pathlib import Path

import typer

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

    waited: dict[str, float] = {}

    def on_wait(phase: str, seconds: float) -> None:     # a line when the phase changes, then every 15 s
        if phase not in waited or seconds - waited[phase] >= 15:
            waited[phase] = seconds
            err_console.print(f"{model}: {phase} ({seconds:.0f} s)")

    # plain lines on stderr: they show in a pipe and a log too (and beside --json)
    with Store() as store:
        outcome = try_model(
            store, model, priority=priority, engine=engine, ctx=ctx, parallel=parallel, threads=threads,
            keep=keep, folder=folder, max_tokens=max_tokens, warmup=warmup, measured=runs,
            quiet_wait=quiet_wait, busy_ok=busy_ok, say=err_console.print, on_wait=on_wait,
            progress=lambda done, total, label: err_console.print(f"bench {done}/{total}: {label}"))
    result = asdict(outcome)
    if json_out:
        print_json(result)
    else:
        print_text(try_text(result))
    raise typer.Exit(0 if outcome.bench_status == "OK" else 1)
