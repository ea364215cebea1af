"""`engineroom bench [SUITE]`: one command per suite, each with only the options it takes (so the
parser itself refuses an option a suite does not use), and `engineroom compare`, which says
whether two stored bench runs (or two sets of boots: what `ab` runs) differ beyond the noise."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .. import views
from ..bench.suites.specs import SUITE_SPECS
from ..output import err_console, print_json, print_text
from .base import BusyOkOpt, ClientKeyEnvOpt, ClientKeyOpt, JsonOpt, QuietWaitOpt, app, check_at_least, check_seconds

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..flows.runs import BenchOutcome, HostGuard
    from ..store import Store

bench_app = typer.Typer(no_args_is_help=False)     # its help: the callback's docstring
app.add_typer(bench_app, name="bench")

# the options every suite takes
_URL = typer.Option(None, "--url", help="OpenAI-compatible server URL (default: the managed server).")
_MAX_TOKENS = typer.Option(None, "--max-tokens", help="Tokens per request (default: the suite's).")
_WARMUP = typer.Option(None, "--warmup", help="Unscored warm-up requests per workload (default: the suite's).")
_RUNS = typer.Option(None, "--runs", help="Measured requests per workload (default: the suite's).")
_STALL = typer.Option(None, "--stall-s", help="The floor of the stall limit: a request that gets no token for this "
                                              "long (or the longer limit the run's own pace gives) stops the run "
                                              "with the reason (default 30).")
# the options of some suites
_FULL = typer.Option(True, "--full-length/--natural-stop",
                     help="Ask the engine to ignore end-of-sequence (when it supports it) so every run reaches max "
                          "tokens.")
_STREAMS = typer.Option(None, "--streams", help="Simultaneous streams (default: the slot count the engine reports; "
                                                "never guessed).")
_PROMPT_TOKENS = typer.Option(None, "--prompt-tokens", help="Tokens of each request's salted prompt (default: the "
                                                            "suite's, capped by the context).")
_PROMPTS = typer.Option(None, "--prompts", help="A JSONL file of extra prompts ({\"prompt\", \"name\"?, "
                                                "\"system\"?, \"max_tokens\"?} per line).")
_SLO_TTFT = typer.Option(None, "--slo-ttft-ms", help="TTFT SLO from the scheduled send, ms (default 2,000).")
_SLO_ITL = typer.Option(None, "--slo-itl-ms", help="Inter-token SLO on each request's TPOT (mean time per token "
                                                   "after the first), ms (default 100).")


def _quick_or_long(name: str, url: str | None, max_tokens: int | None, warmup: int | None, runs: int | None,
                   full_length: bool, stall_s: float | None, host: HostGuard, api_key: str | None,
                   api_key_env: str | None, json_out: bool) -> None:
    import dataclasses

    from .. import flows
    from ..bench import BenchPlan, default_workloads, suite

    check_at_least(("--max-tokens", max_tokens, 1), ("--warmup", warmup, 0), ("--runs", runs, 1))
    chosen = suite(name)
    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    plan = BenchPlan(workloads=default_workloads(max_tokens, chosen.name),
                     warmup=chosen.warmup if warmup is None else warmup,
                     measured=chosen.measured if runs is None else runs, full_length=full_length)
    if stall_s is not None:
        plan = dataclasses.replace(plan, stall_floor_s=stall_s)
    _measured("bench", lambda store, progress: flows.bench(info, store, plan, api_key=key, host=host,
                                                            progress=progress), json_out)


def _suite(name: str, url: str | None, *, host: HostGuard, api_key: str | None, api_key_env: str | None,
           json_out: bool, stall_s: float | None, max_tokens: int | None = None, warmup: int | None = None,
           runs: int | None = None, **options: Any) -> None:
    """One of the longer suites (bench.suites), its own options in ``options`` (None: the suite's)."""
    import math

    from .. import flows
    from ..errors import BadInput

    check_at_least(("--max-tokens", max_tokens, 1), ("--warmup", warmup, 0), ("--runs", runs, 1),
              ("--streams", options.get("streams"), 1), ("--prompt-tokens", options.get("prompt_tokens"), 16),
              ("--turns", options.get("turns"), 1), ("--requests", options.get("requests"), 1))
    for opt in ("budget_s", "rate", "duration_s", "slo_ttft_ms", "slo_itl_ms"):
        value = options.get(opt)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise BadInput(f"--{opt.replace('_', '-')} must be a positive number, not {value}.")
    given = {k: v for k, v in options.items() if v is not None}
    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    _measured(f"bench {name}", lambda store, progress: flows.bench_suite(
        info, store, name, measured=runs, warmup=warmup, max_tokens=max_tokens, api_key=key, stall_floor_s=stall_s,
        host=host, progress=progress, **given), json_out)


def _measured(label: str, run: Callable[[Store, Callable[[int, int, str], None]], BenchOutcome],
              json_out: bool) -> None:
    """Run a bench (``run(store, progress)``) under a progress bar, then print its card (or JSON);
    exit 1 unless the run is OK."""
    from ..report import render_card
    from ..store import Store

    with Store() as store, views.request_progress(err_console) as bar:
        task = bar.add_task(label, total=None)
        outcome = run(store, lambda done, total, what: bar.update(task, completed=done, total=total,
                                                                  description=what))
        card = render_card(store.get_run(outcome.run_id), store.records(outcome.run_id))
    if json_out:
        print_json({"run_id": outcome.run_id, "summary": outcome.summary})
    else:
        print_text(card)
    if outcome.summary.get("status") != "OK":
        raise typer.Exit(1)


def _host(quiet_wait: float, busy_ok: bool, stall_s: float | None, json_out: bool) -> HostGuard:
    from .. import flows

    check_seconds("--quiet-wait", quiet_wait, least=0)
    if stall_s is not None:
        check_seconds("--stall-s", stall_s, least=1)
    return flows.runs.HostGuard(wait_s=quiet_wait, busy_ok=busy_ok,
                                say=None if json_out else lambda line: err_console.print(line, markup=False))


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


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS, warmup: int | None = _WARMUP,
    runs: int | None = _RUNS, full_length: bool = _FULL, stall_s: float | None = _STALL,
    quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    """Per-stream speed: TTFT, decode and wall tokens/s (client clock) beside the engine's own timings.

    Without a suite: the quick suite (192 tokens per request, 1 warm-up + 5 measured per workload).
    A suite (`engineroom bench SUITE --help` lists its options): long, standard, depth, concurrency,
    spec, agentic, sweep, rate; the longer ones carry their integrity checklist and roofline share
    (benchmarks/bench_suites.md).
    """
    if ctx.invoked_subcommand is not None:     # `bench --runs 3 depth`: the suite's options follow its name
        from ..errors import BadInput

        given = [p.opts[0] for p in ctx.command.params if p.name and ctx.params.get(p.name) != p.default]
        if given:
            raise BadInput(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} after the suite's name: "
                           f"`engineroom bench {ctx.invoked_subcommand} {' '.join(given)} ...`.")
        return
    host = _host(quiet_wait, busy_ok, stall_s, json_out)
    _quick_or_long("quick", url, max_tokens, warmup, runs, full_length, stall_s, host, api_key, api_key_env, json_out)


@bench_app.command("long", help="1000 / 800 tokens per request, 3 warm-ups + 5 measured per workload (16 requests, "
                                "14,400 tokens: ~6x as long as the quick suite).")
def bench_long(url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS, warmup: int | None = _WARMUP,
               runs: int | None = _RUNS, full_length: bool = _FULL, stall_s: float | None = _STALL,
               quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
               api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt,
               json_out: bool = JsonOpt) -> None:
    host = _host(quiet_wait, busy_ok, stall_s, json_out)
    _quick_or_long("long", url, max_tokens, warmup, runs, full_length, stall_s, host, api_key, api_key_env, json_out)


@bench_app.command("standard", help=SUITE_SPECS["standard"].about + ".")
def bench_standard(
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS, warmup: int | None = _WARMUP,
    runs: int | None = _RUNS,
    prompts: Path | None = _PROMPTS,
    stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    _suite("standard", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           runs=runs, prompt_file=prompts)


@bench_app.command("depth", help=SUITE_SPECS["depth"].about + ".")
def bench_depth(
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS, warmup: int | None = _WARMUP,
    runs: int | None = _RUNS,
    depths: str | None = typer.Option(None, "--depths", help="The depths in tokens, e.g. 1024,4096 (default: 1K, "
                                                             "10K, 32K, 90K where the context allows)."),
    stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    _suite("depth", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           runs=runs, depths=_depths(depths))


@bench_app.command("concurrency", help=SUITE_SPECS["concurrency"].about + ".")
def bench_concurrency(
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS, warmup: int | None = _WARMUP,
    runs: int | None = typer.Option(None, "--runs", help="Measured rounds (default 3)."),
    streams: int | None = _STREAMS, prompt_tokens: int | None = _PROMPT_TOKENS,
    stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    _suite("concurrency", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           runs=runs, streams=streams, prompt_tokens=prompt_tokens)


@bench_app.command("spec", help=SUITE_SPECS["spec"].about + ".")
def bench_spec(
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS, warmup: int | None = _WARMUP,
    runs: int | None = _RUNS, stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt,
    busy_ok: bool = BusyOkOpt, api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    _suite("spec", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           runs=runs)


@bench_app.command("agentic", help=SUITE_SPECS["agentic"].about + ".")
def bench_agentic(
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS,
    warmup: int | None = typer.Option(None, "--warmup", help="Warm-up sessions (turn 1 of a session of its own "
                                                             "each; default 1)."),
    runs: int | None = typer.Option(None, "--runs", help="Measured sessions (default 2)."),
    turns: int | None = typer.Option(None, "--turns", help="Turns per session (default 12)."),
    prompt_tokens: int | None = typer.Option(None, "--prompt-tokens",
                                             help="The size the conversation grows toward (default 50,000, capped "
                                                  "at 80% of the context)."),
    stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    _suite("agentic", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           runs=runs, turns=turns, prompt_tokens=prompt_tokens)


@bench_app.command("sweep", help=SUITE_SPECS["sweep"].about + ".")
def bench_sweep(
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS,
    warmup: int | None = typer.Option(None, "--warmup", help="Single requests before the first cell (default 1)."),
    runs: int | None = typer.Option(None, "--runs", help="Rounds per cell (default 2)."),
    streams: int | None = typer.Option(None, "--streams", help="The most streams tried (default: the slot count the "
                                                               "engine reports; never guessed)."),
    depths: str | None = typer.Option(None, "--depths", help="The prompt sizes swept, e.g. 1024,8192 (default "
                                                             "1,024)."),
    prompt_tokens: int | None = _PROMPT_TOKENS,
    budget_s: float | None = typer.Option(None, "--budget-s", help="Time budget in seconds (default 300); a cell "
                                                                   "that would overrun it is skipped, and the card "
                                                                   "says so."),
    slo_ttft_ms: float | None = _SLO_TTFT, slo_itl_ms: float | None = _SLO_ITL,
    stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    _suite("sweep", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           runs=runs, streams=streams, depths=_depths(depths), prompt_tokens=prompt_tokens, budget_s=budget_s,
           slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)


@bench_app.command("rate", help=SUITE_SPECS["rate"].about + ".")
def bench_rate(
    rate: float = typer.Option(..., "--rate", help="Poisson arrivals at R requests/s (seeded)."),
    url: str | None = _URL, max_tokens: int | None = _MAX_TOKENS,
    warmup: int | None = typer.Option(None, "--warmup", help="Single requests before the first arrival (default "
                                                             "1)."),
    duration_s: float | None = typer.Option(None, "--duration-s", help="Send arrivals for this many seconds "
                                                                       "(default 60)."),
    requests: int | None = typer.Option(None, "--requests", help="Send this many arrivals (with --duration-s: "
                                                                 "whichever ends first)."),
    prompt_tokens: int | None = _PROMPT_TOKENS,
    slo_ttft_ms: float | None = _SLO_TTFT, slo_itl_ms: float | None = _SLO_ITL,
    stall_s: float | None = _STALL, quiet_wait: float = QuietWaitOpt, busy_ok: bool = BusyOkOpt,
    api_key_env: str | None = ClientKeyEnvOpt, api_key: str | None = ClientKeyOpt, json_out: bool = JsonOpt,
) -> None:
    _suite("rate", url, host=_host(quiet_wait, busy_ok, stall_s, json_out), api_key=api_key,
           api_key_env=api_key_env, json_out=json_out, stall_s=stall_s, max_tokens=max_tokens, warmup=warmup,
           rate=rate, duration_s=duration_s, requests=requests, prompt_tokens=prompt_tokens,
           slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)


@app.command("compare")
def compare_cmd(
    runs_a: str = typer.Argument(..., metavar="RUNS_A", help="A stored bench run id, or several (12,14: one per "
                                                             "boot of arm A, as `ab` stores them)."),
    runs_b: str = typer.Argument(..., metavar="RUNS_B", help="The run(s) of arm B, in the same form."),
    json_out: bool = JsonOpt,
) -> None:
    """Is the difference between two stored bench runs real? Each metric's delta with its noise band
    (Welch); with several runs an arm (boots), also every pairing and the boot-to-boot variation, as
    `engineroom ab` judges its boots."""
    from ..bench.compare import compare_arms, compare_runs
    from ..errors import BadInput
    from ..report.ab import ab_text
    from ..report.suites import compare_text
    from ..store import Store

    ids_a, ids_b = _run_ids(runs_a, "RUNS_A"), _run_ids(runs_b, "RUNS_B")
    with Store() as store:
        arms = []
        for ids in (ids_a, ids_b):
            arm = []
            for run_id in ids:
                run = store.get_run(run_id)
                if run.get("kind") not in ("bench", "demo"):
                    raise BadInput(f"run #{run_id} is a {run.get('kind')} run, not a bench run.")
                arm.append((run, store.records(run_id)))
            arms.append(arm)
    if len(ids_a) == 1 and len(ids_b) == 1:
        result = compare_runs(arms[0][0][0], arms[0][0][1], arms[1][0][0], arms[1][0][1])
        text = compare_text(result)
    else:
        result = compare_arms(arms[0], arms[1])
        text = ab_text(result)
    if json_out:
        print_json(result)
    else:
        print_text(text)


def _run_ids(text: str, what: str) -> list[int]:
    from ..errors import BadInput

    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise BadInput(f"{what} takes run ids separated by commas (e.g. 12 or 12,14), not {text!r}.") from None
    if not ids:
        raise BadInput(f"{what} needs at least one run id.")
    return ids
