"""`engineroom try` and `engineroom tune`: the plan's pick measured here (try: on a random-weight file,
before any download), and its launch settings searched (tune)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..output import err_console, print_json, print_text
from .base import BusyOkOpt, JsonOpt, QuietWaitOpt, TimeoutOpt, app

_FOLDER = typer.Option(None, "--folder", help="Where to write the file (default: the temp folder).")
_QUANT = typer.Option(None, "--quant", help="Only this quant of the model (default: the plan's choice).")
_KNOB = typer.Option(None, "--knob", help="Only this knob (repeatable): kv_dtype, parallel, threads, engine_args; "
                                          "default: every knob the engine names.")
_TUNED_PLAN = typer.Option(None, "--out", help="Where to write the tuned plan (default: data folder's tune/).")


@app.command("try", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def try_cmd(
    ctx_: typer.Context,
    model: str = typer.Argument(..., help="A catalog model id, a .gguf file (its header) or a config.json."),
    priority: str | None = typer.Option(None, "--priority", help="The plan's priority (default: balanced)."),
    engine: str | None = typer.Option(None, "--engine", "-e",
                                      help="Only this engine (llama.cpp, ik_llama.cpp, vllm, sglang)."),
    quant: str | None = _QUANT,
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
    timeout: float | None = TimeoutOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Plan MODEL for this machine, write a random-weight file of its exact architecture and quant,
    launch the pick on it, bench it, and set measured memory and decode beside the plan's.

    Arguments after `--` go to the engine as typed, after the pick's own (as for `up`), and the run records them."""
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
            store, model, priority=priority, engine=engine, quant=quant, ctx=ctx, parallel=parallel, threads=threads,
            keep=keep, folder=folder, engine_args=tuple(ctx_.args), max_tokens=max_tokens, warmup=warmup, measured=runs,
            quiet_wait=quiet_wait, busy_ok=busy_ok, timeout=timeout, say=err_console.print, on_wait=on_wait,
            progress=lambda done, total, label: err_console.print(f"bench {done}/{total}: {label}"))
    result = asdict(outcome)
    if json_out:
        print_json(result)
    else:
        print_text(try_text(result))
    raise typer.Exit(0 if outcome.bench_status == "OK" else 1)


@app.command("tune")
def tune_cmd(
    model: str = typer.Argument(..., help="A catalog model id, a .gguf file or a config.json (as for `try`)."),
    priority: str = typer.Option("balanced", "--priority",
                                 help="What to maximise: a speed priority (balanced: one stream's decode; "
                                      "concurrent-throughput: every slot's)."),
    engine: str | None = typer.Option(None, "--engine", "-e", help="Only this engine's pick."),
    quant: str | None = _QUANT,
    ctx: int | None = typer.Option(None, "--ctx", "-c", help="Context per slot (default: the priority's)."),
    parallel: int | None = typer.Option(None, "--parallel", help="Slots to start from (default: the priority's)."),
    budget_min: float = typer.Option(15.0, "--budget-min", help="Stop starting trials past this many minutes."),
    boots: int = typer.Option(2, "--boots", help="Boots per arm of each trial, interleaved A B B A (at least 2)."),
    knob: list[str] | None = _KNOB,
    random_weights: bool = typer.Option(False, "--random", help="Tune on a random-weight file of the pick's quant "
                                                                "(written and deleted here), as `try` does."),
    folder: Path | None = _FOLDER,
    out: Path | None = _TUNED_PLAN,
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens per bench request."),
    warmup: int = typer.Option(1, "--warmup", help="Unscored requests per boot."),
    runs: int = typer.Option(3, "--runs", help="Measured requests (or rounds) per boot."),
    quiet_wait: float = QuietWaitOpt,
    busy_ok: bool = BusyOkOpt,
    timeout: float | None = TimeoutOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Search the launch settings that matter for a priority (threads, KV type, slots, GPU sampling, flash
    attention) from the plan's pick: each value an A/B over interleaved boots, kept only when its gain is
    real. Writes the best as a plan `engineroom up --from-plan` launches."""
    from dataclasses import asdict

    from ..flows.tuning import tune
    from ..report.tuning import tune_text
    from ..store import Store

    with Store() as store:
        outcome = tune(store, model, priority=priority, engine=engine, quant=quant, ctx=ctx, parallel=parallel,
                       budget_s=budget_min * 60.0, boots=boots, knobs=tuple(knob or ()), random=random_weights,
                       folder=folder, out=out, max_tokens=max_tokens, warmup=warmup, measured=runs,
                       quiet_wait=quiet_wait, busy_ok=busy_ok, timeout=timeout, say=err_console.print)
    result = asdict(outcome)
    if json_out:
        print_json(result)
    else:
        print_text(tune_text(result))
