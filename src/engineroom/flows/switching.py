"""``switch``: the managed server replaced by another launch, never lost on the way.

Everything is checked before the running server stops (``prepare``: the model file's GGUF header
in full, the engine installed; the engine's own parser on the argv; fit's memory prediction
against what will be free), the options not given again are the running server's
(``carried_options``: never another engine's own binary, arguments or KV type), a planned launch
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
from ..redaction import MASK
from ..refs import ModelRef
from .picks import Pick, pick_from_row
from .serving import Prepared, launch_prepared, prepare, record_launch, stop

# launch options that belong to one engine: a switch to another engine does not carry them
ENGINE_OWN_OPTIONS = ("engine_bin", "extra_args", "kv_dtype")


def carried_options(options: dict, given: Sequence[str], current: launch.ServerState | None) -> tuple[dict, list[str]]:
    """The options ``switch`` launches with: the ones given this time, the running server's for the
    rest (its engine and port included). A switch to another engine keeps none of the old engine's
    own options (its binary, its extra arguments, its KV type); the second value names the ones left."""
    previous = dict(current.options) if current and current.options else {}
    merged = dict(options)
    old_engine = (current.engine if current else None) or previous.get("engine")
    new_engine = options.get("engine") if "engine" in given else old_engine
    other_engine = old_engine is not None and new_engine is not None and new_engine != old_engine
    # a key given this time in any form (after `--` too) replaces the running server's reference whole
    split = engines.adapter(new_engine if new_engine and engines.has_adapter(new_engine)
                            else engines.DEFAULT_ENGINE).split_api_key
    new_key = any(k in given for k in apikey.KEY_OPTIONS) or any(split(merged.get("extra_args") or ())[1:])
    left: list[str] = []
    for key, value in previous.items():
        if key in given or (new_key and key in apikey.KEY_OPTIONS) or (key not in merged and key != "engine"):
            continue
        if other_engine and key in ENGINE_OWN_OPTIONS:
            if value:
                left.append(key)
            continue
        merged[key] = value
    if current and "port" not in given:
        merged["port"] = current.port
    return merged, left


def kept_pick(current: launch.ServerState | None, model_ref: str | ModelRef, options: dict,
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
    engine = options.get("engine") if "engine" in given and options.get("engine") else current.engine
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


def switch(model_ref: str | ModelRef, *, given: Sequence[str] = (), on_wait: Callable[[str, float], None] | None = None,
           pick: Pick | None = None, **options: Any) -> launch.ServerState:
    """Start MODEL in the managed server's place: checked first, stopped only once the new one is ready to go.

    Options the user did not give this time (``given`` lists the ones they did) are taken
    from the running server's launch, extra engine arguments included, and so is its port
    (``carried_options``; never another engine's own). Everything is checked before the running
    server stops: the model file (its GGUF header in full), the engine installed, its own parser
    on the argv, the memory fit. If the new server still fails to come up, the old one is
    started again from its recorded command line and the error says so (``restore``).
    """
    current = launch.read_state()
    if current is not None and not launch.is_alive(current.pid, current.proc_created):
        current = None
    merged, left = carried_options(options, given, current)
    pick = pick or kept_pick(current, model_ref, options, given)
    if "extra_args" not in given and MASK in (merged.get("extra_args") or ()):
        raise BadInput("the running server's engine arguments held a secret, which engineroom does not keep; "
                       "give them again after `--` (for an API key: --api-key-env VAR).")
    timeout = merged.pop("timeout", None)
    prepared = prepare(model_ref, timeout=timeout, pick=pick, **merged)
    from .validation import require

    require(prepared)                         # the engine's own parser, before the running server is stopped
    try:
        check_memory(prepared, current)
    except BaseException:
        if prepared.key is not None:
            apikey.discard(prepared.key)
        raise
    notes = [f"not carried from the {current.engine if current else ''} server to {prepared.spec.engine}: "
             f"{', '.join('--' + k.replace('_', '-') for k in left)} (another engine's own)"] if left else []
    try:
        state = launch_prepared(prepared, before=stop, timeout=timeout, on_wait=on_wait)
    except EngineroomError as exc:
        if current is None:
            raise
        raise restore(current, exc, on_wait) from None
    if notes:
        state = launch.update_state(state, notes=notes)
    return record_launch(state, prepared)


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
        back = launch.up(spec, options=old.options, on_wait=on_wait,
                         hide_env=apikey.hidden_env(old.options))
    except EngineroomError as again:
        return EngineroomError(f"{message.rstrip('.')}; restarting the previous server ({old.model}) failed too: "
                               f"{again}", detail=detail, exit_code=failure.exit_code)
    launch.update_state(back, memory=old.memory, launch_run_id=old.launch_run_id,
                        model_sha256=old.model_sha256,
                        notes=[f"restored after a failed switch: {message}"])
    return EngineroomError(f"{message.rstrip('.')}; the previous server ({old.model}) was restarted on port "
                           f"{old.port} (pid {back.pid}).", detail=detail, exit_code=failure.exit_code)


__all__ = ["ENGINE_OWN_OPTIONS", "SWITCH_FAILED_LOG", "carried_options", "check_memory", "kept_pick", "restore",
           "switch"]
