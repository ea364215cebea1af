"""Commands that plan before anything is downloaded: plan, fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..hardware import Rig
    from ..plan import Choice, ResolvedModel

import typer

from .. import views
from ..output import err_console, print_json
from .base import JsonOpt, KvUnifiedOpt, app, show

_RIG = typer.Option(None, "--rig",
                    help="Rig spec: 2x3090, 1xH200, 3090+4090, cpu:64GB, m3max:128GB (default: this machine).")


_MODEL_HELP = ("Catalog model id, alias, name or HF repo (e.g. qwen3.6-27b); or a model not in the catalog: "
               "a config.json or a folder holding one (or exactly one .gguf), a .gguf file (header only), "
               "an https URL to a .gguf, hf:ORG/REPO/FILE.gguf[@REVISION] (a pulled copy, or the "
               "header read over HTTP), or ORG/REPO (its config.json from Hugging Face).")


def _model_facts(subject: ResolvedModel) -> dict[str, Any]:
    """JSON keys for a model outside the catalog (none for a catalog model)."""
    if subject.in_catalog:
        return {}
    return {"model_source": subject.source, "estimates": list(subject.estimates)}


@app.command()
def plan(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    rig: str | None = _RIG,
    priority: str | None = typer.Option(None, "--priority",
                                        help="balanced, full-features, max-context, leanest-vram, "
                                             "concurrent-throughput, non-nvidia, fastest-cold-start, multi-tenant."),
    ctx: int | None = typer.Option(None, "--ctx", "-c", help="Required context (tokens); default: the priority's."),
    parallel: int | None = typer.Option(None, "--parallel",
                                    help="Server slots (concurrent sequences) every config must serve, each at the "
                                         "full context (default: the priority's), as `up --parallel` launches."),
    engine: str | None = typer.Option(None, "--engine", "-e", help="Only this engine."),
    quant: str | None = typer.Option(None, "--quant", help="Only this quant of the model (with --priority)."),
    top: int = typer.Option(5, "--top", "-n", help="How many ranked configs to show."),
    rope_scaling: str | None = typer.Option(None, "--rope-scaling",
                                            help="RoPE scaling and its factor (yarn:4, linear:2): allows --ctx up "
                                                 "to the model's maximum positions x the factor."),
    json_out: bool = JsonOpt,
) -> None:
    """Ranked engine/quant/KV/context configs for MODEL on a rig, with one-line reasons.

    Without --priority: the top pick for every priority (a computed "how to choose" table).
    """
    from ..hardware import resolve_rig
    from ..plan import how_to_choose, plans_as_rows, resolve_model
    from ..plan import plan as make_plan
    from ..speedpoints import calibration_here

    the_rig = resolve_rig(rig)
    subject = resolve_model(model)
    calibration = calibration_here(rig=the_rig) if rig is None else None   # this machine's measured speeds
    if priority is None:
        if quant is not None:
            from ..errors import BadInput

            raise BadInput("--quant goes with --priority (a how-to-choose table compares every quant).")
        rows = how_to_choose(subject, the_rig, ctx=ctx, engine=engine, parallel=parallel, calibration=calibration)
        _print_how_to_choose(model, subject, the_rig, rows, json_out)
        return
    plans = make_plan(subject, the_rig, priority, ctx=ctx, engine=engine, limit=max(1, top), detail=3,
                      parallel=parallel, rope_scaling=rope_scaling, calibration=calibration, quant=quant)
    if json_out:
        print_json({"model": model, **_model_facts(subject), "rig": the_rig.label, "rig_notes": list(the_rig.notes),
                    "priority": plans[0].priority, "plans": plans_as_rows(plans)})
        return
    show(views.rig_notes(the_rig), to=err_console)
    show(views.plan_view(model, subject, the_rig, plans))


def _print_how_to_choose(model: str, subject: ResolvedModel, the_rig: Rig, rows: list[Choice], json_out: bool) -> None:
    from ..plan import plans_as_rows

    if json_out:
        print_json({"model": model, **_model_facts(subject), "rig": the_rig.label, "rig_notes": list(the_rig.notes),
                    "how_to_choose": [{"priority": r.priority, "label": r.label,
                                       "pick": plans_as_rows([r.plan])[0] if r.plan else None,
                                       "why_none": r.why_none} for r in rows]})
        return
    show(views.rig_notes(the_rig), to=err_console)
    show(views.how_to_choose_view(model, subject, the_rig, rows))


@app.command("fit")
def fit_cmd(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    engine: str = typer.Option(..., "--engine", "-e", help="llama.cpp, ik_llama.cpp, vllm or sglang."),
    quant: str = typer.Option(..., "--quant", "-q", help="Catalog quant id (e.g. Q4_K_M, autoround-int4); "
                              "for a model not in the catalog: a .gguf's own type (e.g. Q4_K_M), or for a "
                              "config.json its dtype (bf16, fp8), Q8_0, Q4_K_M, fp8, awq-int4, gptq-int4 or "
                              "autoround-int4."),
    kv: str = typer.Option(..., "--kv", help="KV cache type as the engine names it (q4_0, fp8, ...)."),
    ctx: int = typer.Option(..., "--ctx", help="Context length (tokens)."),
    parallel: int = typer.Option(1, "--parallel",
                             help="Server slots (concurrent sequences), each of --ctx tokens, as `up --parallel` "
                                  "launches; the output names the `up` launch that matches."),
    kv_unified: bool | None = typer.Option(None, "--kv-unified/--no-kv-unified",
                                           help="Slots share one KV cache (default: not, as `up --parallel N` "
                                                "launches)."),
    tp: int = typer.Option(1, "--tp", help="GPUs for one instance (tensor parallel or layer split)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline stages (vLLM, SGLang; on a cluster rig such as 2x(8xH100) "
                                            "the stages sit on the nodes)."),
    rig: str = typer.Option(..., "--rig", help="Rig spec: 2x3090, 1xH200, cpu:64GB, m3max:128GB, 2x(8xH100) "
                                                "(two nodes), or 'auto'."),
    rope_scaling: str | None = typer.Option(None, "--rope-scaling",
                                            help="RoPE scaling and its factor the engine will run with (yarn:4, "
                                                 "linear:2): allows --ctx up to the model's maximum x the factor."),
    repack: bool = typer.Option(True, "--weights-repack/--no-weights-repack",
                                help="llama.cpp on a CPU: the CPU backend's repacked weight copies (its default); "
                                     "--no-weights-repack sizes a launch with repacking off."),
    full_swa_cache: bool = typer.Option(False, "--full-swa-cache",
                                        help="Sliding-window layers keep a full-size KV cache (llama.cpp's "
                                             "full-size SWA option) instead of the window."),
    ubatch: int | None = typer.Option(None, "--ubatch",
                                      help="Physical batch in tokens (llama.cpp's micro-batch; default 512): it "
                                           "sizes the compute buffer."),
    json_out: bool = JsonOpt,
) -> None:
    """One memory breakdown: per-device components, verdict and the largest fillable context."""
    from ..fit import Verdict
    from ..hardware import resolve_rig
    from ..plan import fit_one, resolve_model

    the_rig = resolve_rig(rig)
    subject = resolve_model(model)
    m, f = fit_one(subject, the_rig, engine, quant, kv, ctx, parallel=parallel, tp=tp, pp=pp, rope_scaling=rope_scaling,
                   repack=repack, swa_full=full_swa_cache, ubatch=ubatch,
                   kv_unified=kv_unified)
    slots, unified = f.request.parallel, f.request.kv_unified
    # `up`'s own engine-neutral switch (cli/base.py KvUnifiedOpt), read from its declaration
    on, off = KvUnifiedOpt.param_decls[0].split("/")
    launch_line = f"engineroom up MODEL --ctx {ctx} --parallel {slots} {on if unified else off}"
    asked = [what for what, given in (("weights repack off", not repack), ("a full-size SWA cache", full_swa_cache),
                                      (f"a {ubatch}-token micro-batch", ubatch is not None)) if given]
    if asked:   # the engine's own arguments for these go after `--` (its flags are its adapter's words)
        launch_line += f" -- <{engine}'s arguments for {', '.join(asked)}>"
    if json_out:
        print_json({"model": m.id, **_model_facts(subject), "rig": the_rig.label, "slots": slots,
                    "kv_unified": unified, "launch": launch_line, "fit": f})
        return
    show(views.rig_notes(the_rig), to=err_console)
    show(views.fit_view(m.name, subject, the_rig, f, engine=engine, quant=quant, kv=kv, ctx=ctx,
                         launch_line=launch_line))
    if f.verdict is Verdict.DOES_NOT_FIT:
        raise typer.Exit(1)

