"""Weight bytes: exact per tensor from a GGUF, else parameters x bits per weight, split into
the pieces the engines place separately (input embedding, layers, head).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..arch import ModelArch
from ..arch import count_params as estimate_param_count  # the one parameter counter (arch.params)
from ..errors import BadInput
from .request import FitRequest

# Effective bits per weight over a whole checkpoint (embeddings and norms included) for
# standard quant ids. GGUF k-quant mixes: llama.cpp's published averages; the int4 /
# fp8 / nvfp4 entries are fitted to the published Qwen3.6-27B disk sizes (spec: AutoRound
# ~17.5-19 GB, GPTQ ~16.5-17, AWQ ~16-17, FP8 ~29, NVFP4 ~22) because their
# embeddings, heads and vision tower stay in bf16.
BITS_PER_WEIGHT: dict[str, float] = {
    "f32": 32.0, "fp32": 32.0,
    "bf16": 16.0, "f16": 16.0, "fp16": 16.0,
    "fp8": 8.35, "fp8-dynamic": 8.35, "fp8_e4m3": 8.35,
    "q8_0": 8.5, "q6_k": 6.5625, "q5_k_m": 5.69, "q5_k_s": 5.54, "q5_0": 5.5, "q5_1": 6.0,
    "q4_k_m": 4.85, "q4_k_s": 4.58, "q4_0": 4.5, "q4_1": 5.0,
    "iq4_xs": 4.25, "iq4_nl": 4.5, "iq4_ks": 4.37, "iq4_k": 4.5,
    "ud-q4_k_xl": 4.9, "ud-q3_k_xl": 4.25, "q3_k_m": 3.91, "q3_k_s": 3.5, "q3_k_l": 4.27,
    "iq3_xxs": 3.06, "iq3_m": 3.66, "q2_k": 3.35, "ud-q2_k_xl": 3.2, "iq2_xxs": 2.06,
    "autoround-int4": 5.2, "gptq-int4": 4.85, "awq-int4": 4.7, "int4": 4.85,
    "nvfp4": 6.4, "mxfp4": 4.25,
}

# kv_pool activation coefficient per KV bytes-per-element (the catalog's number; spec:

_BLK = re.compile(r"^blk\.(\d+)\.")


def _bpw(quant: str | None) -> float | None:
    if quant is None:
        return None
    return BITS_PER_WEIGHT.get(quant.lower())


@dataclass(frozen=True)
class WeightSplit:
    """Weight bytes of a model split into the pieces the engines place separately."""

    embedding: int                 # token_embd (a lookup: stays on the host for llama.cpp CUDA)
    per_layer: tuple[int, ...]     # trunk layers (+ MTP layers appended)
    head: int                      # output + output_norm
    source: str

    @property
    def total(self) -> int:
        return self.embedding + sum(self.per_layer) + self.head


def weight_split(arch: ModelArch, req: FitRequest) -> WeightSplit:
    """Exact tensor bytes when the arch came from a GGUF (and the request is that file: no
    other quant named, or exactly its bytes given); else a bits-per-weight estimate."""
    n_layers = arch.n_layers + arch.mtp_layers
    same_file = req.weight_bytes == arch.weight_bytes_exact if req.weight_bytes is not None else (
        req.quant is None or arch.file_type is None or req.quant.lower() == str(arch.file_type).lower())
    if arch.tensor_bytes and same_file:
        last_blk = max((int(m.group(1)) for n in arch.tensor_bytes if (m := _BLK.match(n))), default=0)
        per = [0] * max(n_layers, 1 + last_blk)
        emb = head = 0
        for name, b in arch.tensor_bytes.items():
            m = _BLK.match(name)
            if m:
                per[int(m.group(1))] += b
            elif name.startswith("token_embd"):
                emb += b
            else:
                head += b
        return WeightSplit(emb, tuple(per), head, "GGUF tensor bytes")
    params = arch.param_count or estimate_param_count(arch)
    bpw = _bpw(req.quant)
    if req.weight_bytes is not None:
        total = req.weight_bytes
        src = "given weight bytes"
    elif bpw is not None:
        total = int(params * bpw / 8)
        src = f"{params / 1e9:.2f}B params x {bpw} bpw ({req.quant})"
    elif arch.torch_dtype:
        total = int(params * BITS_PER_WEIGHT.get(arch.torch_dtype.lower(), 16.0) / 8)
        src = f"{params / 1e9:.2f}B params at {arch.torch_dtype}"
    else:
        raise BadInput(f"Cannot size weights: unknown quant {req.quant!r}; "
                       f"known: {', '.join(sorted(BITS_PER_WEIGHT))}.")
    frac = total / params if params else 0
    emb = int(arch.vocab_size * arch.hidden_size * frac)
    head = 0 if arch.tie_embeddings else emb
    rest = max(0, total - emb - head)
    per_layer = tuple([rest // max(n_layers, 1)] * max(n_layers, 1))
    return WeightSplit(emb, per_layer, head, src)
