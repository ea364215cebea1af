#!/usr/bin/env python3
"""Device-side helpers for the vLLM GPU visit (run with the venv's Python that device.sh makes).

    python models.py fallbacks PAYLOAD             # fallback wheels to install (device version fails the spec)
    python models.py tokenizer GGUF OUT            # SmolLM2's tokenizer, read from the GGUF by transformers
    python models.py folder NAME OUT --tokenizer DIR   # config.json + tokenizer for --load-format dummy
    python models.py figures LOG                   # vLLM's own memory lines from a server log, as JSON
    python models.py gguf NAME OUT [QUANT]         # the same layout as a random-weight GGUF (llama.cpp's visit)
    python models.py variants OUT                  # config.json of each shape moe_shapes.sh tries

Folders (NAME): ``tiny`` (a 2-layer Llama on SmolLM2's tokenizer: the install smoke test),
``qwen36-27b`` (tests/fixtures/configs/qwen3.6-27b.json: the Qwen3.6-27B layout, 48 Gated-DeltaNet
+ 16 full-attention layers) and ``qwen36-35b-a3b`` (tests/fixtures/configs/qwen3.5-35b-a3b.json:
the Qwen3.6-35B-A3B MoE layout, 256 experts, 8 active). The random-weight models get SmolLM2's
tokenizer padded to the model's vocabulary (extra BPE entries no merge reaches), so every id a
random-weight model samples decodes, as the GGUF synthetics of benchmarks/gpu_bench.md do.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
FIXTURE = {"qwen36-27b": "qwen3.6-27b.json", "qwen36-35b-a3b": "qwen3.5-35b-a3b.json"}
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 49152,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu"}


def fallbacks(payload: Path) -> int:
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    rows = []
    for c in json.loads((payload / "checks.json").read_text()):
        try:
            have: str | None = version(c["name"])
        except PackageNotFoundError:
            have = None
        ok = have is not None and SpecifierSet(c["spec"]).contains(Version(have), prereleases=True)
        rows.append({**c, "device_version": have, "ok": ok})
        if not ok and c.get("fallback"):
            print(payload / "fallback" / c["fallback"])
    Path(payload / "checks_result.json").write_text(json.dumps(rows, indent=1) + "\n")
    for r in rows:
        print(f"check {r['name']} {r['device_version']} '{r['spec']}' -> {'ok' if r['ok'] else 'NOT MET'}",
              file=sys.stderr)
    return 0


def tokenizer(gguf: Path, out: Path) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    print(f"tokenizer: {len(tok)} tokens -> {out}")
    return 0


def _pad_tokenizer(src: Path, out: Path, vocab: int) -> None:
    for f in src.iterdir():
        if f.is_file() and f.name != "tokenizer.json" and not f.name.startswith("config"):
            shutil.copy2(f, out / f.name)
    data = json.loads((src / "tokenizer.json").read_text())
    table = data["model"]["vocab"]
    used = set(table.values()) | {t["id"] for t in data.get("added_tokens", [])}
    for i in range(vocab):
        if i not in used:
            table[f"<pad_{i}>"] = i
    (out / "tokenizer.json").write_text(json.dumps(data))


def folder(name: str, out: Path, tok: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    if name == "tiny":
        cfg = dict(TINY)
    else:
        cfg = json.loads((CONFIGS / FIXTURE[name]).read_text())
        cfg.pop("quantization_config", None)
        cfg.pop("quantization", None)
        cfg["dtype"] = cfg["torch_dtype"] = "bfloat16"
        # the fixtures name the text model as the outer one; transformers' and vLLM's Qwen3.5 read
        # text_config.model_type "qwen3_5_text" / "qwen3_5_moe_text" (as the published configs say)
        text = cfg.get("text_config")
        if isinstance(text, dict) and text.get("model_type") == cfg.get("model_type"):
            text["model_type"] = f"{cfg['model_type']}_text"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    text = cfg.get("text_config", cfg)
    _pad_tokenizer(tok, out, int(text["vocab_size"]))
    print(f"{name}: {out} (vocab {text['vocab_size']}, {text.get('num_hidden_layers')} layers)")
    return 0


# vLLM 0.26.0's own lines (vllm/v1/worker/gpu_worker.py, kv_cache_utils.py, gpu_model_runner.py)
FIGURES = {
    "model_loading_gib": r"Model loading took ([\d.]+) GiB",
    "requested_util": r"Requested memory: ([\d.]+) \(util\), ([\d.]+) GiB",
    "initial_free_gib": r"Initial free memory: ([\d.]+) GiB",
    "free_after_profiling_gib": (r"Free memory after profiling: ([\d.]+) GiB \(total\), "
                                 r"([\d.]+) GiB \(within requested\)"),
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "gpu_kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
    "num_gpu_blocks": r"num_gpu_blocks(?: is)?:? ?=? ?([\d,]+)",
    "cuda_graph_gib": r"Graph capturing finished in [\d.]+ secs?, took ([\d.\-]+) GiB",
    "torch_peak_gib": r"torch peak memory increase: ([\d.]+) GiB|peak[^\n]*?([\d.]+) GiB",
    "profiling_line": r"(Memory profiling takes[^\n]*)",
    "attention_backend": r"Using (\w+) attention backend|Using AttentionBackendEnum\.(\w+)",
}


def figures(log: Path) -> int:
    text = log.read_text(errors="replace")
    found: dict[str, list] = {}
    for key, pattern in FIGURES.items():
        hits = [[g for g in m.groups() if g is not None] for m in re.finditer(pattern, text)]
        if hits:
            found[key] = hits[-1] if len(hits) == 1 else hits
    lines = [ln for ln in text.splitlines() if re.search(r"GiB|KV cache|blocks|memory", ln)]
    found["memory_lines"] = lines[-40:]
    print(json.dumps(found, indent=1))
    return 0


# the catalog ids of the two layouts (the fixtures above describe the same tensors: tests/test_synth.py)
CATALOG = {"qwen36-27b": "qwen3.6-27b", "qwen36-35b-a3b": "qwen3.6-35b-a3b"}


def gguf(name: str, out: Path, quant: str = "Q4_K_M") -> int:
    """The layout ``name`` as a random-weight GGUF, written as ``engineroom try`` writes it (the catalog's
    architecture through engineroom.synth; SmolLM2's tokenizer from $ENGINEROOM_TOKENIZER_GGUF)."""
    import time

    sys.path.insert(0, str(ROOT / "src"))
    from engineroom.catalog import arch_from_catalog
    from engineroom.plan import resolve_model
    from engineroom.synth import write_synthetic_gguf

    subject = resolve_model(CATALOG[name])
    arch = subject.arch or arch_from_catalog(subject.model)
    t = time.time()
    write_synthetic_gguf(arch, quant, out)
    print(json.dumps({"model": name, "catalog_id": CATALOG[name], "architecture": arch.architecture, "quant": quant,
                      "path": str(out), "bytes": out.stat().st_size, "write_s": round(time.time() - t, 1)}))
    return 0


def variants(out: Path) -> int:
    """config.json files of the shapes moe_shapes.sh tries, each from a fixture with some fields changed."""
    out.mkdir(parents=True, exist_ok=True)
    moe30 = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    moe35 = json.loads((CONFIGS / "qwen3.5-35b-a3b.json").read_text())
    dense27 = json.loads((CONFIGS / "qwen3.6-27b.json").read_text())
    dense = {k: v for k, v in moe30.items() if k not in ("moe_intermediate_size", "num_experts", "num_experts_per_tok",
                                                          "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob",
                                                          "output_router_logits", "router_aux_loss_coef")}
    dense.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    hybrid = json.loads(json.dumps(dense27))
    t35, th = moe35["text_config"], hybrid["text_config"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
        th[key] = t35[key]
    th["intermediate_size"] = 6144
    th["layer_types"] = t35.get("layer_types") or th["layer_types"][: t35["num_hidden_layers"]]
    shapes = {"moe30": moe30, "moe30-24": {**moe30, "num_hidden_layers": 24, "max_window_layers": 24},
              "dense2048": dense, "hybrid2048": hybrid, "moe35": moe35}
    for name, config in shapes.items():
        (out / f"{name}.json").write_text(json.dumps(config, indent=1))
    print(json.dumps(sorted(shapes)))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "fallbacks":
        return fallbacks(Path(args[0]))
    if cmd == "tokenizer":
        return tokenizer(Path(args[0]), Path(args[1]))
    if cmd == "folder":
        return folder(args[0], Path(args[1]), Path(args[args.index("--tokenizer") + 1]))
    if cmd == "figures":
        return figures(Path(args[0]))
    if cmd == "gguf":
        return gguf(args[0], Path(args[1]), *args[2:3])
    if cmd == "variants":
        return variants(Path(args[0]))
    print(f"unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
