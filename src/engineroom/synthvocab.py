"""The vocabulary of a random-weight GGUF (``engineroom.synth``): a real model's tokenizer copied
(SmolLM2's by default) or a small byte-level one, and which of its tokens would print nothing.

Random weights sample any token, and greedy decoding repeats one; a token the server prints as
nothing (a control token that does not end a sequence, a byte that is not whole UTF-8) then makes a
silent stream, which bench rightly calls INVALID. So the copied control tokens are written
USER_DEFINED (``vocabulary``) and the writer gives the rest zero output rows (``silent_tokens``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


def default_tokenizer_source() -> Path | None:
    """The GGUF whose tokenizer synthetic models copy: $ENGINEROOM_TOKENIZER_GGUF, else the
    cached SmolLM2 (``engineroom models pull smollm2-135m``), else None (a byte-level vocab)."""
    explicit = os.environ.get("ENGINEROOM_TOKENIZER_GGUF")
    if explicit:
        return Path(explicit)
    from .models import resolve

    cached = resolve("smollm2-135m").path
    return cached if cached is not None and cached.is_file() else None


@functools.lru_cache(maxsize=4)
def _read_tokenizer(source: Path) -> tuple:
    """Tokens, types, merges, pre, ids, template of a GGUF's tokenizer (cached), read with
    engineroom's one GGUF reader keeping the long arrays."""
    from .arch import read_gguf_header_local

    kv = read_gguf_header_local(source, keep_arrays=True).kv

    def values(key: str) -> list:
        return list(kv[key].values)

    ids = {k: int(kv[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "unknown", "padding")}
    return (tuple(values("tokenizer.ggml.tokens")), tuple(int(t) for t in values("tokenizer.ggml.token_type")),
            tuple(values("tokenizer.ggml.merges")), str(kv["tokenizer.ggml.pre"]), ids,
            kv.get("tokenizer.chat_template"))


NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4   # GGUF token types (gguf.TokenType)
# the fallback vocabulary's chat template (ChatML, whose specials it has): vLLM answers HTTP 400 to a chat request
# for a tokenizer without one ("default chat template is no longer allowed"), where llama-server falls back itself
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

_FALLBACK_PAIRS = (" t", "th", "he", " a", "in", "er", "an", " s", "re", "on", " w", "at", "en", "nd", " o",
                   "or", "es", "is", "it", " c", "ed", "ng", " b", "ou", "ar", "al", " f", " m", "te", "st")


def vocabulary(vocab_size: int, source: Path | None) -> dict:
    """Tokens, types, merges, pre-tokenizer, special ids and chat template for a ``vocab_size`` vocabulary:
    ``source``'s tokenizer (cut or padded with USER_DEFINED tokens), else the byte-level fallback."""
    if source is not None and source.exists():
        tokens_t, types_t, merges_t, pre, ids, tmpl = _read_tokenizer(Path(source))
        tokens, types, merges, ids = list(tokens_t), list(types_t), list(merges_t), dict(ids)
    else:  # a small byte-level BPE vocab: 256 byte tokens, specials and merges of common pairs
        byte_map = _bytes_to_unicode()
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [byte_map[b] for b in range(256)]
        types = [CONTROL] * 3 + [1] * 256
        # llama.cpp's gpt2 tokenizer refuses a file without merges ("cannot find tokenizer
        # merges"): a few dozen English pairs make it a real (if weak) BPE vocab that loads
        merges = []
        for pair in _FALLBACK_PAIRS:
            a, b = (byte_map[ord(c)] for c in pair)
            merges.append(f"{a} {b}")
            tokens.append(a + b)
            types.append(1)
        pre, tmpl = "default", CHATML        # its specials are ChatML's: an engine without a default template chats
        ids = {"bos": 1, "eos": 2, "unknown": 0, "padding": 0}
    # Random weights sample any token. One the engine prints as nothing (a control token that does not end
    # generation: SmolLM2's <|im_start|>, <file_sep>, ...) makes a silent stream, which bench rightly
    # calls INVALID (the H200's MoE edge pick: 18 of 96 streams, benchmarks/gpu_edge.md). Every control
    # token but end of sequence, unknown and padding is written USER_DEFINED: a prompt still tokenizes it
    # as one special token, and llama.cpp prints its text (token_to_piece skips CONTROL and UNKNOWN only).
    ends = {ids["eos"], ids["unknown"], ids["padding"]}
    types = [USER_DEFINED if t == CONTROL and i not in ends else t for i, t in enumerate(types)]
    if vocab_size < len(tokens):
        keep = set(tokens[:vocab_size])
        tokens, types = tokens[:vocab_size], types[:vocab_size]
        merges = [m for m in merges if "".join(m.split(" ", 1)) in keep and all(p in keep for p in m.split(" ", 1))]
        ids = {k: (v if v < vocab_size else 0) for k, v in ids.items()}
    else:
        extra = vocab_size - len(tokens)
        tokens = tokens + [f"<|synthetic_pad_{i}|>" for i in range(extra)]
        types = types + [USER_DEFINED] * extra
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre, "ids": ids, "template": tmpl}


def silent_tokens(tok: dict) -> list[int]:
    """Token ids a server prints as nothing when one is sampled alone (and a random model repeats one
    token): control and unknown tokens, and byte-level tokens that are not whole UTF-8 (a lone lead or
    continuation byte; llama-server holds such bytes back until the character completes). The H200's
    MoE edge pick, with SmolLM2's control tokens made printable, still had 2 silent streams of 96."""
    to_byte = {c: b for b, c in _bytes_to_unicode().items()}
    out = []
    for i, (text, kind) in enumerate(zip(tok["tokens"], tok["types"], strict=True)):
        if kind in (CONTROL, UNKNOWN):
            out.append(i)
            continue
        if kind != NORMAL or not all(c in to_byte for c in text):
            continue
        try:
            bytes(to_byte[c] for c in text).decode("utf-8")
        except UnicodeDecodeError:
            out.append(i)
    return out


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))
