"""Running a verify suite: each check K times, its exchanges kept, flakiness as pass k/K.

``run_suite("smoke" | "full" | "stress" | "soak" | "toolstream", ...)`` returns one ``CheckResult``
per check (the soak and toolstream suites: one each, ``checks.soak`` / ``checks.toolstream``, which
repeat by ``--turns`` / ``--tries``, not ``--repeat``). Its ``details`` hold, besides the check's own
figures:

- ``suite``; ``attempts``: ``[{status, reason, seconds}]`` for every one of the K runs;
  ``passes`` / ``ran`` / ``repeat`` (k of the K runs that were not SKIPs passed);
- ``exchanges``: every request the check sent and the answer kept (``context.RecordingClient``),
  of the first failing attempt, else of the last one;
- ``forced``: set on a tool-call check whose PASS the served chat template can produce by
  itself (``Dialect.forced_tools``), so the card does not read "6/6" as the model's skill.

A check that raises becomes a FAIL with its one-line message, so the suite always completes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from engineroom.checks.context import Ctx, Dialect, RecordingClient, probe_dialect, read_dialect
from engineroom.checks.full import FULL_CHECKS, TOOL_CHECKS, FullCheck
from engineroom.checks.smoke import CheckResult
from engineroom.checks.soak import MemoryProbe, SoakOptions, run_soak
from engineroom.checks.toolstream import DEFAULT_TRIES, MAX_TRIES, run_toolstream
from engineroom.engines.base import ServerInfo
from engineroom.errors import BadInput, EngineroomError

SUITES = ("smoke", "full", "stress", "soak", "toolstream")
# Suites that are one long check repeated by their own bound, not K times by --repeat.
SELF_REPEATING = {"soak": "--turns / --minutes", "toolstream": "--tries"}

# What a stress suite needs from its caller: restart the managed server, return its new ServerInfo.
Restart = Callable[[], ServerInfo]


def check_tries(tries: int) -> int:
    """``--tries`` of the toolstream suite, checked (``BadInput`` with one sentence)."""
    if not 1 <= tries <= MAX_TRIES:
        raise BadInput(f"--tries must be between 1 and {MAX_TRIES:,}, not {tries}.")
    return tries


def suite_checks(suite: str) -> tuple[tuple[str, FullCheck], ...]:
    """The (name, check) pairs of ``suite``; ``BadInput`` for a name that is not a suite."""
    if suite == "smoke":
        return FULL_CHECKS[:6]
    if suite == "full":
        return FULL_CHECKS
    if suite in ("stress", "soak", "toolstream"):
        return ()
    raise BadInput(f"unknown verify suite {suite!r} (known: {', '.join(SUITES)}).")


def _attempt(name: str, check: FullCheck, ctx: Ctx) -> CheckResult:
    t0 = time.perf_counter()
    try:
        result = check(ctx)
    except EngineroomError as exc:
        result = CheckResult(name, "FAIL", str(exc))
    except Exception as exc:  # noqa: BLE001 - one check must not stop the suite
        message = str(exc).splitlines()[0] if str(exc) else ""
        result = CheckResult(name, "FAIL", f"check crashed: {type(exc).__name__}: {message}")
    result.name = name
    result.seconds = time.perf_counter() - t0
    result.details["exchanges"] = ctx.client.take()
    return result


def aggregate(name: str, attempts: Sequence[CheckResult], suite: str) -> CheckResult:
    """One result from K attempts: PASS only when every attempt that ran passed."""
    ran = [a for a in attempts if a.status != "SKIP"]
    passes = sum(1 for a in ran if a.status == "PASS")
    failed = [a for a in ran if a.status != "PASS"]
    shown = failed[0] if failed else attempts[-1]
    details: dict[str, Any] = dict(shown.details)
    details.update(suite=suite, repeat=len(attempts), ran=len(ran), passes=passes,
                   attempts=[{"status": a.status, "reason": a.reason, "seconds": round(a.seconds, 4)}
                             for a in attempts])
    seconds = sum(a.seconds for a in attempts)
    if not ran:
        return CheckResult(name, "SKIP", shown.reason, seconds, details)
    if len(attempts) == 1:
        return CheckResult(name, shown.status, shown.reason, seconds, details)
    if not failed:
        note = f" ({len(attempts) - len(ran)} not exercised)" if len(ran) < len(attempts) else ""
        return CheckResult(name, "PASS", f"passed {passes}/{len(ran)}{note}: {shown.reason}", seconds, details)
    if passes:
        return CheckResult(name, "FAIL", f"flaky: passed {passes}/{len(ran)}; a failing run: {shown.reason}",
                           seconds, details)
    return CheckResult(name, "FAIL", f"failed {len(ran)}/{len(ran)}: {shown.reason}", seconds, details)


def make_ctx(client: RecordingClient, info: ServerInfo, *, timeout_scale: float = 1.0, fast: bool = False,
             dialect: Dialect | None = None) -> Ctx:
    """The suite's context: the dialect from the ServerInfo (probed only when it serves no template)."""
    if dialect is None:
        dialect = probe_dialect(client, info, read_dialect(info), timeout=30 * timeout_scale)
        client.take()          # the probe's exchanges belong to no check
    return Ctx(client=client, info=info, dialect=dialect, timeout_scale=timeout_scale, fast=fast)


def run_suite(suite: str, client: RecordingClient, info: ServerInfo, *, repeat: int = 1,
              on_result: Callable[[CheckResult], None] | None = None, timeout_scale: float = 1.0,
              fast: bool = False, only: Sequence[str] = (), dialect: Dialect | None = None,
              restart: Restart | None = None, ctx: Ctx | None = None, soak: SoakOptions | None = None,
              memory: MemoryProbe | None = None, memory_note: str = "",
              on_turn: Callable[[dict[str, Any]], None] | None = None, tries: int | None = None) -> list[CheckResult]:
    """Run ``suite``'s checks in order, each ``repeat`` times; ``on_result`` sees each as it finishes.

    ``only`` keeps the named checks (in suite order). ``restart`` is used by the stress suite
    when the engine dies mid-way (the managed server only); the other suites never restart.
    ``ctx`` (from ``make_ctx``, with the engine's tokenizer and counters) replaces the one made here.
    The soak suite takes ``soak`` (mode and bounds), the caller's ``memory`` probe (or, without
    one, ``memory_note`` saying why there is none) and ``on_turn`` (each turn's record as it ends);
    the toolstream suite takes ``tries``.
    """
    if repeat < 1:
        raise BadInput(f"--repeat must be at least 1, not {repeat}.")
    if suite in SELF_REPEATING and repeat != 1:
        raise BadInput(f"the {suite} suite repeats by {SELF_REPEATING[suite]}, not --repeat.")
    if suite in ("soak", "toolstream"):
        ctx = ctx or make_ctx(client, info, timeout_scale=timeout_scale, fast=fast, dialect=dialect)
        if suite == "soak":
            result = run_soak(ctx, soak or SoakOptions(), memory=memory, memory_note=memory_note, on_turn=on_turn)
        else:
            chosen = DEFAULT_TRIES if tries is None else check_tries(tries)
            result = run_toolstream(ctx, chosen)
            if ctx.dialect.forced_tools and result.status != "SKIP":
                result.details["forced"] = ctx.dialect.forced_tools
        result.details.setdefault("suite", suite)
        if on_result is not None:
            on_result(result)
        return [result]
    if suite == "stress":
        from engineroom.checks.stress import run_stress

        ctx = ctx or make_ctx(client, info, timeout_scale=timeout_scale, fast=fast, dialect=dialect)
        return run_stress(ctx, on_result=on_result, restart=restart)
    checks = suite_checks(suite)
    if only:
        unknown = sorted(set(only) - {n for n, _ in checks})
        if unknown:
            raise BadInput(f"no check named {', '.join(unknown)} in the {suite} suite.")
        checks = tuple((n, c) for n, c in checks if n in only)
    ctx = ctx or make_ctx(client, info, timeout_scale=timeout_scale, fast=fast, dialect=dialect)
    results = []
    for name, check in checks:
        result = aggregate(name, [_attempt(name, check, ctx) for _ in range(repeat)], suite)
        if name in TOOL_CHECKS and ctx.dialect.forced_tools and result.status == "PASS":
            result.details["forced"] = ctx.dialect.forced_tools
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def dialect_record(ctx_dialect: Dialect, info: ServerInfo) -> dict[str, Any]:
    """What the run's ``dialect`` record stores: how the suite spoke to the server, and why."""
    return {"engine": info.engine, "model_id": info.model_id, "n_ctx": info.n_ctx, **ctx_dialect.as_dict()}
