"""engineroom's recipes for Qwen3.6-27B set flag by flag against the comparison's tested configurations.

For each tested configuration in ``benchmarks/data/comparison_tested.yaml`` (transcribed from the
engine comparison; this script never reads the comparison itself) it runs

    engineroom recipe qwen3.6-27b --rig RIG --engine ENGINE --priority PRIORITY --json
    engineroom recipe qwen3.6-27b --rig RIG --engine ENGINE --priority PRIORITY --compose --json

reads the launch facts out of each command line (weights, context per sequence, KV type, TP,
sequences, speculative decoding, tool and reasoning parsers, vision, the fork's flags) and writes
``docs/recipes-vs-comparison.md``: per flag, the comparison's value, engineroom's (plain and
compose), and "same" or "differs" with the reason engineroom gives (the plan's notes) or, where it
gives none, that it gives none. A recipe engineroom refuses is listed with its one-sentence error.

    python benchmarks/recipes_vs_comparison.py            # rewrite docs/recipes-vs-comparison.md
    python benchmarks/recipes_vs_comparison.py --check    # exit 1 (and a diff) when the doc has drifted

tests/test_recipes_vs_comparison.py runs ``--check`` in the fast tier. Nothing here depends on this
machine: the recipes are for the named rigs (``--rig``), rendered with each engine's stand-in
program, and the parsers' verdicts (which do depend on what is installed here) are left out.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "comparison_tested.yaml"
DOC = ROOT / "docs" / "recipes-vs-comparison.md"
FLAGS = ("weights", "ctx", "kv", "tp", "parallel", "spec", "tools", "reasoning", "vision", "fork_flags")
LABEL = {"weights": "weights", "ctx": "context / sequence", "kv": "KV cache type", "tp": "tensor parallel",
         "parallel": "sequences", "spec": "speculative decoding", "tools": "tool-call parser",
         "reasoning": "reasoning parser", "vision": "vision", "fork_flags": "fork flags"}
# words of the plan's notes that explain a flag (the reason engineroom gives for a difference)
NOTE_WORDS = {"weights": ("weights", "quant", "file", "repo"), "ctx": ("context", "ctx"),
              "kv": ("kv",), "tp": ("tp", "tensor"), "parallel": ("sequence", "slot"),
              "spec": ("speculative", "mtp", "dflash", "draft"), "tools": ("tool",),
              "reasoning": ("reasoning",), "vision": ("vision", "text-only", "projector", "mmproj"),
              "fork_flags": ("fork",)}

# ---- reading a command line (each engine's flags, as its adapter renders them) ---------------------
ENGINE_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"weights": ("--model",), "ctx": ("--max-model-len",), "kv": ("--kv-cache-dtype",),
             "tp": ("--tensor-parallel-size", "-tp"), "parallel": ("--max-num-seqs",),
             "tools": ("--tool-call-parser",), "reasoning": ("--reasoning-parser",)},
    "sglang": {"weights": ("--model-path", "--model"), "ctx": ("--context-length",), "kv": ("--kv-cache-dtype",),
               "tp": ("--tp-size", "--tp", "--tensor-parallel-size"), "parallel": ("--max-running-requests",),
               "tools": ("--tool-call-parser",), "reasoning": ("--reasoning-parser",)},
    "llama.cpp": {"weights": ("-m", "--model", "-hf", "--hf-repo", "-hff", "--hf-file"), "ctx": ("-c", "--ctx-size"),
                  "kv": ("-ctk", "--cache-type-k"), "parallel": ("-np", "--parallel"),
                  "reasoning": ("--reasoning-format",)},
}
ENGINE_FLAGS["ik_llama.cpp"] = ENGINE_FLAGS["llama.cpp"]
CTX_TOLERANCE = 0.025          # 1,024 vs 1,000 tokens a K
FORK_FLAGS = ("-khad", "-vhad", "--merge-qkv", "-mqkv", "--parallel-tool-calls")


def _values(argv: list[str], names: tuple[str, ...]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        if flag in names:
            out.append(inline if eq else (argv[i + 1] if i + 1 < len(argv) else ""))
    return out


def _first(argv: list[str], names: tuple[str, ...]) -> str | None:
    found = _values(argv, names)
    return found[0] if found else None


def facts(engine: str, argv: list[str]) -> dict[str, Any]:
    """The launch facts of one command line, in the comparison's terms."""
    names = ENGINE_FLAGS[engine]
    got: dict[str, Any] = {}
    weights = _values(argv, names["weights"])
    got["weights"] = " / ".join(weights) if weights else None
    kv = _first(argv, names["kv"])
    got["kv"] = kv or "engine default"
    parallel = _first(argv, names["parallel"])
    got["parallel"] = int(parallel) if parallel and parallel.isdigit() else None
    ctx = _first(argv, names["ctx"])
    if engine in ("llama.cpp", "ik_llama.cpp"):
        total = int(ctx) if ctx and ctx.isdigit() else None
        got["ctx"] = total // (got["parallel"] or 1) if total else None        # -c is ctx x slots
        split = _first(argv, ("-ts", "--tensor-split"))
        got["tp"] = len(split.split(",")) if split else 1
        got["tools"] = "--jinja" in argv or "--chat-template-file" in argv
        got["reasoning"] = _first(argv, names["reasoning"]) or False
        got["vision"] = bool(_first(argv, ("--mmproj", "-mm", "--mmproj-url", "-mmu")))
        method = _first(argv, ("--spec-type",))
        if method is None and ("-mtp" in argv or "--multi-token-prediction" in argv):
            method = "mtp"
        tokens = _first(argv, ("--spec-draft-n-max", "--spec-n-max", "--draft-max", "--draft", "--draft-n"))
        got["spec"] = ({"method": method.replace("draft-", ""), "tokens": int(tokens) if tokens else None}
                       if method else "none")
        got["fork_flags"] = [f for f in FORK_FLAGS if f in argv]
    else:
        got["ctx"] = int(ctx) if ctx and ctx.isdigit() else None
        tp = _first(argv, names["tp"])
        got["tp"] = int(tp) if tp and tp.isdigit() else 1
        got["tools"] = _first(argv, names["tools"]) or False
        got["reasoning"] = _first(argv, names["reasoning"]) or False
        if engine == "vllm":
            spec = _first(argv, ("--speculative-config",))
            conf = json.loads(spec) if spec else None
            got["spec"] = ({"method": conf.get("method"), "tokens": conf.get("num_speculative_tokens")}
                           if conf else "none")
            limits = _first(argv, ("--limit-mm-per-prompt",))
            got["vision"] = "--language-model-only" not in argv and not (limits and not re.search(r"[1-9]", limits))
        else:
            method = _first(argv, ("--speculative-algorithm", "--speculative-algo"))
            tokens = _first(argv, ("--speculative-num-draft-tokens",))
            got["spec"] = ({"method": method.lower(), "tokens": int(tokens) if tokens else None}
                           if method else "none")
            got["vision"] = "engine default (served when the model has it)"
        got["fork_flags"] = []
    return got


# ---- comparing ----------------------------------------------------------------------------------
def same(flag: str, tested: Any, got: Any) -> bool:
    if got is None:
        return False
    if flag == "weights":
        return bool(re.search(tested, str(got)))
    if flag == "kv":
        return str(got).lower() in [str(k).lower() for k in tested]
    if flag == "spec":
        if tested == "none" or got == "none":
            return tested == got
        return got.get("method") == tested["method"] and got.get("tokens") == tested.get("tokens")
    if flag in ("tools", "reasoning", "vision"):
        return bool(got) == bool(tested) if not isinstance(got, str) or got not in ("engine default",) else False
    if flag == "fork_flags":
        present = set(got) | ({"--merge-qkv"} if "-mqkv" in got else set())
        return set(tested) <= present
    if flag == "ctx":           # the comparison writes "214K", "262K": a K of 1,000 or 1,024 tokens
        return bool(abs(got - tested) <= CTX_TOLERANCE * tested)
    return bool(got == tested)


def show(flag: str, value: Any) -> str:
    if value is None:
        return "—"
    if flag == "ctx" and isinstance(value, int):
        return f"{value:,}"
    if flag == "spec" and isinstance(value, dict):
        return f"{value['method']}" + (f", {value['tokens']} tokens" if value.get("tokens") else "")
    if flag == "fork_flags":
        return " ".join(value) if value else "none"
    if flag == "weights" and isinstance(value, str) and value.startswith("(?i)"):
        return f"matching `{value[4:]}`".replace("|", "\\|")
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return " or ".join(str(v) for v in value)
    return str(value).replace("|", "\\|")


def reason(flag: str, notes: list[str]) -> str:
    words = NOTE_WORDS[flag]
    # a priority's name ("max-context") is no statement about the context
    said = [n for n in notes if any(w in re.sub(r"priority \S+", "", n.lower()) for w in words)]
    return "; ".join(said) if said else "engineroom states no reason for this flag (to be explained or fixed)"


def recipe(cfg: dict[str, Any], model: str, *, compose: bool) -> dict[str, Any]:
    """``engineroom recipe ... --json`` run in this process (the CLI's own code, one import for all)."""
    from typer.testing import CliRunner

    from engineroom.cli import app_for

    args = ["recipe", model, "--rig", cfg["rig"], "--engine", cfg["engine"], "--priority", cfg["priority"],
            "--json"] + (["--compose"] if compose else [])
    result = CliRunner().invoke(app_for(), args, env={"COLUMNS": "200", "NO_COLOR": "1"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return {"ok": False, "error": " ".join(str(result.exception).split())}
    from engineroom import paths

    text = result.stdout.replace(str(paths.cache_dir()), "<cache>")    # this machine's folder is no fact
    try:
        return {"ok": True, **json.loads(text)}
    except ValueError:
        return {"ok": False, "error": f"exit {result.exit_code}: {result.output.strip()[-300:]}"}


def compose_argv(out: dict[str, Any]) -> list[str]:
    svc = next(iter(out["compose"]["services"].values()))
    return [*svc.get("entrypoint", []), *svc["command"]]


def report(data: dict[str, Any]) -> str:
    model = data["model"]
    lines = ["# engineroom's recipes vs the comparison's tested configurations", "",
             "Generated by `python benchmarks/recipes_vs_comparison.py` — do not edit by hand; "
             "`tests/test_recipes_vs_comparison.py` regenerates it and fails when it drifts. "
             "The tested configurations are transcribed in `benchmarks/data/comparison_tested.yaml` "
             f"({data['source']}).",
             "", "Each row: what the comparison ran, what `engineroom recipe` renders (and `recipe --compose`, the "
             "same launch for the engine's image), and whether they agree; where they differ, the reason is the one "
             "engineroom gives in its notes (the plan's and the adapter's, as `recipe` prints them), or it says that "
             "engineroom gives none. Parser verdicts are left "
             "out (they depend on what is installed where the script runs).", "",
             "| configuration | recipe | flags the same | flags that differ |", "|---|---|---|---|"]
    sections: list[str] = []
    rendered = [recipe(cfg, model, compose=c) for cfg in data["configs"] for c in (False, True)]
    for i, cfg in enumerate(data["configs"]):
        cmd = (f"engineroom recipe {model} --rig {cfg['rig']} --engine {cfg['engine']} --priority {cfg['priority']}")
        plain, comp = rendered[2 * i], rendered[2 * i + 1]
        tested = cfg["tested"]
        sections += ["", f"## {cfg['id']}", "", f"`{cmd}` (and `--compose`)", "", f"> {cfg['quote']}", ""]
        if not plain["ok"]:
            lines.append(f"| {cfg['id']} | refused | — | all {len(tested)} |")
            sections.append(f"**engineroom gives no recipe:** {plain['error']}")
            sections += ["", "| flag | comparison tested | engineroom |", "|---|---|---|"]
            sections += [f"| {LABEL[f]} | {show(f, tested[f])} | — (no recipe) |" for f in FLAGS if f in tested]
            continue
        got = facts(cfg["engine"], [str(a) for a in plain["argv"]])
        got_c = facts(cfg["engine"], [str(a) for a in compose_argv(comp)]) if comp["ok"] else None
        notes = list((plain.get("plan") or {}).get("notes") or []) + list(plain.get("notes") or [])
        sections += ["```", " ".join(str(a) for a in plain["argv"]), "```", ""]
        if notes:
            sections += [f"engineroom's notes: {'; '.join(notes)}", ""]
        if not comp["ok"]:
            sections += [f"`--compose` refused: {comp['error']}", ""]
        sections += ["| flag | comparison tested | engineroom | compose | verdict |", "|---|---|---|---|---|"]
        n_same, differ = 0, []
        for flag in FLAGS:
            if flag not in tested:
                continue
            ok = same(flag, tested[flag], got[flag])
            n_same += ok
            if not ok:
                differ.append(LABEL[flag])
            c = "—" if got_c is None else ("same" if got_c[flag] == got[flag] else show(flag, got_c[flag]))
            verdict = "same" if ok else f"differs: {reason(flag, notes)}"
            sections.append(f"| {LABEL[flag]} | {show(flag, tested[flag])} | {show(flag, got[flag])} | {c} | "
                            f"{verdict.replace('|', '/')} |")
        lines.append(f"| {cfg['id']} | rendered | {n_same} of {n_same + len(differ)} | "
                     f"{', '.join(differ) or 'none'} |")
    return "\n".join(lines + sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed doc instead of writing it")
    args = ap.parse_args(argv)
    text = report(yaml.safe_load(DATA.read_text()))
    if args.check:
        old = DOC.read_text() if DOC.is_file() else ""
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                   str(DOC.relative_to(ROOT)), "regenerated"))
        print(f"\n{DOC.relative_to(ROOT)} has drifted: run `python benchmarks/recipes_vs_comparison.py`.",
              file=sys.stderr)
        return 1
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
