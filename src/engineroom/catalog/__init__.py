"""The catalog: models (with quants), engines, hardware classes, drafters and priorities.

``load_catalog()`` returns the validated, immutable Catalog; ``arch_from_catalog`` turns a
model's inline architecture block into the ModelArch that fit and plan consume
(``convert``: the lossless mapping both ways).
"""

from __future__ import annotations

from ..arch import ModelArch
from ..errors import BadInput
from .convert import arch_from_block, block_from_arch
from .engine_schema import Engine, KvDtype
from .load import CATALOG_DIR, catalog_from_raw, find_engine, find_model, find_priority, load_catalog, read_raw
from .schema import Catalog, Drafter, HardwareClass, Model, Priority, Quant

__all__ = [
    "arch_from_block", "arch_from_catalog", "block_from_arch", "Catalog", "CATALOG_DIR", "catalog_from_raw",
    "Drafter", "Engine", "find_engine", "find_model", "find_priority", "HardwareClass", "KvDtype",
    "load_catalog", "Model", "Priority", "Quant", "read_raw",
]


def arch_from_catalog(model: Model) -> ModelArch:
    """ModelArch from the model's inline architecture block (no network, no files)."""
    if model.architecture is None:
        raise BadInput(
            f"model {model.id} has no inline architecture in the catalog; "
            f"read it from its config with `load_arch('{model.hf_config}')`."
        )
    return arch_from_block(model.architecture, name=model.hf_repo or model.id)
