"""``engineroom demo``: pull -> up -> verify -> bench -> card -> down, all in one stored run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import models
from ..launchargs import LaunchArgs
from ..store import Store

if TYPE_CHECKING:
    from ..checks import CheckResult


@dataclass
class DemoOutcome:
    run_id: int
    card: str
    failed: int
    bench_status: str
    stages: list[dict] = field(default_factory=list)     # what ran: stage, seconds, outcome (down included)


def demo(store: Store, *, model: str = "smollm2-135m", port: int | None = None, ctx: int = 2048,
         threads: int | None = None, max_tokens: int = 256, warmup: int = 3, measured: int = 5,
         tools_template: bool = True, keep: bool = False, extra_args: Sequence[str] = (),
         quiet_wait: float = 60.0, busy_ok: bool = False,
         on_spawn: Callable[[int], None] | None = None,
         say: Callable[[str], None] | None = None,
         on_wait: Callable[[str, float], None] | None = None,
         on_result: Callable[[CheckResult], None] | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> DemoOutcome:
    """pull -> up -> verify -> bench -> card -> down, all in one stored run.

    The bench settings are checked before anything is pulled or started; ``quiet_wait`` and
    ``busy_ok`` are bench's pre-flight on a busy machine (wait up to S seconds for quiet cores, then
    refuse; or measure anyway and be judged on the contention seen)."""
    from ..bench import BenchPlan, default_workloads
    from ..report import render_card
    from .runs import HostGuard, bench, closing_run, verify
    from .stages import STAGES_KEY, StageLog, open_run, served

    log = StageLog(say)
    plan = BenchPlan(workloads=default_workloads(max_tokens), warmup=warmup, measured=measured, full_length=True)
    ref = models.resolve(model)          # resolved once; every stage below gets the same reference
    with log.stage("pull", ""):          # models.pull reports its own progress
        models.pull(ref, say)
    args = LaunchArgs(ctx=ctx, port=port if port is not None else 0, threads=threads,
                      tools_template=tools_template and ref.tool_template is not None, extra_args=tuple(extra_args))
    with served(ref, args, log, keep=keep, on_wait=on_wait, on_spawn=on_spawn) as s:
        run_id = open_run(store, "demo", s, plan, label=f"engineroom demo: {model}")
        with closing_run(store, run_id):
            with log.stage("verify"):
                checked = verify(s.info, store, run_id=run_id, on_result=on_result, api_key=s.key)
            with log.stage("bench"):
                benched = bench(s.info, store, plan, run_id=run_id, progress=progress, api_key=s.key,
                                host=HostGuard(wait_s=quiet_wait, busy_ok=busy_ok, say=say))
        status = "OK" if checked.failed == 0 and benched.summary.get("status") == "OK" else "FAILED"
        store.finish_run(run_id, status, {"verify_failed": checked.failed, "bench": benched.summary,
                                          STAGES_KEY: log.so_far()})
    card = render_card(store.get_run(run_id), store.records(run_id))
    return DemoOutcome(run_id, card, checked.failed, benched.summary.get("status", "?"), log.so_far())
