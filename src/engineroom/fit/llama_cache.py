"""llama.cpp's KV cache geometry: contexts padded to 256 cells, one stream per slot (or one
unified), sliding layers capped at their window plus a ubatch; and the KV buffer bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..arch import LayerKind, ModelArch
from ..catalog import Catalog
from .engine import kv_bytes_per_elem
from .kv import kv_elems_per_token_layer, kv_layer_bytes
from .request import FitRequest


def round_up(x: int, to: int) -> int:
    return ((x + to - 1) // to) * to


def llama_n_ctx(ctx: int, parallel: int, unified: bool) -> tuple[int, int, int]:
    """(n_ctx, n_ctx_seq, n_stream) as llama_context computes them for ``-c ctx*parallel
    -np parallel`` (src/llama-context.cpp: n_ctx = GGML_PAD(n_ctx, 256); unified: n_ctx_seq =
    n_ctx, one stream; else n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256), one stream per
    sequence, n_ctx = n_ctx_seq x n_seq_max)."""
    n_ctx = round_up(ctx * parallel, 256)
    if unified:
        return n_ctx, n_ctx, 1
    seq = round_up(n_ctx // parallel, 256)
    return seq * parallel, seq, parallel


def llama_kv_stream_cells(arch: ModelArch, kind: LayerKind, ctx: int, parallel: int, ubatch: int,
                          unified: bool = False, swa_full: bool = False) -> tuple[int, int]:
    """(cells per stream, streams) of one layer's KV tensor [n_embd_gqa, kv_size, n_stream].

    The base cache has n_ctx_seq cells per stream. A sliding layer's cache (src/llama-kv-cache-
    iswa.cpp) has GGML_PAD(min(size_base, n_swa x (unified ? n_seq_max : 1) + n_ubatch), 256)
    cells per stream, or size_base with --swa-full."""
    _, size_base, n_stream = llama_n_ctx(ctx, parallel, unified)
    if kind == LayerKind.SLIDING and arch.sliding_window and not swa_full:
        size = round_up(min(size_base, arch.sliding_window * (parallel if unified else 1) + ubatch), 256)
        return size, n_stream
    return size_base, n_stream


def llama_kv_cells(arch: ModelArch, kind: LayerKind, ctx: int, parallel: int, ubatch: int,
                   unified: bool = False, swa_full: bool = False) -> int:
    """Cells llama.cpp allocates for one layer over all its streams."""
    cells, streams = llama_kv_stream_cells(arch, kind, ctx, parallel, ubatch, unified, swa_full)
    return cells * streams


def slots_text(req: FitRequest) -> str:
    return f"{req.parallel} slot(s), {'unified KV (1 stream)' if req.kv_unified else f'{req.parallel} KV stream(s)'}"


def _kv_cells(arch: ModelArch, req: FitRequest, catalog: Catalog | None
              ) -> tuple[float, int, int, int, Callable[[LayerKind], int]]:
    """(bytes per element, ubatch, cells per stream, streams, cells of a layer of a kind over every stream)."""
    bk = kv_bytes_per_elem(req.engine, req.kv_dtype, catalog)
    ub = effective_ubatch(req)
    _, base, streams = llama_n_ctx(req.ctx, req.parallel, req.kv_unified)

    def cells_of(kind: LayerKind) -> int:   # over every stream; streams are the same for all kinds
        return llama_kv_stream_cells(arch, kind, req.ctx, req.parallel, ub, req.kv_unified, req.swa_full)[0] * streams

    return bk, ub, base, streams, cells_of


def llama_kv_bytes(arch: ModelArch, req: FitRequest, layers: range | None = None, *,
                   catalog: Catalog | None = None) -> tuple[int, str]:
    """KV buffer bytes of ``layers`` (default: every layer, plus MTP layers when MTP drafts):
    THE KV formula (``kv.kv_layer_bytes``) over the cells llama.cpp allocates per layer."""
    bk, ub, base, streams, cells_of = _kv_cells(arch, req, catalog)
    total = 0.0
    groups: dict[tuple[str, int, int], int] = {}   # (kind, cells/stream, elems) -> layers
    for k, elems, cells, b, n in kv_layer_bytes(arch, bk, cells_of, layers=layers):
        total += b * n
        key = (k.value, cells // streams, elems)
        groups[key] = groups.get(key, 0) + n
    if req.spec_method == "mtp" and arch.mtp_layers and layers is None:
        ke, ve = kv_elems_per_token_layer(arch, LayerKind.FULL)
        total += arch.mtp_layers * (ke + ve) * base * streams * bk   # MTP layers: full attention
        key = ("mtp", base, ke + ve)
        groups[key] = groups.get(key, 0) + arch.mtp_layers
    parts = [f"{n} {kind} layer(s) x {cells} cells x {streams} stream(s) x {el} elem x {bk:g} B"
             for (kind, cells, el), n in groups.items()]
    note = " + ".join(parts) + f" ({req.kv_dtype}; {slots_text(req)}"
    if arch.count(LayerKind.SLIDING) and arch.sliding_window:
        note += (f"; SWA cap: pad256(min(n_ctx_seq, window {arch.sliding_window}"
                 + (f" x {req.parallel} parallel" if req.kv_unified else "") + f" + ubatch {ub})) per sliding layer"
                 + (", --swa-full: off" if not req.swa_full else "; --swa-full: on, no cap"))
    return int(total), note + ")"


def llama_kv_shares(arch: ModelArch, req: FitRequest, shares: Sequence[range], *,
                    catalog: Catalog | None = None) -> list[int]:
    """The KV buffer bytes of each range of trunk layers (a GPU's share of a layer split): what
    ``llama_kv_bytes(arch, req, layers)[0]`` gives for each, with the bytes of one layer of each
    kind (``kv.kv_layer_bytes``) computed once for all of them."""
    bk, _, _, _, cells_of = _kv_cells(arch, req, catalog)
    per_layer = [(k, b) for k, _, _, b, _ in kv_layer_bytes(arch, bk, cells_of)]
    out = []
    for layers in shares:
        counts = arch.kind_counts_in(layers.start, layers.stop)
        total = 0.0
        for k, b in per_layer:           # the model's order of kinds, as kv_layer_bytes sums them
            n = counts.get(k, 0)
            if n:
                total += b * n
        out.append(int(total))
    return out


def effective_ubatch(req: FitRequest) -> int:
    """Effective -ub: llama.cpp caps n_batch at n_ctx (total) and n_ubatch at n_batch."""
    return max(1, min(req.ubatch, req.batch, llama_n_ctx(req.ctx, req.parallel, req.kv_unified)[0]))


def kq_mask_bytes(arch: ModelArch, req: FitRequest, ub: int, bytes_per: int = 2) -> int:
    """KQ masks: [n_kv, n_tokens / n_stream, 1, n_stream] (llama-graph.cpp build_attn_inp_kv),
    i.e. one stream's cells x ubatch tokens; unified KV: the one stream spans every slot's cells."""
    n_kv, _ = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.parallel, ub, req.kv_unified)
    m = bytes_per * n_kv * ub if arch.count(LayerKind.FULL) or arch.count(LayerKind.MLA) else 0
    if arch.count(LayerKind.SLIDING):
        swa, _ = llama_kv_stream_cells(arch, LayerKind.SLIDING, req.ctx, req.parallel, ub, req.kv_unified, req.swa_full)
        m += bytes_per * swa * ub
    return m


def kv_rotation_bytes(arch: ModelArch, req: FitRequest) -> int:
    """Hadamard rotation inputs llama.cpp adds to the graph for a quantized KV cache
    (llama-kv-cache.cpp, attn_rot_k/v): K: n x n f32 with n the largest power-of-two multiple
    of 64 dividing head_dim; V: 64 x 64 f32; once per KV cache (an iSWA model has two).
    Derived from the source, not fitted: it explains the +0.03 / +0.08 / +0.53 MiB that
    quantized caches add at head_dim 64 / 128 / 256."""
    if arch.mla is not None or not arch.n_kv_layers:
        return 0
    if req.kv_dtype.lower() in ("f32", "f16", "bf16") or arch.head_dim % 64:
        return 0
    n = 64
    while arch.head_dim % (2 * n) == 0:
        n *= 2
    caches = 2 if arch.count(LayerKind.SLIDING) and arch.count(LayerKind.FULL) else 1
    return caches * (n * n * 4 + 64 * 64 * 4)
