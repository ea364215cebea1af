"""THE parameter counter: parameters from tensor shapes, per block kind.

A config.json gives shapes, not a tensor table; the weights a quant needs are
parameters x bits per weight, so the count must follow how each family lays out its
tensors (gated attention, QKV bias, QK norm, fused shared experts, Mamba-1 vs -2). The
config.json reader counts with the config's own keys; ``count_params`` counts a ModelArch
that came without a count (a hand-built shape) with the same code from the facts it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import LayerKind, LinearAttnSpec, MambaSpec, MLASpec, ModelArch, MoESpec

GEMMA_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text")


@dataclass(frozen=True)
class StackShapes:
    """Tensor shapes of one decoder stack, to count parameters per block kind."""

    model_type: str
    hidden: int
    vocab: int
    n_heads: int
    n_kv: int
    head_dim: int
    intermediate: int | None
    tie: bool
    attn_gate: bool
    attn_bias: bool
    mla: MLASpec | None
    linear: LinearAttnSpec | None
    mamba: MambaSpec | None
    moe: MoESpec | None
    moe_blocks: frozenset[int]
    mamba_dt_rank: int | None
    mamba_conv_bias: bool
    gated_mlp: bool
    qk_norm: bool = False

    @classmethod
    def from_arch(cls, arch: ModelArch) -> StackShapes:
        """The shapes a ModelArch states (no QKV bias, gated MLPs, Mamba defaults: what a
        config would add is not in it); MoE blocks: the n_moe_layers after the dense ones."""
        moe = arch.moe
        blocks: frozenset[int] = frozenset()
        if moe is not None:
            blocks = frozenset(range(moe.first_dense_layers, moe.first_dense_layers + moe.sparse_layers(arch.n_layers)))
        return cls(model_type=arch.architecture, hidden=arch.hidden_size, vocab=arch.vocab_size,
                   n_heads=arch.n_heads, n_kv=arch.n_kv_heads, head_dim=arch.head_dim,
                   intermediate=arch.intermediate_size, tie=arch.tie_embeddings, attn_gate=arch.attn_output_gate,
                   attn_bias=False, mla=arch.mla, linear=arch.linear, mamba=arch.mamba, moe=moe, moe_blocks=blocks,
                   mamba_dt_rank=None, mamba_conv_bias=True, gated_mlp=True, qk_norm=arch.qk_norm)

    def attention(self) -> int:
        h, hd = self.hidden, self.head_dim
        if self.mla:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.n_heads * qk
            else:
                q = h * self.n_heads * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * self.n_heads * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + self.n_heads * m.v_head_dim * h
        q_out = self.n_heads * hd * (2 if self.attn_gate else 1)
        n = h * q_out + 2 * h * self.n_kv * hd + self.n_heads * hd * h
        if self.attn_bias:
            n += q_out + 2 * self.n_kv * hd
        if self.qk_norm:
            n += 2 * hd
        return n

    def linear_attention(self) -> int:
        la = self.linear
        assert la is not None
        h = self.hidden
        v_dim = la.n_value_heads * la.value_head_dim
        return (
            h * la.conv_dim + h * v_dim + 2 * h * la.n_value_heads   # in_proj qkv, z, b, a
            + la.conv_dim * la.conv_kernel                           # depthwise conv
            + 2 * la.n_value_heads + la.value_head_dim               # dt_bias, A_log, gated norm
            + v_dim * h                                              # out_proj
        )

    def mamba_mixer(self) -> int:
        m = self.mamba
        assert m is not None
        h, di = self.hidden, m.d_inner
        if m.n_heads:   # Mamba-2
            conv_dim = di + 2 * m.n_groups * m.d_state
            return (h * (di + conv_dim + m.n_heads) + conv_dim * m.d_conv + conv_dim
                    + 3 * m.n_heads + di + di * h)
        dt_rank = self.mamba_dt_rank or -(-h // 16)
        n = (h * 2 * di + di * m.d_conv + (di if self.mamba_conv_bias else 0)
             + di * (dt_rank + 2 * m.d_state) + dt_rank * di + di
             + di * m.d_state + di + di * h)
        if self.model_type == "jamba":
            n += dt_rank + 2 * m.d_state   # dt/B/C layernorms
        return n

    def dense_mlp(self, width: int | None = None) -> int:
        w = width if width is not None else (self.intermediate or 4 * self.hidden)
        return (3 if self.gated_mlp else 2) * self.hidden * w

    def moe_mlp(self) -> int:
        moe = self.moe
        assert moe is not None
        h = self.hidden
        n = h * moe.n_experts + moe.n_experts * 3 * h * moe.expert_intermediate_size
        if moe.shared_width:
            n += 3 * h * moe.shared_width
            if self.model_type.startswith(("qwen2_moe", "qwen3_next", "qwen3_5")):
                n += h   # shared_expert_gate
        if self.model_type.startswith("deepseek_v3"):
            n += moe.n_experts   # e_score_correction_bias
        return n

    def norms_per_block(self) -> int:
        return (4 if self.model_type in GEMMA_TYPES else 2) * self.hidden

    def trunk_params(self, kinds: list[LayerKind], n_blocks: int,
                     block_types: list[str] | None, estimated: list[str]) -> int:
        """Embeddings + every block + final norm + untied head."""
        total = self.vocab * self.hidden + self.hidden
        if not self.tie:
            total += self.vocab * self.hidden
        moe_blocks = self.moe_blocks
        if block_types is not None:   # Nemotron-H: blocks are mixer OR mlp, one norm each
            for ch in block_types:
                total += self.hidden
                if ch == "M":
                    total += self.mamba_mixer()
                elif ch == "*":
                    total += self.attention()
                elif ch == "E" and self.moe:
                    total += self.moe_mlp()
                else:
                    total += self.dense_mlp()
            return total
        for i, kind in enumerate(kinds):
            total += self.norms_per_block()
            if kind == LayerKind.LINEAR:
                total += self.linear_attention()
            elif kind == LayerKind.MAMBA:
                total += self.mamba_mixer()
            else:
                total += self.attention()
            total += self.moe_mlp() if i in moe_blocks else self.dense_mlp()
        return total

    def mtp_params(self, n: int) -> int:
        """One MTP module: two input norms, a 2h->h projection, one decoder block, a final norm;
        embeddings and head are shared with the trunk (DeepSeek-V3 and Qwen3.5 layouts)."""
        h = self.hidden
        block = self.norms_per_block() + self.attention() + (self.moe_mlp() if self.moe else self.dense_mlp())
        return n * (2 * h + 2 * h * h + block + h)


def count_params(arch: ModelArch) -> int:
    """Trunk + embeddings + head parameters of ``arch`` from its shapes (``StackShapes.from_arch``):
    for a ModelArch that came without a ``param_count``."""
    return StackShapes.from_arch(arch).trunk_params(list(arch.layer_kinds), arch.n_layers, None, [])


def count_active_params(arch: ModelArch) -> int | None:
    """MoE: the parameters one token reads, i.e. all but the idle experts' three matrices in
    each sparse layer (the shapes ``param_count`` was counted from); None for dense."""
    m = arch.moe
    if m is None or not arch.param_count or not m.n_experts_active:
        return None
    idle = (m.sparse_layers(arch.n_layers) * (m.n_experts - m.n_experts_active) * 3 * arch.hidden_size
            * m.expert_intermediate_size)
    return arch.param_count - idle if 0 < idle < arch.param_count else None
