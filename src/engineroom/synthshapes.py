"""The architectures ``engineroom.synth`` writes for tests and benchmarks: ``SHAPES`` (small test
shapes by name), ``qwen36_27b`` (the Qwen3.6-27B text layout, optionally shallower), and the
dense / DeepSeek-V2 builders they are made with. ``engineroom.synth`` writes them."""

from __future__ import annotations

from dataclasses import replace

from .arch import LayerKind, LinearAttnSpec, MLASpec, ModelArch, MoESpec


def qwen36_27b(n_layers: int = 64, vocab_size: int = 248_320) -> ModelArch:
    """The Qwen3.6-27B text layout (qwen35: [linear x3, full] repeated), optionally shallower."""
    kinds = tuple(LayerKind.FULL if (i + 1) % 4 == 0 else LayerKind.LINEAR for i in range(n_layers))
    return ModelArch(
        name=f"Qwen3.6-27B-layout-{n_layers}L", source="catalog", architecture="qwen35",
        n_layers=n_layers, hidden_size=5120, vocab_size=vocab_size, n_heads=24, n_kv_heads=4,
        head_dim=256, layer_kinds=kinds, intermediate_size=17408, max_position=262_144, rope_dim=64,
        mtp_layers=0, attn_output_gate=True, qk_norm=True,
        linear=LinearAttnSpec(n_key_heads=16, n_value_heads=48, key_head_dim=128,
                                            value_head_dim=128, conv_kernel=4),
    )


def dense_arch(name: str, arch: str, L: int, E: int, H: int, KV: int, hd: int, ff: int, V: int = 49152) -> ModelArch:
    return ModelArch(name=name, source="catalog", architecture=arch, n_layers=L, hidden_size=E, vocab_size=V,
                     n_heads=H, n_kv_heads=KV, head_dim=hd, layer_kinds=(LayerKind.FULL,) * L,
                     intermediate_size=ff, max_position=131072, qk_norm=arch in ("qwen3", "qwen3moe", "gemma3"),
                     standard_block=arch in ("llama", "qwen3"))   # as tensor_layout writes them


def _shapes() -> dict[str, ModelArch]:
    s: dict[str, ModelArch] = {}
    s["dense-s"] = dense_arch("dense-s", "qwen3", 8, 512, 8, 2, 64, 1536)
    s["dense-m"] = dense_arch("dense-m", "qwen3", 12, 1024, 16, 4, 64, 2816)
    s["dense-mha"] = dense_arch("dense-mha", "qwen3", 6, 768, 12, 12, 64, 2048)
    s["moe-s"] = replace(dense_arch("moe-s", "qwen3moe", 6, 512, 8, 2, 64, 0), intermediate_size=None,
                         moe=MoESpec(n_experts=16, n_experts_active=4, expert_intermediate_size=256))
    s["moe-m"] = replace(dense_arch("moe-m", "qwen3moe", 8, 768, 12, 4, 64, 0), intermediate_size=None,
                         moe=MoESpec(n_experts=32, n_experts_active=8, expert_intermediate_size=384))
    kinds = tuple(LayerKind.FULL if (i + 1) % 6 == 0 else LayerKind.SLIDING for i in range(12))
    s["swa-s"] = replace(dense_arch("swa-s", "gemma3", 12, 640, 4, 1, 256, 2048, V=65536),
                         layer_kinds=kinds, sliding_window=512)
    hy = qwen36_27b(8, vocab_size=49152)
    s["hybrid-s"] = replace(hy, name="hybrid-s", hidden_size=1024, n_heads=8, n_kv_heads=2, head_dim=128,
                            intermediate_size=2816, rope_dim=32,
                            linear=LinearAttnSpec(n_key_heads=8, n_value_heads=16, key_head_dim=64,
                                                  value_head_dim=64, conv_kernel=4))
    s["hybrid-m"] = replace(qwen36_27b(12, vocab_size=65536), name="hybrid-m", hidden_size=1536, n_heads=12,
                            n_kv_heads=2, head_dim=128, intermediate_size=4096, rope_dim=32,
                            linear=LinearAttnSpec(n_key_heads=8, n_value_heads=24, key_head_dim=64,
                                                  value_head_dim=64, conv_kernel=4))
    s["mla-s"] = ModelArch(name="mla-s", source="catalog", architecture="deepseek2", n_layers=4, hidden_size=512,
                           vocab_size=49152, n_heads=8, n_kv_heads=8, head_dim=96,
                           layer_kinds=(LayerKind.MLA,) * 4, intermediate_size=1024, max_position=131072,
                           mla=MLASpec(kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64,
                                       v_head_dim=64, q_lora_rank=384),
                           moe=MoESpec(n_experts=16, n_experts_active=4, expert_intermediate_size=256,
                                       n_shared_experts=1, first_dense_layers=1))
    # ---- issue 6 shapes (fit vs llama-server at the default launch and explicit -np) ----------
    s["hd256"] = dense_arch("hd256", "qwen3", 6, 1024, 8, 2, 256, 3072)
    s["hd80"] = dense_arch("hd80", "llama", 8, 1280, 16, 4, 80, 3456)       # q8_0/q4_0 KV refused
    s["mqa"] = dense_arch("mqa", "llama", 8, 768, 12, 1, 64, 2048)
    s["thin48"] = dense_arch("thin48", "qwen3", 48, 256, 4, 4, 64, 768)      # 48 thin MHA layers
    s["narrow-ff"] = dense_arch("narrow-ff", "llama", 6, 1024, 16, 4, 64, 768)  # FFN narrower than hidden
    s["dsv2"] = _deepseek_v2("dsv2", 4, 512, 8, kv_lora=256, rope=32, nope=64, v=64, q_lora=384,
                             experts=16, active=4, eff=256, shared=2, ff=1024)
    dsv2_mla = s["dsv2"].mla
    assert dsv2_mla is not None      # _deepseek_v2 makes an MLA model
    s["dsv2-noq"] = replace(s["dsv2"], name="dsv2-noq", mla=replace(dsv2_mla, q_lora_rank=None))
    # held out: measured only after the formulas were frozen
    s["hd256-m"] = dense_arch("hd256-m", "qwen3", 8, 1536, 12, 4, 256, 4096)
    s["hd80-m"] = dense_arch("hd80-m", "llama", 6, 960, 12, 3, 80, 2560)
    s["narrow-m"] = dense_arch("narrow-m", "qwen3", 8, 1536, 12, 2, 128, 1024)
    s["narrow-xs"] = dense_arch("narrow-xs", "llama", 4, 2048, 16, 8, 128, 896)
    kinds = tuple(LayerKind.FULL if (i + 1) % 5 == 0 else LayerKind.SLIDING for i in range(10))
    s["swa-m"] = replace(dense_arch("swa-m", "gemma3", 10, 1152, 4, 1, 256, 3456, V=65536),
                         layer_kinds=kinds, sliding_window=1024)
    s["dsv2-m"] = _deepseek_v2("dsv2-m", 6, 768, 12, kv_lora=512, rope=64, nope=128, v=128, q_lora=None,
                               experts=32, active=6, eff=384, shared=2, ff=2048)
    s["hybrid-t"] = replace(qwen36_27b(12, vocab_size=49152), name="hybrid-t", hidden_size=768, n_heads=6,
                            n_kv_heads=2, head_dim=128, intermediate_size=2048, rope_dim=32,
                            linear=LinearAttnSpec(n_key_heads=6, n_value_heads=12, key_head_dim=64,
                                                  value_head_dim=64, conv_kernel=4))
    # ---- issue 16: MoE whose routed experts' down-projection output (n_active x n_embd per token)
    # is wider than twice the active FFN width (Qwen3-30B-A3B: 8 x 2048 > 2 x 8 x 768) -------------
    s["moe-wide"] = replace(dense_arch("moe-wide", "qwen3moe", 4, 1024, 16, 4, 64, 0), intermediate_size=None,
                            moe=MoESpec(n_experts=32, n_experts_active=8, expert_intermediate_size=128))
    s["moe-a3b"] = replace(dense_arch("moe-a3b", "qwen3moe", 4, 2048, 32, 4, 64, 0), intermediate_size=None,
                           moe=MoESpec(n_experts=16, n_experts_active=8, expert_intermediate_size=768))
    return s


def _deepseek_v2(name: str, L: int, E: int, H: int, *, kv_lora: int, rope: int, nope: int, v: int,
                 q_lora: int | None, experts: int, active: int, eff: int, shared: int, ff: int) -> ModelArch:
    """A DeepSeek-V2-style layout: MLA attention, one leading dense layer, routed + shared
    experts (shared_intermediate_size left None: n_shared x expert width, as llama.cpp sizes it)."""
    return ModelArch(name=name, source="catalog", architecture="deepseek2", n_layers=L, hidden_size=E,
                     vocab_size=49152, n_heads=H, n_kv_heads=H, head_dim=nope + rope,
                     layer_kinds=(LayerKind.MLA,) * L, intermediate_size=ff, max_position=131072,
                     mla=MLASpec(kv_lora_rank=kv_lora, qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                                 v_head_dim=v, q_lora_rank=q_lora),
                     moe=MoESpec(n_experts=experts, n_experts_active=active, expert_intermediate_size=eff,
                                 n_shared_experts=shared, first_dense_layers=1))


SHAPES: dict[str, ModelArch] = _shapes()
