#!/usr/bin/env python3
"""fit() vs a real CUDA llama-server (H200), and llama-bench decode/prefill vs the plan's roofline band.

Qwen3.6-27B text layout (qwen35: [linear x3, full] x N, n_embd 5120, ff 17408, vocab 248,320,
GDN 16k/48v heads x 128, attention 24/4 x 256) at reduced depths (8, 16 layers) and full depth
(64), all matrices Q4_0, random weights (engineroom.synth). For each file x ctx x KV type the CUDA
llama-server is started (`-ngl 99 --fit off -lv 4 -c CTX -ctk T -ctv T -np 1`), the buffers it
logs are parsed and compared per component with
`fit(arch, FitRequest(engine="llama.cpp", ctx, kv_dtype), H200)`; the GPU memory
nvidia-smi reports while the server is up is compared with fit()'s per-GPU total (which adds a
300 MiB CUDA-runtime estimate). llama-bench (`-ngl 99 -fa 1 -p 512 -n 128 -d 0,8192`) gives
prefill/decode t/s, compared with plan.py's decode band (plan.decode_rates: bytes read per token
over a share of the catalog bandwidth plus fixed per-layer / per-token costs, the llama.cpp
engine's catalog `decode` model, which was fitted to these rows).

    # here, no GPU: print the predictions only
    .venv/bin/python benchmarks/cuda_fit_and_speed.py --dry-run
    # on the device (see benchmarks/cuda_fit_and_speed.md for the whole command)
    python3 benchmarks/cuda_fit_and_speed.py --phase gen,mem,bench --bin /tmp/llama.cpp/build/bin
    # here, from the JSON that came back: write the markdown tables
    .venv/bin/python benchmarks/cuda_fit_and_speed.py --report RESULTS.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from engineroom.fit import FitRequest, fit  # noqa: E402 - importable only after the sys.path insert
from engineroom.hardware import GpuSpec, Rig  # noqa: E402
from engineroom.synth import arch_with_tensors, write_synthetic_gguf  # noqa: E402
from engineroom.synthshapes import qwen36_27b  # noqa: E402

MiB = 1024 * 1024
# 1x H200 as the catalog gives it (hardware/nvidia.yaml: 141 GB, 4800 GB/s), built here so
# the device needs no pydantic (the catalog loader's dependency)
H200 = Rig(gpus=(GpuSpec("H200", 141 * 10**9, 4800.0, "9.0", hw_class="h200"),), label="1xH200")
GB = 1_000_000_000
QUANT = "Q4_0"
LAYERS = (8, 16, 64)
CTXS = (32768, 131072, 262144)
KVS = ("f16", "q8_0", "q4_0")
KV_BPE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
# the spec's measured oracle (shared/specs/memory-and-models.md): 64 layers, 262,144 ctx, q4_0 KV
ORACLE = {"weights": 13832.13, "weights_embedding": 682.03, "kv_cache": 4608.00, "recurrent_state": 149.62,
          "compute": 1380.29, "compute_host": 296.29}
COMPONENTS = ("weights", "weights_embedding", "kv_cache", "recurrent_state", "compute", "compute_host", "output")
LABELS = {"weights": "CUDA0 model", "weights_embedding": "CPU_Mapped (embd)", "kv_cache": "KV",
          "recurrent_state": "R+S", "compute": "CUDA0 compute", "compute_host": "CUDA_Host compute",
          "output": "output (host)"}

RX = {
    "model": re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB"),
    "rs": re.compile(r"llama_memory_recurrent:\s+(\S+) RS buffer size =\s+([\d.]+) MiB"),
    "rs_total": re.compile(r"llama_memory_recurrent: size =.*R \(\w+\):\s+([\d.]+) MiB, S \(\w+\):\s+([\d.]+) MiB"),
    "compute": re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB"),
    "output": re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB"),
}


def arch_for(layers: int):
    return arch_with_tensors(qwen36_27b(layers), QUANT)


def predict(layers: int, ctx: int, kv: str) -> dict[str, float]:
    f = fit(arch_for(layers), FitRequest(engine="llama.cpp", ctx=ctx, kv_dtype=kv), H200)
    p = {k: round(f.component(k) / MiB, 2) for k in COMPONENTS}
    p["cuda_runtime"] = round(f.component("cuda_runtime") / MiB, 2)
    p["gpu_total"] = round(f.per_gpu[0].used_bytes / MiB, 2)   # what fit() says GPU0 holds
    p["verdict"] = f.verdict
    return p


def err(p: float, m: float) -> float | None:
    if not m:
        return None if p else 0.0
    return (round(p, 2) - round(m, 2)) / round(m, 2) * 100


# ---------------------------------------------------------------------------------------
# device side
# ---------------------------------------------------------------------------------------

def gguf_path(workdir: Path, layers: int) -> Path:
    return workdir / f"qwen35-27b-layout-{layers}L-{QUANT}.gguf"


def _gen_one(args: tuple[int, str]) -> tuple[int, float, int]:
    layers, path = args
    t = time.time()
    write_synthetic_gguf(qwen36_27b(layers), QUANT, path)
    return layers, time.time() - t, os.path.getsize(path)


def gen(workdir: Path, layers: tuple[int, ...], state: dict) -> None:
    todo = [(L, str(gguf_path(workdir, L))) for L in layers if not gguf_path(workdir, L).exists()]
    with ProcessPoolExecutor(max(1, len(todo))) as ex:
        for L, dt, size in ex.map(_gen_one, todo):
            state.setdefault("gen", {})[str(L)] = {"seconds": round(dt, 1), "bytes": size}
            print(f"gen {L}L: {size / GB:.2f} GB in {dt:.1f} s ({size / GB / dt:.2f} GB/s)", flush=True)


def gpu_used_mib() -> float:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout.split()
    return float(out[0]) if out else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_log(text: str) -> dict[str, float]:
    m = dict.fromkeys(COMPONENTS, 0.0)
    for buft, mib in RX["model"].findall(text):
        m["weights" if buft.startswith("CUDA") and "Host" not in buft else "weights_embedding"] += float(mib)
    for _, mib in RX["kv"].findall(text):
        m["kv_cache"] += float(mib)
    rs = RX["rs_total"].findall(text)
    for r, s in rs:
        m["recurrent_state"] += float(r) + float(s)
    for buft, mib in RX["compute"].findall(text):
        m["compute" if buft.startswith("CUDA") and "Host" not in buft else "compute_host"] += float(mib)
    for _, mib in RX["output"].findall(text):
        m["output"] += float(mib)
    return m


def measure(bindir: Path, g: Path, ctx: int, kv: str, logdir: Path, timeout: float = 240) -> dict:
    port = free_port()
    cmd = [str(bindir / "llama-server"), "-m", str(g), "-ngl", "99", "--fit", "off", "-lv", "4", "-c", str(ctx),
           "-ctk", kv, "-ctv", kv, "-np", "1", "--port", str(port), "--host", "127.0.0.1"]
    base = gpu_used_mib()
    logf = logdir / f"{g.stem}-c{ctx}-{kv}.log"
    t0 = time.time()
    used = float("nan")
    with open(logf, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            while time.time() - t0 < timeout:
                time.sleep(0.25)
                text = logf.read_text(errors="replace")
                if "listening on" in text or proc.poll() is not None:
                    break
            up = time.time() - t0
            if proc.poll() is None:
                time.sleep(0.5)
                used = gpu_used_mib()
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    text = logf.read_text(errors="replace")
    meas = parse_log(text)
    meas["gpu_used_delta"] = round(used - base, 2)
    brk = [ln for ln in text.splitlines() if "memory_breakdown_print" in ln]
    return {"meas": meas, "cmd": " ".join(cmd), "startup_s": round(up, 1), "breakdown": brk,
            "ok": bool(meas["compute"])}


def bench(bindir: Path, g: Path, depths: str, reps: int, logdir: Path) -> list[dict]:
    cmd = [str(bindir / "llama-bench"), "-m", str(g), "-ngl", "99", "-fa", "1", "-p", "512", "-n", "128",
           "-d", depths, "-r", str(reps), "-o", "json"]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (logdir / f"{g.stem}-bench.log").write_text(r.stderr + "\n---\n" + r.stdout)
    rows = json.loads(r.stdout) if r.returncode == 0 else []
    out = []
    for x in rows:
        out.append({k: x.get(k) for k in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "samples_ts",
                                           "model_size", "model_n_params", "build_commit", "build_number",
                                           "gpu_info", "cpu_info")})
    print(f"bench {g.name}: rc {r.returncode} in {time.time() - t:.0f} s", flush=True)
    return [dict(o, cmd=" ".join(cmd)) for o in out]


def copy_bandwidth() -> float | None:
    """Device-to-device copy GB/s (bytes read + written), via PyTorch when it is there."""
    try:
        import torch
        a = torch.empty(4 * GB // 4, dtype=torch.float32, device="cuda")
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        bw = 2 * a.numel() * 4 * 20 / (s.elapsed_time(e) / 1e3) / GB
        del a, b
        torch.cuda.empty_cache()
        return round(bw, 1)
    except Exception as ex:  # noqa: BLE001 - any failure only drops the optional number
        print("copy bandwidth failed:", ex)
        return None


# ---------------------------------------------------------------------------------------
# speed model (plan.py's roofline band)
# ---------------------------------------------------------------------------------------

def speed_band(layers: int, depth: int, kv: str = "f16", bandwidth_gbs: float | None = None) -> dict:
    """plan.py's decode band for this file (plan.decode_rates with the llama.cpp engine's
    catalog decode model): bytes read per token (every tensor but token_embd, a lookup, as
    plan.weights_read_per_token does, + KV at depth) over a share of the bandwidth, plus the
    fixed per-layer and per-token costs. ``roofline_tps`` is bandwidth / bytes alone."""
    from engineroom.catalog import find_engine, load_catalog
    from engineroom.plan import DecodeShape, decode_rates
    cat = load_catalog()
    dm = find_engine(cat, "llama.cpp").decode
    bw = bandwidth_gbs or H200.gpus[0].bandwidth_gbs
    a = arch_for(layers)
    w = sum(b for n, b in a.tensor_bytes.items() if not n.startswith("token_embd"))
    n_full = sum(1 for k in a.layer_kinds if k.value == "full")
    kvb = int(n_full * a.n_kv_heads * a.head_dim * 2 * KV_BPE[kv] * depth)
    roof = bw * GB / (w + kvb)
    low, mid, high = decode_rates(dm, w + kvb, DecodeShape.of(a), bw)
    return {"bandwidth_gbs": bw, "weights_read": w, "kv_read": kvb, "roofline_tps": roof,
            "low": low, "mid": mid, "high": high}


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------

def _cell(p: float, m: float) -> str:
    if not p and not m:
        return "-"
    e = err(p, m)
    return f"{p:.2f} / {m:.2f} ({e:+.2f}%)" if e is not None else f"{p:.2f} / 0"


def report(res: dict) -> str:
    lines = []
    mem = [r for r in res.get("mem", []) if r.get("ok")]
    for r in mem:
        r["pred"] = predict(r["layers"], r["ctx"], r["kv"])
    cols = list(COMPONENTS)
    head = "| layers | ctx | KV | " + " | ".join(f"{LABELS[c]} pred / meas (err)" for c in cols) + \
        " | GPU buffers pred / meas (err) | GPU total fit() / nvidia-smi (err) | runtime overhead meas |"
    lines += [head, "|" + "---|" * (3 + len(cols) + 3)]
    for r in sorted(mem, key=lambda r: (r["layers"], r["ctx"], KVS.index(r["kv"]))):
        p, m = r["pred"], r["meas"]
        gpu_keys = ("weights", "kv_cache", "recurrent_state", "compute")
        pb, mb = sum(p[k] for k in gpu_keys), sum(m[k] for k in gpu_keys)
        ov = m["gpu_used_delta"] - mb
        lines.append(f"| {r['layers']} | {r['ctx']} | {r['kv']} | " + " | ".join(_cell(p[c], m[c]) for c in cols)
                     + f" | {_cell(pb, mb)} | {_cell(p['gpu_total'], m['gpu_used_delta'])} | {ov:.0f} MiB |")
    return "\n".join(lines)


def worst_errors(res: dict) -> list[tuple[float, str]]:
    out = []
    for r in res.get("mem", []):
        if not r.get("ok"):
            continue
        p = predict(r["layers"], r["ctx"], r["kv"])
        for c in COMPONENTS:
            e = err(p[c], r["meas"][c])
            if e is not None:
                out.append((abs(e), (f"{c} {r['layers']}L ctx {r['ctx']} {r['kv']}: pred {p[c]:.2f} meas "
                            f"{r['meas'][c]:.2f} MiB ({e:+.2f}%, {p[c] - r['meas'][c]:+.2f} MiB)")))
    return sorted(out, reverse=True)


def speed_table(res: dict) -> str:
    bw_meas = res.get("copy_bw_gbs")
    lines = [("| layers | file GB | test | depth | measured t/s | plan band t/s (middle) | in band? "
              "| measured / middle | tg / roofline @4800 | roofline @ measured copy bw |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for L, rows in sorted(res.get("bench", {}).items(), key=lambda kv: int(kv[0])):
        for x in rows:
            test = f"pp{x['n_prompt']}" if x["n_prompt"] else f"tg{x['n_gen']}"
            size = (x.get("model_size") or 0) / GB
            if x["n_gen"]:
                b = speed_band(int(L), x["n_depth"])
                inb = ("yes" if b["low"] <= x["avg_ts"] <= b["high"]
                       else ("below" if x["avg_ts"] < b["low"] else "above"))
                rm = (f"{speed_band(int(L), x['n_depth'], bandwidth_gbs=bw_meas)['roofline_tps']:.0f}"
                      if bw_meas else "-")
                lines.append(f"| {L} | {size:.2f} | {test} | {x['n_depth']} "
                             f"| {x['avg_ts']:.2f} ± {x['stddev_ts']:.2f} | "
                             f"{b['low']:.0f}-{b['high']:.0f} ({b['mid']:.0f}) | {inb} | "
                             f"{(x['avg_ts'] / b['mid'] - 1) * 100:+.1f}% | "
                             f"{x['avg_ts'] / b['roofline_tps'] * 100:.0f}% | {rm} |")
            else:
                lines.append(f"| {L} | {size:.2f} | {test} | {x['n_depth']} | {x['avg_ts']:.0f} ± {x['stddev_ts']:.0f} "
                             "| - | - | - | - | - |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print fit()'s predictions and the plan band, run nothing")
    ap.add_argument("--phase", default="gen,mem,bench")
    ap.add_argument("--bin", default="/tmp/llama.cpp/build/bin")
    ap.add_argument("--workdir", default="/tmp/cfs")
    ap.add_argument("--layers", default=",".join(map(str, LAYERS)))
    ap.add_argument("--ctxs", default=",".join(map(str, CTXS)))
    ap.add_argument("--bench-layers", default="8,16,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds: start no new run after it")
    ap.add_argument("--state", default=None, help="results JSON kept across calls (default WORKDIR/results.json)")
    ap.add_argument("--out-json", default=None, help="copy the results JSON here too")
    ap.add_argument("--report", default=None, metavar="JSON", help="print markdown tables for stored results")
    a = ap.parse_args()
    layers = tuple(int(x) for x in a.layers.split(","))
    ctxs = tuple(int(x) for x in a.ctxs.split(","))

    if a.report:
        res = json.loads(Path(a.report).read_text())
        print(report(res), "\n")
        print(speed_table(res), "\n")
        for _e, s in worst_errors(res)[:15]:
            print("-", s)
        return
    if a.dry_run:
        for L in layers:
            for ctx in ctxs:
                for kv in KVS:
                    p = predict(L, ctx, kv)
                    print(f"{L:2d}L ctx {ctx:6d} {kv:5s} " + " ".join(f"{k} {p[k]:.2f}" for k in COMPONENTS)
                          + f" gpu_total {p['gpu_total']:.2f} MiB")
        p = predict(64, 262144, "q4_0")
        print("oracle 64L 262144 q4_0: " + ", ".join(f"{k} pred {p[k]:.2f} / meas {v:.2f} ({err(p[k], v):+.2f}%)"
                                                    for k, v in ORACLE.items()))
        for L in layers:
            for d in (0, 8192):
                b = speed_band(L, d)
                print(f"{L:2d}L depth {d:5d}: weights read {b['weights_read'] / GB:.2f} GB "
                      f"+ KV {b['kv_read'] / GB:.3f} GB"
                      f" -> roofline {b['roofline_tps']:.0f} t/s, band {b['low']:.0f}-{b['high']:.0f} t/s")
        return

    wd = Path(a.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    logdir = wd / "logs"
    logdir.mkdir(exist_ok=True)
    state_f = Path(a.state) if a.state else wd / "results.json"
    res = json.loads(state_f.read_text()) if state_f.exists() else {"mem": [], "bench": {}}
    bindir = Path(a.bin)
    phases = a.phase.split(",")

    def save() -> None:
        state_f.write_text(json.dumps(res, indent=1))
        if a.out_json:
            Path(a.out_json).write_text(json.dumps(res, indent=1))

    def late(need: float) -> bool:
        return bool(a.deadline) and time.time() + need > a.deadline

    if "gen" in phases:
        gen(wd, layers, res)
        save()
    if "mem" in phases or "bench" in phases:
        v = subprocess.run([str(bindir / "llama-server"), "--version"], capture_output=True, text=True, check=False)
        res["build"] = (v.stdout + v.stderr).strip().replace("\n", "; ")
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        res["nvidia_smi"] = smi.stdout.strip()
        if "copy_bw_gbs" not in res:
            res["copy_bw_gbs"] = copy_bandwidth()
        save()
    if "mem" in phases:
        done = {(r["layers"], r["ctx"], r["kv"]) for r in res["mem"] if r.get("ok")}
        # the spec oracle first, then the reduced-depth grid, then the full-depth grid
        order = [(64, 262144, "q4_0")] + [(L, c, kv) for L in layers for c in ctxs for kv in KVS]
        seen = set()
        for L, ctx, kv in order:
            if (L, ctx, kv) in seen or L not in layers or ctx not in ctxs or (L, ctx, kv) in done:
                continue
            seen.add((L, ctx, kv))
            if late(25 if L == 64 else 12):
                print(f"deadline: skipping mem {L}L {ctx} {kv}", flush=True)
                continue
            r = measure(bindir, gguf_path(wd, L), ctx, kv, logdir)
            r.update(layers=L, ctx=ctx, kv=kv)
            res["mem"] = [x for x in res["mem"] if (x["layers"], x["ctx"], x["kv"]) != (L, ctx, kv)] + [r]
            save()
            p = predict(L, ctx, kv)
            m = r["meas"]
            print(f"mem {L:2d}L ctx {ctx:6d} {kv:5s} up {r['startup_s']:5.1f}s ok {r['ok']} | "
                  + " ".join(f"{k[:8]} {p[k]:.1f}/{m[k]:.1f}" for k in COMPONENTS)
                  + f" | smi {m['gpu_used_delta']:.0f} vs fit {p['gpu_total']:.0f}", flush=True)
    if "bench" in phases:
        for L in (int(x) for x in a.bench_layers.split(",")):
            if str(L) in res["bench"] and res["bench"][str(L)]:
                continue
            if late(40 if L < 64 else 90):
                print(f"deadline: skipping bench {L}L", flush=True)
                continue
            res["bench"][str(L)] = bench(bindir, gguf_path(wd, L), "0,8192", a.reps, logdir)
            save()
            for x in res["bench"][str(L)]:
                print(f"  {L}L p{x['n_prompt']} n{x['n_gen']} d{x['n_depth']}: {x['avg_ts']:.2f} t/s", flush=True)
    save()


if __name__ == "__main__":
    main()
