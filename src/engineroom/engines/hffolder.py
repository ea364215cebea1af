"""A GGUF file as the Hugging Face folder an engine that serves folders loads (vLLM, SGLang), written by
transformers in the engine's own environment.

Two kinds: a real GGUF converted whole (its weights dequantized to float16 safetensors, with its tokenizer);
and a random-weight GGUF engineroom wrote (``synth.RANDOM_WEIGHTS_KEY``) as its config (the model's own config.json
where the file carries it, ``synth.HF_CONFIG_KEY``, else transformers' reading of the GGUF) and tokenizer alone,
which the engine serves with weights of its own making (``--load-format dummy``): at 16 bits, or packed at
4 bits when the folder's config carries the pick's ``quantization_config`` (the checkpoint convention AWQ,
GPTQ and AutoRound write, which both engines read), so the engine builds that method's layers and kernels.
A multimodal config's folder also has its processor's files, as the model's repo has (SGLang loads the processor
before it serves), written by the environment's transformers where it can build one (``SOURCE_FILE`` says whether:
vLLM's CPU environment has no torchvision, and serves text-only without one). Which formats an engine makes
random weights of is its adapter's to say. Each folder says where it came from (``SOURCE_FILE``) and is cached
under engineroom's cache, per engine, keyed by the file's name, size and the sha256 of its first and last MiB, so
a second launch reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import BadInput, EngineFailed

DTYPE = "float16"                        # what a folder is saved as
SOURCE_FILE = "engineroom-source.json"   # written into each folder: where it came from, its dtype, its weights
SIXTEEN_BIT = ("bf16", "f16", "fp16")   # the formats a folder of random weights holds at DTYPE, as the pick would
INT4_GROUP = 128                 # the group size of the int4 checkpoints the catalog names (AWQ, GPTQ, AutoRound)
# GPTQ names the decoder blocks' modules it quantized: without the key, vLLM (0.26, auto_gptq) reads them from the
# checkpoint's safetensors dtypes, and a dummy-weight folder has none, so it quantized nothing and loaded a
# gptq-int4 pick of Qwen3.6-27B at 16 bits (50.2 GiB for 16.3 planned, H100, 2026-12-05); "layers." is a substring
# of every decoder block's module names (model.layers.N, model.language_model.layers.N, backbone.layers.N)
_INT4_CONFIGS: dict[str, dict[str, object]] = {
    "awq": {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "desc_act": False, "sym": True,
             "modules_in_block_to_quantize": [["layers."]]},
    "autoround": {"quant_method": "auto-round", "bits": 4, "sym": True, "data_type": "int",
                  "packing_format": "auto_round:auto_gptq"},
}
# what a published 4-bit checkpoint of a model with a vision tower says to leave the tower at 16 bits (each method
# its own way; the engines read them): its dims need not divide the group (Qwen3.6's 4,304-wide vision MLP did not,
# and vLLM 0.26 found no int4 kernel for it on the H100, 2026-12-05)
_VISION = r".*(visual|vision_tower|vision_model|multi_modal_projector|mm_projector).*"
_TEXT_ONLY: dict[str, dict[str, object]] = {
    "awq": {"modules_to_not_convert": ["visual", "vision_tower", "vision_model", "multi_modal_projector"]},
    "gptq": {"dynamic": {f"-:{_VISION}": {}}},
    "auto-round": {"block_name_to_quantize": "model.language_model.layers"},
}
Progress = Callable[[float | None, str], None]


def quantization_config(quant_format: str | None, *, vision: bool = False) -> dict[str, object] | None:
    """The quantization_config a folder of ``quant_format`` random weights carries (its group size: INT4_GROUP,
    or the largest power of two down to 32 that divides the shape's dims, set when the folder is written; with
    ``vision``, the vision tower left unquantized as published checkpoints leave it); None for a format that is not
    a 4-bit packed one."""
    found = _INT4_CONFIGS.get((quant_format or "").lower())
    if found is None:
        return None
    return {**found, "group_size": INT4_GROUP, **(_TEXT_ONLY[str(found["quant_method"])] if vision else {})}


def int4_quant(quant_format: str | None) -> str | None:
    """fit's quant id for weights of a 4-bit packed method (``awq`` -> ``awq-int4``, the catalog's ids), None for
    any other format."""
    fmt = (quant_format or "").lower()
    return f"{fmt}-int4" if fmt in _INT4_CONFIGS else None


def dummy_loading(engine: str, quant_format: str) -> str | None:
    """How an engine that loads random weights itself (``--load-format dummy``: vLLM, SGLang) serves a pick in
    ``quant_format`` from a random-weight file's folder (a sentence), or None: a format whose weights it would
    not make as the pick loads them (fp8, nvfp4, GGUF ...)."""
    fmt = quant_format.lower()
    if quantization_config(fmt) is not None:
        return (f"{engine}'s dummy loading (--load-format dummy) of {fmt} 4-bit weights (the folder's "
                f"quantization_config: group size {INT4_GROUP} where the shape allows): the model's shape and "
                f"tokenizer from engineroom's random-weight file, packed weights {engine} initialises itself")
    if fmt not in SIXTEEN_BIT:
        return None
    return (f"{engine}'s dummy loading (--load-format dummy) at {DTYPE}: the model's shape and tokenizer from "
            f"engineroom's random-weight file, weights {engine} initialises itself")


def is_gguf(path: Path) -> bool:
    """Whether ``path`` starts with the GGUF magic (False for a file that cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def random_weights_file(path: Path) -> bool:
    """A GGUF engineroom wrote with random weights (``synth.RANDOM_WEIGHTS_KEY``)."""
    return _random_weights_kv(path) is not None


def _random_weights_kv(path: Path) -> dict[str, Any] | None:
    """The header of a GGUF engineroom wrote with random weights (None: any other file)."""
    from ..arch.gguf import read_gguf_header_local
    from ..synth import RANDOM_WEIGHTS_KEY

    try:
        kv = read_gguf_header_local(path).kv
    except (BadInput, OSError):
        return None
    return dict(kv) if kv.get(RANDOM_WEIGHTS_KEY) else None


def source_of(folder: Path) -> dict[str, Any]:
    """What a folder engineroom wrote says of itself ({}: not one of engineroom's)."""
    try:
        found = json.loads((Path(folder) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def converted_dtype(folder: Path) -> str | None:
    """The dtype engineroom wrote ``folder`` at (None: not a folder engineroom made)."""
    return str(source_of(folder).get("dtype") or "") or None


def dummy_weights(folder: Path) -> bool:
    """Whether ``folder`` is the config and tokenizer of a random-weight file, with no weights: the engine makes
    them (``--load-format dummy``)."""
    return source_of(folder).get("weights") == "dummy"


_CONVERT = r"""
import json, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float16)
for attr in ("hf_quantizer", "quantization_method"):
    if hasattr(model, attr):
        try:
            delattr(model, attr)
        except AttributeError:
            setattr(model, attr, None)
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.config.torch_dtype = torch.float16
model.save_pretrained(str(out), safe_serialization=True)
tok.save_pretrained(str(out))
cfg = json.loads((out / "config.json").read_text())
cfg.pop("quantization_config", None)
(out / "config.json").write_text(json.dumps(cfg, indent=2))
print("OK", sum(p.numel() for p in model.parameters()))
"""
# a random-weight GGUF: its shape and tokenizer only (and a 4-bit pick's quantization_config); the engine makes
# the weights
_CONFIG_ONLY = r"""
import json, sys
from pathlib import Path
from transformers import AutoConfig, AutoTokenizer
gguf, out, quant = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3] or "null")
tied, source = json.loads(sys.argv[4] or "null"), json.loads(sys.argv[5] or "null")
vocab = Path(sys.argv[6]) if sys.argv[6] else None     # None: this environment's reading of it is in out already
tok = AutoTokenizer.from_pretrained(str(vocab.parent), gguf_file=vocab.name) if vocab else None
if source is None:   # transformers' reading of the GGUF's metadata
    cfg = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg.torch_dtype = "float16"
    cfg.save_pretrained(str(out))
    data = json.loads((out / "config.json").read_text())
else:                # the model's own config.json, at float16
    out.mkdir(parents=True, exist_ok=True)
    data = source
    for c in (data, data.get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):
            if key in c or c is data:
                c[key] = "float16"
if tok is not None:
    tok.save_pretrained(str(out))
if source is None and not data.get("architectures"):   # a checkpoint's config names its class; engines read it
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if data.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        data["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[data["model_type"]]]
data.pop("quantization_config", None)
if tied is not None and source is None:   # the metadata alone has no output.weight to say the head is untied
    for c in (data, data.get("text_config") or {}):
        c["tie_word_embeddings"] = tied
if quant:      # every linear layer's input dim a multiple of the group: the largest of group, group/2 ... 32
    c = data.get("text_config") or data
    heads = c.get("num_attention_heads") or 1
    dims = [c.get(k) for k in ("hidden_size", "intermediate_size", "moe_intermediate_size",
                               "shared_expert_intermediate_size")]
    dims.append(heads * (c.get("head_dim") or (c.get("hidden_size") or heads) // heads))
    g = quant["group_size"]
    while g > 32 and any(d and d % g for d in dims):
        g //= 2
    data["quantization_config"] = {**quant, "group_size": g}
(out / "config.json").write_text(json.dumps(data, indent=2))
vision = data.get("vision_config")
if isinstance(vision, dict):   # a multimodal model's repo has its processor's files beside the config: this one's
    # class (for the model's type) with its defaults, at the tower's patch and merge sizes, saved as it saves them
    sizes = {"patch_size": "patch_size", "temporal_patch_size": "temporal_patch_size",
             "merge_size": "spatial_merge_size"}
    (out / "preprocessor_config.json").write_text(json.dumps({k: vision[v] for k, v in sizes.items() if v in vision}))
    import tempfile
    from transformers import AutoProcessor
    try:
        with tempfile.TemporaryDirectory() as saved:   # its files alone: the vocabulary's stay as they were written
            AutoProcessor.from_pretrained(str(out)).save_pretrained(saved)
            for f in Path(saved).iterdir():
                if f.name.endswith("processor_config.json"):
                    f.replace(out / f.name)
        print("PROCESSOR", json.dumps("written"))
    except Exception as exc:   # this environment cannot build it (no torchvision): an engine that needs it says so
        print("PROCESSOR", json.dumps(f"not written: {type(exc).__name__}: {str(exc).strip()[:300]}"))
print("OK", data.get("model_type"), len(tok) if tok is not None else "-", json.dumps(data.get("quantization_config")))
"""


def _tokenizer_file(path: Path, dst: Path) -> Path:
    """The tokenizer of the random-weight file ``path`` alone, as a GGUF of the architecture its vocabulary comes
    from (SmolLM2's: "llama"), for the engine's transformers to read: transformers reads a GGUF's tokenizer only
    for architectures it knows, and the shape file's may be newer than the engine's transformers (qwen35 in SGLang
    0.5.16's transformers 5.12.1: "GGUF model with architecture qwen35 is not supported yet")."""
    import gguf

    from ..arch.gguf import GGUFArray, read_gguf_header_local

    w = gguf.GGUFWriter(str(dst), "llama")
    for key, value in read_gguf_header_local(path, keep_arrays=True).kv.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, GGUFArray):
            w.add_array(key, list(value.values or ()))
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, str(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return dst


def config_refusal(config: dict[str, Any], where: str, engine: str) -> str | None:
    """Why ``engine`` cannot build the model ``config`` describes (one sentence), or None: a composite config whose
    text model has the whole model's type, as MLX re-uploads write it (Qwen3.6-27B's text "qwen3_5" where Qwen's
    own says "qwen3_5_text"); the engine picks the text model's class by that type and fails at load (vLLM 0.26:
    "Invalid model_type qwen3_5", 80 s into the launch on an H100)."""
    text = config.get("text_config")
    kind = config.get("model_type")
    if isinstance(text, dict) and kind and text.get("model_type") == kind:
        return (f"{where} gives its text model the whole model's type ({kind!r}), as MLX re-uploads of a config "
                f"do; {engine} picks the text model's class by that type and would fail at load: use the config.json "
                "of the model's own repository.")
    return None


def folder_config(folder: Path) -> dict[str, Any] | None:
    """The model folder's config.json, or None where there is none to read (a hub id, no folder, not JSON)."""
    try:
        data = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_config_refusal(folder: Path, engine: str) -> str | None:
    """``config_refusal`` of a model folder's config.json (None where it cannot be read: the engine says why)."""
    data = folder_config(folder)
    return config_refusal(data, str(Path(folder) / "config.json"), engine) if data is not None else None


# a folder's files that are not its vocabulary's: the config, and a multimodal model's processor (its files end so,
# as _CONFIG_ONLY keeps them; another model of the same vocabulary may have none)
_NOT_TOKENIZER = ("config.json", "generation_config.json", SOURCE_FILE)
_PROCESSOR_SUFFIX = "processor_config.json"


def _saved_tokenizer(vocab: Path, engine: str, interpreter: Path) -> Path:
    """Where the engine environment's reading of the vocabulary ``vocab`` is kept: transformers converts a GGUF's
    vocabulary in Python (the Qwen3.6 layout's 248,320 tokens: its first folder took 28.5 s here, a later one
    6.0 s), and every folder of a model (each quant, each context) has the same one. Keyed by the vocabulary's
    bytes and the environment's interpreter."""
    h = hashlib.sha256(vocab.read_bytes())
    h.update(str(Path(interpreter).resolve()).encode())
    return paths.cache_dir() / f"{engine}-models" / "tokenizers" / h.hexdigest()[:16]


def _save_tokenizer(folder: Path, saved: Path) -> None:
    """Keep the tokenizer files of a folder just written (all but its config) for the next folder of that
    vocabulary; written aside and renamed, so a reader never sees half of it."""
    tmp = saved.with_name(saved.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in folder.iterdir():
        if f.is_file() and f.name not in _NOT_TOKENIZER and not f.name.endswith(_PROCESSOR_SUFFIX):
            shutil.copy2(f, tmp / f.name)
    try:
        tmp.rename(saved)
    except OSError:                 # another writer got there first: theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)


def _key(path: Path) -> str:
    """Size + name + sha256 of the first and last MiB: a different file gets another folder,
    without hashing gigabytes on every launch; and the scripts that write folders: a folder an older
    engineroom wrote otherwise is written again."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}:{size}".encode())
    h.update((_CONFIG_ONLY + _CONVERT).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
        if size > 1 << 20:
            fh.seek(max(size - (1 << 20), 0))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def folder_of(path: Path, *, engine: str, python: Callable[[], Path], progress: Progress | None = None,
              weights_format: str = "") -> Path:
    """The folder ``engine`` serves for the GGUF ``path``, written once in ``python`` (the engine's interpreter,
    asked for only when the folder must be written): a random-weight file's config and tokenizer (with
    ``weights_format``'s quantization_config where it is a 4-bit packed one), any other GGUF converted whole."""
    from ..synth import HF_CONFIG_KEY, TIED_KEY

    path = Path(path)
    header = _random_weights_kv(path)
    dummy = header is not None
    tied = header.get(TIED_KEY) if header is not None else None
    source = header.get(HF_CONFIG_KEY) if header is not None else None
    carried = json.loads(str(source)) if source else None
    why = config_refusal(carried, f"the config.json {path.name} carries", engine) if carried else None
    if why:
        raise BadInput(why)
    vision = carried is not None and "vision_config" in carried
    quant = quantization_config(weights_format, vision=vision) if dummy else None
    kind = (f"dummy-{weights_format.lower()}" if quant else "dummy") if dummy else DTYPE
    out = paths.cache_dir() / f"{engine}-models" / f"{path.stem}-{_key(path)}-{kind}"
    if (out / "config.json").is_file() and (dummy or any(out.glob("*.safetensors"))):
        return out
    interpreter = python()
    say = progress or (lambda _f, _m: None)
    say(None, f"reading {path.name}'s shape and tokenizer for {engine}'s own random weights (cached in {out})" if dummy
        else f"converting {path.name} to a safetensors folder for {engine} (once; cached in {out})")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    vocab = tmp.with_name(tmp.name + "-tokenizer")
    shutil.rmtree(vocab, ignore_errors=True)
    saved: Path | None = None
    if dummy:
        vocab.mkdir()
        _tokenizer_file(path, vocab / "tokenizer.gguf")
        saved = _saved_tokenizer(vocab / "tokenizer.gguf", engine, interpreter)
        if saved.is_dir():
            shutil.copytree(saved, tmp)
    script = [_CONFIG_ONLY, str(path.resolve()), str(tmp), json.dumps(quant) if quant else "",
              json.dumps(bool(tied)) if tied is not None else "", str(source or ""),
              "" if saved.is_dir() else str(vocab / "tokenizer.gguf")] if saved is not None else \
        [_CONVERT, str(path.resolve()), str(tmp)]
    try:
        proc = subprocess.run([str(interpreter), "-c", *script], capture_output=True, text=True, timeout=1800, env=env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(vocab, ignore_errors=True)
        raise EngineFailed(f"converting {path.name} for {engine} took over 30 minutes; stopped it.") from None
    shutil.rmtree(vocab, ignore_errors=True)
    if proc.returncode != 0 or not (proc.stdout.strip().splitlines() or [""])[-1].startswith("OK"):
        shutil.rmtree(tmp, ignore_errors=True)
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-8:]
        raise EngineFailed(f"transformers could not convert {path.name} to a safetensors folder for {engine} "
                           f"({(last or ['no output'])[-1][:200]}).", detail="\n".join(last))
    if saved is not None and not saved.is_dir():
        _save_tokenizer(tmp, saved)
    processor = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                 if line.startswith("PROCESSOR ")]
    (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": str(path), "size": path.stat().st_size, "dtype": DTYPE,
                                               "weights": "dummy" if dummy else "converted",
                                               **({"quant_format": weights_format.lower()} if quant else {}),
                                               **({"processor": processor[-1]} if processor else {})}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


__all__ = ["DTYPE", "INT4_GROUP", "SIXTEEN_BIT", "SOURCE_FILE", "config_refusal", "converted_dtype", "dummy_loading",
           "dummy_weights", "folder_config", "folder_config_refusal", "folder_of", "int4_quant", "is_gguf",
           "quantization_config", "random_weights_file", "source_of"]
