"""What a model is made of (``ModelArch``), read from a config.json or a GGUF header.

The first stage of the pipeline: ``model`` (the description), ``config`` (config.json
reader), ``gguf`` (the GGUF header reader: local mmap or HTTP range reads, the project's
only one), ``gguf_arch`` (ModelArch from that header), ``params`` (parameter counts from
shapes) and ``load`` (``load_arch``: every way a user names a model file or repo). This
package imports nothing from the later stages (models, catalog, fit, plan).
"""

from __future__ import annotations

from .config import arch_from_config
from .gguf import GGUFArray, GGUFHeader, parse_gguf_header, read_gguf_header_local, read_gguf_header_remote
from .gguf_arch import arch_from_gguf
from .load import fetch_hf_config, load_arch
from .model import LayerKind, LinearAttnSpec, MambaSpec, MLASpec, ModelArch, MoESpec, VisionSpec
from .params import count_active_params, count_params

__all__ = [
    "GGUFArray", "GGUFHeader", "LayerKind", "LinearAttnSpec", "MLASpec", "MambaSpec", "ModelArch",
    "MoESpec", "VisionSpec", "arch_from_config", "arch_from_gguf", "count_active_params", "count_params",
    "fetch_hf_config", "load_arch", "parse_gguf_header", "read_gguf_header_local", "read_gguf_header_remote",
]
