"""Commands that run the managed server: up (and recipe, its dry run), switch, down, status, logs."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .. import views
from ..output import console, err_console, print_json, to_jsonable
from ..redaction import redact_data
from .base import (
    ChatTemplateOpt,
    CtxOpt,
    EngineBinOpt,
    EngineOpt,
    FromPlanOpt,
    JsonOpt,
    KeyEnvOpt,
    KeyFileOpt,
    KeyOpt,
    KvOpt,
    KvUnifiedOpt,
    ParallelOpt,
    PickOpt,
    PlanRigOpt,
    PortOpt,
    PriorityOpt,
    ThreadsOpt,
    TimeoutOpt,
    ToolsTemplateOpt,
    TpOpt,
    app,
    launch_args,
    planned_pick,
    show,
    start_server,
    typed_launch_args,
)

if TYPE_CHECKING:
    from ..flows import Pick
    from ..launchargs import LaunchArgs

# recipe --compose / up --docker (compose.py, flows.docker)
_COMPOSE = typer.Option(False, "--compose",
                        help="Write a docker-compose.yml for the engine's official image instead (printed, or to "
                             "--out), validated against the Compose specification.")
_OUT = typer.Option(None, "--out", help="With --compose: write the compose file here (a folder: its "
                                        "docker-compose.yml).")
_HOST = typer.Option(None, "--host", help="With --compose / --docker: the host address the port is published on "
                                          "(default 127.0.0.1, this machine only).")
_DOCKER = typer.Option(False, "--docker", help="Run the engine's official image with Docker Compose (the file "
                                               "`recipe --compose` writes) and wait until it is healthy.")


_UP_HELP = ("Start a managed server for MODEL and wait until it is healthy and placed as planned. With --priority "
            "(or --from-plan) it launches the plan's pick; flags given as well override the plan. Extra engine args "
            "go after `--`. --dry-run prints what would run instead (as `engineroom recipe`).")
_RECIPE_HELP = ("Print the command line and environment `up` would run (the plan's pick with --priority), without "
                "running it, downloading anything or needing the engine installed: `up --dry-run`, with up's options "
                "(--compose writes the compose file instead).")


def up(
    ctx_: typer.Context,
    model: str | None = typer.Argument(None, help="Model reference: packaged name, .gguf path, hf:ORG/REPO/FILE.gguf "
                                          "(with --from-plan: taken from the plan)."),
    ctx: int | None = CtxOpt, port: int | None = PortOpt, threads: int | None = ThreadsOpt,
    parallel: int | None = ParallelOpt, kv_unified: bool | None = KvUnifiedOpt, engine_bin: Path | None = EngineBinOpt,
    chat_template: Path | None = ChatTemplateOpt, tools_template: bool = ToolsTemplateOpt,
    timeout: float | None = TimeoutOpt, engine: str | None = EngineOpt, kv_dtype: str | None = KvOpt,
    tp: int | None = TpOpt,
    priority: str | None = PriorityOpt, rig: str | None = PlanRigOpt, from_plan: Path | None = FromPlanOpt,
    pick: int = PickOpt, api_key_env: str | None = KeyEnvOpt, api_key_file: Path | None = KeyFileOpt,
    api_key: str | None = KeyOpt, docker: bool = _DOCKER, host: str | None = _HOST,
    accept_placement: bool = typer.Option(
        False, "--accept-placement",
        help="Keep the server running when the engine places it otherwise than planned (layers or buffers on the "
             "host, weights at another precision than the pick's, a smaller context, fewer slots); without it such "
             "a launch is stopped. The acceptance is recorded with the launch."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run (command line, environment, fit's "
                                                          "prediction; with --docker or --compose the compose file) "
                                                          "and start nothing: the same as `engineroom recipe`."),
    compose_file: bool = _COMPOSE, out_file: Path | None = _OUT,
    head_addr: str | None = typer.Option(None, "--head-addr",
                                         help="With --dry-run, a pick spanning nodes (--rig 2x(8xH100)): the head "
                                              "node's address on the cluster network, written into every node's "
                                              "command."),
    json_out: bool = JsonOpt,
) -> None:
    """`up`, and `recipe` (the same options: `up --dry-run`)."""
    from .. import flows
    from ..errors import BadInput

    dry_run = dry_run or ctx_.info_name == "recipe"
    log = flows.StageLog()       # the stage runner's record of this launch: plan (when asked), launch
    args = launch_args(ctx, port, threads, parallel, kv_unified, engine_bin, chat_template, tools_template,
                       timeout, ctx_.args, engine=engine, kv_dtype=kv_dtype, tp=tp, api_key_env=api_key_env,
                       api_key_file=api_key_file)
    model, chosen = planned_pick(ctx_, model, args, priority=priority, rig=rig, from_plan=from_plan, pick=pick,
                                 missing=f"name a model, e.g. `engineroom {ctx_.info_name} smollm2-135m` "
                                         "(or give --from-plan FILE).", log=log)
    if dry_run:                  # what would run: nothing started, downloaded or needed
        if compose_file or docker or out_file is not None or host is not None:
            _compose_recipe(model, args, chosen, compose_file=compose_file or docker, out=out_file, host=host,
                            json_out=json_out, api_key=api_key)
        else:
            _print_recipe(model, args, chosen, head_addr=head_addr, api_key=api_key, json_out=json_out)
        return
    given = [f for f, on in (("--compose", compose_file), ("--out", out_file is not None),
                             ("--head-addr", head_addr is not None)) if on]
    if given:
        verb = "prints" if len(given) == 1 else "print"
        raise BadInput(f"{', '.join(given)} {verb} what would run: add --dry-run (or use `engineroom recipe`).")
    if docker or host is not None:
        _docker_up(model, args, chosen, docker=docker, host=host, json_out=json_out, api_key=api_key)
        return
    start_server(flows.up, model, args, json_out, pick=chosen, log=log, accept_placement=accept_placement,
                 api_key=api_key)


# one option list, two names: `recipe` is `up --dry-run`
_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
app.command("up", context_settings=_EXTRA, help=_UP_HELP)(up)
app.command("recipe", context_settings=_EXTRA, help=_RECIPE_HELP)(up)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def switch(
    ctx_: typer.Context,
    model: str = typer.Argument(...),
    ctx: int | None = CtxOpt, port: int | None = PortOpt, threads: int | None = ThreadsOpt,
    parallel: int | None = ParallelOpt, kv_unified: bool | None = KvUnifiedOpt, engine_bin: Path | None = EngineBinOpt,
    chat_template: Path | None = ChatTemplateOpt, tools_template: bool = ToolsTemplateOpt,
    timeout: float | None = TimeoutOpt, engine: str | None = EngineOpt, kv_dtype: str | None = KvOpt,
    tp: int | None = TpOpt,
    api_key_env: str | None = KeyEnvOpt, api_key_file: Path | None = KeyFileOpt, api_key: str | None = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Start MODEL in the managed server's place. The new model is checked before the old server stops;
    options not given again (extra engine args after `--` included) are kept from the running server."""
    from .. import flows

    start_server(flows.switch, model, launch_args(ctx, port, threads, parallel, kv_unified, engine_bin,
                                             chat_template, tools_template, timeout, ctx_.args,
                                             engine=engine, kv_dtype=kv_dtype, tp=tp, api_key_env=api_key_env,
                                             api_key_file=api_key_file),
           json_out, given=typed_launch_args(ctx_), api_key=api_key)


def _print_recipe(model: str, args: LaunchArgs, chosen: Pick | None, *, head_addr: str | None, api_key: str | None,
                  json_out: bool) -> None:
    """What `up` would run for these arguments (recipe, and up --dry-run): the command line, the environment,
    fit's prediction and the engine's own parser's verdict; exit 1 when that parser refuses it."""
    from .. import flows
    from ..flows import validation
    from ..redaction import redact_argv

    prepared = flows.prepare(model, args, download=False, require_binary=False, pick=chosen, head_addr=head_addr,
                             api_key=api_key)
    checked = validation.check(prepared)        # the installed engine's own parser, when there is one
    # a key the engine reads from its environment is printed as a mask, like everywhere else
    spec = replace(prepared.spec, env=redact_data(prepared.spec.env))
    if prepared.cluster and chosen is not None:
        if json_out:
            print_json({"engine": spec.engine, "cluster": chosen.cluster, "head_addr_given": head_addr is not None,
                        "steps": [{"node": s.node, "role": s.role, "argv": redact_argv(list(s.argv)),
                                   "env": redact_data(s.env)} for s in prepared.cluster],
                        "engine_installed": checked.installed, "validation": checked.as_dict(),
                        "plan": {"source": chosen.source, "notes": list(chosen.notes)}})
        else:
            for line in views.cluster_recipe_lines(prepared.cluster, chosen, head_given=head_addr is not None):
                console.print(line, markup=False, soft_wrap=True)
            console.print(f"# {checked.line()}", markup=False, soft_wrap=True)
        if not checked.ok:
            raise typer.Exit(1)
        return
    argv = redact_argv(list(spec.argv))
    served = Path(spec.model_path)       # a file (GGUF) or a model folder (vLLM, SGLang)
    model_present = served.is_file() or (served / "config.json").is_file()
    out = {"engine": spec.engine, "argv": argv, "env": spec.env, "url": spec.url, "model": spec.model,
           "model_path": spec.model_path, "model_present": model_present,
           "engine_installed": checked.installed, "validation": checked.as_dict(), "changes": list(spec.changes),
           "notes": list(spec.notes),    # what the adapter rendered beyond the request, and why (as the text says)
           "predicted_memory": prepared.prediction.components if prepared.prediction else {},
           "prediction_missing": prepared.prediction.why_none if prepared.prediction else "",
           "plan": None if chosen is None else {"source": chosen.source, "notes": list(chosen.notes)}}
    if json_out:
        print_json(out)
    else:
        for line in views.recipe_lines(spec, argv, chosen, checked=checked.line(), model_present=model_present,
                                       model=model):
            console.print(line, markup=False, soft_wrap=True)
    if not checked.ok:
        raise typer.Exit(1)             # the engine's own parser refused it: marked above, and a failure


@app.command()
def down(json_out: bool = JsonOpt) -> None:
    """Stop the managed server and every process it started."""
    from .. import apikey, flows

    state = flows.stop()
    apikey.forget()           # no server runs: engineroom's key files are not needed
    if json_out:
        print_json(redact_data({"stopped": state is not None, "server": to_jsonable(state)}))
    else:
        show(views.down_line(state))


@app.command()
def status(json_out: bool = JsonOpt) -> None:
    """Is the managed server running and healthy?"""
    from .. import launch

    st = launch.status()
    if json_out:
        print_json(redact_data(to_jsonable(st)))
    else:
        show(views.status_lines(st))
    if not st.running:
        raise typer.Exit(1)   # scripts can test `engineroom status` alone


@app.command()
def logs(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    lines: int = typer.Option(40, "--lines", "-n", help="How many last lines to show."),
    json_out: bool = JsonOpt,
) -> None:
    """Show the managed server's log."""
    from .. import launch
    from ..errors import BadInput

    if lines < 0:
        raise BadInput(f"--lines must be 0 or more, not {lines}.")
    state = launch.read_state()
    log_path = state.log_path if state is not None else str(launch.last_log())
    if state is None and not Path(log_path).is_file():
        from ..errors import NotFound

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



def _compose_recipe(model: str, args: LaunchArgs, chosen: Pick | None, *, compose_file: bool, out: Path | None,
                    host: str | None, json_out: bool, api_key: str | None) -> None:
    from .. import compose, flows
    from ..errors import BadInput

    if not compose_file:
        raise BadInput("--out and --host go with --compose (a recipe's plain command line is printed).")
    done = flows.compose_recipe(model, args, out=out, bind=host or compose.DEFAULT_BIND, pick=chosen, api_key=api_key)
    r = done.recipe
    if json_out:
        # the document holds no secret (compose.render refuses one); its text is printed as written, since
        # text redaction would take `HF_TOKEN: null` (pass-through from the shell) for an assignment
        print_json({**redact_data({
            "engine": done.prepared.spec.engine, "image": r.image, "image_source": r.image_source,
            "project": r.project, "service": r.service, "url": r.url, "path": str(done.path) if done.path else None,
            "validated": done.checks, "notes": list(r.notes), "mounts": [to_jsonable(m) for m in r.mounts],
            "compose": r.document}), "yaml": done.text})
        return
    if done.path is None:
        sys.stdout.write(done.text)
        return
    console.print(f"wrote {done.path}: {r.image} serving on {r.url}; validated by "
                  f"{', '.join(f'{k} ({v})' for k, v in done.checks.items())}", markup=False, soft_wrap=True)
    console.print(f"run it: docker compose -p {r.project} -f {done.path} up -d", markup=False, soft_wrap=True)


def _docker_up(model: str, args: LaunchArgs, chosen: Pick | None, *, docker: bool, host: str | None, json_out: bool,
               api_key: str | None) -> None:
    from .. import compose, flows
    from ..errors import BadInput

    if not docker:
        raise BadInput("--host goes with --docker (a managed server listens on 127.0.0.1 only).")
    with console.status(f"starting {model} in a container") as spin:
        server = flows.docker_up(model, args, bind=host or compose.DEFAULT_BIND, pick=chosen,
                                 say=lambda msg: spin.update(msg),
                                 on_wait=lambda phase, t: spin.update(f"{model}: {phase} ({t:.0f} s)"),
                                 api_key=api_key)
    if json_out:
        print_json(redact_data(to_jsonable(server)))
        return
    console.print(f"{server.engine} ready in {server.ready_s:.0f} s at {server.url} ({server.image}, compose project "
                  f"{server.project}: {server.compose_file})", markup=False, soft_wrap=True)
    console.print(f"stop it: {' '.join(server.down)}", markup=False, soft_wrap=True)
