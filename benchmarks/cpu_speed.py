#!/usr/bin/env python3
"""CPU decode speed: llama-bench tg on this machine vs the CPU decode model plan uses.

For each GGUF (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M, random-weight GGUFs of larger
dense shapes written with engineroom.synth) and each thread count, run
``llama-bench -p 0 -n N -t T -r R -o json`` (single-stream decode from an empty context),
with ``os.getloadavg()`` recorded before every call and the machine's copy bandwidth
(engineroom.hardware.probe_copy_bandwidth) at each thread count measured around the runs.
The raw rows go to benchmarks/data/cpu_speed.json.

``--fit`` fits the CPU decode model (plan.decode_rates: bytes read per token over a share
of the copy bandwidth at T threads, plus per-token and per-layer costs) on the FIT files
only, by least squares on the relative error, and prints the numbers for the catalog.
``--report`` prints measured vs predicted for every row with the CATALOG's current model
(what plan says), marking the held-out files, which were never used for fitting.

    .venv/bin/python benchmarks/cpu_speed.py --measure      # writes benchmarks/data/cpu_speed.json
    .venv/bin/python benchmarks/cpu_speed.py --fit          # fitted numbers (fit files only)
    .venv/bin/python benchmarks/cpu_speed.py --report       # the tables of benchmarks/cpu_speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GB = 1_000_000_000
DATA = ROOT / "benchmarks" / "data" / "cpu_speed.json"
WORK = Path(os.environ.get("CPU_SPEED_WORKDIR", "/tmp/cpuspeed"))

# random-weight dense shapes (qwen3 layout, SmolLM2 tokenizer padded to the vocab):
# (name, layers, hidden, heads, kv heads, head_dim, ffn, vocab, quant)
# "-rs": every block's f16 scale is drawn log-normal (SCALE_SIGMA, as in real GGUFs) after
# engineroom.synth wrote the file. synth writes ONE scale value into every block, and the
# non-repacked CPU kernels (vec_dot_q8_0/q5_0/q6_K...) turn each block's f16 scale into f32
# through ggml's 256 KiB lookup table (ggml_table_f32_f16): with a single value that lookup
# always hits one cache line, so constant-scale files decode up to ~30% faster than real
# weights of the same types and shapes (cpu_speed.md, "Why Gemma 3 was slow"). The rows of
# the constant-scale files (the names without "-rs") are kept in the JSON as "superseded".
SYNTH = [
    ("syn-s-q4_0-rs", 16, 1024, 16, 4, 64, 2816, 49152, "Q4_0"),
    ("syn-m-q4_0-rs", 24, 1536, 16, 4, 96, 4096, 49152, "Q4_0"),
    ("syn-m-q8_0-rs", 24, 1536, 16, 4, 96, 4096, 49152, "Q8_0"),
    ("syn-l-q4_0-rs", 28, 2048, 16, 4, 128, 5632, 49152, "Q4_0"),
    ("syn-deep-q4_0-rs", 48, 768, 12, 4, 64, 2048, 49152, "Q4_0"),
    ("syn-l-q4_k-rs", 28, 2048, 16, 4, 128, 5632, 49152, "Q4_K_M"),
    ("syn-m-q5_0-rs", 24, 1536, 16, 4, 96, 4096, 49152, "Q5_0"),
    ("syn-m-q6_k-rs", 24, 1536, 16, 4, 96, 4096, 49152, "Q6_K"),
    ("syn-s-v262k-q4_0-rs", 16, 1024, 16, 4, 64, 2816, 262144, "Q4_0"),
]
# gemma3-architecture synthetics (tied 262K head, 5:1 sliding/full layers, head_dim 256), with
# the per-tensor types llama-quantize's Q4_K_M gives a width that is not a multiple of 256:
# token_embd Q8_0, attn_q/k + ffn_gate/up Q5_0, attn_v Q8_0, attn_output Q4_K, ffn_down Q6_K
# (name, layers, hidden, heads, kv heads, head_dim, ffn, vocab)
GEMMA3_SYNTH = [("syn-g3-1152-mix-rs", 14, 1152, 4, 1, 256, 6912, 262144)]
GEMMA3_TYPES = {"token_embd": "Q8_0", "attn_q": "Q5_0", "attn_k": "Q5_0", "ffn_gate": "Q5_0", "ffn_up": "Q5_0",
                "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K"}
SCALE_SIGMA = 0.37       # sd of ln(block scale) in the Gemma 3 270M and SmolLM2-135M GGUFs: 0.28-0.41
SCALE_MEDIAN = 0.002
# decode after a filled context (llama-bench -d): checks the KV term (f16 KV, as plan's default)
DEPTH_ROWS = (("smollm2-135m-q4_1", 2048), ("syn-s-q4_0-rs", 2048), ("syn-deep-q4_0-rs", 1024))
# files the model is fitted on; everything else is held out (never seen by --fit)
FIT = ("smollm2-135m-q4_1", "syn-s-q4_0-rs", "syn-l-q4_0-rs", "syn-m-q8_0-rs", "syn-deep-q4_0-rs", "syn-l-q4_k-rs",
       "syn-m-q5_0-rs", "syn-m-q6_k-rs", "syn-s-q4_0-rs@d2048", "syn-deep-q4_0-rs@d1024")
# gemma-3-270m-q4_k_m was never fitted on, but it was used to FIND the scale effect (the
# experiments in cpu_speed.md); syn-g3-1152-mix-rs is the held-out file that was not
HELD_OUT = ("gemma-3-270m-q4_k_m", "syn-m-q4_0-rs", "smollm2-135m-q4_1@d2048", "syn-s-v262k-q4_0-rs",
            "syn-g3-1152-mix-rs")


def files() -> dict[str, Path]:
    from engineroom.models import resolve

    out = {"smollm2-135m-q4_1": resolve("smollm2-135m").path,
           "gemma-3-270m-q4_k_m": WORK / "gemma-3-270m-q4_k_m.gguf"}
    for name, *_ in SYNTH + GEMMA3_SYNTH:
        out[name] = WORK / f"{name}.gguf"
    return out


def spread_scales(path: Path, seed: int = 1) -> None:
    """Rewrite every quantized block's f16 scale(s) in place: log-normal around SCALE_MEDIAN
    with SCALE_SIGMA, as real quantized weights have (engineroom.synth writes one value)."""
    import gguf
    import numpy as np

    from engineroom.synth import _F16_FIELDS

    rng = np.random.default_rng(seed)
    r = gguf.GGUFReader(str(path), "r+")
    for t in r.tensors:
        fields = _F16_FIELDS.get(t.tensor_type.name)
        if not fields:
            continue
        blocks = np.asarray(t.data).reshape(-1, gguf.GGML_QUANT_SIZES[t.tensor_type][1])
        for off, cnt in fields:
            d = np.exp(rng.normal(np.log(SCALE_MEDIAN), SCALE_SIGMA, (blocks.shape[0], cnt))).astype(np.float16)
            blocks[:, off:off + 2 * cnt] = d.view(np.uint8)
    r.data.flush()


def write_synth() -> None:
    import engineroom.synth as synth
    from engineroom.arch import LayerKind, ModelArch
    from engineroom.synth import write_synthetic_gguf

    jobs = [(n, "qwen3", L, E, H, KV, hd, ff, V, q) for n, L, E, H, KV, hd, ff, V, q in SYNTH]
    jobs += [(n, "gemma3", L, E, H, KV, hd, ff, V, "Q4_0") for n, L, E, H, KV, hd, ff, V in GEMMA3_SYNTH]
    for name, archname, L, E, H, KV, hd, ff, V, q in jobs:
        path = WORK / f"{name}.gguf"
        if path.exists():
            continue
        g3 = archname == "gemma3"
        kinds = tuple(LayerKind.FULL if not g3 or (i + 1) % 6 == 0 else LayerKind.SLIDING for i in range(L))
        arch = ModelArch(name=name, source="catalog", architecture=archname, n_layers=L, hidden_size=E, vocab_size=V,
                         n_heads=H, n_kv_heads=KV, head_dim=hd, layer_kinds=kinds, intermediate_size=ff,
                         max_position=32768, tie_embeddings=g3, sliding_window=512 if g3 else None)
        t = time.time()
        layout = synth.tensor_layout
        if g3:      # the per-tensor types of a Q4_K_M quant at this width (GEMMA3_TYPES)
            synth.tensor_layout = lambda a, qt: [
                synth.TensorSpec(s.name, s.shape, GEMMA3_TYPES.get(s.name.split(".")[-2], s.type)
                                 if s.type != "F32" else s.type) for s in layout(a, qt)]  # noqa: B023 - restored below
        try:
            write_synthetic_gguf(arch, q, path)
        finally:
            synth.tensor_layout = layout
        spread_scales(path)
        print(f"wrote {path} ({path.stat().st_size / GB:.3f} GB) in {time.time() - t:.1f} s", flush=True)


def bench_bin() -> tuple[Path, dict]:
    from engineroom.engines.llamacpp import find_binary, soname_env

    b = find_binary()
    bench = llama_bench_beside(b.path)
    return bench, {**os.environ, **soname_env(b.path.parent)}


def llama_bench_beside(server: Path) -> Path:
    """llama-bench beside ``server``: `engines install llama.cpp` builds llama-server only, so where it is
    missing it is built in that install's kept build folder (the one target and its link, ~1 CPU-minute)."""
    bench = server.parent / "llama-bench"
    build_dir = server.parent.parent
    if not bench.is_file():
        if not (build_dir / "CMakeCache.txt").is_file():
            sys.exit(f"no llama-bench beside {server}, and no CMake build folder at {build_dir} to build it in")
        print(f"building llama-bench in {build_dir}", flush=True)
        from engineroom.engines.build import find_cmake

        proc = subprocess.run([find_cmake(), "--build", str(build_dir), "--target", "llama-bench", "-j",
                               str(os.cpu_count() or 1)], capture_output=True, text=True)
        if proc.returncode != 0 or not bench.is_file():
            sys.exit(f"building llama-bench in {build_dir} failed: {proc.stderr.strip()[-600:]}")
    return bench


def cpu_idle(seconds: float = 2.0) -> float:
    """Share of all CPUs idle over the next ``seconds`` (/proc/stat): what other users leave."""
    def snap() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return v[3] + v[4], sum(v[:8])
    i0, t0 = snap()
    time.sleep(seconds)
    i1, t1 = snap()
    return (i1 - i0) / max(1, t1 - t0)


QUIET: dict = {}


def wait_quiet(max_load: float, wait_s: float, min_idle: float = 0.0) -> tuple[float, float, float]:
    """Wait (up to ``wait_s``) until the 1-minute load average is below ``max_load`` or the
    CPUs were at least ``min_idle`` idle over 2 s; returns the load average then (the idle
    share is kept in QUIET["idle"])."""
    t0 = time.time()
    while True:
        load = os.getloadavg()
        idle = cpu_idle()
        QUIET["idle"] = round(idle, 3)
        if load[0] <= max_load or (min_idle and idle >= min_idle) or time.time() - t0 >= wait_s:
            return load
        time.sleep(3)


def run_one(bench: Path, env: dict, gguf: Path, threads: int, n_gen: int, reps: int, depth: int = 0) -> dict:
    cmd = [str(bench), "-m", str(gguf), "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", str(reps),
           "-o", "json"] + (["-d", str(depth)] if depth else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        return {"cmd": " ".join(cmd), "error": (r.stderr or r.stdout)[-600:]}
    row = json.loads(r.stdout)[0]
    keep = ("n_gen", "n_threads", "avg_ts", "stddev_ts", "samples_ts", "model_size", "model_n_params",
            "model_type", "cpu_info", "build_commit", "build_number", "backends", "n_depth")
    return {"cmd": " ".join(cmd), **{k: row.get(k) for k in keep}}


def measure(a) -> None:
    from engineroom.hardware import cpu_model_name, probe_copy_bandwidth

    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "measure.pid").write_text(str(os.getpid()))
    write_synth()
    bench, env = bench_bin()
    res = json.loads(DATA.read_text()) if DATA.exists() and not a.fresh else {"rows": [], "probes": []}
    res["machine"] = {"cpu_model": cpu_model_name(), "logical_cpus": os.cpu_count(),
                      "date": time.strftime("%Y-%m-%d", time.gmtime())}
    threads = [int(t) for t in a.threads.split(",")]
    names = a.files.split(",") if a.files else list(files())
    fs = files()
    for rnd in range(a.rounds):
        if a.deadline and time.time() > a.deadline:
            break
        load = wait_quiet(a.max_load, a.wait_s, a.min_idle)
        res["probes"].append({"loadavg": load, "idle_before": QUIET.get("idle"),
                              "time": time.strftime("%H:%M:%S", time.gmtime()),
                              "gbs": {str(t): probe_copy_bandwidth(t) for t in threads}})
        print("probe", res["probes"][-1], flush=True)
        jobs = [(n, 0) for n in names] + [(n, d) for n, d in DEPTH_ROWS if n in names and a.depth_rows]
        for name, depth in jobs:
            for t in threads:
                if a.deadline and time.time() > a.deadline:
                    break
                load = wait_quiet(a.max_load, a.wait_s, a.min_idle)
                n_gen = a.n_gen if fs[name].stat().st_size < 0.6 * GB else max(16, a.n_gen // 2)
                row = run_one(bench, env, fs[name], t, n_gen, a.reps, depth)
                b, layers = bytes_and_layers(fs[name])
                b += kv_read(fs[name], depth)
                row.update(file=name + (f"@d{depth}" if depth else ""), depth=depth, idle_before=QUIET.get("idle"),
                           bytes=fs[name].stat().st_size, threads=t, loadavg_before=list(load),
                           round=rnd, time=time.strftime("%H:%M:%S", time.gmtime()), bytes_read=b, layers=layers)
                res["rows"].append(row)
                print(f"{name:22s} t={t} load {load[0]:.2f}: "
                      + (f"{row['avg_ts']:.2f} ± {row['stddev_ts']:.2f} t/s {row['samples_ts']}" if "avg_ts" in row
                         else row["error"]), flush=True)
                DATA.parent.mkdir(parents=True, exist_ok=True)
                DATA.write_text(json.dumps(res, indent=1))
    load = os.getloadavg()
    res["probes"].append({"loadavg": load, "time": time.strftime("%H:%M:%S", time.gmtime()),
                          "gbs": {str(t): probe_copy_bandwidth(t) for t in threads}})
    DATA.write_text(json.dumps(res, indent=1))


# ---------------------------------------------------------------------------------------
# model: the planner's own bytes per token and decode formula
# ---------------------------------------------------------------------------------------

_BYTES: dict[str, tuple[int, int]] = {}


def bytes_and_layers(path: Path) -> tuple[int, int]:
    """Bytes a decode step reads (plan.weights_read_per_token over the GGUF, exactly as
    `plan FILE.gguf` sizes it) and the layer count."""
    from engineroom.plan import resolve_model, weights_read_per_token

    if str(path) not in _BYTES:
        subject = resolve_model(str(path))
        _BYTES[str(path)] = (weights_read_per_token(subject.model, subject.arch, subject.model.quants[0]),
                             subject.arch.n_layers)
    return _BYTES[str(path)]


def weight_mixes() -> dict[str, list]:
    """Per file: the share of streamed weight bytes per ggml type (plan.weight_type_mix)."""
    from engineroom.plan import resolve_model, weight_type_mix

    out = {}
    for name, path in files().items():
        if path.exists():
            r = resolve_model(str(path))
            out[name] = [list(x) for x in weight_type_mix(r.arch, r.model.quants[0].id)]
    return out


def kv_read(path: Path, depth: int) -> int:
    """KV bytes a decode step reads at ``depth`` (plan.kv_bytes_per_token, f16 KV: llama-bench's default)."""
    if not depth:
        return 0
    from engineroom.catalog import find_engine, load_catalog
    from engineroom.plan import kv_bytes_per_token, resolve_model

    kv = find_engine(load_catalog(), "llama.cpp").kv("f16")
    return kv_bytes_per_token(resolve_model(str(path)).arch, kv, depth)


def summary(res: dict) -> list[dict]:
    """One entry per (file, threads): median and spread of the per-round best sample, the
    load average before each, and the copy bandwidth the probe measured at those threads."""
    probes = res["probes"]
    bw = {t: max(p["gbs"][t] for p in probes if t in p["gbs"]) for t in {k for p in probes for k in p["gbs"]}}
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in res["rows"]:
        if "avg_ts" in r:
            groups.setdefault((r["file"], r["threads"]), []).append(r)
    out = []
    for (name, t), rows in sorted(groups.items()):
        samples = [s for r in rows for s in r["samples_ts"]]
        best_per_call = [max(r["samples_ts"]) for r in rows]
        b, layers = rows[0]["bytes_read"], rows[0]["layers"]     # plan.weights_read_per_token at measure time
        mix = [tuple(x) for x in res["mix"][name.split("@")[0]]]
        if "@d" in name:     # the KV read at depth streams at its own rate ("kv_f16"), as plan.speed does
            base = next(r for r in res["rows"] if r["file"] == name.split("@")[0] and "bytes_read" in r)["bytes_read"]
            kv = b - base
            mix = [(t, share * base / b) for t, share in mix] + [("kv_f16", kv / b)]
        out.append({"file": name, "threads": t, "bytes_read": b, "layers": layers, "size": rows[0]["bytes"],
                    "best": max(samples), "median": statistics.median(samples), "min": min(samples),
                    "n": len(samples), "calls": len(rows), "best_per_call": best_per_call,
                    "loads": [round(r["loadavg_before"][0], 2) for r in rows], "bw_gbs": bw[str(t)],
                    "set": "fit" if name in FIT else "held-out" if name in HELD_OUT else "superseded",
                    "depth": rows[0].get("depth", 0), "mix": mix})
    return out


# weight types whose ggml-cpu kernels on x86 run on repacked (interleaved) weights
# (ggml-cpu/repack.cpp: Q4_0, Q4_K, IQ4_NL, MXFP4); every other type (Q8_0, Q5_0, Q6_K, Q4_1,
# the KV read ...) goes through its plain vec_dot kernel. The two families read memory
# differently, so each gets its own memory-roof efficiency
REPACKED = ("q4_0", "q4_k", "iq4_nl", "mxfp4")


def eff_for(p: dict, t: str) -> float:
    return p["eff_repacked"] if t in REPACKED else p["eff"]


def stream_gbs(p: dict, s: dict) -> float:
    """The mix's stream rate: each type's bytes at min(threads x its per-thread rate, its
    family's efficiency x copy bandwidth); the times add (harmonic mean), as plan.decode_rates."""
    tot = sum(share for _, share in s["mix"])
    return tot / sum(share / min(s["threads"] * p["rates"].get(t, p["default"]), eff_for(p, t) * s["bw_gbs"])
                     for t, share in s["mix"])


def bound_by(p: dict, s: dict) -> set[str]:
    return {"compute" if s["threads"] * p["rates"].get(t, p["default"]) < eff_for(p, t) * s["bw_gbs"] else "memory"
            for t, share in s["mix"] if share >= 0.05}


def predict_ms(p: dict, s: dict) -> float:
    """plan.decode_rates' formula at one parameter set: bytes / stream (stream_gbs) +
    per_token + layers x per_layer."""
    return s["bytes_read"] / (stream_gbs(p, s) * GB) * 1000 + p["per_token"] + s["layers"] * p["per_layer"]


def nelder_mead(f, x0, steps, iters=4000):
    import numpy as np

    pts = [np.array(x0, float)] + [np.array(x0, float) + np.eye(len(x0))[k] * steps[k] for k in range(len(x0))]
    vals = [f(x) for x in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[k] for k in order], [vals[k] for k in order]
        c = sum(pts[:-1]) / (len(pts) - 1)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (x - pts[0]) for x in pts[1:]]
                vals = [vals[0]] + [f(x) for x in pts[1:]]
    k = int(np.argmin(vals))
    return pts[k], vals[k]


RATE_CAP = 60.0     # GB/s per thread


def fit_model(rows: list[dict], stat: str) -> dict:
    """Least squares on the relative error of the time per token over ``rows`` (Nelder-Mead
    on log-parameters): a per-thread rate for every weight type holding >= 5% of some fit
    file's bytes, two memory-roof efficiencies (repacked types, REPACKED, and the rest),
    per_layer_ms and per_token_ms (both >= 0)."""
    import math

    types = sorted({t for s in rows for t, share in s["mix"] if share >= 0.05})

    def unpack(x):
        # a rate above RATE_CAP is "never the binding roof" here (memory binds first): capped
        rates = {t: min(RATE_CAP, math.exp(v)) for t, v in zip(types, x, strict=False)}
        return {"rates": rates, "default": math.exp(sum(math.log(v) for v in rates.values()) / len(rates)),
                "eff": math.exp(x[len(types)]), "per_layer": math.exp(x[len(types) + 1]),
                "per_token": math.exp(x[len(types) + 2]), "eff_repacked": math.exp(x[len(types) + 3])}

    def loss(x):
        p = unpack(x)
        return sum((predict_ms(p, s) * s[stat] / 1000 - 1) ** 2 for s in rows)

    x0 = [math.log(15.0)] * len(types) + [math.log(1.0), math.log(0.02), math.log(0.3), math.log(1.0)]
    best = None
    for _start in range(3):        # restarts from the last optimum
        x, v = nelder_mead(loss, x0 if best is None else best[0], [0.3] * len(x0))
        if best is None or v < best[1]:
            best = (x, v)
    p = unpack(best[0])
    p["types"] = types
    p["worst"] = max(abs(1000 / predict_ms(p, s) / s[stat] - 1) for s in rows)
    p["rms"] = math.sqrt(best[1] / len(rows))
    return p


def catalog_block(p: dict, k: float, machine: dict) -> str:
    """The catalog's decode block: each fitted value with the band +-k; types not measured
    (the default) get the whole span of the measured weight types."""
    r = lambda v: f"{v:.3g}"  # noqa: E731
    wr = [v for t, v in p["rates"].items() if not t.startswith("kv_")]
    by = "\n".join(f"        - {{types: [{t}], low: {r(v * (1 - k))}, high: {r(v * (1 + k))}}}"
                   for t, v in p["rates"].items())
    return (f"    decode:\n      bandwidth: cpu_copy\n"
            f"      per_thread_gbs: {{low: {r(min(wr) * (1 - k))}, high: {r(min(RATE_CAP, max(wr)) * (1 + k))}}}\n"
            f"      per_thread_by_type:\n{by}\n"
            f"      bandwidth_efficiency: {{low: {r(p['eff'] * (1 - k))}, high: {r(p['eff'] * (1 + k))}}}\n"
            f"      bandwidth_efficiency_by_type:\n"
            f"        - {{types: [{', '.join(REPACKED)}], low: {r(p['eff_repacked'] * (1 - k))}, "
            f"high: {r(p['eff_repacked'] * (1 + k))}}}\n"
            f"      per_layer_ms: {{low: {r(p['per_layer'] * (1 - k))}, high: {r(p['per_layer'] * (1 + k))}}}\n"
            f"      per_token_ms: {r(p['per_token'])}\n"
            f"      fitted_on: \"{machine['cpu_model']}, {machine['logical_cpus']} cores (KVM VM), {machine['date']}\"")


def catalog_model():
    from engineroom.catalog import find_engine, load_catalog

    return find_engine(load_catalog().for_vendor("cpu"), "llama.cpp").decode


def report(res: dict) -> str:
    from engineroom.plan import DecodeShape, decode_rates

    dm = catalog_model()
    rows = summary(res)
    m = res["machine"]
    lines = [f"Machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, measured {m['date']}.", "",
             "Copy-bandwidth probe (engineroom.hardware.probe_copy_bandwidth, GB/s read + written):", "",
             "| time (UTC) | load avg (1 min) | "
             + " | ".join(f"{t} thread(s)" for t in sorted(res['probes'][0]['gbs'])) + " |",
             "|---|---|" + "---|" * len(res["probes"][0]["gbs"])]
    for p in res["probes"]:
        lines.append(f"| {p['time']} | {p['loadavg'][0]:.2f} | "
                     + " | ".join(f"{p['gbs'][t]:.1f}" for t in sorted(p['gbs'])) + " |")
    lines += ["", f"Decode model (catalog, llama.cpp cpu build): {dm.source}", "",
              "| file | set | size GB | bytes read/token | layers | threads | measured t/s: best / median (min-max, n) "
              "| load avg before each call | plan band t/s (middle) | best in band? | best vs middle |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        low, mid, high = decode_rates(dm, s["bytes_read"], DecodeShape(s["layers"]), s["bw_gbs"], s["threads"],
                                      tuple(s["mix"]))
        inb = "yes" if low <= s["best"] <= high else ("below" if s["best"] < low else "above")
        lines.append(f"| {s['file']} | {s['set']} | {s['size'] / GB:.3f} | {s['bytes_read'] / 1e6:.0f} MB "
                     f"| {s['layers']} | {s['threads']} | "
                     f"{s['best']:.1f} / {s['median']:.1f} ({s['min']:.1f}-{s['best']:.1f}, {s['n']}) | "
                     f"{', '.join(f'{x:.2f}' for x in s['loads'])} | {low:.1f}-{high:.1f} ({mid:.1f}) | {inb} | "
                     f"{(s['best'] / mid - 1) * 100:+.1f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--files", default="", help="comma list of file names (default all)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="passes over all files (interleaved in time)")
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--max-load", type=float, default=1.0, help="wait (up to --wait-s) for a lower load average")
    ap.add_argument("--wait-s", type=float, default=120)
    ap.add_argument("--min-idle", type=float, default=0.0, help="or start once the CPUs were this idle over 2 s")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds: start nothing after it")
    ap.add_argument("--stat", default="best", choices=("best", "median"))
    ap.add_argument("--fresh", action="store_true", help="drop the stored rows first")
    ap.add_argument("--depth-rows", type=int, default=1, help="also run DEPTH_ROWS (decode after a filled context)")
    a = ap.parse_args()
    if a.measure:
        measure(a)
    res = json.loads(DATA.read_text())
    sets = {"fit": list(FIT), "held_out": list(HELD_OUT)}
    if res.get("sets") != sets or "mix" not in res:
        res["sets"] = sets
        res["mix"] = {**res.get("mix", {}), **weight_mixes()}   # superseded files keep theirs
        DATA.write_text(json.dumps(res, indent=1))
    if a.fit:
        rows = [s for s in summary(res) if s["set"] == "fit"]
        p = fit_model(rows, a.stat)
        bound = set().union(*(bound_by(p, s) for s in rows))
        print(f"fit on {len(rows)} rows ({', '.join(sorted({s['file'] for s in rows}))}), stat {a.stat}: "
              + ", ".join(f"{t} {v:.2f}" for t, v in p["rates"].items())
              + f" GB/s per thread (default {p['default']:.2f}); "
              f"efficiency {p['eff']:.3f} of the copy bandwidth (repacked {', '.join(REPACKED)}: "
              f"{p['eff_repacked']:.3f}); per_layer_ms {p['per_layer']:.4f}; "
              f"per_token_ms {p['per_token']:.3f}; bound by {'/'.join(sorted(bound))}; "
              f"fit rows: worst {p['worst'] * 100:.1f}%, rms {p['rms'] * 100:.1f}%")
        for s in summary(res):
            pred = 1000 / predict_ms(p, s)
            print(f"  {s['set']:8s} {s['file']:28s} t={s['threads']} meas {s[a.stat]:7.2f} pred {pred:7.2f} "
                  f"({(pred / s[a.stat] - 1) * 100:+.1f}%)")
        k = round(p["worst"] + 0.02, 2)     # the band: the worst fit row plus 2 points, never the held-out rows
        print(f"\ncatalog decode block (band +-{k * 100:.0f}% on every rate and on per_layer_ms):")
        print(catalog_block(p, k, res["machine"]))
    if a.report:
        print(report(res))


if __name__ == "__main__":
    main()
