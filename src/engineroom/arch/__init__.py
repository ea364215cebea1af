"""What a model is made of (``ModelArch``), read from a config.json or a GGUF header.

The first stage of the pipeline: ``model`` (the description), ``config`` (config.json
reader), ``gguf`` (the GGUF header reader: local mmap or HTTP range reads, the project's
only one), ``gguf_arch`` (ModelArch from that header), ``params`` (parameter counts from
shapes) and ``load`` (``load_arch``: every way a user names a model file or repo). This
package imports nothing from the later stages (models, catalog, fit, plan).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .model import LayerKind, LinearAttnSpec, MambaSpec, MLASpec, ModelArch, MoESpec, VisionSpec
from .params import count_active_params, count_params

if TYPE_CHECKING:
    from .config import arch_from_config
    from .gguf import GGUFArray, GGUFHeader, parse_gguf_header, read_gguf_header_local, read_gguf_header_remote
    from .gguf_arch import arch_from_gguf
    from .load import fetch_hf_config, load_arch

# The readers (config.json, GGUF headers, every way to name a model file or repo) are imported
# at their first use: fit and plan of a catalog model need none of them, and `engineroom plan`
# pays for every module it imports (benchmarks/plan_speed.md).
_READERS = {
    "arch_from_config": "config", "GGUFArray": "gguf", "GGUFHeader": "gguf", "parse_gguf_header": "gguf",
    "read_gguf_header_local": "gguf", "read_gguf_header_remote": "gguf", "arch_from_gguf": "gguf_arch",
    "fetch_hf_config": "load", "load_arch": "load",
}


def __getattr__(name: str) -> object:
    module = _READERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "GGUFArray", "GGUFHeader", "LayerKind", "LinearAttnSpec", "MLASpec", "MambaSpec", "ModelArch",
    "MoESpec", "VisionSpec", "arch_from_config", "arch_from_gguf", "count_active_params", "count_params",
    "fetch_hf_config", "load_arch", "parse_gguf_header", "read_gguf_header_local", "read_gguf_header_remote",
]
