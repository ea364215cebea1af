"""Would a per-layer decode cost by width (and by layer kind) fix the CUDA speed model? Leave one shape out.

On the H200 points of `calibration_loo.md` with byte counts the plan gives today (the Qwen3.6-27B layout, the
dense 32B, the 30B-A3B MoE and the 35B-A3B hybrid MoE; llama.cpp CUDA, Q4_K_M, single stream), time per token is
fitted as 0.25 ms + bytes x c + layers x (a + b x width / 1000) [+ linear-attention layers x g], least squares on
relative error; each shape is then predicted from a fit of the other three. Printed: the fit's parameters, each
shape's in-sample fit and its leave-one-out prediction beside the plan's middle today.

    .venv/bin/python benchmarks/speed_refit_loo.py
"""

from __future__ import annotations

import numpy as np

from engineroom.hardware import parse_rig
from engineroom.plan import plan

RIG = parse_rig("h200")
# (shape, model, measured single-stream tok/s on record, layers, linear-attention layers, width)
SHAPES = (("27B layout", "qwen3.6-27b", (76.5, 81.0, 79.4, 78.8, 80.3, 80.1), 64, 48, 5120),
          ("dense 32B", "tests/fixtures/configs/qwen3-32b.json", (70.9, 74.1), 64, 0, 5120),
          ("30B-A3B MoE", "tests/fixtures/configs/qwen3-30b-a3b.json", (255.1, 253.6), 48, 0, 2048),
          ("35B-A3B hybrid MoE", "tests/fixtures/configs/qwen3.5-35b-a3b.json", (230.6, 209.6), 40, 30, 2048))
PER_TOKEN_MS = 0.25


def rows() -> list[tuple[str, float, float, int, int, int, float, float]]:
    out = []
    for name, model, measured, layers, linear, width in SHAPES:
        plans = plan(model, RIG, "balanced", engine="llama.cpp", quant="Q4_K_M", ctx=32768, limit=40)
        p = next(p for p in plans if not p.spec and p.kv_dtype == "f16" and p.parallel == 1)
        assert p.decode is not None
        tps = float(np.mean(measured))
        out.append((name, p.decode.bytes_per_token / 1e9, 1000 / tps, layers, linear, width, p.decode.mid, tps))
    return out


def fit(rs: list, use_linear: bool) -> np.ndarray:
    a, y = [], []
    for _name, gb, t, layers, linear, width, _mid, _tps in rs:
        terms = [gb, layers, layers * width / 1000] + ([linear] if use_linear else [])
        a.append([x / t for x in terms])
        y.append((t - PER_TOKEN_MS) / t)
    sol, *_ = np.linalg.lstsq(np.array(a), np.array(y), rcond=None)
    return sol


def predict(sol: np.ndarray, r: tuple, use_linear: bool) -> float:
    _name, gb, _t, layers, linear, width, _mid, _tps = r
    t = PER_TOKEN_MS + gb * sol[0] + layers * sol[1] + layers * width / 1000 * sol[2]
    return 1000 / (t + (linear * sol[3] if use_linear else 0.0))


def main() -> None:
    rs = rows()
    for use_linear in (True, False):
        sol = fit(rs, use_linear)
        names = "bytes (ms/GB), layers (ms), layers x width (ms per 1,000)"
        names += ", linear layers (ms)" if use_linear else ""
        print(f"\n{names}: {', '.join(f'{x:.4g}' for x in sol)}")
        print("| shape | measured | fit, all four | leave one out | plan's middle today |")
        print("|---|---:|---:|---:|---:|")
        for i, r in enumerate(rs):
            rest = [x for j, x in enumerate(rs) if j != i]
            whole, held = predict(sol, r, use_linear), predict(fit(rest, use_linear), r, use_linear)
            tps = r[7]
            print(f"| {r[0]} | {tps:.1f} | {whole:.1f} ({whole / tps - 1:+.1%}) | {held:.1f} ({held / tps - 1:+.1%}) | "
                  f"{r[6]:.1f} ({r[6] / tps - 1:+.1%}) |")


if __name__ == "__main__":
    main()
