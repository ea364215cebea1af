"""`engineroom bakeoff`: every engine here on one model, the same suites, one stored comparison; and the
comparison page `engineroom report --bakeoff ID` writes (markdown, or one HTML file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..errors import BadInput
from ..output import err_console, print_json, print_text
from .base import BusyOkOpt, JsonOpt, QuietWaitOpt, TimeoutOpt, app

_SUITES_HELP = ("Comma-separated suites, run on each cell in this order: verify-smoke, verify-full, stress, soak, "
                "bench-quick, bench-standard, depth, concurrency, sweep, spec (default: verify-full, "
                "bench-standard, depth, concurrency, stress).")

_FOLDER = typer.Option(None, "--folder", help="With --random: where to write the file (default: the temp folder).")
_PRIORITIES = typer.Option(None, "--priority", help="The plan's priority whose pick each engine runs (repeatable; "
                                                    "default: balanced).")
_ENGINE_ARGS = typer.Option(None, "--engine-args", help="ENGINE=ARGS: that engine's own arguments on every launch "
                                                        "(repeatable), e.g. vllm=-O0.")


def _split(text: str | None) -> list[str]:
    return [w.strip() for w in (text or "").split(",") if w.strip()]


def _engine_args(given: list[str] | None) -> dict[str, list[str]]:
    """``--engine-args 'vllm=-O0 --foo 1'`` (repeatable) -> {engine: its words}."""
    import shlex

    out: dict[str, list[str]] = {}
    for item in given or ():
        name, sep, words = item.partition("=")
        if not sep or not name.strip():
            raise BadInput(f"--engine-args takes ENGINE=ARGS (for example vllm=-O0), not {item!r}.")
        out.setdefault(name.strip(), []).extend(shlex.split(words))
    return out


@app.command("bakeoff")
def bakeoff_cmd(
    model: str | None = typer.Argument(None, help="The model every engine serves (a catalog id or a file); "
                                                  "not with --resume."),
    engines_: str | None = typer.Option(None, "--engines", help="Comma-separated engines (default: every engine "
                                                                "engineroom knows; those that cannot run here "
                                                                "get a row that says why). With --resume: "
                                                                "engines to add to the stopped bakeoff."),
    priority: list[str] | None = _PRIORITIES,
    suites: str | None = typer.Option(None, "--suites", help=_SUITES_HELP),
    short: bool = typer.Option(False, "--short", help="Each suite at its smallest sizes: a first look in minutes, "
                                                      "not figures to publish (the page says so)."),
    ctx: int | None = typer.Option(None, "--ctx", "-c", help="Context per slot for every pick (default: the "
                                                             "priority's)."),
    quant: str | None = typer.Option(None, "--quant", "-q", help="Every engine's pick at this quant (default: each "
                                                               "priority's; with --random, the first pick's)."),
    engine_args: list[str] | None = _ENGINE_ARGS,
    budget_min: float | None = typer.Option(None, "--budget-min", help="Start no cell past this many minutes (the "
                                                                      "rest: --resume later)."),
    random_weights: bool = typer.Option(False, "--random", help="Every engine serves one random-weight GGUF of "
                                                                "MODEL's exact shape (as `try` writes it), deleted "
                                                                "at the end: speed and memory before any download."),
    folder: Path | None = _FOLDER,
    resume: int | None = typer.Option(None, "--resume", help="Run the cells a stopped bakeoff ID has not done "
                                                            "(and those of the --engines it lacks)."),
    quiet_wait: float = QuietWaitOpt,
    busy_ok: bool = BusyOkOpt,
    timeout: float | None = TimeoutOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Run the plan's pick of every engine on MODEL through the same verify and bench suites, one engine at a
    time, into one stored bakeoff; then print its comparison page (`report --bakeoff ID --html F` for HTML)."""
    from ..flows.bakeoff import DEFAULT_SUITES, bakeoff
    from ..store import Store

    if (model is None) == (resume is None):
        raise BadInput("give MODEL for a new bakeoff, or --resume ID for a stopped one (not both).")
    if resume is not None and (priority or suites or short or ctx or quant or engine_args or random_weights):
        raise BadInput("--resume runs the stopped bakeoff as it was asked; give no other settings with it "
                       "(but --engines, to add engines to it).")
    with Store() as store:
        if resume is not None:
            model = str(store.get_run(resume)["conditions"].get("model"))
        assert model is not None
        outcome = bakeoff(store, model, engine_names=_split(engines_), priorities=priority or (),
                          suites=_split(suites) or DEFAULT_SUITES, short=short, ctx=ctx,
                          budget_s=None if budget_min is None else budget_min * 60.0, resume=resume,
                          engine_args=_engine_args(engine_args), random=random_weights, folder=folder, quant=quant,
                          quiet_wait=quiet_wait, busy_ok=busy_ok, timeout=timeout,
                          say=err_console.print)
        _show_page(store, outcome.run_id, None, None, json_out, None)
    if outcome.left:
        err_console.print(f"{len(outcome.left)} cell(s) not started (the budget): "
                          f"`engineroom bakeoff --resume {outcome.run_id}`")
    raise typer.Exit(0 if outcome.status == "OK" else 1)


def _show_page(store: Any, bakeoff: int | None, runs: list[int] | None, compare: int | None, json_out: bool,
               html: Path | None, output: Path | None = None) -> None:
    from ..report.bakeoff import bakeoff_page, compare_pages, page_markdown, runs_page

    page = bakeoff_page(store, bakeoff) if bakeoff is not None else runs_page(store, runs or [])
    compared = compare_pages(store, bakeoff_page(store, compare), page) if compare is not None else None
    if html is not None:
        from ..report.bakeoffhtml import page_html

        _write(html, page_html(page, compared))
        err_console.print(f"wrote {html}")
    text = page_markdown(page, compared)
    if output is not None:
        _write(output, text)
    if json_out:               # redacted as the page is: secrets, home paths, host and user names
        import json

        from ..redaction import redact, redact_data

        print_json(json.loads(redact(json.dumps(redact_data({**page, "compared": compared, "markdown": text})))))
    elif output is None:
        print_text(text)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise BadInput(f"cannot write {path} ({exc.strerror}).") from None


def report_page(bakeoff: int | None, runs: str | None, compare: int | None, html: Path | None,
                output: Path | None, json_out: bool) -> None:
    """`report --bakeoff ID` / `report --runs 12,15,19`: the comparison page (``--compare ID2``: what changed)."""
    from ..store import Store

    ids: list[int] = []
    for word in _split(runs):
        try:
            ids.append(int(word))
        except ValueError:
            raise BadInput(f"--runs takes run ids separated by commas, not {word!r}.") from None
    if runs is not None and not ids:
        raise BadInput("--runs names no run.")
    if compare is not None and bakeoff is None:
        raise BadInput("--compare ID2 goes with --bakeoff ID (the bakeoff it is compared with).")
    with Store() as store:
        _show_page(store, bakeoff, ids, compare, json_out, html, output)
