"""The catalog: models (with quants), engines, hardware classes, drafters and priorities.

``load_catalog()`` returns the validated, immutable Catalog; ``arch_from_catalog`` turns a
model's inline architecture block into the ModelArch that fit and plan consume.
"""

from __future__ import annotations

from ..arch import LayerKind, LinearAttnSpec, ModelArch, MoESpec, VisionSpec
from ..errors import BadInput
from .load import (CATALOG_DIR, catalog_from_raw, find_engine, find_model, find_priority,
                   load_catalog, read_raw)
from .schema import (Catalog, Drafter, Engine, HardwareClass, KvDtype, Model, Priority,
                     Quant)

__all__ = [
    "CATALOG_DIR", "Catalog", "Drafter", "Engine", "HardwareClass", "KvDtype", "Model",
    "Priority", "Quant", "arch_from_catalog", "catalog_from_raw", "find_engine", "find_model",
    "find_priority", "load_catalog", "read_raw",
]


def arch_from_catalog(model: Model) -> ModelArch:
    """ModelArch from the model's inline architecture block (no network, no files)."""
    a = model.architecture
    if a is None:
        raise BadInput(
            f"model {model.id} has no inline architecture in the catalog; "
            f"read it from its config with `load_arch('{model.hf_config}')`."
        )
    kinds = tuple(LayerKind(k) for k in a.layer_pattern) * (a.n_layers // len(a.layer_pattern))
    linear = None
    if a.linear is not None:
        linear = LinearAttnSpec(
            n_key_heads=a.linear.n_key_heads, n_value_heads=a.linear.n_value_heads,
            key_head_dim=a.linear.key_head_dim, value_head_dim=a.linear.value_head_dim,
            conv_kernel=a.linear.conv_kernel,
        )
    moe = None
    if a.moe is not None:
        moe = MoESpec(
            n_experts=a.moe.n_experts, n_experts_active=a.moe.n_experts_active,
            expert_intermediate_size=a.moe.expert_intermediate_size,
            n_shared_experts=a.moe.n_shared_experts,
            shared_intermediate_size=a.moe.shared_intermediate_size,
        )
    vision = None
    if a.vision is not None:
        vision = VisionSpec(depth=a.vision.depth, hidden_size=a.vision.hidden_size,
                            n_heads=a.vision.n_heads, patch_size=a.vision.patch_size,
                            param_count=a.vision.param_count)
    return ModelArch(
        name=model.hf_repo or model.id, source="catalog", architecture=a.architecture,
        n_layers=a.n_layers, hidden_size=a.hidden_size, vocab_size=a.vocab_size,
        n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim, layer_kinds=kinds,
        intermediate_size=a.intermediate_size, sliding_window=a.sliding_window,
        max_position=a.max_position, rope_dim=a.rope_dim, tie_embeddings=a.tie_embeddings,
        mtp_layers=a.mtp_layers, moe=moe, linear=linear, vision=vision,
        param_count=a.param_count, torch_dtype=a.torch_dtype,
    )
