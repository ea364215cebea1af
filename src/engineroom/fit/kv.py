"""THE KV formula: elements per token per layer, and the bytes a cache of N tokens holds.

Every KV figure of engineroom (llama.cpp's buffers, the paged pools of vLLM/SGLang, the KV
a decode step reads in plan's speed model) is these per-layer elements x the engine's bytes
per element x the tokens each layer keeps; the memory models differ only in how many cells
they allocate per layer. Also: the fixed recurrent state of linear-attention / Mamba layers,
and the engine's refusal of a KV type whose block does not divide the head size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

from ..arch import LayerKind, ModelArch
from ..catalog import Catalog
from .engine import engine_spec, kv_bytes_per_elem, kv_dtype_spec
from .request import FitRequest


def kv_elems_per_token_layer(arch: ModelArch, kind: LayerKind, heads_div: int = 1) -> tuple[int, int]:
    """(K elements, V elements) per token for one layer of ``kind`` on one shard."""
    if kind == LayerKind.MLA and arch.mla is not None:
        # llama.cpp caches the compressed latent + rope key only (V is a view of it).
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, 0
    kvh = max(1, arch.n_kv_heads // max(1, heads_div))
    return kvh * arch.head_dim, kvh * arch.head_dim


# the layers whose cache grows with the context (LINEAR / MAMBA hold a fixed state instead)
KV_KINDS = frozenset({LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA})


def kv_layer_bytes(arch: ModelArch, bytes_per_elem: float, cells: int | Callable[[LayerKind], int], *,
                   heads_div: int = 1, layers: Iterable[int] | None = None
                   ) -> Iterator[tuple[LayerKind, int, int, float, int]]:
    """(kind, K+V elements per cell, cells, bytes of one layer, layers) for each kind of growing
    KV layer in ``layers`` (default: all); every layer of a kind holds the same cache.
    ``cells``: the tokens each layer holds, a sliding layer at most its window; or a function
    of the layer kind, for an engine that sizes its own cells (llama.cpp pads them and adds a
    ubatch to the window)."""
    if callable(cells):
        cells_of = cells
    else:
        window = arch.sliding_window
        cells_of = lambda k: min(cells, window) if k == LayerKind.SLIDING and window else cells  # noqa: E731
    counts: Mapping[LayerKind, int]
    if layers is None:
        counts = arch.kind_counts
    elif isinstance(layers, range) and layers.step == 1:
        counts = arch.kind_counts_in(layers.start, layers.stop)
    else:
        kinds = arch.layer_kinds
        counts = Counter(kinds[i] for i in layers)
    for k in arch.kind_counts:          # the model's own order of first appearance
        n_layers = counts.get(k, 0)
        if k not in KV_KINDS or not n_layers:
            continue
        ke, ve = kv_elems_per_token_layer(arch, k, heads_div)
        n = cells_of(k)
        yield k, ke + ve, n, (ke + ve) * n * bytes_per_elem, n_layers


def kv_bytes(arch: ModelArch, bytes_per_elem: float, cells: int | Callable[[LayerKind], int], *,
             heads_div: int = 1, layers: Iterable[int] | None = None) -> float:
    """THE KV formula: sum over the growing layers of (K + V elements per token) x cells x
    bytes per element (``kv_layer_bytes``). MLA layers hold the compressed latent + rope key
    (kv_lora_rank + qk_rope_head_dim per token), never 0."""
    return sum(b * n for _, _, _, b, n in kv_layer_bytes(arch, bytes_per_elem, cells, heads_div=heads_div,
                                                          layers=layers))


def kv_shard(n_kv_heads: int, tp: int) -> int:
    """Divisor of the KV heads per card: heads shard up to TP = n_kv_heads, replicate above."""
    return max(1, min(tp, n_kv_heads))


def recurrent_state_bytes(arch: ModelArch, parallel: int = 1) -> tuple[int, int]:
    """(R conv bytes, S state bytes) for all recurrent layers and ``parallel`` sequences (fp32)."""
    r = s = 0
    n_lin = arch.count(LayerKind.LINEAR)
    if n_lin and arch.linear is not None:
        la = arch.linear
        r += n_lin * (la.conv_kernel - 1) * la.conv_dim * 4
        s += n_lin * la.n_value_heads * la.key_head_dim * la.value_head_dim * la.state_bytes_per_elem
    n_mamba = arch.count(LayerKind.MAMBA)
    if n_mamba and arch.mamba is not None:
        m = arch.mamba
        r += n_mamba * (m.d_conv - 1) * (m.d_inner + 2 * m.n_groups * m.d_state) * 4
        s += n_mamba * m.d_state * m.d_inner * m.state_bytes_per_elem
    return r * parallel, s * parallel


def pool_kv_grow_per_card(arch: ModelArch, req: FitRequest, *, catalog: Catalog | None = None) -> tuple[int, str]:
    """KV bytes per card of a paged pool for ``req``: every growing layer holds ctx (+ 32 per
    MTP draft token) tokens of each sequence, a sliding layer only its window; KV heads
    shard over TP (MLA's latent does not)."""
    bpe = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    div = kv_shard(arch.n_kv_heads, req.tp)
    per_tok = kv_bytes(arch, bpe, 1, heads_div=div)
    n_mtp = req.spec_tokens if req.spec_method == "mtp" else 0
    total = kv_bytes(arch, bpe, req.ctx + 32 * n_mtp, heads_div=div)
    return int(total * req.parallel), (f"{arch.n_kv_layers} KV layers, {arch.n_kv_heads}/{div} KV heads/card, "
                                     f"{per_tok:.0f} B/token/card x ({req.ctx} + 32 x {n_mtp}) x {req.parallel}")


def pool_bytes_per_token(arch: ModelArch, req: FitRequest, catalog: Catalog | None) -> int:
    """KV bytes one cached token costs over every growing KV layer (per card)."""
    one, _ = pool_kv_grow_per_card(arch, replace(req, ctx=1, parallel=1, spec_method=None, spec_tokens=0),
                                   catalog=catalog)
    return max(one, 1)


def kv_head_dims(arch: ModelArch) -> tuple[int, int]:
    """(n_embd_head_k, n_embd_head_v) as llama.cpp sees them (MLA: the cached latent + rope
    key as K, the latent as V: how the GGUF's key_length / value_length are written)."""
    if arch.mla is not None:
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, arch.mla.kv_lora_rank
    return arch.head_dim, arch.head_dim


def kv_refusal(arch: ModelArch, req: FitRequest, catalog: Catalog | None = None) -> str | None:
    """The engine's own refusal when its KV type's block size does not divide the head size
    (catalog: the engine's kv_block_rule and each KV type's block_size), else None."""
    eng = engine_spec(req.engine, catalog)
    rule = eng.kv_block_rule
    if rule is None or not arch.n_kv_layers:
        return None
    kv = kv_dtype_spec(req.engine, req.kv_dtype, catalog)
    if kv.block_size <= 1:
        return None
    dk, dv = kv_head_dims(arch)
    # K and V use the same type here (-ctk = -ctv); K is checked only with flash attention on,
    # a quantized V cache turns flash attention on (or is refused without it)
    for side, dim, applies in (("K", dk, req.flash_attn or not rule.when_flash_attn_only), ("V", dv, True)):
        if applies and dim % kv.block_size:
            return rule.message.format(side=side, side_l=side.lower(), kv=kv.id, block=kv.block_size, dim=dim)
    return None
