"""A/B of two launch settings: interleaved boots, one bench run per boot, compared over boots.

``engineroom ab MODEL --a threads=1 --b threads=2 --boots 2`` (or two builds of one engine: ``--engine
ik_llama.cpp --a bin=PATH --b bin=PATH``): the arms boot in the order
A B B A (then A B, B A ... for more boots), so a slow drift of the machine (heat, a neighbour's
load) falls on both arms alike; each boot is a stored bench run labelled with its arm, and
``bench.compare.compare_arms`` says, per metric, whether the difference is real: beyond the
pooled noise band, the same way in every pairing, and beyond a 99% band over the boot means.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import launch
from ..errors import BadInput
from ..launchargs import LaunchArgs
from ..store import Store
from .runs import HostGuard, bench
from .stages import STAGES_KEY, StageLog, open_run, served

__all__ = ["ARM_KEYS", "ABOutcome", "ab", "boot_order", "describe_settings", "jsonable_settings", "parse_arm"]

# what an arm may set: the LaunchArgs field, and how its text becomes a value
ARM_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "threads": ("threads", int), "ctx": ("ctx", int), "parallel": ("parallel", int), "tp": ("tp", int),
    "kv": ("kv_dtype", str), "kv_unified": ("kv_unified", lambda v: _bool(v)),
    "extra": ("extra_args", lambda v: tuple(shlex.split(v))),
    "bin": ("engine_bin", str),       # the engine's program: two builds of one engine (native vs prebuilt kernels)
}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def parse_arm(text: str, name: str) -> dict[str, Any]:
    """``threads=1;extra=-nr --mlock`` -> the launch arguments it sets (LaunchArgs field -> value); one
    sentence for anything else."""
    out: dict[str, Any] = {}
    for part in [p.strip() for p in text.split(";") if p.strip()]:
        key, sep, value = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or key not in ARM_KEYS:
            raise BadInput(f"arm {name}: {part!r} is not KEY=VALUE with KEY one of {', '.join(ARM_KEYS)} "
                           f"(separate settings with ';').")
        option, convert = ARM_KEYS[key]
        try:
            out[option] = convert(value.strip())
        except ValueError:
            raise BadInput(f"arm {name}: {key}={value.strip()!r} is not a valid value.") from None
    if not out:
        raise BadInput(f"arm {name} sets nothing; give KEY=VALUE, e.g. threads=2.")
    return out


def boot_order(boots: int) -> list[str]:
    """A B B A A B B A ...: each pair of boots mirrors the one before, so a linear drift cancels."""
    if boots < 1:
        raise BadInput(f"--boots must be at least 1, not {boots}.")
    order: list[str] = []
    for i in range(boots):
        order += ["A", "B"] if i % 2 == 0 else ["B", "A"]
    return order


@dataclass
class ABOutcome:
    runs_a: list[int]
    runs_b: list[int]
    order: list[str]
    comparison: dict[str, Any]
    invalid: list[dict[str, Any]] = field(default_factory=list)   # boots whose bench said INVALID, set aside


def _undecided(comparison: Mapping[str, Any], most: int) -> bool:
    """True when some metric is not real only for the boot-to-boot variation, and its spread says
    ``most`` boots an arm or fewer would tell."""
    return any(row.get("boots_needed") is not None and row["boots_needed"] <= most
               for row in comparison.get("rows") or [])


def ab(store: Store, model: str, *, arm_a: Mapping[str, Any], arm_b: Mapping[str, Any], boots: int,
       plan: Any, base: LaunchArgs, say: Callable[[str], None] | None = None,
       progress: Callable[[int, int, str], None] | None = None, retries: int = 2,
       max_boots: int | None = None) -> ABOutcome:
    """Boot each arm ``boots`` times, interleaved; bench each boot; compare the arms. An arm is the
    launch arguments it sets (``parse_arm``) laid over ``base``; each boot's run keeps the whole
    ``LaunchArgs`` it was launched with.

    A boot whose bench says INVALID (a busy machine, a decode CV over the limit, ...) is not compared:
    it is kept in the store, named in ``invalid`` with its reason, and the arm is booted again (at most
    ``retries`` times per boot). When a metric is undecided only by the boot-to-boot variation and its
    spread says ``max_boots`` boots an arm would tell, mirrored pairs of boots are added up to there."""
    from ..bench.compare import compare_arms
    from ..bench.guards import failed_checks

    running = launch.read_state()
    if running is not None and launch.is_alive(running.pid, running.proc_created):
        raise BadInput("a managed server is running; `engineroom down` first (ab boots its own servers).")
    most = max(boots, max_boots or boots)
    order = boot_order(boots)
    runs: dict[str, list[int]] = {"A": [], "B": []}
    invalid: list[dict[str, Any]] = []

    def boot(n: int, arm: str) -> None:
        settings = arm_a if arm == "A" else arm_b
        args = base.with_fields(**settings)
        for attempt in range(retries + 1):
            again = f", again ({attempt} INVALID before)" if attempt else ""
            if say:
                say(f"boot {n}/{len(order)}: arm {arm} ({describe_settings(settings)}){again}")
            log = StageLog()          # each boot's own stages (its progress is the boot line above)
            with served(model, args, log) as s:
                nth = len(runs[arm]) + 1
                run_id = open_run(store, "bench", s, plan, f"ab arm {arm} boot {nth}: {model}", {
                    "ab": {"arm": arm, "boot": nth, "order": order, "position": n, "attempt": attempt + 1,
                           "arm_a": jsonable_settings(arm_a), "arm_b": jsonable_settings(arm_b),
                           "args": s.state.args.to_dict()}})
                with log.stage("bench"):
                    outcome = bench(s.info, store, plan, run_id=run_id, progress=progress, api_key=s.key,
                                    host=HostGuard(say=say))
                status = outcome.summary.get("status", "OK")
                store.finish_run(run_id, status, {**outcome.summary, STAGES_KEY: log.so_far()})
            if status != "INVALID":
                runs[arm].append(run_id)
                return
            why = "; ".join(failed_checks(outcome.summary)) or "the bench said INVALID"
            invalid.append({"arm": arm, "position": n, "run": run_id, "why": why})
            if say:
                say(f"boot {n}: arm {arm} run {run_id} is INVALID ({why}); not compared")

    def compare() -> dict[str, Any]:
        return compare_arms([(store.get_run(i), store.records(i)) for i in runs["A"]],
                            [(store.get_run(i), store.records(i)) for i in runs["B"]])

    for n, arm in enumerate(order, 1):
        boot(n, arm)
    comparison = compare()
    while len(order) < 2 * most and _undecided(comparison, most):
        pair = boot_order(len(order) // 2 + 1)[-2:]
        order += pair
        if say:
            say(f"undecided by the boot-to-boot variation: two more boots ({' '.join(pair)}), up to {most} an arm")
        for i, arm in enumerate(pair, len(order) - 1):
            boot(i, arm)
        comparison = compare()
    comparison.update(arm_a=jsonable_settings(arm_a), arm_b=jsonable_settings(arm_b), order=order, model=model,
                      invalid_boots=invalid)
    return ABOutcome(runs["A"], runs["B"], order, comparison, invalid)


def jsonable_settings(arm: Mapping[str, Any]) -> dict[str, Any]:
    """Launch settings (field -> value) for JSON: tuples (engine arguments) as lists."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in arm.items()}


def describe_settings(arm: Mapping[str, Any]) -> str:
    """Launch settings in one line: ``threads=1, engine_args=-ub 256``."""
    return ", ".join(f"{k}={' '.join(v) if isinstance(v, tuple) else v}" for k, v in arm.items())
