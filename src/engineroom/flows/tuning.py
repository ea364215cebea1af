"""``engineroom tune MODEL --priority P``: the launch settings that matter for P, searched on this machine.

The plan's pick is where the search starts (the incumbent). The priority names what it maximises; tune
measures the two speeds a priority can rank by: one stream's decode (``decode_tps``: balanced,
full-features, ...) or every slot decoding at once (``aggregate_tps``: concurrent-throughput,
multi-tenant). The engine's adapter names the settings worth trying for that objective and the values
to try (``Engine.tune_knobs``: llama.cpp's threads, GPU sampling, flash attention, KV type, slots). One
knob at a time, each value is an A/B against the incumbent over interleaved boots (A B B A, ``flows.ab.boot_order``),
compared by ``bench.compare.compare_boot_samples``: a value is kept only when its gain is real (beyond
the noise band, the same way in every pairing, beyond the boot-to-boot variation); anything else leaves
the incumbent as it was. The search ends when every knob is tried or the time budget cannot pay for
another trial (said, with what was not tried). A launch the engine or fit refuses is a trial that says
why. When more than one change was kept, a last A/B sets the result against the pick itself, so the
gain printed is measured, not multiplied.

The result is a plan file (``plan --json``'s shape, the tuned LaunchRequest in its row) that
``engineroom up --from-plan FILE`` launches as it was measured, and a stored run of kind ``tune``.
Random weights (``random=True``: the file ``try`` writes) serve every knob here: none of them is a
spec-decode setting, whose acceptance random weights would make meaningless.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import engines
from ..engines.base import Knob
from ..errors import BadInput, EngineroomError, NotFound
from ..launchargs import LaunchArgs, check_timeout
from ..store import Store
from .ab import boot_order, describe_settings, jsonable_settings
from .picks import Pick, pick_from_plan
from .runs import HostGuard, bench, bench_suite
from .stages import StageLog, open_run, served

__all__ = ["OBJECTIVES", "Trial", "TuneOutcome", "objective_of", "tune"]

# the priority's rank metric -> what tune measures for it
OBJECTIVES = {"decode_tps": "decode_tps", "aggregate_tps": "aggregate_tps", "shared_prefix_tps": "aggregate_tps"}
OBJECTIVE_TEXT = {"decode_tps": "single-stream decode (tok/s)",
                  "aggregate_tps": "aggregate decode over every slot (tok/s)"}
TUNE_KIND = "tune"


# the rank keys a knob may worsen, by what the knob changes; a key the priority ranks above its speed guards
# it: balanced keeps its KV precision, leanest-vram its memory (tune then leaves those knobs out)
MEMORY_KEYS = frozenset({"gpu_bytes", "headroom_bytes"})
CONTEXT_KEYS = frozenset({"max_ctx"})


def objective_of(priority_id: str) -> tuple[str, tuple[str, ...]]:
    """What tune measures for ``priority_id`` and what it must not trade for it: the first of its rank
    keys that is a speed (catalog priorities.yaml), and the keys ranked above that one. BadInput for a
    priority whose first key is memory or context (which plan sizes exactly) with no speed after it
    that tune could raise without trading the first."""
    from ..catalog import find_priority, load_catalog

    prio = find_priority(load_catalog(), priority_id)
    for i, key in enumerate(prio.rank):
        if key.metric in OBJECTIVES:
            return OBJECTIVES[key.metric], tuple(k.metric for k in prio.rank[:i])
    ranked = ", ".join(k.metric for k in prio.rank)
    raise BadInput(f"priority {prio.id} ranks by {ranked}, which `engineroom plan` sizes from memory, not by a "
                   "speed tune could measure; tune a speed priority (balanced, full-features, "
                   "concurrent-throughput, ...).")


def guarded_knobs(knobs: list[Knob], guarded: tuple[str, ...], kv_bytes: Mapping[str, float],
                  pick_kv: str | None) -> tuple[list[Knob], list[str]]:
    """``knobs`` less what would worsen a key the priority ranks above its speed: (kept, what was left out
    and why). Memory first: only knobs that leave memory as it is. KV precision: only KV types at least
    as wide as the pick's."""
    kept, left = [], []
    for k in knobs:
        if MEMORY_KEYS & set(guarded) and k.field != "threads":
            left.append(f"{k.name}: it changes memory, which this priority ranks above speed")
            continue
        if k.field == "kv_dtype" and "kv_precision" in guarded:
            floor = kv_bytes.get((pick_kv or "f16").lower(), 2.0)
            values = tuple(v for v in k.values if kv_bytes.get(str(v).lower(), 0.0) >= floor)
            if len(values) < len(k.values):
                left.append(f"{k.name} narrower than the pick's {pick_kv}: this priority keeps KV precision")
            if not values:
                continue
            k = replace(k, values=values)
        kept.append(k)
    return kept, left


@dataclass
class Trial:
    """One value of one knob against the incumbent."""

    knob: str
    value: Any
    setting: dict[str, Any]                 # the launch fields this value sets (field -> value)
    outcome: str                            # "kept" | "not kept" | "refused" | "not measured"
    why: str
    runs_a: list[int] = field(default_factory=list)    # the incumbent's boots
    runs_b: list[int] = field(default_factory=list)    # this value's boots
    invalid_runs: list[int] = field(default_factory=list)   # boots whose bench said INVALID (kept, not compared)
    a_mean: float | None = None
    b_mean: float | None = None
    gain_pct: float | None = None           # (b - a) / a
    band_pct: float | None = None           # the pooled 95% noise band of the difference, as % of a
    boot_band_pct: float | None = None      # the 99% band of the boot means (None: fewer than 2 boots an arm)
    seconds: float = 0.0


@dataclass
class TuneOutcome:
    run_id: int
    model: str
    priority: str
    objective: str
    pick: dict[str, Any]                    # the plan's request (to_dict)
    best: dict[str, Any]                    # the tuned request (to_dict)
    changes: dict[str, Any]                 # what the best sets beside the pick (field -> value)
    trials: list[Trial]
    gain: dict[str, Any] | None             # best vs pick: a_mean, b_mean, gain_pct, band_pct, verdict, runs
    plan_file: str | None                   # what `up --from-plan` launches (None: nothing changed)
    untried: list[str] = field(default_factory=list)    # knobs / values the budget left out
    budget_s: float = 0.0
    seconds: float = 0.0
    random_weights: bool = False
    held: list[str] = field(default_factory=list)     # knobs the priority keeps out (it ranks their cost higher)
    left_out: list[str] = field(default_factory=list)  # what the pick had that random weights run without


def _knobs(pick: Pick, objective: str, guarded: tuple[str, ...], rig: Any) -> tuple[list[Knob], list[str]]:
    """The adapter's knobs for ``objective`` on this machine, less those the priority guards against."""
    from ..catalog import find_engine, load_catalog

    adapter = engines.adapter(pick.engine)
    entry = find_engine(load_catalog(), pick.engine)
    cores = None if rig.gpus else (rig.cpu_cores or None)
    offered = list(adapter.tune_knobs(objective, kv_dtype=pick.request.kv_dtype, parallel=pick.request.parallel or 1,
                                      cpu_cores=cores, kv_dtypes=[k.id for k in entry.plan_kv_dtypes]))
    widths = {k.id.lower(): k.bytes_per_elem for k in entry.kv_dtypes}
    return guarded_knobs(offered, guarded, widths, pick.request.kv_dtype)


def _request_with(pick: Pick, setting: Mapping[str, Any]) -> Pick:
    """The pick with ``setting`` (request fields; ``engine_args`` added to the request's own). A pick so
    changed keeps no uncalibrated band: that band is the pick's, not this launch's, so a bench of it makes
    no speed point for the next plan (on the H200 visit of 2026-12-04 a balanced tune's 8 boots, 4 of them
    with ``-bs`` or ``-fa off``, each stored a point "of the pick", and calibrated the next plan from them)."""
    if not setting:
        return pick
    r = pick.request
    values = dict(setting)
    if "engine_args" in values:
        values["engine_args"] = (*r.engine_args, *values["engine_args"])
    plan = {k: v for k, v in pick.plan.items() if k != "decode_tps_uncalibrated"}
    return replace(pick, request=replace(r, **values), plan=plan)


def _with(incumbent: Mapping[str, Any], setting: Mapping[str, Any]) -> dict[str, Any]:
    """The incumbent's settings with ``setting`` laid over them; the engine's own arguments add up (a
    kept ``-bs`` stays when ``-fa off`` is tried next)."""
    out = {**incumbent, **setting}
    if "engine_args" in incumbent and "engine_args" in setting:
        out["engine_args"] = (*incumbent["engine_args"], *setting["engine_args"])
    return out


def _setting(knob: Knob, value: Any) -> dict[str, Any]:
    return {"engine_args": tuple(str(a) for a in value)} if knob.field == "engine_args" else {knob.field: value}


def _describe(setting: Mapping[str, Any]) -> str:
    return describe_settings(setting) or "the pick"


def tune(store: Store, model: str, *, priority: str, engine: str | None = None, quant: str | None = None,
         ctx: int | None = None,
         parallel: int | None = None, budget_s: float = 900.0, boots: int = 2, knobs: tuple[str, ...] = (),
         random: bool = False, folder: Path | None = None, out: Path | None = None, max_tokens: int = 64,
         warmup: int = 1, measured: int = 3, quiet_wait: float = 60.0, busy_ok: bool = False,
         timeout: float | None = None, say: Callable[[str], None] | None = None) -> TuneOutcome:
    """Search the engine's knobs for ``priority`` on this machine from the plan's pick (see the module's
    docstring); ``knobs``: only these fields (kv_dtype, parallel, threads, engine_args); ``random``: on a
    random-weight file of the pick's quant (written and deleted here), else on the model itself; ``timeout``: seconds
    each boot may take to become healthy (None: the engine's own wait)."""
    from ..hardware import detect_rig
    from .trying import random_weights, random_weights_pick

    say = say or (lambda _m: None)
    for flag, value, least in (("--boots", boots, 2), ("--max-tokens", max_tokens, 1), ("--warmup", warmup, 0),
                               ("--runs", measured, 2)):
        if value < least:
            raise BadInput(f"{flag} must be at least {least} for tune, not {value}.")
    if budget_s <= 0:
        raise BadInput(f"--budget-min must be positive, not {budget_s / 60:g}.")
    check_timeout(timeout)
    objective, guarded = objective_of(priority)
    t0 = time.monotonic()
    log = StageLog(say)
    with log.stage("plan", f"plan {model} for this machine ({priority})"):
        pick = pick_from_plan(model, priority=priority, engine=engine, ctx=ctx, parallel=parallel, quant=quant)
    left_out: list[str] = []
    if random:
        if str(pick.plan.get("quant_format") or "") != "gguf":
            raise BadInput(f"the plan's pick is {pick.engine} {pick.plan.get('quant')}; tune --random writes "
                           "random-weight GGUF files (llama.cpp and ik_llama.cpp picks): give --engine llama.cpp, "
                           "or tune real weights.")
        pick, left_out = random_weights_pick(pick)     # no drafter, no projector: each said
    rig = detect_rig()
    offered, held = _knobs(pick, objective, guarded, rig)
    unknown = sorted(set(knobs) - {k.field for k in offered})
    if unknown:
        raise BadInput(f"{pick.engine} has no knob {', '.join(unknown)} to tune for {objective} here; it has "
                       f"{', '.join(sorted({k.field for k in offered})) or 'none'}.")
    chosen = [k for k in offered if not knobs or k.field in knobs]
    if not chosen:
        raise BadInput(f"engineroom knows no setting of {pick.engine} to tune for {OBJECTIVE_TEXT[objective]} "
                       f"under {priority} here" + (f" ({'; '.join(held)})" if held else "") + ".")
    try:        # the engine before anything runs (or is written): a missing one is one sentence
        engines.adapter(pick.engine).find_binary(None)
    except NotFound as exc:
        raise NotFound(f"{str(exc).rstrip('.')}; tune launches it once per boot.", detail=exc.detail) from None
    run_id = store.start_run(TUNE_KIND, {"tune": {"model": model, "priority": priority, "objective": objective,
                                                  "pick": pick.request.to_dict(), "source": pick.source,
                                                  "knobs": [asdict(k) for k in chosen], "boots": boots,
                                                  "budget_s": budget_s, "random_weights": random,
                                                  "held": held, "left_out": left_out}},
                             label=f"tune {model} --priority {priority}")
    trials: list[Trial] = []
    untried: list[str] = []
    status, result = "FAIL", {}
    try:
        with ExitStack() as files:
            served_ref = pick.model_ref       # what `up --priority` serves: the pick's weights
            if random:
                path, _size = files.enter_context(random_weights(model, pick, log, folder=folder, command="tune"))
                served_ref = str(path)
            ab = _Trials(store, served_ref, objective, boots, max_tokens, warmup, measured,
                         HostGuard(wait_s=quiet_wait, busy_ok=busy_ok, say=say), say, timeout)
            incumbent: dict[str, Any] = {}
            per_trial: float | None = None
            for knob in chosen:
                for value in knob.values:
                    setting = _setting(knob, value)
                    label = f"{knob.name} = {' '.join(value) if isinstance(value, tuple) else value}"
                    left = budget_s - (time.monotonic() - t0)
                    if per_trial is not None and per_trial > left:
                        untried.append(label)
                        continue
                    say(f"trial {len(trials) + 1}: {label} against {_describe(incumbent)}")
                    trial = ab.run(pick, incumbent, _with(incumbent, setting), knob.name, value)
                    trials.append(trial)
                    per_trial = max(per_trial or 0.0, trial.seconds)
                    say(f"  {trial.outcome}: {trial.why}")
                    if trial.outcome == "kept":
                        incumbent = _with(incumbent, setting)
                        break                 # the next knob starts from the kept value
            kept = [t for t in trials if t.outcome == "kept"]
            gain: dict[str, Any] | None = None
            if len(kept) == 1:
                t = kept[0]
                gain = {"a_mean": t.a_mean, "b_mean": t.b_mean, "gain_pct": t.gain_pct, "band_pct": t.band_pct,
                        "verdict": "real", "runs_a": t.runs_a, "runs_b": t.runs_b, "measured": "the one kept trial"}
            elif len(kept) > 1:
                if per_trial is not None and per_trial > budget_s - (time.monotonic() - t0):
                    untried.append("the last A/B of the result against the pick itself (its gain is each kept "
                                   "trial's, measured against the incumbent of its time)")
                else:
                    say(f"the result against the pick: {_describe(incumbent)}")
                    final = ab.run(pick, {}, incumbent, "the result", _describe(incumbent))
                    gain = {"a_mean": final.a_mean, "b_mean": final.b_mean, "gain_pct": final.gain_pct,
                            "band_pct": final.band_pct, "verdict": "real" if final.outcome == "kept" else "not real",
                            "why": final.why, "runs_a": final.runs_a, "runs_b": final.runs_b,
                            "measured": "an A/B of the result against the pick"}
        best = _request_with(pick, incumbent)
        plan_file = _write_plan(best, pick, out, model, priority, objective, run_id, gain) if incumbent else None
        outcome = TuneOutcome(run_id=run_id, model=model, priority=priority, objective=objective,
                              pick=pick.request.to_dict(), best=best.request.to_dict(),
                              changes=jsonable_settings(incumbent),
                              trials=trials, gain=gain, plan_file=plan_file, untried=untried, budget_s=budget_s,
                              seconds=round(time.monotonic() - t0, 1), random_weights=random, held=held,
                              left_out=left_out)
        status, result = "OK", {"best": outcome.best, "changes": outcome.changes, "gain": gain, "plan_file": plan_file,
                                "seconds": outcome.seconds}
        return outcome
    except KeyboardInterrupt:
        status = "INTERRUPTED"       # the boots so far stay stored; the server was stopped on the way out
        raise
    finally:
        summary = {"trials": [asdict(t) for t in trials], "untried": untried, "stages": log.so_far()}
        store.finish_run(run_id, status, {**summary, **(result if status == "OK" else {})})


class _Trials:
    """The A/B of two settings of the pick over interleaved boots, measured for the objective."""

    def __init__(self, store: Store, model: str, objective: str, boots: int, max_tokens: int, warmup: int,
                 measured: int, host: HostGuard, say: Callable[[str], None], timeout: float | None = None) -> None:
        self.store, self.model, self.objective, self.boots = store, model, objective, boots
        self.max_tokens, self.warmup, self.measured, self.host, self.say = max_tokens, warmup, measured, host, say
        self.timeout = timeout
        self.retries = 1

    def run(self, pick: Pick, a: Mapping[str, Any], b: Mapping[str, Any], knob: str, value: Any) -> Trial:
        from ..bench.compare import compare_boot_samples

        t0 = time.monotonic()
        trial = Trial(knob=knob, value=list(value) if isinstance(value, tuple) else value,
                      setting=jsonable_settings(b),
                      outcome="not measured", why="")
        per: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        order = boot_order(self.boots)
        for n, arm in enumerate(order, 1):
            setting = a if arm == "A" else b
            self.say(f"  boot {n}/{len(order)}: arm {arm} ({_describe(setting)})")
            samples: dict[str, Any] | None = None
            why = ""
            for attempt in range(1 + self.retries):        # an INVALID boot (a busy machine) is booted again
                try:
                    run_id, samples, why = self._boot(_request_with(pick, setting), f"{knob} arm {arm} boot {n}")
                except EngineroomError as exc:
                    if arm == "A":
                        raise    # the incumbent launched before: a failure now is the machine's, not the knob's
                    trial.outcome = "refused"
                    trial.why = f"{_describe(setting)} did not launch: {str(exc).rstrip('.')}"
                    trial.seconds = round(time.monotonic() - t0, 1)
                    return trial
                if samples is not None:
                    (trial.runs_a if arm == "A" else trial.runs_b).append(run_id)
                    break
                trial.invalid_runs.append(run_id)
                self.say(f"  boot {n}: run {run_id} is INVALID ({why})" + ("; again" if attempt < self.retries else ""))
            if samples is None:
                trial.why = f"boot {n} (arm {arm}) stayed INVALID: {why}; not compared"
                trial.seconds = round(time.monotonic() - t0, 1)
                return trial
            per[arm].append(samples)
        rows = [r for r in compare_boot_samples(per["A"], per["B"])["rows"] if r["metric"] == self.objective]
        trial.seconds = round(time.monotonic() - t0, 1)
        if not rows:
            trial.why = f"no {self.objective} measured in both arms"
            return trial
        row = rows[0]
        a_mean, b_mean = row["a_mean"], row["b_mean"]
        trial.a_mean, trial.b_mean = round(a_mean, 2), round(b_mean, 2)
        trial.gain_pct = round(row["delta_pct"], 2) if row["delta_pct"] is not None else None
        trial.band_pct = round(row["band_pct"], 2) if row["band_pct"] is not None else None
        trial.boot_band_pct = round(row["boot_band"] / a_mean * 100.0, 2) if row["boot_band"] and a_mean else None
        better = row["verdict"] == "real" and b_mean > a_mean
        trial.outcome = "kept" if better else "not kept"
        trial.why = (f"{trial.b_mean:.1f} vs {trial.a_mean:.1f} tok/s ({trial.gain_pct:+.1f}%, "
                     f"band ±{trial.band_pct:.1f}%): "
                     + ("a real gain" if better else "a real loss" if row["verdict"] == "real" else row["why"]))
        return trial

    def _boot(self, pick: Pick, label: str) -> tuple[int, dict[str, Any] | None, str]:
        """Launch ``pick``, measure it, stop it: (run id, its samples for the comparison or None, why not)."""
        from ..bench import BenchPlan, default_workloads
        from ..bench.compare import samples
        from ..bench.guards import failed_checks
        from ..bench.stats import kept
        from ..bench.suites.summary import round_figures
        from ..records import statistics as st

        log = StageLog()
        shown = [time.monotonic()]

        def progress(done: int, total: int, what: str) -> None:     # a line every 15 s of a long bench
            if time.monotonic() - shown[0] >= 15:
                shown[0] = time.monotonic()
                self.say(f"    bench {done}/{total}: {what}")

        with served(self.model, LaunchArgs(port=0, timeout=self.timeout), log, pick=pick) as s:
            if self.objective == "decode_tps":
                plan = BenchPlan(workloads=default_workloads(self.max_tokens)[:1], warmup=self.warmup,
                                 measured=self.measured, full_length=True)
                run_id = open_run(self.store, "bench", s, plan, f"tune {label}", {"tune_boot": label})
                outcome = bench(s.info, self.store, plan, run_id=run_id, api_key=s.key, host=self.host,
                                progress=progress)
                self.store.finish_run(run_id, outcome.summary.get("status", "OK"), outcome.summary)
            else:
                outcome = bench_suite(s.info, self.store, "concurrency", streams=pick.request.parallel or 1,
                                      measured=self.measured, warmup=self.warmup, max_tokens=self.max_tokens,
                                      prompt_tokens=256, host=self.host, api_key=s.key, progress=progress)
                run_id = outcome.run_id
        if outcome.summary.get("status") == "INVALID":
            return run_id, None, "; ".join(failed_checks(outcome.summary)) or "the bench said INVALID"
        if self.objective == "decode_tps":
            return run_id, samples(self.store.get_run(run_id), self.store.records(run_id)), ""
        # every slot decoding at once: each round's rate over the window where every stream decoded (a round's
        # tokens over its wall time would count the prompts' prefill too); the arms may differ in slots, so
        # the rounds of both are one group
        recs = kept(st.payloads(self.store.records(run_id)))
        rounds = round_figures(recs)
        rates = [r["all_decoding_tps"] for r in rounds if r.get("all_decoding_tps")]
        if not rates and all(r["streams"] == 1 for r in rounds):      # one slot: its stream's own decode rate
            rates = [x for x in (st.decode_tps(r) for r in recs if st.is_usable(r)) if x]
        if not rates:
            why = "; ".join(sorted({str(r.get("all_decoding_why") or "no window") for r in rounds})) or "no rounds"
            return run_id, None, (f"no round had a window where every stream decoded ({why}); a longer --max-tokens "
                                  "gives one")
        return run_id, {"every slot": {"aggregate_tps": rates}}, ""


def _write_plan(best: Pick, pick: Pick, out: Path | None, model: str, priority: str, objective: str, run_id: int,
                gain: Mapping[str, Any] | None) -> str:
    """The tuned pick as a plan file (``plan --json``'s shape) that ``up --from-plan`` launches."""
    from .. import paths

    r = best.request
    row = {**best.plan, "kv": r.kv_dtype, "parallel": r.parallel, "request": r.to_dict(),
           "tuned": {"run": run_id, "objective": objective, "gain": dict(gain) if gain else None,
                     "from": pick.request.to_dict()}}
    row.pop("model", None)
    doc = {"model": r.model, "rig": "this machine", "priority": priority, "plans": [row],
           "source": f"engineroom tune {model} --priority {priority} (run {run_id})"}
    name = f"{r.model.replace('/', '_')}-{priority}-{run_id}.json"
    path = Path(out) if out is not None else paths.data_dir() / "tune" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return str(path)
