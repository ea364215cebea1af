"""Models outside the catalog: a catalog-shaped Model built from a GGUF header or a config.json.

A GGUF is one quant at its exact tensor bytes; a config.json gives its published dtype plus
the usual quants, each an estimate. Quality is a class tier, features only what the
architecture proves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from ..arch import (
    ModelArch,
    count_active_params,  # arch.params: the one counter
)
from ..catalog import Catalog, Model, Quant, block_from_arch, find_model, load_catalog
from ..catalog.base import QuantFormat
from ..catalog.load import closest_model
from ..catalog.schema import ArchBlock, Quality
from ..errors import BadInput, EngineroomError, NotFound
from ..units import GB

if TYPE_CHECKING:
    from ..refs import ModelRef


def _engines_loading(cat: Catalog, fmt: str) -> tuple[str, ...]:
    return tuple(e.id for e in cat.engines if fmt in e.quant_formats)


def class_quality(quant_id: str, catalog: Catalog | None = None) -> Quality | None:
    """The class tier of ``quant_id`` (catalog tables.yaml quant_classes), or None for an unknown class."""
    c = (catalog or load_catalog()).tables.quant_class(quant_id)
    if c is None:
        return None
    return Quality(tier=c.tier, source=f"{c.label} class tier for {quant_id} (no KLD known for this file)")


@dataclass(frozen=True)
class ResolvedModel:
    """The model a plan or fit is about: a catalog entry (``source`` "catalog", ``arch`` None:
    the catalog's inline block), or one built from a file or repo by ``model_from_arch``."""

    model: Model
    arch: ModelArch | None = None
    source: str = "catalog"               # else e.g. "GGUF header of x.gguf"
    estimates: tuple[str, ...] = ()       # what the output must call a guess

    @property
    def in_catalog(self) -> bool:
        return self.source == "catalog"


def names_file_or_repo(ref: str) -> bool:
    """A path, URL, hf:/org/repo reference, a .gguf/.json name, or anything on disk."""
    ref = ref.strip()
    return bool(ref) and ("/" in ref or ref.endswith((".gguf", ".json")) or Path(ref).expanduser().exists())


def resolve_model(ref: str | ModelRef | ResolvedModel, catalog: Catalog | None = None) -> ResolvedModel:
    """A catalog model (id, alias, name or HF repo); else, when ``ref`` names a file or repo,
    the model ``arch.load_arch`` reads from it. One BadInput/NotFound sentence says why
    neither worked; a plain name that is not in the catalog gets the catalog's error.
    A ``refs.ModelRef`` (parsed once by the caller) is used as it is."""
    if isinstance(ref, ResolvedModel):
        return ref
    cat = catalog or load_catalog()
    if isinstance(ref, str):
        if cat.model(ref) is not None or not names_file_or_repo(ref):
            return ResolvedModel(find_model(cat, ref))
        text, mref = ref.strip(), None
    else:
        from ..refs import RefKind

        if ref.kind in (RefKind.CATALOG, RefKind.PACKAGED):
            return ResolvedModel(find_model(cat, ref.catalog_id or ref.name))
        text, mref = ref.raw, ref
    # a file or repo: its readers are imported here (planning a catalog model needs none of them)
    from ..arch import load_arch
    from ..refs import parse

    try:
        arch = load_arch(mref or parse(text))
    except (EngineroomError, OSError) as err:
        close = closest_model(cat, text)
        hint = f" (did you mean '{close}'?)" if close else ""
        cls = NotFound if isinstance(err, NotFound) else BadInput
        raise cls(f"model '{text}' is not in the catalog{hint} and cannot be read as a model file or repo: "
                  f"{err}") from None
    return model_from_arch(text, arch, cat)


def _unknown_class(qid: str) -> Quality:
    return Quality(tier=2, source=f"unknown quant class {qid}: lowest tier assumed (no KLD known)")


def _sized(qid: str, fmt: QuantFormat, engines: tuple[str, ...], params: int, cat: Catalog,
           hf_repo: str | None = None) -> Quant:
    bits = cat.tables.bits_per_weight[qid.lower()]
    size = params * bits / 8
    return Quant(id=qid, format=fmt, size_gb=float(f"{size / GB:.3g}"), engines=engines, hf_repo=hf_repo,
                 size_source=f"estimate: {params:,} params x {bits:g} bits/weight; no such file checked",
                 quality=class_quality(qid, cat) or _unknown_class(qid))


def _gguf_quant(arch: ModelArch, ref: str, cat: Catalog) -> tuple[Quant, list[str]]:
    """The file itself: its type (general.file_type, else the tensor type holding most bytes)
    and its exact tensor bytes."""
    if not arch.tensor_bytes:
        raise BadInput(f"{ref} holds no weight tensors (a vocab-only GGUF?), so there is nothing to plan.")
    notes = []
    qid = (arch.file_type or "").removesuffix(" (guessed)")
    if arch.file_type and qid != arch.file_type:
        notes.append(f"quant id: the header's general.file_type is '{arch.file_type}'")
    if not qid or class_quality(qid, cat) is None:
        by_type: dict[str, int] = {}
        for name, b in arch.tensor_bytes.items():
            by_type[arch.tensor_types[name]] = by_type.get(arch.tensor_types[name], 0) + b
        qid = max(by_type, key=lambda t: by_type[t])
        notes.append(f"quant id: no usable general.file_type; named after its largest tensor type, {qid}")
    quality = class_quality(qid, cat) or _unknown_class(qid)
    exact = arch.weight_bytes_exact or 0
    notes.append(f"quality: {quality.source}")
    return Quant(id=qid, format="gguf", size_gb=float(f"{exact / GB:.3g}"), size_bytes=exact,
                 size_source=f"exact: {exact:,} bytes of tensors in the GGUF header",
                 engines=_engines_loading(cat, "gguf"),
                 file=Path(ref).name, quality=quality), notes


def _published_and_usual_quants(arch: ModelArch, hf_repo: str | None, cat: Catalog) -> tuple[list[Quant], list[str]]:
    """The published checkpoint (bf16, fp8, AWQ/GPTQ/AutoRound int4) for the engines that
    load its format, then the usual GGUF and vLLM/SGLang quants, each sized as parameters x
    bits per weight. Safetensors checkpoints carry the vision tower; a GGUF does not (it
    ships in a separate mmproj file, which fit adds when vision is on)."""
    params = arch.total_param_count
    if not params:
        raise BadInput(f"{arch.name} has no parameter count, so its weights cannot be sized.")
    vision = arch.vision.param_count if arch.vision and arch.vision.param_count else 0
    sizes = f"quant sizes: {params:,} parameters counted from the config's shapes x bits/weight per quant"
    if vision:
        sizes += f" (GGUF: {params - vision:,}, without the {vision:,}-parameter vision tower)"
    notes = [f"{sizes}; no such file was checked", "quality tiers: class tiers by quant type (no KLD known)"]
    dtype = (arch.torch_dtype or "").lower()
    if dtype not in cat.tables.bits_per_weight:
        notes.append(f"published dtype: {arch.torch_dtype or 'not stated'} in the config; bf16 assumed")
        dtype = "bf16"
    elif dtype in cat.tables.loaded_as:
        notes.append(f"published dtype: {arch.torch_dtype} in the config; offered at {cat.tables.loaded_as[dtype]}, "
                     "the 16-bit type the engines load a float32 checkpoint at by default (vLLM --dtype auto, "
                     "llama.cpp's converter --outtype auto)")
        dtype = cat.tables.loaded_as[dtype]
    published = cat.tables.published_formats.get(dtype, "bf16")
    quants = [_sized(dtype, published, _engines_loading(cat, published), params, cat, hf_repo)]
    quants += [_sized(qid, fmt, _engines_loading(cat, fmt), params - vision if fmt == "gguf" else params, cat)
               for qid, fmt in ((u.id, u.format) for u in cat.tables.usual_quants) if qid != dtype]
    return quants, notes


def arch_block(arch: ModelArch, source: str, active_param_count: int | None) -> ArchBlock:
    """``arch`` as the catalog's inline block (plan and fit use ``arch`` itself: this keeps
    the ad-hoc Model valid and self-describing), with the active parameters plan counted."""
    return block_from_arch(replace(arch, active_param_count=active_param_count), source)


def model_from_arch(ref: str, arch: ModelArch, catalog: Catalog | None = None) -> ResolvedModel:
    """A catalog-shaped Model for a model that is not in the catalog, validated like one.

    From a GGUF (``arch.source == "gguf"``): one quant, the file itself, at its exact tensor
    bytes, for the catalog engines that load GGUF. From a config.json: the published dtype
    plus the usual quants (GGUF Q8_0 / Q4_K_M, fp8, AWQ / GPTQ / AutoRound int4), each an estimate, each for
    the catalog engines whose quant_formats list its format.
    Quality is the quant's class tier; features are only what the arch proves (vision)."""
    cat = catalog or load_catalog()
    on_hub = arch.source == "config.json" and not Path(ref).expanduser().exists()
    gguf = arch.source == "gguf"
    source = (f"GGUF header of {ref}" if gguf else f"config.json of {ref} on Hugging Face" if on_hub
              else f"config.json at {ref}")
    try:
        if gguf:
            quant, notes = _gguf_quant(arch, ref, cat)
            quants = [quant]
        else:
            quants, notes = _published_and_usual_quants(arch, ref if on_hub else None, cat)
        notes.append("features: tool calling and reasoning cannot be read from "
                     f"{'a GGUF header' if gguf else 'a config.json'}, so none is assumed")
        notes += [f"architecture: {e}" for e in arch.estimated]
        active = count_active_params(arch)
        if active and arch.moe:
            notes.append(f"decode speed: {active:,} of {arch.param_count:,} parameters read per token "
                         f"({arch.moe.n_experts_active} of {arch.moe.n_experts} experts), "
                         "counted from the expert shapes")
        model = Model(id=ref, name=arch.name or ref, hf_repo=ref if on_hub else None,
                      architecture=arch_block(arch, source, active), features=("vision",) if arch.vision else (),
                      quants=tuple(quants), notes=f"not in the catalog: read from the {source}")
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "model"
        raise BadInput(f"the {source} does not describe a model engineroom can plan "
                       f"({where}: {err.get('msg', 'invalid').rstrip('.')}).") from None
    return ResolvedModel(model=model, arch=arch, source=source, estimates=tuple(notes))
