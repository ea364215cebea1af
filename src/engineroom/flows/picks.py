"""The plan's pick as something to launch: its LaunchRequest, where it came from, and what to say about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import engines
from ..engines.base import LaunchOptions
from ..errors import BadInput, EngineroomError, NotFound
from ..launchargs import LaunchArgs
from ..plan.request import LaunchRequest

if TYPE_CHECKING:
    from ..catalog.schema import Priority
    from ..plan import Plan


# --------------------------------------------------------------------------- plan -> launch
@dataclass(frozen=True)
class Pick:
    """The plan's choice, as what to launch: its LaunchRequest (weights, settings, features)."""

    request: LaunchRequest
    plan: dict                       # the plan row it came from (plan --json's shape, its request included)
    source: str                      # "plan smollm2-135m --priority balanced on cpu:24GB, pick 1"
    notes: tuple[str, ...] = ()      # what the launch leaves out of the plan or trades, and why
    # planned for a rig named by spec (--rig 2x3090), not this machine: the recipe is for that
    # machine, so it names the engine's program plainly instead of this machine's install
    other_rig: str = ""
    other_vendor: str = ""           # that rig's accelerator vendor ("cpu", "nvidia", ...)

    @property
    def engine(self) -> str:
        return self.request.engine

    @property
    def model_ref(self) -> str:
        """What `up` pulls and serves (packaged name, hf:ORG/REPO/FILE, ORG/REPO)."""
        return self.request.weights.ref

    @property
    def cluster(self) -> dict[str, int] | None:
        """A pick spanning machines: {"nodes", "gpus_per_node", "pp"} (recipe renders one command per node)."""
        r = self.request
        if r.nodes <= 1:
            return None
        return {"nodes": r.nodes, "gpus_per_node": r.gpus_per_node or 1, "pp": r.pp}


SPEC_NOTE = "speculative decoding: "       # how a pick's note on its drafter starts


def _notes(request: LaunchRequest, row: Mapping[str, Any], priority: str | None) -> list[str]:
    """What to say about the pick: ``row`` holds the plan's sizing as ``plan --json`` writes it
    (instances, ctx, max_ctx, parallel, reasons), whether from a file or from the Plan itself."""
    from ..catalog import find_priority, load_catalog

    notes = []
    if request.spec_method:
        drafter = f" with the drafter {request.draft_model}" if request.draft_model else " (the model's own MTP head)"
        notes.append(f"{SPEC_NOTE}{request.spec_method}, {request.spec_tokens} tokens a step{drafter}")
    if request.text_only:
        notes.append(request.text_only)
    if int(row.get("instances") or 1) > 1:
        notes.append(f"the plan runs {row['instances']} instances; one is launched")
    cat = load_catalog()
    engine = next((e for e in cat.engines if e.id == request.engine), None)
    try:
        prio = find_priority(cat, priority) if priority else None
    except EngineroomError:
        prio = None
    model = cat.model(request.model)
    trained = model.architecture.max_position if model is not None and model.architecture is not None else None
    notes.extend(_sizing_notes(row, prio, trained))
    wanted = prio.constraints.engine_status if prio else ()
    if engine is not None and wanted and engine.status not in wanted:
        notes.append(f"{engine.id} is marked {engine.status} ({engine.status_note}); planned because --engine named "
                     f"it (priority {prio.id if prio else priority} takes {'/'.join(wanted)} engines)")
    elif engine is not None and engine.status not in cat.default_priority().constraints.engine_status:
        # an engine the default plan would not pick: its status is said even where this priority takes it
        notes.append(f"{engine.id} is marked {engine.status} ({engine.status_note})")
    return notes


def _sizing_notes(row: Mapping[str, Any], prio: Priority | None, trained: int | None) -> list[str]:
    """Why the pick's context and sequences are what they are: the priority's workload context, the
    model's trained context, or the most that fits (then fit's memory line says where the memory
    went); sequences sized to fit."""
    ctx, max_ctx, parallel = row.get("ctx"), row.get("max_ctx"), row.get("parallel")
    if prio is None or not isinstance(ctx, int):
        return []
    fit_line = next((r for r in row.get("reasons") or () if str(r).startswith("fit: ")), "")
    fillable = f" of {max_ctx:,} fillable" if isinstance(max_ctx, int) and max_ctx > ctx else ""
    if trained is not None and ctx >= trained:
        out = [f"context {ctx:,} tokens per sequence: the model's trained context"]
    elif prio.ctx == "max" or (isinstance(prio.ctx, int) and ctx < prio.ctx):
        asked = "" if prio.ctx == "max" else f" (the priority sizes for {prio.ctx:,})"
        out = [f"context {ctx:,} tokens per sequence: the most that fits in memory{asked}"
               + (f"; {fit_line}" if fit_line else "")]
    else:
        out = [f"context {ctx:,} tokens per sequence: priority {prio.id}'s workload context{fillable} "
               "(--ctx sets it)"]
    if prio.parallel == "max" and isinstance(parallel, int):
        out.append(f"{parallel} sequences: as many as fit in memory at that context")
    return out


def pick_from_row(row: dict, model_id: str, source: str, priority: str | None = None) -> Pick:
    """A plan row (``plan --json``'s "plans" entries, or ``plans_as_rows``) as a Pick: its request."""
    raw = row.get("request") if isinstance(row, dict) else None
    if not isinstance(raw, dict):
        raise BadInput("the plan row holds no launch request (a plan written by an older engineroom?); "
                       "make it again with `engineroom plan MODEL --json`.")
    request = LaunchRequest.from_dict(raw)
    if request.model != model_id or request.engine != row.get("engine") or request.weights.quant != row.get("quant"):
        raise BadInput(f"the plan row's request ({request.engine} {request.weights.quant} of {request.model}) does not "
                       f"match the row ({row.get('engine')} {row.get('quant')} of {model_id}); make the plan again.")
    return _picked(request, row, model_id, source, priority)


def _picked(request: LaunchRequest, row: dict, model_id: str, source: str, priority: str | None) -> Pick:
    """The Pick of ``request``; ``row``: its plan as ``plan --json`` writes it, kept for the records."""
    if not request.weights.ref:
        raise NotFound(f"the plan row names no weights for {request.model} {request.weights.quant}; make it again.")
    return Pick(request=request, plan={**row, "model": model_id}, source=source,
                notes=tuple(_notes(request, row, priority)))


def pick_of(chosen: Plan, source: str) -> Pick:
    """The Pick of a Plan made in this process: its own LaunchRequest, as it is (no JSON on the way;
    ``pick_from_row`` reads the same request back from ``plan --json``'s row). Its row is kept
    with it for the launch's record and card."""
    from ..plan import plans_as_rows

    if chosen.request is None:
        raise BadInput(f"the plan of {chosen.model} ({chosen.engine} {chosen.quant}) holds no launch request.")
    return _picked(chosen.request, plans_as_rows([chosen])[0], chosen.model, source, chosen.priority)


def pick_from_plan(model: str, *, priority: str | None = None, rig: str | None = None,
                   pick: int = 1, engine: str | None = None, ctx: int | None = None,
                   parallel: int | None = None, quant: str | None = None) -> Pick:
    """Plan ``model`` for ``rig`` (default: this machine) under ``priority`` and take plan ``pick``
    (``ctx`` / ``parallel``: the plan's --ctx / --parallel). For this machine, the speeds are
    calibrated by the runs measured here (``calibration_here``)."""
    from ..hardware import resolve_rig
    from ..plan import plan as make_plan

    if pick < 1:
        raise BadInput(f"--pick counts plans from 1; got {pick}.")
    from ..speedpoints import calibration_here

    the_rig = resolve_rig(rig)
    plans = make_plan(model, the_rig, priority, limit=pick, engine=engine, ctx=ctx, parallel=parallel, quant=quant,
                      calibration=calibration_here(rig=the_rig) if rig is None else None)
    if len(plans) < pick:
        raise NotFound(f"the plan has {len(plans)} configuration(s) for {model}; --pick {pick} is beyond them.")
    chosen = plans[pick - 1]
    source = f"plan {model} --priority {chosen.priority} on {the_rig.label or 'this machine'}, pick {pick}"
    picked = pick_of(chosen, source)
    if ctx is not None and chosen.ctx == ctx:      # the context asked for, not one the priority sized
        picked = replace(picked, notes=tuple(f"context {ctx:,} tokens per sequence: as --ctx asked"
                                             if n.startswith("context ") else n for n in picked.notes))
    if the_rig.source != "spec":
        return picked
    return replace(picked, other_rig=the_rig.label, other_vendor=the_rig.vendor)


def pick_from_file(path: Path, pick: int = 1) -> Pick:
    """Plan ``pick`` of a file written by ``engineroom plan MODEL --json > plan.json``."""
    import json

    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise NotFound(f"cannot read the plan file {path} ({exc.strerror}).") from None
    except ValueError:
        raise BadInput(f"{path} is not JSON; write it with `engineroom plan MODEL --json > {path}`.") from None
    plans = doc.get("plans") if isinstance(doc, dict) else None
    if not isinstance(plans, list) or not plans or not isinstance(doc.get("model"), str):
        raise BadInput(f"{path} holds no plans; write it with `engineroom plan MODEL --json > {path}` "
                       "(a how-to-choose table needs --priority).")
    if not 1 <= pick <= len(plans):
        raise BadInput(f"--pick {pick} is not among the {len(plans)} plan(s) in {path}.")
    row = plans[pick - 1]
    source = f"{path}, plan {pick} ({doc.get('priority', '?')} on {doc.get('rig', '?')})"
    priority = doc.get("priority") if isinstance(doc.get("priority"), str) else None
    picked = pick_from_row(row, doc["model"], source, priority)
    rig = doc.get("rig")
    if not isinstance(rig, str) or rig in ("", "this machine"):
        return picked
    try:                       # a plan for a rig named by spec: the recipe is for that machine
        from ..hardware import parse_rig

        vendor = parse_rig(rig).vendor
    except EngineroomError:
        return picked
    return replace(picked, other_rig=rig, other_vendor=vendor)


# --------------------------------------------------------------------------- request -> adapter
# the launch arguments that are also fields of the request, by the one name both use
REQUEST_FIELDS = ("ctx", "parallel", "kv_unified", "kv_dtype", "tp", "engine", "chat_template", "threads")


def typed_request(model_ref: str, pick: Pick | None, args: LaunchArgs, default_engine: str) -> LaunchRequest:
    """The request to launch: the pick's with every request field of ``args`` given (not None)
    replacing its own, or, without a pick, those fields alone."""
    from ..plan.request import Weights

    given: dict[str, Any] = {name: getattr(args, name) for name in REQUEST_FIELDS if getattr(args, name) is not None}
    if "engine" in given:            # an alias typed (llamacpp) is the engine's id from here on
        given["engine"] = engines.resolve(str(given["engine"]))
    if pick is None:
        base = LaunchRequest(model=model_ref, engine=str(given.pop("engine", default_engine)),
                             weights=Weights(ref=model_ref))
        return replace(base, **given, given=tuple(given)) if given else base
    request = pick.request
    if given.get("engine") not in (None, request.engine):     # the old engine's own words stay behind
        request = replace(request, engine_options=(), engine_args=(), tool_parser=None, reasoning_parser=None)
    return request.with_user(given)


def launch_options(request: LaunchRequest, *, model_path: Path, projector: Path | None = None,
                   **process: Any) -> LaunchOptions:
    """The adapter's LaunchOptions for ``request``: ``model_path`` / ``projector`` where the weights and
    projector are (or will be) on this machine; ``process``: how this launch runs here (port, host,
    model_name, extra_args: after the request's own ``engine_args``, changes, log_path, api_key_file)."""
    r = request
    extra = (*r.engine_args, *process.pop("extra_args", ()))     # the request's own arguments first
    return LaunchOptions(
        model_path=model_path, ctx=r.ctx, parallel=r.parallel, kv_unified=r.kv_unified, kv_dtype=r.kv_dtype,
        tp=r.tp or 1, chat_template=Path(r.chat_template) if r.chat_template else None,
        spec_method=r.spec_method, spec_tokens=r.spec_tokens, draft_model=r.draft_model,
        tool_parser=r.tool_parser, reasoning_parser=r.reasoning_parser, quant_format=r.weights.format or None,
        vision=True if r.vision else (False if r.text_only else None), projector=projector,
        engine_options=r.engine_options, threads=r.threads, mem_fraction=r.mem_fraction, extra_args=extra, **process)
