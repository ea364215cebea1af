"""The speed model: single-stream decode rates from the bytes a token reads.

Time per token = bytes read / the rate they stream at (a share of the memory bandwidth, or a
CPU kernel's per-thread compute roof) + fixed per-layer and per-token costs; the engine's
catalog ``decode`` block holds every constant, so this module holds no number of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..arch import LayerKind, ModelArch
from ..catalog import Model, Quant
from ..catalog.engine_schema import DecodeModel, KvDtype
from ..fit import kv_bytes
from ..units import GB

SPEED_DEPTH = 4096          # decode speed is quoted at this KV depth (tokens already in context)


@dataclass(frozen=True)
class DecodeShape:
    """What a decode step's fixed cost depends on (``DecodeModel.fixed_ms``): the layers, their width, how many
    are linear attention or SSM (a recurrent state updated every token) and how many route to experts."""

    layers: int
    width: int = 0
    linear: int = 0
    moe: int = 0

    @classmethod
    def of(cls, arch: ModelArch) -> DecodeShape:
        kinds = arch.kind_counts
        moe = max(0, arch.moe.sparse_layers(arch.n_layers)) if arch.moe is not None else 0
        return cls(layers=arch.n_layers, width=arch.hidden_size,
                   linear=kinds.get(LayerKind.LINEAR, 0) + kinds.get(LayerKind.MAMBA, 0), moe=moe)

    def fixed_ms(self, dm: DecodeModel, per_layer_ms: float) -> float:
        return dm.fixed_ms(self.layers, per_layer_ms, width=self.width, linear=self.linear, moe=self.moe)


@dataclass(frozen=True)
class SpeedBand:
    """Expected single-stream decode speed: the engine's decode model (bytes over a share of
    the bandwidth, plus fixed per-layer and per-token costs) x TP scaling x spec multiplier."""

    low: float
    high: float
    roofline_tps: float                    # bandwidth / bytes, no overheads (the upper bound)
    bytes_per_token: int
    bandwidth_gbs: float                   # one GPU's datasheet bandwidth
    efficiency: tuple[float, float]        # share of that bandwidth the byte stream reaches
    efficiency_source: str
    overhead_ms: tuple[float, float] = (0.0, 0.0)   # fixed cost per token (layers x per-layer + per-token)
    tp_scale: float = 1.0
    spec_multiplier: tuple[float, float] = (1.0, 1.0)
    spec_source: str = ""
    threads: int | None = None                         # CPU decode threads (None: a GPU, or an unknown CPU)
    per_thread_gbs: tuple[float, float] | None = None  # CPU compute roof per thread, when it applies
    basis: str = ""                                    # calibrated from this machine's runs, or not (calibration.py)
    shape: str = ""                                    # the model's shape class (calibration.shape_class)
    uncalibrated: tuple[float, float] | None = None    # (low, high) by the catalog alone, where calibrated

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2


def kv_bytes_per_token(arch: ModelArch, kv: KvDtype, depth: int) -> int:
    """KV bytes read per decoded token at ``depth``: fit's one KV formula (``fit.kv_bytes``)
    over every growing layer, sliding layers at most their window, MLA layers their latent +
    rope key."""
    return int(kv_bytes(arch, kv.bytes_per_elem, depth))


_GGML_TYPE = re.compile(r"(iq\d_[a-z]+|q\d_k|q\d_\d|bf16|f16|f32)")


def weight_type_mix(arch: ModelArch | None, quant_id: str) -> tuple[tuple[str, float], ...]:
    """The share of streamed weight bytes per ggml type: from the GGUF's tensors when known
    (the token-embedding lookup left out unless it doubles as the head), else the type the
    quant id names ("Q4_K_M" -> q4_k) for all of it."""
    if arch is not None and arch.tensor_bytes and arch.tensor_types:
        by: dict[str, int] = {}
        for name, b in arch.tensor_bytes.items():
            if name.startswith("token_embd") and not arch.tie_embeddings:
                continue
            t = arch.tensor_types[name].lower()
            by[t] = by.get(t, 0) + b
        total = sum(by.values())
        if total:
            return tuple(sorted(((t, b / total) for t, b in by.items()), key=lambda x: -x[1]))
    m = _GGML_TYPE.search(quant_id.lower())
    return ((m.group(1) if m else quant_id.lower(), 1.0),)


def decode_rates(dm: DecodeModel, bytes_per_token: float, shape: DecodeShape, bandwidth_gbs: float,
                 threads: int | None = None, mix: tuple[tuple[str, float], ...] = ()) -> tuple[float, float, float]:
    """(slow, middle, fast) single-stream tokens/s on one device by the engine's decode model:
    time per token = bytes / stream rate + the fixed cost of ``shape``'s layers (DecodeModel.fixed_ms). Each ggml
    weight type's share of the bytes (``mix``) streams at min(threads x its per-thread rate,
    its efficiency x bandwidth) (per_thread_for / efficiency_for: a CPU kernel's compute roof
    and how it reads memory), and the shares' times add (a harmonic mean of the rates). None
    threads, or no per-thread rates (GPUs): memory-bound, efficiency x bandwidth."""
    parts = []
    for t, share in (mix or (("", 1.0),)):
        pt = dm.per_thread_for(t) if threads and (dm.per_thread_gbs or dm.per_thread_by_type) else None
        parts.append((share, pt, dm.efficiency_for(t)))
    tot = sum(share for share, _, _ in parts) or 1.0

    def rate(pick: Callable[[tuple[float, float]], float], per_layer_ms: float) -> float:
        s_per_gb = 0.0
        for share, pt, ef in parts:
            stream = pick(ef) * bandwidth_gbs
            if pt is not None and threads:      # (a per-thread rate is only looked up with threads)
                stream = min(stream, threads * pick(pt))
            s_per_gb += share / tot / stream
        return 1.0 / (bytes_per_token * s_per_gb / GB + shape.fixed_ms(dm, per_layer_ms) / 1000)
    lay = dm.per_layer_ms
    return (rate(lambda r: r[0], lay.high),
            rate(lambda r: (r[0] + r[1]) / 2, (lay.low + lay.high) / 2),
            rate(lambda r: r[1], lay.low))


def mixed_per_thread(dm: DecodeModel, threads: int | None,
                      mix: tuple[tuple[str, float], ...]) -> tuple[float, float] | None:
    """The (low, high) per-thread GB/s for this weight mix: each type's bytes stream at that
    type's rate, so the mix's rate is the share-weighted harmonic mean (None: no compute roof)."""
    if not threads or not (dm.per_thread_gbs or dm.per_thread_by_type):
        return None
    rates = [(share, dm.per_thread_for(t)) for t, share in (mix or (("", 1.0),))]
    parts = [(share, r) for share, r in rates if r]
    if not parts:
        return None
    tot = sum(share for share, _ in parts)
    low, high = (tot / sum(share / r[i] for share, r in parts) for i in (0, 1))
    return low, high


def weights_read_per_token(model: Model, arch: ModelArch, quant: Quant) -> int:
    """Weight bytes a decode step reads: the file minus the input-embedding lookup (the
    output head is read every token; tied, it is the embedding matrix); MoE: the trunk's
    bytes x its active share, where both counts leave the embedding and head out:
    (active - emb - head) / (params - emb - head), from the same parameter counter as
    ``param_count`` (``arch.count_active_params`` / the catalog's active_param_count)."""
    w = quant.weight_bytes
    params = (model.architecture.param_count if model.architecture else None) or arch.param_count
    if not params:
        return w
    emb_p = arch.vocab_size * arch.hidden_size              # one vocab x n_embd matrix
    n_mats = 1 if arch.tie_embeddings else 2                # embedding (+ untied head)
    emb = int(emb_p * w / params)                           # its bytes at the file's mean bits/weight
    trunk = max(0, w - n_mats * emb)
    active = model.architecture.active_param_count if model.architecture else None
    if active and active < params and params > n_mats * emb_p:
        share = max(0.0, (active - n_mats * emb_p) / (params - n_mats * emb_p))
        trunk = int(trunk * share)
    return max(trunk + emb, 1)      # + the head (tied: the embedding matrix read as the head)
