"""Weight bytes: exact per tensor from a GGUF, else parameters x bits per weight, split into
the pieces the engines place separately (input embedding, layers, head).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from ..arch import ModelArch
from ..arch import count_params as estimate_param_count  # the one parameter counter (arch.params)
from ..catalog import Catalog, load_catalog
from ..errors import BadInput
from .request import FitRequest

_BLK = re.compile(r"^blk\.(\d+)\.")


def bits_per_weight(catalog: Catalog | None = None) -> dict[str, float]:
    """Effective bits per weight by lower-case quant id (catalog tables.yaml ``bits_per_weight``)."""
    return (catalog or load_catalog()).tables.bits_per_weight


@dataclass(frozen=True)
class WeightSplit:
    """Weight bytes of a model split into the pieces the engines place separately."""

    embedding: int                 # token_embd (a lookup: stays on the host for llama.cpp CUDA)
    per_layer: tuple[int, ...]     # trunk layers (+ MTP layers appended)
    head: int                      # output + output_norm
    source: str

    @cached_property
    def total(self) -> int:
        return self.embedding + sum(self.per_layer) + self.head


def weight_split(arch: ModelArch, req: FitRequest, catalog: Catalog | None = None) -> WeightSplit:
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
    table = bits_per_weight(catalog)
    bpw = None if req.quant is None else table.get(req.quant.lower())
    if req.weight_bytes is not None:
        total = req.weight_bytes
        src = "given weight bytes"
    elif bpw is not None:
        total = int(params * bpw / 8)
        src = f"{params / 1e9:.2f}B params x {bpw} bpw ({req.quant})"
    elif arch.torch_dtype:
        total = int(params * table.get(arch.torch_dtype.lower(), 16.0) / 8)
        src = f"{params / 1e9:.2f}B params at {arch.torch_dtype}"
    else:
        raise BadInput(f"Cannot size weights: unknown quant {req.quant!r}; "
                       f"known: {', '.join(sorted(table))}.")
    frac = total / params if params else 0
    emb = int(arch.vocab_size * arch.hidden_size * frac)
    head = 0 if arch.tie_embeddings else emb
    rest = max(0, total - emb - head)
    per_layer = tuple([rest // max(n_layers, 1)] * max(n_layers, 1))
    return WeightSplit(emb, per_layer, head, src)
