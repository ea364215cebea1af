"""A Hugging Face tokenizer folder made from a GGUF's own vocabulary, for tools that want one offline.

aiperf, guidellm and llama-benchy size their prompts and count tokens with a Hugging Face
tokenizer (``AutoTokenizer.from_pretrained(name_or_path)``); the hub is unreachable here, so
they are given a local folder instead. The GGUF carries everything a byte-level BPE tokenizer
needs (``tokenizer.ggml.tokens`` / ``merges`` / ``token_type``, the special ids and the chat
template), so the folder is written from it with the ``gguf`` package alone, no
``transformers`` in the project:

- ``tokenizer.json``: BPE model (vocab + merges), ``ByteLevel`` pre-tokenizer and decoder, with
  SmolLM2's split of digits one by one (llama.cpp's ``smollm`` pre-tokenizer type) in front;
  control tokens (type 3) as special added tokens;
- ``tokenizer_config.json``: ``PreTrainedTokenizerFast`` with bos / eos / pad / unk and the
  GGUF's ``tokenizer.chat_template``;
- ``config.json``: ``model_type: llama`` (some loaders read it to pick the tokenizer class).

    .venv/bin/python benchmarks/hf_tokenizer.py GGUF OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gguf import GGUFReader

CONTROL = 3          # llama.cpp's token type for control tokens


def _field(reader: GGUFReader, key: str) -> object:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def write_tokenizer_folder(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the folder (idempotent); returns its path."""
    reader = GGUFReader(str(gguf_path))
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"{gguf_path}: tokenizer model {model!r}; only byte-level BPE (gpt2) is written here")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))            # type: ignore[arg-type]
    types = list(_field(reader, "tokenizer.ggml.token_type") or [])   # type: ignore[arg-type]
    merges = [m.split(" ", 1) for m in _field(reader, "tokenizer.ggml.merges")]  # type: ignore[union-attr]
    pre = _field(reader, "tokenizer.ggml.pre")

    def name(key: str) -> str | None:
        i = _field(reader, key)
        return tokens[int(i)] if isinstance(i, int) and 0 <= i < len(tokens) else None

    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
               for i, t in enumerate(tokens) if i < len(types) and types[i] == CONTROL]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pre_tokenizer: dict = byte_level
    if pre in ("smollm", "starcoder", "refact"):
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                               byte_level]}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
           "pre_tokenizer": pre_tokenizer,
           "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                              "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
           "bos_token": name("tokenizer.ggml.bos_token_id"), "eos_token": name("tokenizer.ggml.eos_token_id"),
           "pad_token": name("tokenizer.ggml.padding_token_id"), "unk_token": name("tokenizer.ggml.unknown_token_id"),
           "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token")), "clean_up_tokenization_spaces": False}
    template = _field(reader, "tokenizer.chat_template")
    if isinstance(template, str):
        cfg["chat_template"] = template
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    (out / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(tokens)}, indent=1))
    return out


def default_gguf() -> Path:
    """The SmolLM2 GGUF that ``engineroom models pull smollm2-135m`` caches (pulled if missing)."""
    from engineroom import models

    return Path(models.pull("smollm2-135m"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip())
        sys.exit(2)
    print(write_tokenizer_folder(sys.argv[1], sys.argv[2]))
