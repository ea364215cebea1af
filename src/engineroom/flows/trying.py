"""``engineroom try MODEL``: the plan's pick measured on this machine before its weights are downloaded.

Memory and decode speed do not depend on the weights' values, so a random-weight GGUF of the
model's exact architecture and quant (``engineroom.synth``) gives real memory and real speed here.
``try`` plans the model for this machine, writes that file (its disk space checked first),
launches the plan's pick on it (the launch's own memory rows: fit's prediction against what the
engine reported, and its placement check), benches it at full length, sets the measured decode
beside the plan's band, deletes the file unless asked to keep it, and stores the run (a bench run
whose conditions carry ``try``: `engineroom report RUN` shows it).

What random weights make meaningless is said, not measured: the answers, a drafter's acceptance
(spec-decode is left off), a MoE router's balance (random routers spread tokens near evenly). The
file carries no projector, so a pick with vision is tried text-only where the engine serves it so (one that
builds the tower anyway, SGLang, is sized and measured with it, and the card says so). An engine that makes random
weights itself (vLLM's and SGLang's dummy loading, for 16-bit picks and the 4-bit AWQ, GPTQ and AutoRound
ones: ``engines.hffolder``) gets a file of the shape and tokenizer alone and serves weights of its own making.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

from .. import engines
from ..errors import BadInput, NotFound
from ..launchargs import LaunchArgs, check_timeout
from ..speedpoints import POINT_KEY, decode_mean
from ..store import Store
from ..units import gib
from .picks import SPEC_NOTE, Pick, pick_from_plan
from .runs import HostGuard, bench
from .stages import STAGES_KEY, StageLog, open_run, served

__all__ = ["NOT_MEANINGFUL", "TryOutcome", "random_file_name", "random_weights", "random_weights_pick", "try_model",
           "vision_said"]

GGUF_FORMAT = "gguf"
NOT_MEANINGFUL = (
    "answer quality: the weights are random, the text is noise",
    "spec-decode acceptance: a drafter's guesses against random weights mean nothing (tried without it)",
    "MoE routing balance: a random router spreads tokens near evenly, a trained one does not",
)
DISK_MARGIN = 1.10          # free space the file needs beside it: its size + 10%
SHAPE_ONLY_QUANT = "F16"    # the file type a shape-and-tokenizer file says it is (it holds no weight)


@dataclass
class TryOutcome:
    run_id: int
    model: str
    pick: dict[str, Any]                     # engine, quant, kv, ctx, parallel, source (the plan it came from)
    file_bytes: int
    kept: str | None                         # the random-weight file's path when kept, else None (deleted)
    memory_rows: list[dict[str, Any]]        # the launch's: component, predicted, measured, error
    placement: dict[str, Any]
    decode_band: tuple[float, float] | None  # the plan's single-stream band (tok/s)
    decode_tps: float | None                 # measured mean over the measured requests
    bench_status: str
    bench_failed: list[str]                  # an INVALID bench's failed checks ("name: detail")
    left_out: list[str] = field(default_factory=list)   # what the pick had that the try ran without
    speed_basis: str = ""                                 # the band's: calibrated from runs here, or not
    calibrated_by: dict[str, Any] | None = None           # the speed point this run adds (a valid bench only)
    stages: list[dict[str, Any]] = field(default_factory=list)   # what ran: stage, seconds, outcome
    not_meaningful: tuple[str, ...] = NOT_MEANINGFUL


def random_file_name(model_id: str, quant: str) -> str:
    """The random-weight file's name: the model's last path part, in safe characters. A model given by
    path has that path as its id; joined as it was, an absolute one put the file beside the model and the
    clean-up deleted the model's own folder (a relative one left empty folders in the scratch folder)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", PurePath(model_id.replace("\\", "/")).name).strip("-.") or "model"
    return f"{stem}-{quant}-random.gguf"


def _point_of(run_id: int, point: Any) -> dict[str, Any] | None:
    """The speed point this run stored, with this run's id (the bench summary holds it before the run has
    one, as run 0; the plan reads it back from the store with the id, so try --json said run 0)."""
    return {**point, "run_id": run_id} if isinstance(point, dict) else None


def random_weights_pick(pick: Pick) -> tuple[Pick, list[str]]:
    """The pick as a random-weight file can serve it: no drafter, no projector (each said)."""
    r, left = pick.request, []
    if r.spec_method:
        left.append(f"spec-decode ({r.spec_method}): acceptance against random weights means nothing")
    if r.vision:
        left.append("vision: the random-weight file carries no projector; tried text-only")
    request = replace(r, spec_method=None, spec_tokens=None, draft_model=None, vision=False, projector=None)
    plan = dict(pick.plan)
    speedup = plan.get("spec_speedup")
    if r.spec_method:        # the bands count the drafter's speed-up: this launch is set against them without it
        if speedup and len(speedup) == 2 and min(speedup) > 0:
            for key in ("decode_tps", "decode_tps_uncalibrated"):
                if plan.get(key):
                    plan[key] = [round(plan[key][i] / speedup[i], 1) for i in (0, 1)]
            plan["spec_speedup"] = [1.0, 1.0]
            left.append(f"speed: set against the plan's band without the drafter's x{speedup[0]:g}-{speedup[1]:g}")
        else:                # a plan file written before the rows said the speed-up: no point
            plan.pop("decode_tps_uncalibrated", None)
            left.append("calibration: none from this run (the plan's band counts the spec-decode speed-up)")
    notes = tuple(n for n in pick.notes if not (r.spec_method and n.startswith(SPEC_NOTE)))   # not launched so
    return replace(pick, request=request, plan=plan, notes=notes), left


def vision_said(left_out: list[str], engine: str, memory: dict[str, Any]) -> list[str]:
    """``left_out`` as the launch made it true: where the engine built the model's vision tower anyway (the
    launch's fit request says so: SGLang has no text-only launch for Qwen3.6), the tower was sized and measured,
    not left out."""
    if not (memory.get("fit_request") or {}).get("vision"):
        return list(left_out)
    return [*(n for n in left_out if not n.startswith("vision:")),
            f"vision: {engine} builds the model's vision tower whatever the pick's vision: sized and measured with "
            "it (random weights); no image was sent"]


def _local_config(model: str) -> dict[str, Any] | None:
    """The config.json ``model`` names on this machine (a file or the folder holding one), whole; None for anything
    else (a catalog id, a GGUF, a hub repo)."""
    from ..arch.config import read_config

    path = Path(model).expanduser()
    if not (path.is_file() and path.suffix == ".json") and not (path / "config.json").is_file():
        return None
    return read_config(path)[0]


def model_config(model: str, hf_config: str | None, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The model's own config.json, whole, for an engine that builds the model from it (vLLM, SGLang): the file
    ``model`` names here, else the catalog's ``hf_config`` repo's (Hugging Face, or huggingface_hub's cached copy
    when the hub is unreachable). None, said, when neither is at hand: the folder is then transformers' reading of
    the shape file, a text-only class the engine may not register (vLLM 0.26 builds Qwen3.5 only as its VL class:
    `try qwen3.6-27b --engine vllm` failed so on the H200, 2026-12-05)."""
    from ..arch import fetch_hf_config
    from ..errors import EngineroomError

    local = _local_config(model)
    if local is not None or not hf_config:
        return local
    try:
        return fetch_hf_config(hf_config)
    except EngineroomError as exc:
        say(f"note: {str(exc).rstrip('.')}; the folder is transformers' reading of the shape file instead, which "
            f"the engine may not build as the model: give the model's config.json (from {hf_config}) for its own")
        return None


@contextmanager
def random_weights(model: str, pick: Pick, log: StageLog, *, folder: Path | None = None, keep: bool = False,
                   command: str = "try", tensors: bool = True) -> Iterator[tuple[Path, int]]:
    """The random-weight GGUF of ``pick``'s quant of ``model`` for the block: (its path, its bytes), in a
    scratch folder of its own that is removed after the block unless ``keep``. Before writing: the disk's
    free space (the file + 10%), and the pick's engine (a missing one is said before minutes of writing
    a file nothing would serve). ``tensors`` False: the shape and tokenizer alone, for an engine that makes
    the weights itself (``engines.Engine.random_weights_loading``)."""
    from ..catalog import arch_from_catalog
    from ..plan import resolve_model
    from ..synth import arch_with_tensors, write_synthetic_gguf

    quant = str(pick.plan["quant"]) if tensors else SHAPE_ONLY_QUANT
    subject = resolve_model(model)
    arch = subject.arch or arch_from_catalog(subject.model)
    size = sum((arch_with_tensors(arch, quant).tensor_bytes or {}).values()) if tensors else 0
    where = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if size * DISK_MARGIN > free:
        raise BadInput(f"the random-weight file of {model} {quant} takes {gib(size)} and {where} has "
                       f"{gib(free)} free; give --folder on a disk with room.")
    try:
        engines.adapter(pick.engine).find_binary(None)
    except NotFound as exc:
        raise NotFound(f"{str(exc).rstrip('.')}; {command} writes its random-weight file only once the engine "
                       "is here.", detail=exc.detail) from None
    scratch = Path(tempfile.mkdtemp(prefix=f"engineroom-{command}-", dir=where))
    path = scratch / random_file_name(subject.model.id, quant)
    try:
        with log.stage("write", f"write {path.name}: random weights, {gib(size, 2)}" if tensors
                       else f"write {path.name}: the shape and tokenizer ({pick.engine} makes the weights)"):
            source = None if tensors else model_config(model, getattr(subject.model, "hf_config", None),
                                                           log.say or (lambda _m: None))
            write_synthetic_gguf(arch, quant, path, tensors=tensors, hf_config=source)
        yield path, path.stat().st_size if not tensors else size
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def try_model(store: Store, model: str, *, priority: str | None = None, engine: str | None = None,
              quant: str | None = None, ctx: int | None = None, parallel: int | None = None, threads: int | None = None,
              keep: bool = False, folder: Path | None = None, engine_args: tuple[str, ...] = (),
              max_tokens: int = 128, warmup: int = 1,
              measured: int = 3, quiet_wait: float = 60.0, busy_ok: bool = False, timeout: float | None = None,
              say: Callable[[str], None] | None = None, on_wait: Callable[[str, float], None] | None = None,
              progress: Callable[[int, int, str], None] | None = None) -> TryOutcome:
    """Plan ``model`` here, write its random-weight file, launch the pick on it, bench, compare, clean up.
    ``engine_args``: the engine's own arguments, after the pick's (a user's override, recorded with the run);
    ``timeout``: seconds the launch may take to become healthy (None: the engine's own wait)."""
    from ..bench import BenchPlan, default_workloads
    from ..bench.guards import failed_checks

    say = say or (lambda _m: None)
    for flag, value, least in (("--max-tokens", max_tokens, 1), ("--warmup", warmup, 0), ("--runs", measured, 1)):
        if value < least:
            raise BadInput(f"{flag} must be at least {least}, not {value}.")
    check_timeout(timeout)
    log = StageLog(say)
    with log.stage("plan", f"plan {model} for this machine"):
        pick = pick_from_plan(model, priority=priority, engine=engine, ctx=ctx, parallel=parallel, quant=quant)
    fmt = str(pick.plan.get("quant_format") or "")
    loading = None if fmt == GGUF_FORMAT else engines.adapter(pick.engine).random_weights_loading(fmt)
    if fmt != GGUF_FORMAT and loading is None:
        raise BadInput(f"the plan's pick is {pick.engine} {pick.plan.get('quant')} ({fmt} weights); try serves a "
                       "random-weight GGUF (llama.cpp, ik_llama.cpp) or an engine's own random weights (vLLM, "
                       f"SGLang: 16-bit, AWQ, GPTQ and AutoRound picks), and {pick.engine} {fmt} is neither: give "
                       "--engine llama.cpp, or --quant awq-int4 (or bf16) for vLLM.")
    pick, left_out = random_weights_pick(pick)
    if engine_args:
        left_out.append(f"calibration: none from this run (engine arguments typed after --: {' '.join(engine_args)})")
    quant = str(pick.plan["quant"])
    if loading:
        say(f"weights: {loading}")
    with random_weights(model, pick, log, folder=folder, keep=keep, command="try",
                        tensors=loading is None) as (path, size):
        r = pick.request
        plan = BenchPlan(workloads=default_workloads(max_tokens)[:1], warmup=warmup, measured=measured,
                         full_length=True)
        what = f"launch {r.engine} {quant} KV {r.kv_dtype} at {r.ctx} tokens x {r.parallel}"
        launch = LaunchArgs(port=0, threads=threads, extra_args=engine_args, timeout=timeout)
        with served(str(path), launch, log, pick=pick, on_wait=on_wait, what=what) as s:
            left_out = vision_said(left_out, r.engine, s.state.memory or {})
            tried = {"model": model, "quant": quant, "file_bytes": size, "source": pick.source,
                     "left_out": left_out, "not_meaningful": list(NOT_MEANINGFUL),
                     **({"engine_args": list(engine_args)} if engine_args else {})}
            run_id = open_run(store, "bench", s, plan, f"try {model} {r.engine} {quant} (random weights)",
                              {"try": tried})
            with log.stage("bench"):
                outcome = bench(s.info, store, plan, run_id=run_id, progress=progress, api_key=s.key,
                                host=HostGuard(wait_s=quiet_wait, busy_ok=busy_ok, say=say))
            store.finish_run(run_id, outcome.summary.get("status", "OK"),
                             {**outcome.summary, STAGES_KEY: log.so_far()})
    state = s.state
    memory = state.memory or {}
    decode = pick.plan.get("decode_tps") or []
    band = (float(decode[0]), float(decode[1])) if len(decode) == 2 else None
    measured_tps = decode_mean(outcome.summary)
    return TryOutcome(
        run_id=run_id, model=model,
        pick={"engine": pick.engine, "quant": quant, "kv": pick.request.kv_dtype, "ctx": pick.request.ctx,
              "parallel": pick.request.parallel, "source": pick.source, "engine_args": list(engine_args)},
        file_bytes=size, kept=str(path) if keep else None, memory_rows=list(memory.get("rows") or []),
        placement=dict(memory.get("placement") or {}), decode_band=band,
        decode_tps=measured_tps, speed_basis=str(pick.plan.get("speed_basis") or ""),
        calibrated_by=_point_of(run_id, outcome.summary.get(POINT_KEY)),
        bench_status=str(outcome.summary.get("status", "?")),
        bench_failed=failed_checks(outcome.summary) if outcome.summary.get("status") == "INVALID" else [],
        left_out=left_out, stages=log.so_far())
