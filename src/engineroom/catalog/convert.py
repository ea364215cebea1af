"""ModelArch <-> the catalog's inline ArchBlock, without loss.

Two representations of one description exist because the catalog is validated YAML
(pydantic) and fit/plan work on the frozen dataclass. Every ModelArch field has its
ArchBlock counterpart, except the three that are not the model's but the file's or the
label's: ``name`` (given back to ``arch_from_block``), ``source`` (the kind of reader;
an ArchBlock's ``source`` is a citation instead) and the GGUF tensor tables (exact bytes of
one file, never inline). The layer kinds are stored as their shortest repeating pattern.
"""

from __future__ import annotations

from typing import TypeVar

from ..arch import LayerKind, LinearAttnSpec, MambaSpec, MLASpec, ModelArch, MoESpec, VisionSpec
from .base import Strict
from .schema import ArchBlock, LinearBlock, MambaBlock, MLABlock, MoEBlock, VisionBlock

_Block = TypeVar("_Block", bound=Strict)


def _period(kinds: tuple[LayerKind, ...]) -> tuple[LayerKind, ...]:
    """The shortest prefix that, repeated, gives every layer kind (all of them at worst)."""
    n = len(kinds)
    for p in range(1, n + 1):
        if n % p == 0 and kinds == kinds[:p] * (n // p):
            return kinds[:p]
    return kinds


def arch_from_block(a: ArchBlock, name: str, source: str = "catalog") -> ModelArch:
    """The ModelArch an inline block describes (``name``: its label, a repo id or file name)."""
    pattern = tuple(LayerKind(k) for k in a.layer_pattern)
    return ModelArch(
        name=name, source=source, architecture=a.architecture, n_layers=a.n_layers, hidden_size=a.hidden_size,
        vocab_size=a.vocab_size, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
        layer_kinds=pattern * (a.n_layers // len(pattern)), intermediate_size=a.intermediate_size,
        sliding_window=a.sliding_window, max_position=a.max_position, rope_dim=a.rope_dim,
        tie_embeddings=a.tie_embeddings, mtp_layers=a.mtp_layers,
        moe=MoESpec(**vars(a.moe)) if a.moe else None,
        mla=MLASpec(**vars(a.mla)) if a.mla else None,
        linear=LinearAttnSpec(**vars(a.linear)) if a.linear else None,
        mamba=MambaSpec(**vars(a.mamba)) if a.mamba else None,
        vision=VisionSpec(**vars(a.vision)) if a.vision else None,
        param_count=a.param_count, torch_dtype=a.torch_dtype, file_type=a.file_type, estimated=a.estimated,
        mtp_param_count=a.mtp_param_count, active_param_count=a.active_param_count,
        attn_output_gate=a.attn_output_gate, qk_norm=a.qk_norm, standard_block=a.standard_block,
    )


def block_from_arch(arch: ModelArch, source: str = "") -> ArchBlock:
    """``arch`` as an inline block (``source``: where its numbers come from, as a catalog
    entry cites it); ``arch_from_block(block_from_arch(a), a.name, a.source) == a``."""
    def spec(block_type: type[_Block], value: object | None) -> _Block | None:
        return block_type(**vars(value)) if value is not None else None

    return ArchBlock(
        architecture=arch.architecture, n_layers=arch.n_layers, hidden_size=arch.hidden_size,
        vocab_size=arch.vocab_size, n_heads=arch.n_heads, n_kv_heads=arch.n_kv_heads, head_dim=arch.head_dim,
        layer_pattern=tuple(k.value for k in _period(arch.layer_kinds)), intermediate_size=arch.intermediate_size,
        sliding_window=arch.sliding_window, max_position=arch.max_position, rope_dim=arch.rope_dim,
        tie_embeddings=arch.tie_embeddings, mtp_layers=arch.mtp_layers, param_count=arch.param_count,
        active_param_count=arch.active_param_count, torch_dtype=arch.torch_dtype,
        linear=spec(LinearBlock, arch.linear), mamba=spec(MambaBlock, arch.mamba), mla=spec(MLABlock, arch.mla),
        moe=spec(MoEBlock, arch.moe), vision=spec(VisionBlock, arch.vision),
        mtp_param_count=arch.mtp_param_count, file_type=arch.file_type,
        attn_output_gate=arch.attn_output_gate, qk_norm=arch.qk_norm, standard_block=arch.standard_block,
        estimated=arch.estimated, source=source,
    )
