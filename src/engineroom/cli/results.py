"""Commands that check and report: verify, runs, report, demo (bench and compare: benching.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..checks import CheckResult

from pathlib import Path

import typer

from .. import views
from ..output import console, err_console, print_json, print_text, to_jsonable
from ..redaction import redact_data
from .base import BusyOkOpt, ClientKeyEnvOpt, ClientKeyOpt, JsonOpt, QuietWaitOpt, ThreadsOpt, app, check_seconds, show

_URL = typer.Option(None, "--url", help="OpenAI-compatible server URL (default: the managed server).")


def _print_check(result: CheckResult) -> None:
    console.print(views.check_line(result))


_JUNIT_FILE = typer.Option(None, "--junit", help="Also write the results as JUnit XML here.")





_CHECK = typer.Option(None, "--check", metavar="NAME",
                      help="--suite smoke or full: run only this check (repeat the flag, or NAME,NAME).")


@app.command()
def verify(url: str | None = _URL, api_key_env: str | None = ClientKeyEnvOpt,
           api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
           suite: str = typer.Option("smoke", "--suite",
                                     help="smoke: 6 quick checks; full: 26 conformance checks (tool calls, reasoning, "
                                          "usage, stop, logprobs, seed, schemas, images, Responses API, ...); "
                                          "stress: needles, big tool return, the context ceiling; "
                                          "soak: a long session judged on memory growth, latency drift, errors and "
                                          "answer quality; toolstream: N streamed tool calls, PASS / DROP counts."),
           repeat: int = typer.Option(1, "--repeat", help="Run each check K times and report pass k/K "
                                                          "(sampling makes single runs lie)."),
           mode: str | None = typer.Option(None, "--mode",
                                           help="--suite soak: fresh (default; sessions of 5 varied turns) or "
                                                "continuous (one growing tool conversation per session, ~25K "
                                                "tokens by turn 5, scaled to the context)."),
           minutes: float | None = typer.Option(None, "--minutes",
                                                help="--suite soak: stop starting turns after M minutes."),
           turns: int | None = typer.Option(None, "--turns",
                                            help="--suite soak: run N turns (5 a session). Default without "
                                                 "--minutes/--turns: fresh 20 sessions, continuous 5 (--fast: 3 "
                                                 "each), at most 30 minutes."),
           tries: int | None = typer.Option(None, "--tries",
                                            help="--suite toolstream: streamed tool-call tries (default 30: 10 "
                                                 "prompts x3)."),
           junit: Path | None = _JUNIT_FILE,
           baseline: int | None = typer.Option(None, "--baseline",
                                               help="A stored run id: list the checks that regressed since it."),
           fast: bool = typer.Option(False, "--fast", help="Smaller token budgets and sizes (small CPU models)."),
           check: list[str] | None = _CHECK,
           ) -> None:
    """API conformance: smoke (default), full, stress, soak or toolstream suite; results stored, shown in the card.

    Exit code = number of failed checks (a soak's INCONCLUSIVE counts as failed). SKIP only where the
    server declares a feature absent or a check could not be exercised (with the reason).
    """
    from .. import flows
    from ..errors import BadInput
    from ..store import Store

    suite = suite.strip().lower()
    if junit is not None and junit.is_dir():
        raise BadInput(f"--junit {junit} is a folder; give a file name.")
    only = tuple(n.strip() for item in check or [] for n in item.split(",") if n.strip())
    flows.runs.verify_options(suite, repeat, mode, minutes, turns, tries, only)   # refused before a server is asked
    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    with Store() as store:
        outcome = flows.verify(info, store, on_result=None if json_out else _print_check, api_key=key,
                               suite=suite, repeat=repeat, fast=fast, baseline=baseline, mode=mode,
                               minutes=minutes, turns=turns, tries=tries, only=only,
                               on_turn=None if json_out else lambda rec: err_console.print(views.soak_turn_line(rec)))
    if junit is not None:
        from ..checks.junit import junit_xml

        try:
            junit.write_text(junit_xml(outcome.results, suite=suite, engine=info.engine, model=info.model_id,
                                       run_id=outcome.run_id))
        except OSError as exc:
            raise BadInput(f"cannot write the JUnit file {junit} ({exc.strerror}).") from None
    if json_out:
        print_json({"run_id": outcome.run_id, "engine": info.engine, "model": info.model_id, "suite": suite,
                    "results": outcome.results, "failed": outcome.failed, "baseline": outcome.baseline})
    else:
        show(views.verify_summary(info, outcome))
        if outcome.baseline is not None:
            regressed = outcome.baseline["regressed"]
            console.print(f"since run {baseline}: {len(regressed)} regressed"
                          + (f" ({', '.join(r['name'] for r in regressed)})" if regressed else ""))
    raise typer.Exit(min(outcome.failed, 125))


@app.command("runs")
def runs_cmd(limit: int = typer.Option(20, "--limit", "-n"),
             kind: str | None = typer.Option(None, "--kind", help="Only runs of this kind (bench, verify, launch, "
                                                                  "bakeoff, ...)."),
             recover: bool = typer.Option(False, "--recover",
                                          help="The results database is damaged: keep it aside and copy every "
                                               "readable run (and the newest backup's) into a new one."),
             json_out: bool = JsonOpt) -> None:
    """Stored verify / bench / demo runs, newest first."""
    from ..errors import BadInput
    from ..store import Store

    if limit < 1:
        raise BadInput(f"--limit must be at least 1, not {limit}.")
    if recover:
        _recover(json_out)
        return
    with Store() as store:
        rows = store.runs(limit, kind=kind)
    if json_out:
        print_json(redact_data(to_jsonable(rows)))
    else:
        show(views.runs_view(rows))


def _recover(json_out: bool) -> None:
    from .. import storecare
    from ..paths import db_path
    from ..store import SCHEMA_VERSION, Store

    done = storecare.recover(db_path(), SCHEMA_VERSION, Store)
    if json_out:
        print_json(to_jsonable(done))
        return
    kept = f"kept the damaged file as {done.kept_as}" if done.kept_as else "there was no database file"
    backup = (f"; {done.runs_from_backup} runs and {done.records_from_backup} records only the backup "
              f"{done.from_backup} held" if done.from_backup else "; no backup to add from")
    console.print(f"{kept}; a new results database holds {done.runs_salvaged} runs and {done.records_salvaged} "
                  f"records read from it{backup}.", markup=False, soft_wrap=True)
    for line in done.unreadable[:20]:
        console.print(f"unreadable: {line}", markup=False, soft_wrap=True)


_CARD_FILE = typer.Option(None, "--output", "-o", help="Write the card to this file.")


_HTML = typer.Option(None, "--html", help="With --bakeoff / --runs: also write the page as one self-contained "
                                         "HTML file.")


@app.command()
def report(run: int | None = typer.Argument(None, help="Run id (see `engineroom runs`)."),
           output: Path | None = _CARD_FILE,
           bakeoff: int | None = typer.Option(None, "--bakeoff", help="The comparison page of bakeoff ID."),
           runs: str | None = typer.Option(None, "--runs", help="The comparison page of these stored runs "
                                                                "(comma-separated ids), one column per engine."),
           compare: int | None = typer.Option(None, "--compare", help="With --bakeoff: what changed since bakeoff "
                                                                      "ID2, with the noise band of each figure."),
           html: Path | None = _HTML,
           json_out: bool = JsonOpt) -> None:
    """A markdown card for RUN, recomputed from its raw records (redacted for sharing); or the engine comparison
    page of a bakeoff (--bakeoff) or of stored runs (--runs)."""
    from ..errors import BadInput
    from ..report import render_card
    from ..store import Store

    if sum(x is not None for x in (run, bakeoff, runs)) != 1:
        raise BadInput("give one of RUN, --bakeoff ID or --runs IDS.")
    if run is None:
        from .bakeoff import report_page

        report_page(bakeoff, runs, compare, html, output, json_out)
        return
    if compare is not None or html is not None:
        raise BadInput("--compare and --html go with --bakeoff or --runs, not a single run's card.")
    with Store() as store:
        run_row = store.get_run(run)
        records = store.records(run)
    card = render_card(run_row, records)
    if output:
        try:
            output.write_text(card)
        except OSError as exc:
            raise BadInput(f"cannot write the card to {output} ({exc.strerror}).") from None
    if json_out:
        print_json({"run": run_row["id"], "card": card})
    elif not output:
        print_text(card)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def demo(
    ctx_: typer.Context,
    model: str = typer.Option("smollm2-135m", "--model", help="Model reference."),
    port: int | None = typer.Option(None, "--port", help="Port (default: a free one)."),
    ctx: int = typer.Option(2048, "--ctx",
                            help="Context per sequence (the engine's default slots each hold this many)."),
    threads: int | None = ThreadsOpt,
    max_tokens: int = typer.Option(
        256, "--max-tokens",
        help="Tokens per bench request. The client-vs-engine cross-check needs >= 0.25 s of decoding "
             "per request; 256 tokens give that up to ~1000 tok/s."),
    warmup: int = typer.Option(3, "--warmup"),
    runs: int = typer.Option(5, "--runs"),
    keep: bool = typer.Option(False, "--keep", help="Leave the server running afterwards."),
    quiet_wait: float = QuietWaitOpt,
    busy_ok: bool = BusyOkOpt,
    json_out: bool = JsonOpt,
) -> None:
    """pull smollm2-135m -> up -> verify -> bench -> card -> down, in one stored run. Extra engine args go after `--`.
    """
    from .. import flows
    from ..store import Store

    check_seconds("--quiet-wait", quiet_wait, least=0)

    with Store() as store, views.request_progress(err_console) as bar:
        task = bar.add_task("demo", total=None)
        outcome = flows.demo(
            store, model=model, port=port, ctx=ctx, threads=threads, max_tokens=max_tokens,
            warmup=warmup, measured=runs, keep=keep, extra_args=tuple(ctx_.args),
            quiet_wait=quiet_wait, busy_ok=busy_ok,
            say=lambda msg: bar.update(task, description=msg),
            on_wait=lambda phase, t: bar.update(task, description=f"{model}: {phase} ({t:.0f} s)"),
            on_result=None if json_out else _print_check,
            progress=lambda done, total, label: bar.update(task, completed=done, total=total, description=label),
        )
    if json_out:
        print_json({"run_id": outcome.run_id, "verify_failed": outcome.failed, "bench_status": outcome.bench_status,
                    "stages": outcome.stages, "card": outcome.card})
    else:
        print_text(outcome.card)
    raise typer.Exit(min(outcome.failed, 125) if outcome.failed else (0 if outcome.bench_status == "OK" else 1))


# --- commands: issue 3 (plan / fit / hardware) are registered below --------------------------

