#!/usr/bin/env python3
"""fit vs vLLM's own memory figures for the H200 runs of this folder (issue 21).

    .venv/bin/python benchmarks/vllm_gpu/compare.py            # print the table (markdown) and write compare.json
    .venv/bin/python benchmarks/vllm_gpu/compare.py --check    # exit 1 when a KV pool misses by more than 2%

Reads the raw results `run_gpu.sh` brought back (benchmarks/data/vllm_gpu/2026-12-04/*.tgz: the server
log of each launch) with engineroom's own vLLM log reader (`engines/vllm/server.py`: the component
figures vLLM logged, its KV pool in bytes and tokens), and sizes the same launch with `fit` on the
`h200` rig preset: the catalog's model as it stands (``now``) and the pool model fit used before
the profile terms were added (``before``: the catalog's vLLM entry without ``pool_profile``). The
models: SmolLM2-135M from its GGUF's header (the float16 folder vLLM served was converted from it;
its config stayed on the device), the two random-weight layouts from the config.json fixtures the
device folders were made from. Nothing here needs a GPU or vLLM.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "vllm_gpu" / "2026-12-04"
GIB = 1 << 30
# model -> (the tgz, where fit reads the architecture, quant, ctx, parallel)
RUNS = {
    "SmolLM2-135M (real weights, float16)": ("vllm_gpu_smollm2.tgz", "smollm2-gguf", "f16", 4096, 4),
    "Qwen3.6-27B layout (dummy weights, bf16)": ("vllm_gpu_qwen36-27b.tgz",
                                                 "tests/fixtures/configs/qwen3.6-27b.json", "bf16", 32768, 4),
    "Qwen3.6-35B-A3B layout (dummy weights, bf16)": ("vllm_gpu_qwen36-35b-a3b.tgz",
                                                     "tests/fixtures/configs/qwen3.5-35b-a3b.json", "bf16", 32768, 4),
}
ROWS = ("weights", "activations", "non_torch", "cuda_graphs", "runtime_reserve", "kv_pool")


def _server_log(tgz: Path) -> str:
    with tarfile.open(tgz) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/server.log"))
        fh = tar.extractfile(member)
        assert fh is not None
        return fh.read().decode(errors="replace")


def _arch(where: str):
    from engineroom.arch import arch_from_config, arch_from_gguf

    if where == "smollm2-gguf":
        gguf = Path.home() / ".cache/engineroom/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
        if not gguf.is_file():
            sys.exit(f"{gguf} is missing: `engineroom models pull smollm2-135m` first")
        return arch_from_gguf(gguf)
    return arch_from_config(ROOT / where)


def _fit(arch, quant: str, ctx: int, parallel: int, catalog) -> dict[str, int]:
    from engineroom.engines.vllm.dtype import fit_kv
    from engineroom.fit import FitRequest, fit
    from engineroom.fit.search import max_concurrency
    from engineroom.hardware import resolve_rig

    rig = resolve_rig("h200", catalog)
    req = FitRequest(engine="vllm", ctx=ctx, quant=quant, kv_dtype=fit_kv("auto", quant), parallel=parallel,
                     kv_unified=True)
    f = fit(arch, req, rig, catalog=catalog)
    comps = f.bytes_by_component(per_gpu=True)
    pool = comps.get("kv_cache", 0) + comps.get("kv_pool_spare", 0)
    if catalog.engine("vllm").pool_profile is not None:
        pool += comps.get("recurrent_state", 0)
    comps["kv_pool"] = pool
    comps["sequences"] = max_concurrency(arch, req, rig, catalog=catalog)   # of ctx tokens each, in the pool
    return comps


def main(argv: list[str]) -> int:
    from engineroom.catalog import load_catalog
    from engineroom.engines.vllm import server

    now = load_catalog().for_vendor("nvidia")     # the CUDA build's view (the h200 rig's)
    before = now.model_copy(update={"engines": tuple(e.model_copy(update={"pool_profile": None})
                                                     if e.id == "vllm" else e for e in now.engines)})
    out: dict = {}
    lines = ["| model | component | vLLM's log | fit now | error | fit before | error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    worst = 0.0
    for label, (tgz, where, quant, ctx, parallel) in RUNS.items():
        log = _server_log(DATA / tgz)
        report = server.memory_report(log)
        assert report is not None, f"{tgz}: no memory figures in the log"
        measured = {c.name: c.bytes for c in report.components}
        capacity = server.kv_capacity(log) or {}
        arch = _arch(where)
        fits = {"now": _fit(arch, quant, ctx, parallel, now), "before": _fit(arch, quant, ctx, parallel, before)}
        rows = {}
        for name in ROWS:
            m = measured.get(name)
            got = {k: f.get(name) for k, f in fits.items()}
            err = {k: (100.0 * (v - m) / m if (v is not None and m) else None) for k, v in got.items()}
            rows[name] = {"measured": m, **{f"fit_{k}": v for k, v in got.items()},
                          **{f"error_pct_{k}": e for k, e in err.items()}}
            if name == "kv_pool" and err["now"] is not None:
                worst = max(worst, abs(err["now"]))

            def cell(v: int | None) -> str:
                return "-" if v is None else f"{v / GIB:.2f} GiB"

            def pct(e: float | None) -> str:
                return "-" if e is None else f"{e:+.1f}%"
            lines.append(f"| {label} | {name} | {cell(m)} | {cell(got['now'])} | {pct(err['now'])} | "
                         f"{cell(got['before'])} | {pct(err['before'])} |")
        # the pool in tokens: vLLM's count against fit's pool / the bytes one token costs
        conc = capacity.get("max_concurrency")
        out[label] = {"rows": rows, "vllm_kv_tokens": capacity.get("tokens"), "vllm_max_concurrency": conc,
                      "fit_sequences": {k: f["sequences"] for k, f in fits.items()}}
        lines.append(f"| {label} | sequences of {ctx:,} tokens | {conc}x | {fits['now']['sequences']} | "
                     f"{pct(100.0 * (fits['now']['sequences'] - conc) / conc) if conc else '-'} | "
                     f"{fits['before']['sequences']} | "
                     f"{pct(100.0 * (fits['before']['sequences'] - conc) / conc) if conc else '-'} |")
    print("\n".join(lines))
    print(f"\nworst KV-pool error (fit now): {worst:.2f}% (goal: within 2%)")
    (DATA / "compare.json").write_text(json.dumps(out, indent=1) + "\n")
    if "--check" in argv and worst > 2.0:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
