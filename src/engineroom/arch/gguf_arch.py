"""ModelArch from a GGUF's header and tensor table, locally or over HTTP.

The tensor table gives exact bytes per tensor, so fit places weights without guessing;
layer kinds come from which tensors each block holds, refined by the architecture's keys.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..values import int_or_none
from .gguf import GGUFArray, ggml_tensor_nbytes, read_gguf_header_local, read_gguf_header_remote
from .model import LayerKind, LinearAttnSpec, MambaSpec, MLASpec, ModelArch, MoESpec

_int = int_or_none

_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def _kv_int(kv: dict[str, Any], key: str) -> int | None:
    v = kv.get(key)
    if isinstance(v, GGUFArray):
        return None
    return _int(v)


def _kv_per_layer(kv: dict[str, Any], key: str, n: int) -> list[int] | None:
    """A per-layer value: GGUF stores it as a scalar or as an array of ``n_layer`` ints."""
    v = kv.get(key)
    if isinstance(v, GGUFArray):
        if v.values is None or not all(_int(x) is not None for x in v.values):
            return None
        return [int(x) for x in v.values]
    iv = _int(v)
    return None if iv is None else [iv] * n


def _file_type_name(kv: dict[str, Any]) -> str | None:
    ft = _int(kv.get("general.file_type"))
    if ft is None:
        return None
    from gguf import LlamaFileType  # gguf loads numpy: imported where a GGUF is read

    guessed = bool(ft & 1024)
    try:
        name = LlamaFileType(ft & ~1024).name
    except ValueError:
        return f"file_type {ft}"
    name = name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return f"{name} (guessed)" if guessed else name


_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_LINEAR_ATTN_ARCHS = ("qwen3next", "qwen35", "qwen35moe")
# llama.cpp graphs built from the plain decoder block (src/models/llama.cpp, qwen3.cpp): ModelArch.standard_block
_STANDARD_BLOCK_ARCHS = ("llama", "qwen3")


def arch_from_gguf(path_or_url: str | Path) -> ModelArch:
    """Describe a model from a GGUF's header and tensor table, locally or over HTTP.

    The tensor table gives exact byte sizes per tensor, so fit.py can place weights without
    guessing; layer kinds come from which tensors each block holds, refined by the
    architecture's keys (sliding-window pattern, full-attention interval, MLA ranks).
    """
    ref = str(path_or_url)
    remote = ref.startswith(("http://", "https://"))
    header = read_gguf_header_remote(ref) if remote else read_gguf_header_local(ref)
    kv = header.kv
    estimated: list[str] = []
    tensors: dict[str, tuple[tuple[int, ...], int]] = dict(header.tensors)

    split_count = _kv_int(kv, "split.count") or 1
    m = _SPLIT_RE.search(ref)
    if split_count > 1:
        if m:
            for i in range(2, split_count + 1):
                other = ref[: m.start()] + f"-{i:05d}-of-{split_count:05d}.gguf" + ref[m.end():]
                part = read_gguf_header_remote(other) if remote else read_gguf_header_local(other)
                tensors.update(part.tensors)
        else:
            estimated.append(f"tensor_bytes: shard 1 of {split_count} only; other shard names unknown")

    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise BadInput(f"{ref} has no general.architecture key, so its layout cannot be read.")
    a = arch

    def key(name: str) -> str:
        return f"{a}.{name}"

    block_count = _kv_int(kv, key("block_count"))
    hidden = _kv_int(kv, key("embedding_length"))
    missing = [k for k, v in (("block_count", block_count), ("embedding_length", hidden)) if not v]
    if missing:
        raise BadInput(f"{ref} lacks {', '.join(a + '.' + k for k in missing)}, so the model cannot be described.")
    assert block_count and hidden
    if block_count > 100_000 or hidden > 1 << 24:
        raise BadInput(f"{ref} declares {block_count} blocks of width {hidden}, which is not a real model.")

    # --- which block holds what ---------------------------------------------------------
    per_block: dict[int, set[str]] = {}
    for tname in tensors:
        bm = _BLK_RE.match(tname)
        if bm:
            per_block.setdefault(int(bm.group(1)), set()).add(bm.group(2))
    nextn = _kv_int(kv, key("nextn_predict_layers")) or 0
    mtp_blocks = {i for i, names in per_block.items() if any(n.startswith("nextn.") for n in names)}
    has_mtp_tensors = bool(mtp_blocks)
    trunk_blocks = block_count
    if nextn:
        last_present = max(per_block) if per_block else -1
        if has_mtp_tensors or last_present < block_count - 1:
            trunk_blocks = block_count - nextn
    if nextn and not has_mtp_tensors:
        estimated.append(f"mtp_layers: header declares {nextn} nextn layers but the file has no nextn tensors")
    mtp_blocks |= {i for i in per_block if i >= trunk_blocks}

    head_counts = _kv_per_layer(kv, key("attention.head_count"), block_count) or []
    kv_counts = _kv_per_layer(kv, key("attention.head_count_kv"), block_count)
    n_heads = max(head_counts) if head_counts else 0
    if not n_heads and a not in ("mamba", "mamba2"):
        raise BadInput(f"{ref} lacks {a}.attention.head_count, so the model cannot be described.")
    if kv_counts is None:
        kv_counts = [n_heads] * block_count
    n_kv = max(kv_counts) if kv_counts else n_heads
    key_len = _kv_int(kv, key("attention.key_length"))
    head_dim = key_len or (hidden // n_heads if n_heads else 0)

    is_mla = _kv_int(kv, key("attention.kv_lora_rank")) is not None
    mla: MLASpec | None = None
    rope_dim = _kv_int(kv, key("rope.dimension_count"))
    if is_mla:
        rope = rope_dim or 64
        k_mla = _kv_int(kv, key("attention.key_length_mla")) or key_len or 192
        v_mla = _kv_int(kv, key("attention.value_length_mla")) or _kv_int(kv, key("attention.value_length")) or 128
        mla = MLASpec(
            kv_lora_rank=_kv_int(kv, key("attention.kv_lora_rank")) or 512,
            qk_rope_head_dim=rope,
            qk_nope_head_dim=k_mla - rope,
            v_head_dim=v_mla,
            q_lora_rank=_kv_int(kv, key("attention.q_lora_rank")),
        )
        head_dim = k_mla

    kinds: list[LayerKind] = []
    ffn_only = 0
    for i in range(trunk_blocks):
        names = per_block.get(i, set())
        has_ssm = any(n.startswith("ssm_") for n in names)
        has_attn = any(n.startswith(("attn_q", "attn_k", "attn_qkv", "attn_kv_a_mqa")) for n in names)
        if has_ssm:
            kinds.append(LayerKind.LINEAR if a in _LINEAR_ATTN_ARCHS else LayerKind.MAMBA)
        elif has_attn or not names:
            kinds.append(LayerKind.MLA if is_mla else LayerKind.FULL)
            if not names:
                estimated.append(f"layer_kinds[{i}]: block has no tensors in the table; assumed attention")
        else:
            ffn_only += 1
    if ffn_only:
        estimated.append(f"layer_kinds: {ffn_only} feed-forward-only blocks hold no sequence state and are not listed")

    interval = _kv_int(kv, key("full_attention_interval"))
    if interval and a in _LINEAR_ATTN_ARCHS:
        expected = [LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.LINEAR for i in range(trunk_blocks)]
        if expected != kinds:
            estimated.append("layer_kinds: tensors disagree with full_attention_interval; the tensors were used")

    window = _kv_int(kv, key("attention.sliding_window"))
    if window and not is_mla:
        pattern = kv.get(key("attention.sliding_window_pattern"))
        sliding: list[bool] | None = None
        if isinstance(pattern, GGUFArray) and pattern.values is not None:
            # llama.cpp stores a per-layer bool array: true = sliding-window layer
            sliding = [bool(x) for x in pattern.values][:trunk_blocks]
        elif period := _int(pattern):
            sliding = [(i + 1) % period != 0 for i in range(trunk_blocks)]
        elif a == "gemma3":
            sliding = [(i + 1) % 6 != 0 for i in range(trunk_blocks)]
        elif a == "gemma2":
            sliding = [i % 2 == 0 for i in range(trunk_blocks)]
        elif a in ("mistral", "llama"):
            sliding = None   # a window key alone on llama-family GGUFs is informational
        else:
            sliding = [True] * trunk_blocks
            estimated.append(f"layer_kinds: {a} declares a sliding window but no pattern; "
                             "all attention layers marked sliding")
        if sliding is not None:
            for idx, kind in enumerate(kinds):
                if kind == LayerKind.FULL and idx < len(sliding) and sliding[idx]:
                    kinds[idx] = LayerKind.SLIDING

    linear: LinearAttnSpec | None = None
    mamba: MambaSpec | None = None
    conv = _kv_int(kv, key("ssm.conv_kernel"))
    state = _kv_int(kv, key("ssm.state_size"))
    groups = _kv_int(kv, key("ssm.group_count"))
    rank = _kv_int(kv, key("ssm.time_step_rank"))
    inner = _kv_int(kv, key("ssm.inner_size"))
    if LayerKind.LINEAR in kinds:
        if not (state and groups and rank and inner):
            raise BadInput(f"{ref} has linear-attention blocks but lacks "
                           f"{a}.ssm.state_size/group_count/time_step_rank/inner_size.")
        linear = LinearAttnSpec(
            n_key_heads=groups, n_value_heads=rank, key_head_dim=state,
            value_head_dim=inner // rank, conv_kernel=conv or 4,
        )
    if LayerKind.MAMBA in kinds:
        if not (state and inner):
            raise BadInput(f"{ref} has Mamba blocks but lacks {a}.ssm.state_size/inner_size.")
        mamba = MambaSpec(d_inner=inner, d_state=state, d_conv=conv or 4,
                          n_groups=groups or 1, n_heads=(rank or 0) if a not in ("mamba", "jamba") else 0)

    n_experts = _kv_int(kv, key("expert_count"))
    moe: MoESpec | None = None
    if n_experts and n_experts > 1:
        n_moe = sum(1 for i in range(trunk_blocks)
                    if any(n.startswith("ffn_gate_inp") for n in per_block.get(i, ())))
        first_dense = _kv_int(kv, key("leading_dense_block_count")) or 0
        moe = MoESpec(
            n_experts=n_experts,
            n_experts_active=_kv_int(kv, key("expert_used_count")) or 0,
            expert_intermediate_size=_kv_int(kv, key("expert_feed_forward_length"))
            or (_kv_per_layer(kv, key("feed_forward_length"), block_count) or [0])[-1],
            n_shared_experts=_kv_int(kv, key("expert_shared_count")) or 0,
            shared_intermediate_size=_kv_int(kv, key("expert_shared_feed_forward_length")),
            first_dense_layers=first_dense,
            n_moe_layers=n_moe if n_moe != trunk_blocks - first_dense else None,
        )
        if moe.n_shared_experts == 0 and any("ffn_up_shexp" in n for names in per_block.values() for n in names):
            moe = replace(moe, n_shared_experts=1)

    ff = _kv_per_layer(kv, key("feed_forward_length"), block_count)
    intermediate = max(ff) if ff else None

    vocab = _kv_int(kv, key("vocab_size"))
    tokens = kv.get("tokenizer.ggml.tokens")
    if not vocab and isinstance(tokens, GGUFArray):
        vocab = tokens.count
    if not vocab and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"][0][-1]
    if not vocab:
        estimated.append("vocab_size: no vocab key, token list or token_embd tensor")
        vocab = 0

    from gguf import GGMLQuantizationType  # gguf loads numpy: imported where a GGUF is read

    tensor_bytes: dict[str, int] = {}
    tensor_types: dict[str, str] = {}
    tensor_shapes: dict[str, tuple[int, ...]] = {}
    trunk_params = 0
    mtp_params = 0
    for tname, (dims, gtype) in tensors.items():
        tensor_bytes[tname] = ggml_tensor_nbytes(tname, dims, gtype)
        tensor_types[tname] = GGMLQuantizationType(gtype).name
        tensor_shapes[tname] = tuple(int(d) for d in dims)
        bm = _BLK_RE.match(tname)
        if bm and int(bm.group(1)) in mtp_blocks:
            mtp_params += math.prod(dims)
        else:
            trunk_params += math.prod(dims)

    import httpx

    name = kv.get("general.name")
    return ModelArch(
        name=name if isinstance(name, str) and name else Path(httpx.URL(ref).path if remote else ref).name,
        source="gguf",
        architecture=a,
        n_layers=len(kinds),
        hidden_size=hidden,
        vocab_size=vocab,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        layer_kinds=tuple(kinds),
        intermediate_size=intermediate,
        sliding_window=window if LayerKind.SLIDING in kinds else None,
        max_position=_kv_int(kv, key("context_length")),
        rope_dim=rope_dim or head_dim,
        tie_embeddings="output.weight" not in tensors,
        mtp_layers=nextn if has_mtp_tensors else 0,
        moe=moe,
        mla=mla,
        linear=linear,
        mamba=mamba,
        param_count=trunk_params,
        file_type=_file_type_name(kv),
        tensor_bytes=tensor_bytes,
        tensor_types=tensor_types,
        tensor_shapes=tensor_shapes,
        estimated=tuple(estimated),
        mtp_param_count=mtp_params or None,
        attn_output_gate=_gated_query(tensors, n_heads, head_dim),
        qk_norm=any(n.startswith("attn_q_norm") for names in per_block.values() for n in names),
        standard_block=a in _STANDARD_BLOCK_ARCHS,
    )


def _gated_query(tensors: dict[str, tuple[tuple[int, ...], int]], n_heads: int, head_dim: int) -> bool:
    """The attention layers' Q projection is twice n_heads x head_dim wide: it also yields the
    output gate (llama.cpp qwen35 / qwen3next: attn_q {n_embd, n_embd_head_k x n_head x 2})."""
    for name, (dims, _) in tensors.items():
        if name.startswith("blk.") and name.endswith(".attn_q.weight"):
            return len(dims) > 1 and dims[1] == 2 * n_heads * head_dim
    return False
