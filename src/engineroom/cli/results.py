"""Commands that measure and report: verify, bench, runs, report, demo."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..checks import CheckResult
    from ..flows.runs import HostGuard

from pathlib import Path

import typer

from .. import views
from ..output import console, err_console, print_json, print_text, to_jsonable
from ..redaction import redact_data
from .base import _CLIENT_KEY, _CLIENT_KEY_ENV, _THREADS, BusyOkOpt, JsonOpt, QuietWaitOpt, _show, app

_URL = typer.Option(None, "--url", help="OpenAI-compatible server URL (default: the managed server).")
_PROMPTS = typer.Option(None, "--prompts",
                        help="--suite standard: a JSONL file of extra prompts "
                             "({\"prompt\", \"name\"?, \"system\"?, \"max_tokens\"?} per line).")


def _print_check(result: CheckResult) -> None:
    console.print(views.check_line(result))


_JUNIT_FILE = typer.Option(None, "--junit", help="Also write the results as JUnit XML here.")





def _check_seconds(flag: str, value: float, *, least: float) -> None:
    """A number of seconds given on the command line: finite and at least ``least``, or one sentence."""
    import math

    from ..errors import BadInput

    if not (math.isfinite(value) and value >= least):
        raise BadInput(f"{flag} must be a number of seconds, {'0 or more' if least == 0 else f'at least {least:g}'}, "
                       f"not {value}.")


_CHECK = typer.Option(None, "--check", metavar="NAME",
                      help="--suite smoke or full: run only this check (repeat the flag, or NAME,NAME).")


@app.command()
def verify(url: str | None = _URL, api_key_env: str | None = _CLIENT_KEY_ENV,
           api_key: str | None = _CLIENT_KEY, json_out: bool = JsonOpt,
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
        _show(views.verify_summary(info, outcome))
        if outcome.baseline is not None:
            regressed = outcome.baseline["regressed"]
            console.print(f"since run {baseline}: {len(regressed)} regressed"
                          + (f" ({', '.join(r['name'] for r in regressed)})" if regressed else ""))
    raise typer.Exit(min(outcome.failed, 125))


@app.command()
def bench(
    url: str | None = _URL,
    suite_name: str = typer.Option(
        "quick", "--suite",
        help="quick: 192 tokens per request, 1 warm-up + 5 measured per workload (12 requests, 2,304 tokens); "
             "long: 1000 / 800 tokens, 3 warm-ups + 5 measured (16 requests, 14,400 tokens: ~6x as long); "
             "standard, depth, concurrency, spec: the longer suites with integrity checks and roofline; "
             "agentic: a coding agent's multi-turn session (ten tools, tool outputs growing toward ~50K "
             "tokens, scaled to the engine's context; TTFT / prefill / decode and cached tokens per turn; "
             "--runs sessions, --turns turns); sweep: as --sweep; rate: as --rate "
             "(benchmarks/bench_suites.md)."),
    long: bool = typer.Option(False, "--long", help="Same as --suite long."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Tokens per request (default: the suite's)."),
    warmup: int | None = typer.Option(None, "--warmup",
                                      help="Unscored warm-up requests per workload (default: the suite's; "
                                           "--suite agentic: turn 1 of a session of its own each; --sweep / "
                                           "--rate: single requests before the first cell / arrival)."),
    runs: int | None = typer.Option(None, "--runs", help="Measured requests per workload (default: the suite's; "
                                                         "--suite agentic: sessions; --sweep: rounds per cell)."),
    full_length: bool = typer.Option(True, "--full-length/--natural-stop",
                                     help="Ask the engine to ignore end-of-sequence (when it supports it) so every "
                                          "run reaches max tokens."),
    streams: int | None = typer.Option(None, "--streams",
                                       help="--suite concurrency: simultaneous streams; --sweep: the most streams "
                                            "tried (default: the slot count the engine reports; never guessed)."),
    prompts: Path | None = _PROMPTS,
    prompt_tokens: int | None = typer.Option(None, "--prompt-tokens",
                                             help="--suite concurrency / --sweep / --rate: tokens of each request's "
                                                  "salted prompt (defaults 16,384 / 1,024 / 512, capped by the "
                                                  "context); --suite agentic: the size the conversation grows "
                                                  "toward (default 50,000, capped at 80% of the context)."),
    depths: str | None = typer.Option(None, "--depths", help="--suite depth: the depths in tokens, e.g. 1024,4096 "
                                                             "(default: 1K, 10K, 32K, 90K where the context allows); "
                                                             "--sweep: the prompt sizes swept."),
    sweep_: bool = typer.Option(False, "--sweep",
                                help="Sweep N = 1, 2, 4, ... streams up to the engine's slot count (or --streams) "
                                     "at each prompt size (--depths) within --budget-s: aggregate and per-stream "
                                     "decode, TTFT p50 / p95, the knee and a recommended slot count."),
    budget_s: float | None = typer.Option(None, "--budget-s",
                                          help="--sweep: time budget in seconds (default 300); a cell that would "
                                               "overrun it is skipped, and the card says so."),
    rate: float | None = typer.Option(None, "--rate",
                                      help="Request-rate mode: Poisson arrivals at R requests/s (seeded), latency "
                                           "from the scheduled send, goodput against --slo-ttft-ms / --slo-itl-ms."),
    duration_s: float | None = typer.Option(None, "--duration-s",
                                            help="--rate: send arrivals for this many seconds (default 60)."),
    requests: int | None = typer.Option(None, "--requests",
                                        help="--rate: send this many arrivals (with --duration-s: whichever ends "
                                             "first)."),
    slo_ttft_ms: float | None = typer.Option(None, "--slo-ttft-ms",
                                             help="--rate / --sweep: TTFT SLO from the scheduled send, ms "
                                                  "(default 2,000)."),
    slo_itl_ms: float | None = typer.Option(None, "--slo-itl-ms",
                                            help="--rate / --sweep: inter-token SLO on each request's TPOT (mean "
                                                 "time per token after the first), ms (default 100)."),
    turns: int | None = typer.Option(None, "--turns", help="--suite agentic: turns per session (default 12)."),
    compare: tuple[int, int] = typer.Option((0, 0), "--compare", metavar="RUN_A RUN_B",
                                            help="Compare two stored bench runs: each delta with a noise band."),
    stall_s: float | None = typer.Option(None, "--stall-s",
                                         help="The floor of the stall limit: a request that gets no token for "
                                              "this long (or the longer limit the run's own pace gives) stops the "
                                              "run with the reason (default 30)."),
    quiet_wait: float = QuietWaitOpt,
    busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = _CLIENT_KEY_ENV, api_key: str | None = _CLIENT_KEY,
    json_out: bool = JsonOpt,
) -> None:
    """Per-stream speed: TTFT, decode and wall tokens/s (client clock) beside the engine's own timings.

    Each workload's figures carry mean, std and CV over its measured requests. --suite standard | depth |
    concurrency | spec | agentic, --sweep and --rate run the longer suites, each with its integrity
    checklist and roofline share.
    """
    from .. import flows
    from ..bench import BenchPlan, default_workloads, suite
    from ..bench.suites import suite_spec
    from ..errors import BadInput
    from ..report import render_card
    from ..store import Store

    if compare != (0, 0):
        _compare(compare, json_out)
        return
    import dataclasses

    _check_seconds("--quiet-wait", quiet_wait, least=0)
    if stall_s is not None:
        _check_seconds("--stall-s", stall_s, least=1)
    host = flows.runs.HostGuard(wait_s=quiet_wait, busy_ok=busy_ok,
                                say=None if json_out else lambda line: err_console.print(line, markup=False))
    chosen_name = suite_name.strip().lower()
    from ..bench.suites import SUITE_SPECS
    from ..bench.workloads import SUITES

    if chosen_name not in (*SUITES, *SUITE_SPECS):
        raise BadInput(f"there is no bench suite {suite_name!r}; choose one of {', '.join((*SUITES, *SUITE_SPECS))}.")
    if sweep_ and rate is not None:
        raise BadInput("--sweep and --rate are two different runs; give one of them.")
    for flag, on, name in (("--sweep", sweep_, "sweep"), ("--rate", rate is not None, "rate")):
        if on:
            if chosen_name not in ("quick", name):
                raise BadInput(f"give {flag} or --suite {suite_name}, not both.")
            chosen_name = name
    modes = {"turns": turns, "budget_s": budget_s, "rate": rate, "duration_s": duration_s, "requests": requests,
             "slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms}
    if suite_spec(chosen_name) is not None:
        if long:
            raise BadInput(f"give --long or --suite {chosen_name}, not both.")
        _bench_suite(url, chosen_name, streams=streams, prompts=prompts, max_tokens=max_tokens, warmup=warmup,
                     runs=runs, depths=_depths(depths), prompt_tokens=prompt_tokens, api_key=api_key,
                     api_key_env=api_key_env, json_out=json_out, modes=modes, stall_s=stall_s, host=host)
        return
    if streams is not None or prompts is not None or depths is not None or prompt_tokens is not None:
        raise BadInput("--streams, --prompts and --depths go with --suite concurrency / standard / depth.")
    given = [f for f, v in (("--turns", turns), ("--budget-s", budget_s), ("--duration-s", duration_s),
                            ("--requests", requests), ("--slo-ttft-ms", slo_ttft_ms), ("--slo-itl-ms", slo_itl_ms))
             if v is not None]
    if given:
        raise BadInput(f"{', '.join(given)} go(es) with --suite agentic, --sweep or --rate.")
    if long and suite_name.strip().lower() not in ("quick", "long"):
        raise BadInput(f"give --long or --suite {suite_name}, not both.")
    chosen = suite("long" if long else suite_name)
    if max_tokens is not None and max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1, not {max_tokens}.")
    if warmup is not None and warmup < 0:
        raise BadInput(f"--warmup cannot be negative (got {warmup}).")
    if runs is not None and runs < 1:
        raise BadInput(f"--runs must be at least 1, not {runs}.")
    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    plan = BenchPlan(workloads=default_workloads(max_tokens, chosen.name),
                     warmup=chosen.warmup if warmup is None else warmup,
                     measured=chosen.measured if runs is None else runs, full_length=full_length)
    if stall_s is not None:
        plan = dataclasses.replace(plan, stall_floor_s=stall_s)
    with Store() as store, views.request_progress(err_console) as bar:
        task = bar.add_task("bench", total=None)
        outcome = flows.bench(info, store, plan, api_key=key, host=host,
                              progress=lambda done, total, label: bar.update(task, completed=done, total=total,
                                                                             description=label))
        card = render_card(store.get_run(outcome.run_id), store.records(outcome.run_id))
    if json_out:
        print_json({"run_id": outcome.run_id, "summary": outcome.summary})
    else:
        print_text(card)
    if outcome.summary.get("status") != "OK":
        raise typer.Exit(1)


def _bench_suite(url: str | None, name: str, *, streams: int | None, prompts: Path | None, max_tokens: int | None,
                 warmup: int | None, runs: int | None, depths: list[int] | None, prompt_tokens: int | None,
                 api_key: str | None, api_key_env: str | None, json_out: bool,
                 modes: dict[str, float | int | None] | None = None, stall_s: float | None = None,
                 host: HostGuard | None = None) -> None:
    import math

    from .. import flows
    from ..errors import BadInput
    from ..report import render_card
    from ..store import Store

    modes = {k: v for k, v in (modes or {}).items() if v is not None}
    for flag, value, least in (("--max-tokens", max_tokens, 1), ("--warmup", warmup, 0), ("--runs", runs, 1),
                               ("--streams", streams, 1), ("--prompt-tokens", prompt_tokens, 16),
                               ("--turns", modes.get("turns"), 1), ("--requests", modes.get("requests"), 1)):
        if value is not None and value < least:
            raise BadInput(f"{flag} must be at least {least}, not {value}.")
    for opt in ("budget_s", "rate", "duration_s", "slo_ttft_ms", "slo_itl_ms"):
        value = modes.get(opt)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise BadInput(f"--{opt.replace('_', '-')} must be a positive number, not {value}.")
    belongs = {"turns": ("agentic",), "budget_s": ("sweep",), "rate": ("rate",), "duration_s": ("rate",),
               "requests": ("rate",), "slo_ttft_ms": ("sweep", "rate"), "slo_itl_ms": ("sweep", "rate")}
    for opt in modes:
        if name not in belongs[opt]:
            where = " or ".join("--suite agentic" if k == "agentic" else f"--{k}" for k in belongs[opt])
            raise BadInput(f"--{opt.replace('_', '-')} goes with {where}, not --suite {name}.")
    if streams is not None and name not in ("concurrency", "sweep"):
        raise BadInput(f"--streams goes with --suite concurrency or --sweep, not --suite {name}.")
    if runs is not None and name == "rate":
        raise BadInput("--runs does not apply to --rate: give --requests N or --duration-s S.")
    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    with Store() as store, views.request_progress(err_console) as bar:
        task = bar.add_task(f"bench --suite {name}", total=None)
        outcome = flows.bench_suite(info, store, name, streams=streams, prompt_file=prompts, measured=runs,
                                    warmup=warmup, max_tokens=max_tokens, depths=depths, prompt_tokens=prompt_tokens,
                                    api_key=key, stall_floor_s=stall_s, host=host,
                                    **modes,  # type: ignore[arg-type]
                                    progress=lambda done, total, label: bar.update(task, completed=done, total=total,
                                                                                   description=label))
        card = render_card(store.get_run(outcome.run_id), store.records(outcome.run_id))
    if json_out:
        print_json({"run_id": outcome.run_id, "summary": outcome.summary})
    else:
        print_text(card)
    if outcome.summary.get("status") != "OK":
        raise typer.Exit(1)


def _depths(text: str | None) -> list[int] | None:
    from ..errors import BadInput

    if text is None:
        return None
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise BadInput(f"--depths takes whole numbers of tokens separated by commas, not {text!r}.") from None
    if not values or min(values) < 16:
        raise BadInput(f"--depths needs at least one depth of 16 tokens or more (got {text!r}).")
    return values


def _compare(pair: tuple[int, int], json_out: bool) -> None:
    from ..bench.compare import compare_runs
    from ..errors import BadInput
    from ..report.suites import compare_text
    from ..store import Store

    with Store() as store:
        runs_ = [store.get_run(i) for i in pair]
        for r in runs_:
            if r.get("kind") not in ("bench", "demo"):
                raise BadInput(f"run #{r.get('id')} is a {r.get('kind')} run, not a bench run.")
        result = compare_runs(runs_[0], store.records(pair[0]), runs_[1], store.records(pair[1]))
    if json_out:
        print_json(result)
    else:
        print_text(compare_text(result))


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
        _show(views.runs_view(rows))


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
    threads: int | None = _THREADS,
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

    _check_seconds("--quiet-wait", quiet_wait, least=0)

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

