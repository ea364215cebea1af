"""The plan's pick as something to launch: which engine, which file, which settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInput, EngineroomError, NotFound

if TYPE_CHECKING:
    pass



# --------------------------------------------------------------------------- plan -> launch
@dataclass(frozen=True)
class Pick:
    """The plan's choice, as what to launch: the engine, the model file, and launch settings."""

    engine: str
    model_ref: str                   # what `up` pulls and serves (packaged name, hf:..., path)
    settings: dict                   # LaunchOptions fields: ctx, n_seqs, kv_unified, kv_dtype, tp
    plan: dict                       # the plan row it came from (plan --json's shape)
    source: str                      # "plan smollm2-135m --priority balanced on cpu:24GB, pick 1"
    notes: tuple[str, ...] = ()      # what the launch leaves out of the plan, and why
    missing_file: str = ""           # why no file can be fetched for the pick (model_ref is then a placeholder)
    # a pick spanning machines: {"nodes", "gpus_per_node", "pp"} (recipe renders one command per node)
    cluster: dict | None = None
    # planned for a rig named by spec (--rig 2x3090), not this machine: the recipe is for that
    # machine, so it names the engine's program plainly instead of this machine's install
    other_rig: str = ""
    other_vendor: str = ""           # that rig's accelerator vendor ("cpu", "nvidia", ...)


def _serving_ref(model_id: str, quant_id: str) -> str:
    """The file or repo that serves ``quant_id`` of ``model_id``: a packaged file, an hf: file, a repo."""
    from ..catalog import load_catalog

    cat = load_catalog()
    model = cat.model(model_id)
    if model is None:        # an ad-hoc model: the plan was made from this very file or repo
        return model_id
    quant = next((q for q in model.quants if q.id == quant_id), None)
    if quant is None:
        raise NotFound(f"{model.id} has no quant {quant_id} in the catalog; the plan is from another catalog.")
    if quant.pypi_package:
        return model.id
    if quant.file and quant.hf_repo:
        return f"hf:{quant.hf_repo}/{quant.file}"
    repo = quant.hf_repo or model.hf_repo
    if quant.format != "gguf" and repo:      # a checkpoint: engines that load repos take the repo
        return repo
    if quant.hf_repo:
        raise MissingFile(f"the catalog names the repo {quant.hf_repo} but not its {quant_id} file; launch it by "
                          f"name with the same settings: `engineroom up hf:{quant.hf_repo}/FILE.gguf ...` "
                          f"(`engineroom recipe` prints them)", placeholder=f"hf:{quant.hf_repo}/<{quant_id} file>")
    raise MissingFile(f"the catalog names no public file for {model.id} {quant_id}; launch a file you have with "
                      f"the same settings (`engineroom recipe` prints them)",
                      placeholder=f"<{model.id} {quant_id} file>")


class MissingFile(NotFound):
    """The plan's pick names no file engineroom can fetch; ``placeholder`` stands in for it in a recipe."""

    def __init__(self, message: str, placeholder: str) -> None:
        super().__init__(message + ".")
        self.placeholder = placeholder


def pick_from_row(row: dict, model_id: str, source: str) -> Pick:
    """A plan row (``plan --json``'s "plans" entries, or ``plans_as_rows``) as a Pick."""
    try:
        engine, quant, ctx, seqs = row["engine"], row["quant"], int(row["ctx"]), int(row["seqs"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"the plan row has no usable {exc} field; "
                       "make it with `engineroom plan MODEL --json`.") from None
    notes = []
    if row.get("spec"):
        notes.append(f"speculative decoding ({row['spec']}) is in the plan but not launched: engineroom does not "
                     "fetch draft models yet")
    if int(row.get("instances") or 1) > 1:
        notes.append(f"the plan runs {row['instances']} instances; one is launched")
    settings = dict(ctx=ctx, n_seqs=seqs, kv_unified=bool(row.get("kv_unified", False)), kv_dtype=row.get("kv"),
                    tp=int(row.get("tp") or 1))
    try:
        ref, missing = _serving_ref(model_id, quant), ""
    except MissingFile as exc:
        ref, missing = exc.placeholder, str(exc)
    cluster = None
    if int(row.get("nodes") or 1) > 1:
        cluster = {"nodes": int(row["nodes"]), "gpus_per_node": int(row.get("gpus_per_node") or 1),
                   "pp": int(row.get("pp") or 1)}
    return Pick(engine=engine, model_ref=ref, settings=settings, plan={**row, "model": model_id}, source=source,
                notes=tuple(notes), missing_file=missing, cluster=cluster)


def pick_from_plan(model: str, *, priority: str | None = None, rig: str | None = None,
                   pick: int = 1, engine: str | None = None) -> Pick:
    """Plan ``model`` for ``rig`` (default: this machine) under ``priority`` and take plan ``pick``."""
    from ..hardware import resolve_rig
    from ..plan import plan as make_plan
    from ..plan import plans_as_rows

    if pick < 1:
        raise BadInput(f"--pick counts plans from 1; got {pick}.")
    the_rig = resolve_rig(rig)
    plans = make_plan(model, the_rig, priority, limit=pick, engine=engine)
    if len(plans) < pick:
        raise NotFound(f"the plan has {len(plans)} configuration(s) for {model}; --pick {pick} is beyond them.")
    chosen = plans[pick - 1]
    row = plans_as_rows([chosen])[0]      # the same row `plan --json` writes, so --from-plan gets it too
    source = f"plan {model} --priority {chosen.priority} on {the_rig.label or 'this machine'}, pick {pick}"
    picked = pick_from_row(row, chosen.model, source)
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
    picked = pick_from_row(row, doc["model"], source)
    rig = doc.get("rig")
    if not isinstance(rig, str) or rig in ("", "this machine"):
        return picked
    try:                       # a plan for a rig named by spec: the recipe is for that machine
        from ..hardware import parse_rig

        vendor = parse_rig(rig).vendor
    except EngineroomError:
        return picked
    return replace(picked, other_rig=rig, other_vendor=vendor)


def apply_pick(pick: Pick, options: dict, given: Sequence[str]) -> dict:
    """The launch options of ``pick``, with every option the user typed winning over the plan's."""
    merged = dict(options)
    plan_to_option = {"ctx": "ctx", "n_seqs": "parallel", "kv_unified": "kv_unified", "kv_dtype": "kv_dtype",
                      "tp": "tp"}
    for field_name, option in plan_to_option.items():
        if option not in given:
            merged[option] = pick.settings[field_name]
    if "engine" not in given:
        merged["engine"] = pick.engine
    return merged
