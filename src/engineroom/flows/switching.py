"""``switch``: the managed server replaced by another launch, never lost on the way.

Everything is checked before the running server stops (``prepare``: the model file's GGUF header
in full, the engine installed; the engine's own parser on the argv; fit's memory prediction
against what will be free), the arguments not given again are the running server's
(``carried_args``: never another engine's own binary, arguments or KV type), a planned launch
keeps its plan's request when the model and engine stay (``kept_pick``: weights, spec-decode,
parsers, vision, the engine's own options), and when the new server still does not come up the
old one is started again from its recorded command line and the error says so (``restore``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import apikey, engines, launch
from ..engines.base import LaunchSpec
from ..errors import BadInput, EngineroomError
from ..launchargs import FIELDS, LaunchArgs
from ..redaction import MASK
from ..refs import ModelRef
from .picks import Pick, pick_from_row
from .prepared import Prepared
from .serving import dropping_key, launch_prepared, prepare, record_launch, stop
from .stages import StageLog, record_stages
from .validation import require

# launch arguments that belong to one engine: a switch to another engine does not carry them
ENGINE_OWN_ARGS = ("engine_bin", "extra_args", "kv_dtype")
KEY_ARGS = ("api_key_env", "api_key_file")      # a key's references: replaced whole when a key is given


def carried_args(args: LaunchArgs, given: Sequence[str], current: launch.ServerState | None,
                 *, new_key: bool = False) -> tuple[LaunchArgs, list[str]]:
    """The arguments ``switch`` launches with: the ones given this time (``given`` names the fields
    typed), the running server's for the rest (its engine and port included). A switch to another
    engine keeps none of the old engine's own arguments (its binary, its extra arguments, its KV type);
    ``new_key``: a key was typed this time (``--api-key``), which replaces the running server's key
    references. The second value names the arguments left behind."""
    previous = current.args if current is not None else LaunchArgs()
    old_engine = (current.engine if current else None) or previous.engine
    new_engine = args.engine if "engine" in given else old_engine
    other_engine = old_engine is not None and new_engine is not None and new_engine != old_engine
    # a key given this time in any form (after `--` too) replaces the running server's reference whole
    split = engines.adapter(new_engine if new_engine and engines.has_adapter(new_engine)
                            else engines.DEFAULT_ENGINE).split_api_key
    new_key = new_key or any(k in given for k in KEY_ARGS) or any(split(args.extra_args)[1:])
    kept: dict[str, Any] = {}
    left: list[str] = []
    for name in FIELDS:
        if name in given or name == "engine" or (new_key and name in KEY_ARGS):
            continue
        value = getattr(previous, name)
        if other_engine and name in ENGINE_OWN_ARGS:
            if value:
                left.append(name)
            continue
        kept[name] = value
    if current is not None and "port" not in given:
        kept["port"] = current.port
    if "engine" not in given and old_engine is not None:
        kept["engine"] = old_engine
    return args.with_fields(**kept), left


def kept_pick(current: launch.ServerState | None, model_ref: str | ModelRef, args: LaunchArgs,
              given: Sequence[str]) -> Pick | None:
    """The running server's plan pick, for a switch that keeps its model and engine (``switch MODEL
    --ctx N`` after ``up MODEL --priority P``): its request (weights, spec-decode, parsers, vision, the
    engine's own options) is launched again with what was typed this time. None for another model
    or engine (another engine's request would name weights and options it does not take), or a
    launch that was not planned."""
    if current is None:
        return None
    plan = current.memory.get("plan") if isinstance(current.memory, dict) else None
    if not isinstance(plan, dict) or not isinstance(plan.get("row"), dict):
        return None
    row: dict = plan["row"]
    request = row.get("request")
    if not isinstance(request, dict):
        return None
    engine = args.engine if "engine" in given and args.engine else current.engine
    if engines.resolve(str(engine)) != current.engine:
        return None
    weights: dict = request["weights"] if isinstance(request.get("weights"), dict) else {}
    ref = str(getattr(model_ref, "raw", model_ref))
    if ref not in {current.model, str(row.get("model")), str(request.get("model")), str(weights.get("ref"))}:
        return None
    try:
        return pick_from_row(row, str(row.get("model")), f"{plan.get('source')}, kept by switch")
    except EngineroomError:
        return None


def switch(model_ref: str | ModelRef, args: LaunchArgs | None = None, *, given: Sequence[str] = (),
           say: Callable[[str], None] | None = None, on_wait: Callable[[str, float], None] | None = None,
           pick: Pick | None = None, api_key: str | None = None, log: StageLog | None = None) -> launch.ServerState:
    """Start MODEL in the managed server's place: checked first, stopped only once the new one is ready to go.

    Arguments the user did not give this time (``given`` names the fields they did) are taken
    from the running server's launch, extra engine arguments included, and so is its port
    (``carried_args``; never another engine's own). Everything is checked before the running
    server stops: the model file (its GGUF header in full), the engine installed, its own parser
    on the argv, the memory fit. If the new server still fails to come up, the old one is
    started again from its recorded command line and the error says so (``restore``).

    On the stage runner (``log``): check, down (the running server), launch, and restore when the
    new server fails; the new launch's stored run holds them (``record_stages``).
    """
    args = args or LaunchArgs()
    log = log if log is not None else StageLog(say)
    current = launch.read_state()
    if current is not None and not launch.is_alive(current.pid, current.proc_created):
        current = None
    merged, left = carried_args(args, given, current, new_key=api_key is not None)
    pick = pick or kept_pick(current, model_ref, args, given)
    if "extra_args" not in given and MASK in merged.extra_args:
        raise BadInput("the running server's engine arguments held a secret, which engineroom does not keep; "
                       "give them again after `--` (for an API key: --api-key-env VAR).")
    with log.stage("check", ""):              # prepare reports its own steps (a pull, a conversion)
        prepared = prepare(model_ref, merged, say=say, pick=pick, api_key=api_key)
        require(prepared)                     # the engine's own parser, before the running server is stopped
        with dropping_key(prepared):
            check_memory(prepared, current)
    notes = [f"not carried from the {current.engine if current else ''} server to {prepared.spec.engine}: "
             f"{', '.join('--' + k.replace('_', '-') for k in left)} (another engine's own)"] if left else []
    with log.stage("down", ""), dropping_key(prepared):
        stop()
    failed: EngineroomError | None = None
    try:
        with log.stage("launch", ""):
            try:
                state = launch_prepared(prepared, timeout=merged.timeout, on_wait=on_wait)
            except EngineroomError as exc:
                failed = exc
                raise
            if notes:
                state = launch.update_state(state, notes=notes)
            state = record_launch(state, prepared)
    except EngineroomError:
        if failed is None or current is None:
            raise
        with log.stage("restore", ""):
            error = restore(current, failed, on_wait)
        raise error from None
    return record_stages(state, log)


def check_memory(prepared: Prepared, current: launch.ServerState | None) -> None:
    """Refuse a launch that fit predicts cannot fit in this machine's free memory, counting what the
    running server (``current``) holds as free, since it stops first: per GPU (NVML: free memory plus
    the running server's own use of that GPU) for a launch fit places on GPUs, else host memory.
    Where NVML cannot be read, the GPU launch is left to the engine's own start."""
    import psutil

    from ..resources import gpu_memory, gpu_memory_of

    pred = prepared.prediction
    total = int((pred.components.get("total") or 0) if pred else 0)
    if not total or pred is None:
        return
    pids: set[int] = set()
    if current is not None:
        try:
            root = psutil.Process(current.pid)
            pids = {p.pid for p in [root, *root.children(recursive=True)]}
        except psutil.Error:
            pass
    per_gpu = {int(str(k)[3:]): int(v) for k, v in pred.components.items()
               if str(k).startswith("GPU") and str(k)[3:].isdigit() and v}
    if per_gpu:
        readings = gpu_memory()
        if readings is None:
            return
        freed = (gpu_memory_of(pids) or {}) if pids else {}
        for index, need in sorted(per_gpu.items()):
            device = next((r for r in readings if r["index"] == index), None)
            if device is None:
                continue
            free = device["total_bytes"] - device["used_bytes"] + freed.get(index, 0)
            if need > free:
                raise BadInput(f"{prepared.spec.model} needs about {need / (1 << 30):.2f} GiB on GPU{index} by fit's "
                               f"prediction and {free / (1 << 30):.2f} GiB of it would be free once the running "
                               "server stops; nothing was stopped (lower --ctx or --parallel, or pick a smaller "
                               "quant).")
        return
    free = psutil.virtual_memory().available
    for pid in pids:
        try:
            free += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    if total > free:
        raise BadInput(f"{prepared.spec.model} needs about {total / (1 << 30):.2f} GiB by fit's prediction and "
                       f"{free / (1 << 30):.2f} GiB would be free once the running server stops; nothing was "
                       "stopped (lower --ctx or --parallel, or pick a smaller quant).")


SWITCH_FAILED_LOG = "server.switch-failed.log"


def restore(old: launch.ServerState, failure: EngineroomError,
            on_wait: Callable[[str, float], None] | None = None) -> EngineroomError:
    """After a switch whose new server did not come up: start the old server again from its recorded
    command line (its options kept for the next switch) and return the error to raise, which says
    whether the old one runs again. The failed start's log is kept as ``server.switch-failed.log``."""
    message, detail = str(failure), failure.detail
    log = Path(old.log_path)
    if log.is_file():
        kept = log.with_name(SWITCH_FAILED_LOG)
        try:
            log.replace(kept)
            message = message.replace(str(log), str(kept))
        except OSError:
            pass
    spec = LaunchSpec(engine=old.engine, argv=tuple(old.argv), port=old.port, host=old.host, env=dict(old.env),
                      log_path=Path(old.log_path), model=old.model, model_path=old.model_path,
                      health_path=old.health_path, engine_version=old.engine_version, changes=tuple(old.changes))
    if MASK in spec.argv or MASK in spec.env.values():
        return EngineroomError(f"{message.rstrip('.')}; the previous server ({old.model}) was stopped and could not "
                               "be restarted: its command line held a secret engineroom does not keep.",
                               detail=detail, exit_code=failure.exit_code)
    try:
        if on_wait:
            on_wait(f"the new server failed; restarting the previous one ({old.model})", 0.0)
        back = launch.up(spec, args=old.args, on_wait=on_wait, hide_env=apikey.hidden_env(old.args))
    except EngineroomError as again:
        return EngineroomError(f"{message.rstrip('.')}; restarting the previous server ({old.model}) failed too: "
                               f"{again}", detail=detail, exit_code=failure.exit_code)
    launch.update_state(back, memory=old.memory, launch_run_id=old.launch_run_id,
                        model_sha256=old.model_sha256,
                        notes=[f"restored after a failed switch: {message}"])
    return EngineroomError(f"{message.rstrip('.')}; the previous server ({old.model}) was restarted on port "
                           f"{old.port} (pid {back.pid}).", detail=detail, exit_code=failure.exit_code)


__all__ = ["ENGINE_OWN_ARGS", "KEY_ARGS", "SWITCH_FAILED_LOG", "carried_args", "check_memory", "kept_pick",
           "restore", "switch"]
