"""The CPU compute buffer by replaying llama.cpp's graph allocator (ggml-alloc) over the
dense llama / qwen3 decoder graph, whose peak depends on holes a closed formula misses.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..arch import LayerKind, ModelArch
from .llama_cache import effective_ubatch, kv_rotation_bytes, llama_kv_stream_cells, round_up
from .request import FitRequest

# ---- CPU compute buffer by replaying llama.cpp's graph allocator ---------------------------
# ggml-alloc.c (ggml_gallocr_alloc_graph_impl + ggml_dyn_tallocr): graph inputs are allocated
# first; then every node in execution order is placed in the best-fitting free block (the last,
# open-ended block only when none fits), or in its parent's memory when the op may work in
# place (ggml_op_can_inplace: ADD, MUL, RMS_NORM, ROPE, SCALE, ...) and that parent has no
# other consumer; a tensor is freed when its last consumer has run. The buffer is the highest
# offset reached. Used for the dense llama / qwen3 graphs (src/models/llama.cpp, qwen3.cpp),
# whose peak depends on the holes the embedding inputs leave (narrow FFNs, wide Q).

_ALIGN = 32
_INPLACE = {"ADD", "MUL", "RMS_NORM", "ROPE", "SCALE", "UNARY", "SOFT_MAX"}


class _T:
    __slots__ = ("name", "size", "op", "srcs", "view_src", "external", "output", "n_children", "n_views",
                 "allocated", "offset")

    def __init__(self, name: str, size: int, op: str = "", srcs: Iterable[_T] = (), view_src: _T | None = None,
                 external: bool = False, output: bool = False) -> None:
        self.name, self.size, self.op, self.srcs = name, size, op, list(srcs)
        self.view_src, self.external, self.output = view_src, external, output
        self.n_children = self.n_views = 0
        self.allocated: bool = False
        self.offset: int | None = None


class _DynAlloc:
    """ggml_dyn_tallocr: sorted free blocks, best fit except the last block, merge on free."""

    def __init__(self) -> None:
        self.blocks = [[0, 1 << 62]]   # [offset, size]
        self.max = 0

    def alloc(self, size: int) -> int:
        size = round_up(size, _ALIGN)
        best, best_size = -1, None
        for i, (_, bs) in enumerate(self.blocks[:-1]):
            if bs >= size and (best_size is None or bs <= best_size):
                best, best_size = i, bs
        if best == -1:
            best = len(self.blocks) - 1
        off = self.blocks[best][0]
        self.blocks[best][0] += size
        self.blocks[best][1] -= size
        if self.blocks[best][1] == 0:
            del self.blocks[best]
        self.max = max(self.max, off + size)
        return off

    def free(self, off: int, size: int) -> None:
        size = round_up(size, _ALIGN)
        for i, b in enumerate(self.blocks):
            if b[0] + b[1] == off:
                b[1] += size
                if i + 1 < len(self.blocks) and b[0] + b[1] == self.blocks[i + 1][0]:
                    b[1] += self.blocks[i + 1][1]
                    del self.blocks[i + 1]
                return
            if off + size == b[0]:
                b[0], b[1] = off, b[1] + size
                if i > 0 and self.blocks[i - 1][0] + self.blocks[i - 1][1] == b[0]:
                    self.blocks[i - 1][1] += b[1]
                    del self.blocks[i]
                return
        self.blocks.append([off, size])
        self.blocks.sort()


def gallocr_peak(inputs: list[_T], nodes: list[_T]) -> int:
    """The compute buffer ggml_gallocr reserves for this graph (bytes)."""
    for n in nodes:
        if n.view_src is not None:
            n.view_src.n_views += 1
        for s in n.srcs:
            s.n_children += 1
    a = _DynAlloc()
    for t in inputs:
        t.offset, t.allocated = a.alloc(t.size), True

    def free(t: _T) -> None:
        if t.output or t.external or not t.allocated:
            return
        assert t.offset is not None      # an allocated tensor has its offset
        a.free(t.offset, t.size)
        t.allocated = False

    for n in nodes:
        if n.view_src is None and not n.allocated and not n.external:
            reused = False
            if n.op in _INPLACE:
                for p in n.srcs:
                    # a view is never "own" memory at this point (ggml_gallocr_is_own): no reuse
                    if p.external or p.output or p.view_src is not None or p.size != n.size \
                            or p.n_children != 1 or p.n_views:
                        continue
                    if p.allocated:
                        n.offset, n.allocated, reused = p.offset, True, True
                        p.allocated = False
                        break
            if not reused:
                n.offset, n.allocated = a.alloc(n.size), True
        for p in n.srcs:
            p.n_children -= 1
            if p.n_children == 0 and p.n_views == 0:
                if p.view_src is not None:
                    v = p.view_src
                    v.n_views -= 1
                    if v.n_views == 0 and v.n_children == 0:
                        free(v)
                else:
                    free(p)
    return a.max


def dense_graph(arch: ModelArch, req: FitRequest) -> tuple[list[_T], list[_T]] | None:
    """The llama / qwen3 decoder graph of the worst-case ubatch as llama.cpp builds it on the CPU
    (flash attention, f16 cache; node order and sizes as ggml-alloc sees them): for a model whose
    every block is that plain block (``ModelArch.standard_block``), with Q/K norms when it has them."""
    if not arch.standard_block or arch.moe or arch.mla or any(k != LayerKind.FULL for k in arch.layer_kinds):
        return None
    ub = effective_ubatch(req)
    e, q, kv = arch.hidden_size, arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
    n_out = ub if req.graph_outputs == "ubatch" else min(ub, req.parallel)
    n_kv, n_stream = llama_kv_stream_cells(arch, LayerKind.FULL, req.ctx, req.parallel, ub, req.kv_unified)
    W = _T("weights", 0, external=True)
    def f32(n: int) -> int:
        return 4 * n * ub
    # a quantized cache adds Hadamard rotations (llama-kv-cache.cpp attn_rot_k / attn_rot_v):
    # K (and Q) times an n x n f32 matrix before the store, V times 64 x 64, the attention
    # output rotated back
    rot = kv_rotation_bytes(arch, req) > 0
    n_rot = 64
    while rot and arch.head_dim % (2 * n_rot) == 0:
        n_rot *= 2
    inputs = [_T("inp_tokens", 4 * ub), _T("inp_embd", f32(e)), _T("inp_mixed_tokens", 4 * ub),
              _T("inp_mixed_slots", 8 * ub), _T("inp_mixed_embd", f32(e))]
    if rot:
        inputs.append(_T("k_rot", 4 * n_rot * n_rot))
    inputs.append(_T("inp_pos", 4 * ub))
    if rot:
        inputs.append(_T("v_rot", 4 * 64 * 64))
    inputs += [_T("k_idxs", 8 * ub), _T("v_idxs", 8 * ub), _T("kq_mask", 2 * n_kv * ub),
               _T("out_ids", 4 * n_out), _T("embd", f32(e))]
    it = {t.name: t for t in inputs}
    nodes: list[_T] = []

    def node(name: str, size: int, op: str, *srcs: _T, view_src: _T | None = None) -> _T:
        t = _T(name, size, op, srcs, view_src)
        nodes.append(t)
        return t

    g1 = node("node_1", f32(e), "GET_ROWS", W, it["inp_mixed_tokens"])
    g2 = node("node_2", f32(e), "DUP", it["inp_mixed_embd"])
    node("set_rows", f32(e), "SET_ROWS", g1, it["inp_mixed_slots"], g2, view_src=g2)
    cur_in = it["embd"]
    L = arch.n_layers
    for il in range(L):
        last = il == L - 1
        norm = node(f"norm-{il}", f32(e), "RMS_NORM", cur_in)
        an = node(f"attn_norm-{il}", f32(e), "MUL", norm, W)

        def proj(nm: str, width: int) -> _T:  # called in this iteration only (as rotate, r4)
            m = node(nm, f32(width), "MUL_MAT", W, an)  # noqa: B023 - this iteration's `an`
            r = node(nm + "-r", f32(width), "RESHAPE", m, view_src=m)
            if arch.qk_norm:
                qn = node(nm + "-n", f32(width), "RMS_NORM", r)
                r = node(nm + "-nw", f32(width), "MUL", qn, W)
            return r

        def rotate(t: _T, width: int, mat: str, nm: str) -> _T:
            """reshape -> mul_mat by the rotation -> reshape (llama_mul_mat_hadamard)"""
            src = t.view_src or t
            r = node(nm + "-rr", f32(width), "RESHAPE", t, view_src=src)
            m = node(nm + "-rot", f32(width), "MUL_MAT", it[mat], r)
            return node(nm + "-rot-r", f32(width), "RESHAPE", m, view_src=m)

        qc = proj(f"Qcur-{il}", q)
        qr = node(f"Qrope-{il}", f32(q), "ROPE", qc, it["inp_pos"])
        if rot:
            qr = rotate(qr, q, "k_rot", f"Q-{il}")
        vc = node(f"Vcur-{il}", f32(kv), "MUL_MAT", W, an)
        vr = node(f"Vcur-{il}-r", f32(kv), "RESHAPE", vc, view_src=vc)
        if rot:
            vr = rotate(vr, kv, "v_rot", f"V-{il}")
        kc = proj(f"Kcur-{il}", kv)
        kr = node(f"Krope-{il}", f32(kv), "ROPE", kc, it["inp_pos"])
        if rot:
            kr = rotate(kr, kv, "k_rot", f"K-{il}")
        kv_ = node(f"Kview-{il}", f32(kv), "VIEW", kr, view_src=kr.view_src or kr)
        node(f"set_k-{il}", 0, "SET_ROWS", kv_, it["k_idxs"], W, view_src=W)
        vv = node(f"Vview-{il}", f32(kv), "VIEW", vr, view_src=vr.view_src or vr)
        node(f"set_v-{il}", 0, "SET_ROWS", vv, it["v_idxs"], W, view_src=W)
        qbase = qr.view_src or qr
        qv = node(f"Qview-{il}", f32(q), "VIEW", qr, view_src=qbase)
        qp = node(f"Qperm-{il}", f32(q), "PERMUTE", qv, view_src=qbase)
        fa = node(f"fa-{il}", f32(q), "FLASH_ATTN_EXT", qp, W, W, it["kq_mask"])
        ko = node(f"kqv_out-{il}", f32(q), "RESHAPE", fa, view_src=fa)
        if rot:
            ko = rotate(ko, q, "v_rot", f"O-{il}")
        ao = node(f"attn_out-{il}", f32(e), "MUL_MAT", W, ko)
        rows, res = ub, cur_in
        if last:
            rows = n_out
            ao = node(f"out_rows_a-{il}", 4 * e * rows, "GET_ROWS", ao, it["out_ids"])
            res = node(f"out_rows_r-{il}", 4 * e * rows, "GET_ROWS", cur_in, it["out_ids"])
        r4 = lambda n: 4 * n * rows  # noqa: E731, B023 - this iteration's `rows`
        fi = node(f"ffn_inp-{il}", r4(e), "ADD", ao, res)
        fn = node(f"ffn_norm_-{il}", r4(e), "RMS_NORM", fi)
        fn = node(f"ffn_norm-{il}", r4(e), "MUL", fn, W)
        ff = arch.intermediate_size or 4 * e
        gate = node(f"ffn_gate-{il}", r4(ff), "MUL_MAT", W, fn)
        up = node(f"ffn_up-{il}", r4(ff), "MUL_MAT", W, fn)
        sw = node(f"ffn_swiglu-{il}", r4(ff), "SWIGLU", gate, up)
        fo = node(f"ffn_out-{il}", r4(e), "MUL_MAT", W, sw)
        cur_in = node(f"l_out-{il}", r4(e), "ADD", fo, fi)
    nrm = node("norm", 4 * e * n_out, "RMS_NORM", cur_in)
    rn = node("result_norm", 4 * e * n_out, "MUL", nrm, W)
    out = node("result_output", 4 * arch.vocab_size * n_out, "MUL_MAT", W, rn)
    out.output = True
    return inputs, nodes
