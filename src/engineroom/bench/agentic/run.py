"""The agentic suite's run: sessions of a recorded coding-agent conversation (``agentic.session``),
one turn at a time, each turn the whole conversation so far with the ten tools; a session stops
early when its next turn would not fit the context with the reply and headroom (an
``agentic_stop`` record says so).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from engineroom.bench.agentic import session as agentic
from engineroom.bench.depth.sizes import DEPTH_HEADROOM
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.request import sequential_request
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.workloads import Workload

__all__ = ["run_agentic"]


def run_agentic(spec: SuiteSpec, ctx: SuiteContext, tick: Callable[[str], None]) -> None:
    """Warm-ups (turn 1 of a session of their own each), then ``measured`` sessions of the plan's turns."""
    plan, _ = agentic.plan_turns(ctx.server.n_ctx, spec.max_tokens, spec.turns, spec.prompt_tokens)
    request = {"tools": agentic.TOOLS, "tool_choice": spec.tool_choice}
    client = ctx.new_client()
    n_ctx = int(ctx.server.n_ctx or 0)
    for i in range(spec.warmup):
        session = agentic.SessionBuilder(ctx.salts(), ctx.count_tokens)
        workload = Workload("agentic turn 1", json.dumps(session.messages), spec.max_tokens)   # hashed, not sent
        rec = sequential_request(spec, ctx, client, workload, index=i, warmup=True, messages=list(session.messages),
                                 request=request, extra={"group": {"turn": 1}, "session": -1 - i, "turn": 1,
                                                         "salt": session.salt, "previous_prompt_tokens": None,
                                                         "step": {}})
        ctx.store("bench_request", rec)
        tick(f"warm-up {i + 1}")
    for s in range(spec.measured):
        session = agentic.SessionBuilder(ctx.salts(), ctx.count_tokens)
        previous: int | None = None
        for k, turn in enumerate(plan):
            step = session.add(turn)               # the recorded call and its output, sized before the clock
            grown = 0
            if turn.exchange is not None:
                grown = (step.get("output_counted_tokens") or turn.output_tokens) + agentic.call_tokens(turn.exchange)
            if previous is not None and previous + grown + spec.max_tokens + DEPTH_HEADROOM > n_ctx:
                ctx.store(agentic.STOP_KIND, {"session": s, "turn": turn.turn, "previous_prompt_tokens": previous,
                                              "adding_tokens": grown, "n_ctx": n_ctx,
                                              "why": "the next turn would not fit the context with the reply and "
                                                     "headroom"})
                for later in plan[k:]:
                    tick(f"session {s + 1} turn {later.turn} not sent (context)")
                break
            workload = Workload(f"agentic turn {turn.turn}", json.dumps(session.messages), spec.max_tokens)
            rec = sequential_request(spec, ctx, client, workload, index=s, warmup=False,
                                     messages=list(session.messages), request=request,
                                     extra={"group": {"turn": turn.turn}, "session": s,
                                            "turn": turn.turn, "salt": session.salt,
                                            "previous_prompt_tokens": previous, "step": step,
                                            "sized_by": agentic.sized_by(step)})
            ctx.store("bench_request", rec)
            previous = rec.get("prompt_tokens") if isinstance(rec.get("prompt_tokens"), int) else previous
            tick(f"session {s + 1} turn {turn.turn}")
