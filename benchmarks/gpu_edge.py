"""Issue 16's "Done when" on one H200: the plan at its edges, placed as planned or refused, measured.

Run on the lent GPU machine through ``benchmarks/gpu_edge.sh`` (it builds llama.cpp for sm_90 and
calls this script); ``--report`` turns the raw results into benchmarks/gpu_edge.md's table here.

Per model (random-weight Q4_K_M GGUFs written on the device by engineroom.synth with SmolLM2's
tokenizer): the Qwen3.6-27B layout (qwen35 hybrid), a Qwen3-30B-A3B-like MoE (128 experts, 8 active),
a dense 32B (Qwen3-32B's shape) and a sliding-window shape (Gemma-3-12B's: 5 local : 1 global, window
1024):

1. ``engineroom plan FILE --priority balanced --json`` and ``engineroom up FILE --priority balanced``:
   the launch record (fit's components beside the engine's buffer lines and NVML, the placement
   check), then ``bench depth`` and ``bench concurrency``, short;
2. a pick at >= 90% of the GPU's memory: the concurrent-throughput priority's pick when its plan
   row fills >= 90% of the card, else an explicit ``--ctx C --parallel N`` (fit's max_concurrency
   at C = 32,768, then larger C until the launch fills >= 90%); ``up`` either runs it placed as
   planned or refuses it with its sentence (both recorded), then the same two short suites.

Commands:
    python3 benchmarks/gpu_edge.py synth --out DIR --models qwen36,moe                # (device)
    python3 benchmarks/gpu_edge.py run --out DIR --models qwen36,moe --deadline-s 540  # (device)
    .venv/bin/python benchmarks/gpu_edge.py --report benchmarks/data/gpu_edge           # (here)
    .venv/bin/python benchmarks/gpu_edge.py run --out /tmp/ge --models tiny --cpu      # (here) a dry run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

QUANT = "Q4_K_M"
MODELS = ("qwen36", "moe", "dense32", "swa")
EDGE = 0.90                      # the share of the GPU's memory the edge pick must fill
DEPTHS = "1024,16384"
SHORT = ("--warmup", "1", "--runs", "2", "--max-tokens", "64")
# the concurrency suite's tokens a stream: at 64, 32 streams' TTFTs (3-25 s on the H200) left bench's
# all-decoding window empty or too short to time (lease6); 256 keeps every stream decoding together
CONCURRENCY_TOKENS = "256"
DEADLINE = float("inf")          # run() sets it: no bench step may outlast the call's deadline


def _cap(s: float) -> float:
    """A step's timeout, cut to the time left before the deadline (30 s at least)."""
    return max(30.0, min(s, DEADLINE - time.time()))


def _arch(name: str):
    from engineroom.arch import LayerKind, MoESpec
    from engineroom.synthshapes import SHAPES, qwen36_27b

    if name == "qwen36":
        return qwen36_27b(64)
    if name == "tiny":
        return SHAPES["dense-s"]
    if name == "moe":        # Qwen3-30B-A3B's shape: 48 layers, 2048 wide, 32 q / 4 kv heads of 128, 128 x 768 experts
        return replace(SHAPES["moe-m"], name="qwen3-30b-a3b-shape", n_layers=48, hidden_size=2048, n_heads=32,
                       n_kv_heads=4, head_dim=128, vocab_size=151_936, max_position=40_960,
                       layer_kinds=(LayerKind.FULL,) * 48, param_count=None,
                       moe=MoESpec(n_experts=128, n_experts_active=8, expert_intermediate_size=768))
    if name == "dense32":    # Qwen3-32B's shape: 64 layers, 5120 wide, 64 q / 8 kv heads of 128, ff 25600
        return replace(SHAPES["dense-m"], name="qwen3-32b-shape", n_layers=64, hidden_size=5120, n_heads=64,
                       n_kv_heads=8, head_dim=128, intermediate_size=25_600, vocab_size=151_936,
                       max_position=40_960, layer_kinds=(LayerKind.FULL,) * 64, param_count=None)
    if name == "swa":        # Gemma-3-12B's shape: 48 layers (5 sliding : 1 global, window 1024), 3840 wide
        kinds = tuple(LayerKind.FULL if (i + 1) % 6 == 0 else LayerKind.SLIDING for i in range(48))
        return replace(SHAPES["swa-s"], name="gemma-3-12b-shape", n_layers=48, hidden_size=3840, n_heads=16,
                       n_kv_heads=8, head_dim=256, intermediate_size=15_360, vocab_size=262_144,
                       max_position=131_072, layer_kinds=kinds, sliding_window=1024, param_count=None)
    raise SystemExit(f"unknown model {name!r} ({', '.join(MODELS)}, tiny)")


def gguf_path(out: Path, name: str) -> Path:
    return out / f"{name}-{QUANT}.gguf"


def synth(out: Path, names: list[str]) -> None:
    from engineroom.synth import write_synthetic_gguf

    out.mkdir(parents=True, exist_ok=True)
    info = json.loads((out / "synth.json").read_text()) if (out / "synth.json").is_file() else {}
    for name in names:
        path = gguf_path(out, name)
        if path.exists():
            continue
        t = time.time()
        write_synthetic_gguf(_arch(name), QUANT, path)
        info[name] = {"seconds": round(time.time() - t, 1), "bytes": path.stat().st_size}
        print(f"synth {name}: {info[name]}", flush=True)
        (out / "synth.json").write_text(json.dumps(info, indent=1))


# ---------------------------------------------------------------------------------------------
def _cli(*args: str, timeout: float = 600) -> tuple[int, Any, str]:
    t = time.time()
    try:
        proc = subprocess.run(["engineroom", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"engineroom {' '.join(args)}: timed out after {timeout:.0f} s", flush=True)
        return 124, None, f"timed out after {timeout:.0f} s"
    print(f"engineroom {' '.join(args)}: rc {proc.returncode} in {time.time() - t:.0f} s", flush=True)
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip().startswith(("{", "[")) else None
    except ValueError:
        data = None
    return proc.returncode, data, " ".join(proc.stderr.split())[-3000:]


def _gpu_bytes() -> tuple[int, int]:
    """(total, free) bytes of GPU 0 as NVML reports them (0, 0 without a GPU)."""
    from engineroom.hardware import detect_rig

    rig = detect_rig()
    if not rig.gpus:
        return 0, 0
    g = rig.gpus[0]
    return g.vram_bytes, g.free_bytes or g.vram_bytes


def _llama_rows(plan: Any) -> list[tuple[int, dict]]:
    rows = (plan or {}).get("plans") or []
    return [(i + 1, r) for i, r in enumerate(rows) if r.get("engine") == "llama.cpp"]


def edge_pick(model: Path, total: int) -> dict:
    """The >= 90% pick: concurrent-throughput's when it fills the card, else fit's largest slot
    count at a context that does (in-process, the same fit `up` predicts with)."""
    from engineroom.arch import arch_from_gguf
    from engineroom.catalog import load_catalog
    from engineroom.fit import FitRequest, fit
    from engineroom.fit.search import max_concurrency
    from engineroom.hardware import detect_rig

    rc, plan, err = _cli("plan", str(model), "--priority", "concurrent-throughput", "--json")
    rows = _llama_rows(plan)
    if rows:
        n, row = rows[0]
        share = max(row.get("per_gpu_gb") or [0]) * 1e9 / total if total else 0
        if share >= EDGE:
            return {"how": "priority", "args": ["--priority", "concurrent-throughput", "--pick", str(n)],
                    "plan_row": row, "share_of_gpu": round(share, 4)}
    arch = arch_from_gguf(model)
    rig = detect_rig()
    cat = load_catalog().for_vendor(rig.vendor)
    tried = []
    for ctx in (32_768, 65_536, 131_072, arch.max_position or 131_072):
        ctx = min(ctx, arch.max_position or ctx)
        req = FitRequest(engine="llama.cpp", ctx=ctx, quant=arch.file_type, parallel=1, kv_unified=False)
        n = max_concurrency(arch, req, rig, limit=256, catalog=cat)
        if not n:
            break
        f = fit(arch, replace(req, parallel=n), rig, catalog=cat)
        share = max(g.used_bytes for g in f.per_gpu) / total if total else 0
        tried.append({"ctx": ctx, "parallel": n, "share_of_gpu": round(share, 4), "verdict": str(f.verdict)})
        if share >= EDGE or n == 256:
            return {"how": "explicit", "args": ["--ctx", str(ctx), "--parallel", str(n), "--no-kv-unified"],
                    "concurrent_throughput_row": rows[0][1] if rows else None, "share_of_gpu": round(share, 4),
                    "tried": tried, "fit_binding": f.binding}
    return {"how": "none", "tried": tried, "concurrent_throughput_row": rows[0][1] if rows else None,
            "plan_stderr": err}


def launch_and_bench(model: Path, args: list[str], label: str, out: Path, left: Any, depths: str = DEPTHS,
                     short: tuple[str, ...] = SHORT) -> dict:
    res: dict[str, Any] = {"args": args}
    rc, state, err = _cli("up", str(model), "--port", "0", *args, "--json", timeout=900)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    res["up_rc"] = rc
    if rc != 0:
        res["refused"] = err                      # the placement sentence, or why the engine did not start
        _cli("down")
        return res
    mem = (state or {}).get("memory") or {}
    res["memory_rows"] = mem.get("rows")
    res["placement"] = mem.get("placement")
    res["argv"] = (state or {}).get("argv")
    log = Path((state or {}).get("log_path") or "")
    streams = str(min(int((mem.get("placement") or {}).get("actual", {}).get("slots") or 1), 32))
    if left(90, f"{label} depth"):
        rc, data, err = _cli("bench", "depth", "--depths", depths, *short, "--json", timeout=_cap(400))
        res["depth"] = {"rc": rc, "result": data, "stderr": err if rc else ""}
    if left(90, f"{label} concurrency"):
        rc, data, err = _cli("bench", "concurrency", "--streams", streams, "--prompt-tokens", "1024",
                             *short, "--max-tokens", CONCURRENCY_TOKENS, "--json", timeout=_cap(400))
        res["concurrency"] = {"rc": rc, "result": data, "stderr": err if rc else ""}
    _cli("down")
    if log.is_file():
        (logs / f"{model.stem}-{label}.server.log").write_text(log.read_text(errors="replace"))
    return res


def run(out: Path, names: list[str], deadline_s: float, gpu: bool,
        picks: tuple[str, ...] = ("balanced", "edge")) -> None:
    """Each model's ``picks`` (balanced, edge), measured into results.json; a model already there keeps
    what this call does not measure again."""
    global DEADLINE
    deadline = DEADLINE = time.time() + deadline_s
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    total, free = _gpu_bytes()
    for name in names:
        model = gguf_path(out, name)
        res: dict[str, Any] = {**results.get(name, {}), "model": name, "file_bytes": model.stat().st_size,
                               "gpu_total_bytes": total, "gpu_free_bytes": free, "skipped": []}

        def left(need: float, what: str, res: dict[str, Any] = res) -> bool:
            if time.time() + need > deadline:
                res["skipped"].append(f"{what}: {deadline - time.time():.0f} s left, needs about {need:.0f}")
                print("deadline: skip", what, flush=True)
                return False
            return True

        rc, plan, err = _cli("plan", str(model), "--priority", "balanced", "--json")
        rows = _llama_rows(plan)
        res["balanced_plan_row"] = rows[0][1] if rows else {"error": err}
        pick = ["--priority", "balanced", "--pick", str(rows[0][0])] if rows else ["--ctx", "32768"]
        if not gpu:
            pick = ["--ctx", "2048", "--threads", "2"]
        if "balanced" in picks and left(150, "balanced"):
            # a dry run on a shared CPU measures whatever else runs there (--busy-ok): it checks the script only
            res["balanced"] = launch_and_bench(model, pick, "balanced", out, left, DEPTHS if gpu else "256,1024",
                                               SHORT if gpu else (*SHORT, "--busy-ok"))
        if gpu and "edge" in picks and left(200, "edge"):
            res["edge_pick"] = edge_pick(model, total)
            if res["edge_pick"].get("args"):
                res["edge"] = launch_and_bench(model, res["edge_pick"]["args"], "edge", out, left)
        results[name] = res
        results_path.write_text(json.dumps(results, indent=1, default=str))
        print(f"{name}: done ({deadline - time.time():.0f} s left)", flush=True)


# ---------------------------------------------------------------------------------------------
def _pct(r: dict) -> str:
    e = r.get("error_pct")
    return "" if e is None else f"{e:+.2f}%"


def _suite(res: dict | None) -> str:
    if not res:
        return "not run"
    summary = (res.get("result") or {}).get("summary") or {}
    failed = [c["name"] for c in summary.get("integrity") or () if c.get("status") == "FAIL"]
    return str(summary.get("status") or f"rc {res.get('rc')}") + (f" ({', '.join(failed)})" if failed else "")


def report(folder: Path) -> str:
    results = json.loads((folder / "results.json").read_text())
    lines = ["| model | pick | ctx x slots | placement | GPU plan / measured GiB | worst component | depth | "
             "concurrency |", "|---|---|---|---|---:|---|---|---|"]
    for name, r in results.items():
        for label in ("balanced", "edge"):
            x = r.get(label)
            if not x:
                continue
            if x.get("refused"):
                why = x["refused"][x["refused"].rfind("error:"):]      # engineroom's sentence, after the log tail
                lines.append(f"| {name} | {label} | {' '.join(x['args'])} | refused: {why[:300]} | | | | |")
                continue
            rows = x.get("memory_rows") or []
            gpu = next((m for m in rows if str(m.get("component")) == "GPU0"), {})
            comps = [m for m in rows if m.get("error_pct") is not None and not str(m["component"]).startswith(
                ("GPU", "total"))]
            worst = max(comps, key=lambda m: abs(m["error_pct"]), default=None)
            placed = x.get("placement") or {}
            act = placed.get("actual") or {}
            gib = lambda b: f"{b / 2**30:.2f}" if b else "?"  # noqa: E731
            lines.append(f"| {name} | {label} | {act.get('ctx_per_slot')} x {act.get('slots')} | "
                         f"{placed.get('status')} | {gib(gpu.get('predicted_bytes'))} / "
                         f"{gib(gpu.get('measured_bytes'))} | "
                         f"{(worst['component'] + ' ' + _pct(worst)) if worst else ''} | {_suite(x.get('depth'))} | "
                         f"{_suite(x.get('concurrency'))} |")
    return "\n".join(lines)


def _cut(name: str, layers: int):
    """The shape ``name`` cut to its first ``layers`` layers (qwen36: synth's own layout at that depth)."""
    from engineroom.synthshapes import qwen36_27b

    if name == "qwen36":
        return qwen36_27b(layers)
    arch = _arch(name)
    kinds = arch.layer_kinds[:layers] if arch.layer_kinds else arch.layer_kinds
    return replace(arch, n_layers=layers, layer_kinds=kinds)


def _ask(port: int, prompt: str) -> dict[str, Any]:
    """One chat request for 32 tokens with ignore_eos and the first tokens' top log-probabilities (a
    non-finite logit shows there): finish reason, tokens, text, the first three tokens' top-3."""
    import httpx

    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 32, "ignore_eos": True,
            "temperature": 0, "logprobs": True, "top_logprobs": 3}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300).json()
    choice = r["choices"][0]
    first = ((choice.get("logprobs") or {}).get("content") or [])[:3]
    return {"finish_reason": choice.get("finish_reason"), "prompt_tokens": r.get("usage", {}).get("prompt_tokens"),
            "completion_tokens": r.get("usage", {}).get("completion_tokens"),
            "text": (choice.get("message") or {}).get("content"),
            "first_tokens": [{"token": t.get("token"), "logprob": t.get("logprob"),
                              "top": [(x.get("token"), x.get("logprob")) for x in t.get("top_logprobs") or []]}
                             for t in first]}


SHORT_PROMPT = "Hello, who are you?"
LONG_PROMPT = "Summarise this. " + "The harbour was quiet and the boats rocked on the grey water. " * 80


def scales(out: Path, names: list[str], layers: int = 8) -> None:
    """The random files' weight scale, A/B on the GPU: each shape cut to ``layers`` layers, written once
    with the one 0.002 block scale synth used before and once with ``synth.BLOCK_SCALES``, launched by
    `engineroom up FILE --ctx 4096 --parallel 1` (as every step here) and asked for 32 tokens with
    ignore_eos (``_ask``); what came back is kept in ``scales.json``."""

    from engineroom.synth import write_synthetic_gguf

    results = []
    for name in names:
        arch = _cut(name, layers)
        for label, value in (("old 0.002", 0.002), ("BLOCK_SCALES", None)):
            path = out / f"scale-{name}-{layers}L.gguf"
            write_synthetic_gguf(arch, QUANT, path, block_scale=value)
            row: dict[str, Any] = {"model": name, "layers": layers, "scale": label}
            try:
                row.update(_launch_and_ask(path, {"short": SHORT_PROMPT})["short"])
            finally:
                path.unlink(missing_ok=True)
            print(json.dumps(row), flush=True)
            results.append(row)
    (out / "scales.json").write_text(json.dumps(results, indent=1))


def _launch_and_ask(path: Path, prompts: dict[str, str], *up_args: str) -> dict[str, dict[str, Any]]:
    """`up` ``path`` (with ``up_args``), ask each prompt (label -> text), `down`: each answer's row, or
    its error (recorded, so the next launch still runs)."""
    import httpx

    rc, state, err = _cli("up", str(path), "--ctx", "4096", "--parallel", "1", "--port", "0", "--json", *up_args)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for label, prompt in prompts.items():
            try:
                rows[label] = _ask(state["port"], prompt) if rc == 0 and state else {"error": f"up: rc {rc}: {err}"}
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                rows[label] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        _cli("down")
    return rows


def onetoken(out: Path, name: str = "qwen36") -> None:
    """Why the full-size random files stop after one token on the GPU while 8-layer cuts answer in
    full (lease3): the two things that differed, split. The shape at 8 layers and at its full depth,
    each asked with the short prompt the cuts had and a ~1,000-token prompt like the suites'; each
    answer's first tokens come with their top log-probabilities. Kept in ``onetoken.json``."""

    from engineroom.synth import write_synthetic_gguf

    full = _arch(name)
    results = []
    for layers in sorted({min(8, full.n_layers), full.n_layers}):
        path = out / f"onetoken-{name}-{layers}L.gguf"
        write_synthetic_gguf(_cut(name, layers), QUANT, path)
        try:
            answers = _launch_and_ask(path, {"short": SHORT_PROMPT, "long": LONG_PROMPT})
        finally:
            path.unlink(missing_ok=True)
        for label, answer in answers.items():
            row: dict[str, Any] = {"model": name, "layers": layers, "prompt": label, **answer}
            print(json.dumps(row), flush=True)
            results.append(row)
    (out / "onetoken.json").write_text(json.dumps(results, indent=1))


def nonfinite(out: Path, name: str = "qwen36") -> None:
    """Where the non-finite logits came from (lease4: every qwen36 launch answered NaN log-probabilities
    on the GPU, at any cache type, with flash attention off too; the CPU answered finite). The cause
    proposed since: the writer's f16 min fields equalled d, so Q4_K / Q5_K weights leaned positive
    (mean 0.93 std) and activations grew layer by layer past f16 on CUDA. The shape's 8-layer cut is
    written by the writer as it is now (centred min fields, random signs: ``synth.MIN_OF_D``) and
    asked on the GPU with an f16 and a q4_0 cache and without flash attention; then written the old
    way (one value, 0.002, in every f16 field, as lease 1 wrote them: NaN there) and asked once more.
    Each file is deleted after its launches. Kept in ``nonfinite.json``."""

    from engineroom.synth import write_synthetic_gguf

    results = []
    cut = _cut(name, min(8, _arch(name).n_layers))
    for writer, value, runs in (("centred", None, (("f16", []), ("q4_0", []), ("f16", ["--", "-fa", "off"]))),
                                ("old 0.002 in every f16 field", 0.002, (("f16", []),))):
        path = out / f"nonfinite-{name}-8L.gguf"
        write_synthetic_gguf(cut, QUANT, path, block_scale=value)
        try:
            for kv, extra in runs:
                row: dict[str, Any] = {"model": name, "layers": 8, "writer": writer, "kv": kv,
                                       "flash_attention": "off" if extra else "default",
                                       **_launch_and_ask(path, {"short": SHORT_PROMPT}, "--kv", kv, *extra)["short"]}
                print(json.dumps(row), flush=True)
                results.append(row)
                (out / "nonfinite.json").write_text(json.dumps(results, indent=1))
        finally:
            path.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", nargs="?", choices=["synth", "run", "scales", "onetoken", "nonfinite"])
    ap.add_argument("--out", type=Path, default=Path(".ci-work/edge"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--cpu", action="store_true", help="a dry run on this machine's CPU (model: tiny)")
    ap.add_argument("--picks", default="balanced,edge", help="which picks `run` measures (balanced, edge)")
    ap.add_argument("--report", type=Path)
    a = ap.parse_args()
    if a.report:
        print(report(a.report))
        return 0
    names = [n for n in a.models.split(",") if n]
    if a.stage == "synth":
        synth(a.out, names)
    elif a.stage == "scales":
        scales(a.out, names)
    elif a.stage == "onetoken":
        onetoken(a.out, names[0])
    elif a.stage == "nonfinite":
        for n in names:
            nonfinite(a.out, n)
    elif a.stage == "run":
        if a.cpu:
            synth(a.out, names)
        picks = tuple(p for p in a.picks.split(",") if p)
        if set(picks) - {"balanced", "edge"}:
            ap.error(f"--picks: balanced and/or edge, not {a.picks!r}")
        run(a.out, names, a.deadline_s, gpu=not a.cpu, picks=picks)
    else:
        ap.error("give a stage (synth, run) or --report DIR")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
