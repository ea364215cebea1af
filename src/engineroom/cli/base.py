"""The engineroom command line: the app, its shared options and helpers (commands live beside it).

Tables and lines are built in views.py from the results, so this module holds no formatting
and the views can be tested on constructed data without running a command.

Every command takes ``--json``. Errors a user can cause end in one sentence on stderr and a
non-zero exit code (see ``errors.py``); nothing here branches on an engine's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from ..flows import Pick, StageLog
    from ..launch import ServerState

from pathlib import Path

import typer

from .. import __version__, views
from ..launchargs import LaunchArgs, check_timeout
from ..output import console, err_console, print_json, to_jsonable
from ..progress import WaitProgress
from ..redaction import redact_data

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


def show(items: Any, to: Console = console) -> None:
    """Print a view (views.py): one renderable, or a list of them in order."""
    for item in items if isinstance(items, list) else [items]:
        to.print(item)




def launch_args(ctx: int | None, port: int | None, threads: int | None, parallel: int | None,
                 kv_unified: bool | None, engine_bin: Path | None, chat_template: Path | None,
                 tools_template: bool, timeout: float | None, extra: Sequence[str] | None, *,
                 engine: str | None = None, kv_dtype: str | None = None, tp: int | None = None,
                 api_key_env: str | None = None, api_key_file: Path | None = None) -> LaunchArgs:
    """The launch's arguments as typed (a key typed with --api-key is not one of them: it goes to
    ``flows.prepare`` alone, which writes it to a private file and keeps the file's path)."""
    check_timeout(timeout)
    return LaunchArgs(engine=engine, ctx=ctx, parallel=parallel, kv_unified=kv_unified, kv_dtype=kv_dtype, tp=tp,
                      port=port, threads=threads, engine_bin=str(engine_bin) if engine_bin else None,
                      chat_template=str(chat_template) if chat_template else None,
                      tools_template=tools_template, extra_args=tuple(extra or ()), timeout=timeout,
                      api_key_env=api_key_env, api_key_file=str(api_key_file) if api_key_file else None)


def typed_launch_args(ctx_: typer.Context) -> list[str]:
    """The launch arguments typed on this command line, by LaunchArgs field (``switch`` keeps the
    others from the running server; a plan's pick fills the others); ``api_key``: a key typed."""
    names = ("ctx", "port", "threads", "parallel", "kv_unified", "engine_bin", "chat_template",
             "tools_template", "timeout", "engine", "kv_dtype", "tp", "api_key", "api_key_env", "api_key_file")

    def typed(param: str) -> bool:   # by name: typer vendors its own click, with its own enum
        source = ctx_.get_parameter_source(param)
        return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")

    given = [name for name in names if typed(name)]
    if ctx_.args:
        given.append("extra_args")
    return given


def planned_pick(ctx_: typer.Context, model: str | None, args: LaunchArgs, *, priority: str | None,
             rig: str | None, from_plan: Path | None, pick: int, missing: str,
             log: StageLog | None = None) -> tuple[str, Pick | None]:
    """The model and the plan's pick `up` and `recipe` run (the pick when one is asked for:
    ``flows.prepare`` renders its LaunchRequest with every argument typed here replacing its field);
    ``log``: the stage runner's record the plan stage goes to (`up` launches with it)."""
    from .. import flows
    from ..errors import BadInput

    typed_engine = args.engine if "engine" in typed_launch_args(ctx_) else None
    chosen = flows.planned(model, log if log is not None else flows.StageLog(), priority=priority, rig=rig,
                           from_plan=from_plan, pick=pick, engine=typed_engine)
    if chosen is not None:
        model = chosen.model_ref
    if model is None:
        raise BadInput(missing)
    return model, chosen


def start_server(fn: Callable[..., ServerState], model: str, args: LaunchArgs, json_out: bool,
           **extra: Any) -> ServerState:
    pick = extra.get("pick")
    if pick is not None and not json_out:
        show(views.pick_lines(pick))
    # a spinner on a terminal, progress lines in a pipe (vLLM's cold start is minutes of silence otherwise)
    with WaitProgress(model, err_console) as waiting:   # stderr: --json's stdout stays one document
        state = fn(model, args, say=waiting.say, on_wait=waiting.wait, **extra)
    if json_out:
        print_json(redact_data(to_jsonable(state)))
    else:
        show(views.started_lines(state, picked_port=args.port == 0))
    return state


CtxOpt = typer.Option(None, "--ctx", "-c",
                    help="Context per sequence (tokens), as plan and fit size it: each of the --parallel slots "
                         "holds this many (llama.cpp: -c ctx x slots); at most the model's trained maximum unless RoPE "
                         "scaling is passed after `--`.")
QuietWaitOpt = typer.Option(60.0, "--quiet-wait",
                           help="Before measuring, wait up to S seconds for other processes to leave the engine's "
                                "and the client's cores, then refuse (0: refuse at once).")
BusyOkOpt = typer.Option(False, "--busy-ok",
                         help="Measure on a busy machine anyway; the run is judged on the contention it saw "
                              "(INVALID above the limits).")
PortOpt = typer.Option(None, "--port", "-p", help="Port (default 8080; 0 picks a free one; bound to 127.0.0.1).")
ThreadsOpt = typer.Option(None, "--threads", "-t", help="CPU threads.")
ParallelOpt = typer.Option(None, "--parallel",
                         help="Server slots (concurrent sequences; default: the engine's, llama.cpp 4).")
KvUnifiedOpt = typer.Option(None, "--kv-unified/--no-kv-unified",
                        help="One KV pool shared by all slots (default: the engine's; llama.cpp: unified when "
                             "--parallel is not given).")
EngineBinOpt = typer.Option(None, "--engine-bin", help="Explicit engine binary.")
ChatTemplateOpt = typer.Option(None, "--chat-template-file", help="Jinja chat template to use instead of the model's.")
ToolsTemplateOpt = typer.Option(False, "--tools-template",
                                help="Use engineroom's tool-capable template for this model.")
TimeoutOpt = typer.Option(None, "--timeout", help="Seconds to wait for the server to become healthy "
                         "(default: the engine's: 300 s, longer for slow-starting engines).")
# API keys by reference (apikey.py): engineroom keeps a variable's name or a file's path, never the key
KeyEnvOpt = typer.Option(None, "--api-key-env", metavar="VAR",
                        help="Require this API key, read from environment variable VAR at launch (only the name is "
                             "kept).")
KeyFileOpt = typer.Option(None, "--api-key-file", metavar="PATH",
                         help="Require the API key in PATH, a file only you can read (chmod 600).")
KeyOpt = typer.Option(None, "--api-key", metavar="KEY",
                    help="Require this API key (written to a 0600 file of engineroom's; prefer --api-key-env, "
                         "which keeps the key off engineroom's own command line).")
ClientKeyEnvOpt = typer.Option(None, "--api-key-env", metavar="VAR",
                               help="Send the API key in environment variable VAR (default: the managed server's own).")
ClientKeyOpt = typer.Option(None, "--api-key", metavar="KEY",
                           help="Send this API key (prefer --api-key-env: a command line is visible to other users).")


EngineOpt = typer.Option(None, "--engine", "-e", help="Engine to launch (default: llama.cpp, or the plan's pick).")
KvOpt = typer.Option(None, "--kv",
                   help="KV cache type as the catalog names it (f16, q8_0, q4_0; default: the engine's, f16).")
TpOpt = typer.Option(None, "--tp", help="GPUs for one instance (default 1).")
PriorityOpt = typer.Option(None, "--priority",
                         help="Launch what `engineroom plan MODEL --priority P` ranks first for this machine.")
PlanRigOpt = typer.Option(None, "--rig",
                         help="Plan for this rig spec instead of this machine (the launch still runs here).")
FromPlanOpt = typer.Option(None, "--from-plan",
                          help="Launch a plan saved with `engineroom plan MODEL --json > plan.json`.")
PickOpt = typer.Option(1, "--pick", help="Which of the plan's configurations (1 = its first).")


def check_seconds(flag: str, value: float, *, least: float) -> None:
    """A number of seconds given on the command line: finite and at least ``least``, or one sentence."""
    import math

    from ..errors import BadInput

    if not (math.isfinite(value) and value >= least):
        raise BadInput(f"{flag} must be a number of seconds, {'0 or more' if least == 0 else f'at least {least:g}'}, "
                       f"not {value}.")


def check_at_least(*checks: tuple[str, int | None, int]) -> None:
    """Counts given on the command line (flag, value or None, least): each at least its least, or one sentence."""
    from ..errors import BadInput

    for flag, value, least in checks:
        if value is not None and value < least:
            raise BadInput(f"{flag} must be at least {least}, not {value}.")
