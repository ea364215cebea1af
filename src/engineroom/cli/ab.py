"""`engineroom ab`: is a launch setting's effect real? Interleaved boots of two arms, compared."""

from __future__ import annotations

import typer

from ..output import err_console, print_json, print_text
from .base import JsonOpt, TimeoutOpt, app, check_at_least


@app.command("ab")
def ab_cmd(
    model: str = typer.Argument(..., help="Model reference (as for `engineroom up`)."),
    arm_a: str = typer.Option(..., "--a", help="Arm A's launch settings: KEY=VALUE[;KEY=VALUE], KEY one of "
                                                "threads, ctx, parallel, tp, kv, kv_unified, extra (engine "
                                                "arguments, e.g. 'extra=-nr'), bin (the engine's program: two "
                                                "builds of one engine)."),
    arm_b: str = typer.Option(..., "--b", help="Arm B's launch settings (same form)."),
    boots: int = typer.Option(2, "--boots", help="Boots per arm, interleaved A B B A ... (at least 2 for a verdict)."),
    max_boots: int | None = typer.Option(None, "--max-boots",
                                         help="Add mirrored pairs of boots, up to this many an arm, while a metric "
                                              "is undecided only by the boot-to-boot variation (default: --boots)."),
    retries: int = typer.Option(2, "--retries", help="Times a boot whose bench says INVALID is booted again "
                                                     "(INVALID boots are never compared)."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens per request."),
    warmup: int = typer.Option(1, "--warmup", help="Unscored requests per workload and boot."),
    runs: int = typer.Option(3, "--runs", help="Measured requests per workload and boot."),
    ctx: int | None = typer.Option(None, "--ctx", "-c", help="Context per slot for both arms (an arm may override)."),
    threads: int | None = typer.Option(None, "--threads", "-t",
                                       help="CPU threads for both arms (an arm may override)."),
    engine: str | None = typer.Option(None, "--engine", "-e", help="Engine of both arms (default: llama.cpp, or "
                                                                   "the plan's pick)."),
    timeout: float | None = TimeoutOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Boot two launch settings in turn (A B B A ...), bench each boot, and say per metric whether
    the difference is real: beyond the noise band, in every pairing, beyond the boot-to-boot variation."""
    from ..bench import BenchPlan, default_workloads
    from ..flows.ab import ab, parse_arm
    from ..report.ab import ab_text
    from ..store import Store

    check_at_least(("--max-tokens", max_tokens, 1), ("--warmup", warmup, 0), ("--runs", runs, 1),
                   ("--boots", boots, 1), ("--retries", retries, 0), ("--max-boots", max_boots, boots))
    a, b = parse_arm(arm_a, "A"), parse_arm(arm_b, "B")
    from ..launchargs import LaunchArgs, check_timeout

    check_timeout(timeout)
    base = LaunchArgs(port=0, ctx=ctx, threads=threads, engine=engine, timeout=timeout)
    plan = BenchPlan(workloads=default_workloads(max_tokens)[:1], warmup=warmup, measured=runs, full_length=True)
    def say(line: str) -> None:          # progress goes to stderr, with --json too
        err_console.print(line)

    with Store() as store:
        outcome = ab(store, model, arm_a=a, arm_b=b, boots=boots, plan=plan, base=base, say=say, retries=retries,
                     max_boots=max_boots)
    # the same verdict from the stored runs, any time later (`engineroom compare` judges boots as ab does)
    again = f"engineroom compare {','.join(map(str, outcome.runs_a))} {','.join(map(str, outcome.runs_b))}"
    if json_out:
        print_json({"runs_a": outcome.runs_a, "runs_b": outcome.runs_b, "order": outcome.order,
                    "invalid_boots": outcome.invalid, "comparison": outcome.comparison, "compare_command": again})
    else:
        print_text(ab_text(outcome.comparison) + f"\nThe same comparison from the stored runs: `{again}`\n")
