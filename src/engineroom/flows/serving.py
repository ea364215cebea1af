"""Launching: check everything first, render through the adapter, start, record predicted vs measured."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import apikey, engines, hardware, launch, models
from ..engines.base import LaunchSpec
from ..errors import BadInput, EngineFailed, EngineroomError, NotFound
from ..launchargs import LaunchArgs
from ..redaction import redact_data
from ..refs import ModelRef
from ..store import Store

if TYPE_CHECKING:
    from ..arch import ModelArch
    from ..plan.request import LaunchRequest

from .picks import Pick, launch_options, typed_request
from .prediction import Prediction, placement_check, predict_memory, process_memory
from .prepared import Prepared

DEFAULT_PORT = 8080


def check_port(port: int | None) -> int | None:
    """None: the default port; 0: a free port; anything else must be a TCP port number."""
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be between 1 and 65535 (0 picks a free port); got {port}.")
    return port


def check_ctx(ctx: int | None, arch: ModelArch, extra_args: Sequence[str], adapter: engines.Engine) -> None:
    """fit's rule (positive, not beyond the model's positions unless RoPE scaling is asked for),
    with the engine's RoPE-scaling arguments found among the extra ones by its adapter."""
    from ..fit import check_ctx as fit_check_ctx

    if ctx is None:
        return
    rope = adapter.rope_scaling_arg(extra_args)
    try:
        fit_check_ctx(arch, ctx, rope)
    except BadInput as exc:
        example = adapter.rope_scaling_example(-(-ctx // max(arch.max_position or 1, 1)))
        raise BadInput(f"{str(exc).rstrip('.')}: engine arguments go after `--`, e.g. `-- {example}`.") from None


def check_bind_args(spec: LaunchSpec, extra_args: Sequence[str]) -> None:
    """Refuse engine arguments (after `--`) that change where the managed server listens: the
    adapter renders the address and port engineroom asked for, and a second flag after them would
    win unseen (``status`` and every client would look at 127.0.0.1 while the engine listened
    elsewhere, 0.0.0.0 included). The flags are the ones the adapter itself put before the host and
    the port in the rendered argv (the user's arguments come last), so no engine's flag is named here."""
    extra = list(extra_args)
    rendered = list(spec.argv[:len(spec.argv) - len(extra)] if extra else spec.argv)
    flags = {rendered[i - 1] for i, token in enumerate(rendered)
             if i > 0 and token in (spec.host, str(spec.port)) and rendered[i - 1].startswith("-")}
    given = [a for a in extra if a in flags or a.split("=", 1)[0] in flags]
    if given:
        raise BadInput(f"{', '.join(sorted({a.split('=', 1)[0] for a in given}))} after `--` would change where the "
                       "managed server listens unseen; give engineroom's --port instead (a managed server listens "
                       "on 127.0.0.1, this machine only; to serve other machines, `engineroom up MODEL --docker --host "
                       "ADDR` publishes the port on ADDR).")


# --------------------------------------------------------------------------- prepare / start
HEAD_PLACEHOLDER = "head-node"   # the head's address in a printed cluster recipe when none is given


def prepare(
    model_ref: str | ModelRef,
    args: LaunchArgs | None = None,
    *,
    say: Callable[[str], None] | None = None,
    pick: Pick | None = None,
    download: bool = True,
    require_binary: bool = True,
    api_key: str | None = None,
    head_addr: str | None = None,
    container: bool = False,
) -> Prepared:
    """Resolve and pull the model, find and check the engine, render its LaunchSpec, predict
    its memory; start nothing. ``download=False, require_binary=False``: a recipe (what would run).
    ``container``: rendered for the engine's container image, which brings its own program, so
    the adapter's stand-in program is rendered (nothing of this machine's install leaks in).
    ``pick``: the plan's LaunchRequest is what is rendered, each field of ``args`` given (not None)
    replacing its own (``engine`` None: the pick's, else the default engine). ``api_key``: a key
    typed on the command line, written to a private file here (``args`` keeps references only)."""
    from ..cpuprobe import probe_cpu

    args = args or LaunchArgs()
    request = typed_request(str(getattr(model_ref, "raw", model_ref)), pick, args, engines.DEFAULT_ENGINE)
    engine = request.engine
    if pick is not None:       # the plan's settings, as launched (switch keeps them)
        args = replace(args, ctx=request.ctx, parallel=request.parallel, kv_unified=request.kv_unified,
                       kv_dtype=request.kv_dtype, tp=request.tp, threads=request.threads)
    args = replace(args, engine=engine)
    ctx, port, host, threads, parallel, tp = args.ctx, args.port, args.host, args.threads, args.parallel, args.tp
    engine_bin, tools_template, extra_args = args.engine_bin, args.tools_template, list(args.extra_args)
    chat_template = Path(args.chat_template) if args.chat_template else None
    port = check_port(port)
    if pick is not None and pick.cluster and download:
        raise BadInput(f"the plan's pick spans {pick.cluster['nodes']} machines; engineroom launches one machine: "
                       "`engineroom recipe` with the same arguments prints each node's command.")
    if ctx is not None and ctx <= 0:
        raise BadInput(f"--ctx must be a positive number of tokens; got {ctx}.")
    if parallel is not None and parallel <= 0:
        raise BadInput(f"--parallel must be at least 1; got {parallel}.")
    if threads is not None and threads <= 0:
        raise BadInput(f"--threads must be at least 1; got {threads}.")
    if tp is not None and tp <= 0:
        raise BadInput(f"--tp must be at least 1; got {tp}.")
    if not engines.has_adapter(engine):
        raise NotFound(f"engineroom has no adapter for {engine} yet, so it cannot launch it (it can launch: "
                       f"{', '.join(engines.names())}); `engineroom plan` still sizes it.")
    adapter = engines.adapter(engine)
    if parallel is not None and adapter.max_parallel and parallel > adapter.max_parallel:
        raise BadInput(f"--parallel {parallel} is more sequences than {engine} serves at once; give at most "
                       f"{adapter.max_parallel}.")
    try:
        if container:
            raise NotFound(f"{engine} runs from its image")
        if pick is not None and pick.other_rig and not download:
            raise NotFound(f"the recipe is for {pick.other_rig}, not this machine")
        binary = adapter.find_binary(engine_bin)
        found = True
    except NotFound as exc:
        if require_binary and not container:
            raise NotFound(f"{str(exc).rstrip('.')}; `engineroom recipe` with the same arguments prints the "
                           "command line it would run.", detail=exc.detail) from None
        # a container recipe is for the engine's GPU image; a recipe for another rig, for that rig
        vendor = "nvidia" if container else (pick.other_vendor if pick and pick.other_rig else None)
        binary, found = adapter.placeholder_binary(vendor), False
    probe = probe_cpu()
    if found and require_binary:
        adapter.check_binary_cpu(binary, probe)
    if download:
        mref, path = models.local_model(model_ref, say)
        refusal = adapter.loads_refusal(path)
        if refusal:
            raise BadInput(refusal)
    else:                                 # a recipe: where the file is, or will be once pulled
        mref = models.resolve(model_ref)
        path = mref.served_path or Path(str(model_ref))
    arch = _read_arch(path)
    if ctx is not None and arch is not None:
        check_ctx(ctx, arch, extra_args, adapter)
    # what the engine serves for that file (an engine that serves folders converts a GGUF once;
    # a recipe converts nothing)
    serve_path = (adapter.serving_model(path, (lambda _f, m: say(m)) if say else None,
                                        weights_format=request.weights.format) if download else path)
    arch = served_arch(arch, Path(path), Path(serve_path))
    template = chat_template or (Path(request.chat_template) if request.chat_template else None)
    if tools_template:
        if template is not None:
            raise BadInput("give either --chat-template-file or --tools-template, not both.")
        if mref is None or mref.tool_template is None:
            raise BadInput(f"{getattr(model_ref, 'raw', model_ref)} has no tool-capable chat template in engineroom; "
                           "pass --chat-template-file.")
        template = mref.tool_template
        request = with_template_parser(request, mref.tool_template_calls)
    changes = adapter.cpu_adjustments(probe, extra_args)
    if port is None:
        port = DEFAULT_PORT
    elif port == 0:
        port = launch.free_port(host)
    # the key by reference (apikey.py): a key after `--` is moved out of the argv; options keep references
    key = apikey.for_launch(api_key=api_key, api_key_env=args.api_key_env, api_key_file=args.api_key_file,
                            extra_args=extra_args, split=adapter.split_api_key, write=download)
    extra_args = list(key.extra_args)
    args = replace(args, extra_args=tuple(extra_args), api_key_env=key.env, api_key_file=key.file_ref)
    request = replace(request, chat_template=str(template) if template else None)
    try:
        projector = _projector(request, download, say)
        lopts = launch_options(
            request, model_path=serve_path, projector=projector, model_name=mref.name,
            port=port, host=host, extra_args=tuple(extra_args), changes=tuple(changes),
            api_key_file=key.file,
        )
        settled = adapter.launch_settings(lopts, trained_ctx=arch.max_position if arch is not None else None)
        model_id, quant = (request.model, request.weights.quant) if pick else ("", "")
        if not model_id and mref is not None and getattr(mref, "catalog_id", None):
            model_id = mref.catalog_id or ""
        if settled.ctx is None and arch is None:
            prediction = Prediction({}, {}, "", "no --ctx and no model file to read the trained context from")
        else:
            prediction = predict_memory(engine, arch, settled, probe, model_id=model_id, quant=quant)
        # a cache the engine grows in host RAM, kept within what this launch leaves there (sized for this
        # machine: not for a container image's machine, another rig or a cluster's nodes)
        here = not container and not (pick is not None and (pick.other_rig or pick.cluster))
        if here and prediction.host_spare_bytes is not None:
            cache = adapter.host_cache_change(prediction.host_spare_bytes, extra_args)
            if cache is not None:
                lopts = replace(lopts, changes=(*lopts.changes, cache))
        spec = adapter.render(binary, lopts)
        check_bind_args(spec, extra_args)
        cluster: tuple[LaunchSpec, ...] = ()
        if pick is not None and pick.cluster:
            # the commands run on the cluster's machines, not this one: the engine's plain name
            c = pick.cluster
            cluster = tuple(adapter.render_cluster(
                adapter.placeholder_binary(pick.other_vendor or "nvidia"), lopts, nodes=c["nodes"],
                gpus_per_node=c["gpus_per_node"],
                head_addr=head_addr or HEAD_PLACEHOLDER, pipeline=c["pp"] > 1))
    except BaseException:
        apikey.discard(key)
        raise
    return Prepared(spec, args, prediction, pick, found, key=key, cluster=cluster, request=request)


def _typed_over(pick: Pick, request: LaunchRequest | None, extra_args: Sequence[str] = ()) -> list[str]:
    """The request fields the user typed with a value other than the pick's, and "engine_args" where engine
    arguments were typed after `--` (either way the launch is not the pick's, nor are its speeds)."""
    typed = [] if request is None else [f for f in request.given
                                        if getattr(request, f, None) != getattr(pick.request, f, None)]
    return typed + (["engine_args"] if extra_args else [])


def with_template_parser(request: LaunchRequest, calls: str | None) -> LaunchRequest:
    """``request`` serving engineroom's tools template, which writes tool calls in the format
    ``calls``: the engine's tool parser for that format (its catalog parsers table), where the
    request names none (vLLM refuses ``tool_choice: auto`` without one); unchanged otherwise."""
    from ..catalog import load_catalog

    engine = load_catalog().engine(request.engine) if calls and request.tool_parser is None else None
    parsers = engine.parsers.get(calls or "") if engine is not None else None
    return replace(request, tool_parser=parsers.tool) if parsers is not None and parsers.tool else request


def _projector(request: LaunchRequest, download: bool, say: Callable[[str], None] | None) -> Path | None:
    """Where the request's projector file is on this machine (pulled when ``download``), or None."""
    if not request.projector:
        return None
    if download:
        return models.local_model(request.projector, say)[1]
    ref = models.resolve(request.projector)
    return ref.served_path or Path(request.projector)


@contextmanager
def dropping_key(prepared: Prepared) -> Iterator[None]:
    """A block on the way to ``prepared``'s launch: if it fails (an error, Ctrl-C), the key file written
    for that launch is removed, since the launch does not happen."""
    try:
        yield
    except BaseException:
        if prepared.key is not None:
            apikey.discard(prepared.key)
        raise


def launch_prepared(prepared: Prepared, **kwargs: Any) -> launch.ServerState:
    """launch.up for ``prepared``, keeping engineroom's key files in step: the new launch's file
    is removed if it does not start, the older launches' files once it has."""
    with dropping_key(prepared):
        state = launch.up(prepared.spec, args=prepared.args, hide_env=apikey.hidden_env(prepared.args), **kwargs)
    apikey.keep_only(prepared.key.file if prepared.key else None)
    served = Path(state.model_path)
    if served.is_file():   # the served file's own digest, kept with the launch (cached by path, size and mtime)
        try:
            state = launch.update_state(state, model_sha256=models.file_sha256(served))
        except OSError:
            pass
    return state


def served_arch(arch: ModelArch | None, path: Path, serve_path: Path) -> ModelArch | None:
    """The architecture fit sizes a launch by: that of the model file at ``path`` (a GGUF's tensor table is
    exact), unless the file has no tensors (a random-weight file's shape alone, for an engine that makes the
    weights itself) and the engine serves a folder made from it (``serve_path``): then the folder's config.json,
    which is what the engine builds (its layer kinds, tied head, vision tower and quantization_config, none of
    which a tensorless header tells). A folder served as itself was read already."""
    if (arch is not None and arch.tensor_bytes) or serve_path == path:
        return arch
    if serve_path.is_dir() and (serve_path / "config.json").is_file():
        return _read_arch(serve_path) or arch
    return arch


def _read_arch(path: Path) -> ModelArch | None:
    """The architecture from the model file's header (a folder: its config.json), or None when
    engineroom cannot describe it (the engine has the last word on such a file). A GGUF whose
    header does not parse in full, or that is shorter than its tensors, is refused here
    (``models.check_gguf``'s sentence): nothing is stopped or started for a damaged file."""
    from ..arch import arch_from_config, arch_from_gguf

    if path.is_dir():      # a Hugging Face folder (vLLM, SGLang): its config.json, weights there or not
        try:
            return arch_from_config(path / "config.json", name=path.name) if (path / "config.json").is_file() else None
        except (EngineroomError, OSError, ValueError):
            return None
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise BadInput(f"cannot read {path} ({exc.strerror}).") from None
    if magic == models.GGUF_MAGIC:
        models.check_gguf(path)
    try:
        return arch_from_gguf(path)
    except (EngineroomError, OSError, ValueError):
        return None


def start(model_ref: str | ModelRef, args: LaunchArgs | None = None, *,
          say: Callable[[str], None] | None = None,
          on_wait: Callable[[str, float], None] | None = None,
          on_spawn: Callable[[int], None] | None = None, pick: Pick | None = None,
          accept_placement: bool = False, api_key: str | None = None) -> launch.ServerState:
    """Pull if needed, check the engine for this machine, render its command line, start it; return once
    healthy and placed as planned (``accept_placement``: keep a launch the engine placed otherwise)."""
    from .validation import require

    prepared = prepare(model_ref, args, say=say, pick=pick, api_key=api_key)
    checked = require(prepared)               # the engine's own parser, before anything starts
    state = launch_prepared(prepared, timeout=prepared.args.timeout, on_wait=on_wait, on_spawn=on_spawn)
    state = launch.update_state(state, notes=[*state.notes, checked.line()])
    return record_launch(state, prepared, accept_placement=accept_placement)


def record_launch(state: launch.ServerState, prepared: Prepared, *,
                  accept_placement: bool = False) -> launch.ServerState:
    """Keep fit's prediction beside what the engine reported, in the state file and the store; a
    launch the engine placed otherwise than planned (``placement_check``) is recorded, stopped and
    refused in one sentence, unless ``accept_placement`` (then the acceptance is recorded)."""
    from ..memory import compare, rows_as_dicts

    pred = prepared.prediction
    measured, measured_source, sources = process_memory(state)
    memory = {
        "predicted": pred.components if pred else {},
        "fit_request": pred.request if pred else {},
        "predicted_for": pred.rig if pred else "",
        "prediction_missing": (pred.why_none if pred else "no prediction was made"),
        "measured": measured,
        "measured_source": measured_source,
        "rows": rows_as_dicts(compare(pred.components if pred else {}, measured, sources)),
    }
    placed = placement_check(state.engine, state.log_path, pred, accept_placement)
    memory["placement"] = placed.as_dict()
    if prepared.pick is not None:
        memory["plan"] = {"source": prepared.pick.source, "row": {k: v for k, v in prepared.pick.plan.items()
                                                                   if k not in ("reasons", "tradeoffs")},
                          "notes": list(prepared.pick.notes),
                          # the fields typed over the plan's with another value: the row's speeds are not
                          # this launch's then
                          "typed": _typed_over(prepared.pick, prepared.request, prepared.args.extra_args)}
    state = launch.update_state(state, memory=memory)
    try:
        with Store() as store:
            run_id = store.start_run("launch", redact_data({
                "engine": state.engine, "engine_version": state.engine_version, "model": state.model,
                "model_path": state.model_path, "model_sha256": state.model_sha256,
                "argv": state.argv, "launch_changes": list(state.changes),
                "host": hardware.host_summary(), **({"plan": memory["plan"]} if "plan" in memory else {}),
                "fit_request": memory["fit_request"], "predicted_for": memory["predicted_for"],
                # what the card's memory section reads, so `engineroom report RUN` shows the launch
                "memory": {k: memory[k] for k in ("rows", "measured_source", "predicted_for", "prediction_missing",
                                                  "placement")},
            }), label=f"up {state.model}")
            for row in memory["rows"]:
                store.add_record(run_id, "memory_component", row)
            store.add_record(run_id, "placement", placed.as_dict())
            store.finish_run(run_id, "FAIL" if placed.status == "differs" else "OK",
                             {"memory": memory["rows"], "measured_source": memory["measured_source"],
                              "prediction_missing": memory["prediction_missing"] if not pred or pred.why_none else "",
                              "placement": placed.status, "placement_detail": placed.detail})
        state = launch.update_state(state, launch_run_id=run_id)
    except (sqlite3.Error, OSError, EngineroomError):
        pass   # the server is up; a results store that cannot be written must not take it down
    if placed.status == "differs":
        stop()   # not what was planned: nothing keeps running under the plan's name
        raise EngineFailed(placed.detail, detail=f"log: {state.log_path}")
    return state


def stop(timeout: float = 10.0) -> launch.ServerState | None:
    """Stop the managed server, then keep what the engine said about memory as it exited (llama.cpp
    prints its memory breakdown table at exit) with the launch's record; None when none ran."""
    state = launch.down(timeout=timeout)
    if state is None or state.launch_run_id is None or not engines.has_adapter(state.engine):
        return state
    try:
        text = Path(state.log_path).read_text(errors="replace")
    except OSError:
        return state
    report = engines.adapter(state.engine).memory_report(text)
    totals = {c.name: c.bytes for c in report.components if c.name.startswith("total:")} if report else {}
    if totals:
        try:
            with Store() as store:
                store.add_record(state.launch_run_id, "memory_at_exit",
                                 {"totals": totals, "source": report.source if report else ""})
        except (sqlite3.Error, OSError, EngineroomError):
            pass   # the server is stopped either way; a store that cannot be written loses only this
    return state
