"""Multi-stage commands: they call the stages in order and hand each what it needs.

``start`` = resolve/pull a model -> find the engine -> render its LaunchSpec -> launch.up.
``connect`` = find out what answers at a URL (engine adapters' probes).
Checks and bench never import the launcher; the flow gives them a ServerInfo.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import sqlite3

from . import apikey, engines, launch, models
from .engines.base import LaunchOptions, LaunchSpec, ServerInfo
from .refs import ModelRef
from .errors import BadInput, EngineroomError, NotFound
from .report.redaction import MASK, redact_data
from .store import Store

DEFAULT_PORT = 8080


def check_port(port: int | None) -> int | None:
    """None: the default port; 0: a free port; anything else must be a TCP port number."""
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be between 1 and 65535 (0 picks a free port); got {port}.")
    return port


def check_ctx(ctx: int | None, arch, extra_args: Sequence[str], adapter: engines.Engine) -> None:
    """fit's rule (positive, not beyond the model's positions unless RoPE scaling is asked for),
    with the engine's RoPE-scaling arguments found among the extra ones by its adapter."""
    from .fit import check_ctx as fit_check_ctx

    if ctx is None:
        return
    rope = adapter.rope_scaling_arg(extra_args)
    try:
        fit_check_ctx(arch, ctx, rope)
    except BadInput as exc:
        example = adapter.rope_scaling_example(-(-ctx // max(arch.max_position or 1, 1)))
        raise BadInput(f"{str(exc).rstrip('.')}: engine arguments go after `--`, e.g. `-- {example}`.") from None


# --------------------------------------------------------------------------- plan -> launch
@dataclass(frozen=True)
class Pick:
    """The plan's choice, as what to launch: the engine, the model file, and launch settings."""

    engine: str
    model_ref: str                   # what `up` pulls and serves (packaged name, hf:..., path)
    settings: dict                   # LaunchOptions fields: ctx, n_seqs, kv_unified, kv_dtype, tp
    plan: dict                       # the plan row it came from (plan --json's shape)
    source: str                      # "plan smollm2-135m --priority balanced on cpu:24GB, pick 1"
    notes: tuple[str, ...] = ()      # what the launch leaves out of the plan, and why
    missing_file: str = ""           # why no file can be fetched for the pick (model_ref is then a placeholder)


def _serving_ref(model_id: str, quant_id: str, quant_format: str) -> str:
    """The file or repo that serves ``quant_id`` of ``model_id``: a packaged file, an hf: file, a repo."""
    from .catalog import load_catalog

    cat = load_catalog()
    model = cat.model(model_id)
    if model is None:        # an ad-hoc model: the plan was made from this very file or repo
        return model_id
    quant = next((q for q in model.quants if q.id == quant_id), None)
    if quant is None:
        raise NotFound(f"{model.id} has no quant {quant_id} in the catalog; the plan is from another catalog.")
    if quant.pypi_package:
        return model.id
    if quant.file and quant.hf_repo:
        return f"hf:{quant.hf_repo}/{quant.file}"
    repo = quant.hf_repo or model.hf_repo
    if quant_format != "gguf" and repo:
        return repo
    if quant.hf_repo:
        raise MissingFile(f"the catalog names the repo {quant.hf_repo} but not its {quant_id} file; launch it by "
                          f"name with the same settings: `engineroom up hf:{quant.hf_repo}/FILE.gguf ...` "
                          f"(`engineroom recipe` prints them)", placeholder=f"hf:{quant.hf_repo}/<{quant_id} file>")
    raise MissingFile(f"the catalog names no public file for {model.id} {quant_id}; launch a file you have with "
                      f"the same settings (`engineroom recipe` prints them)", placeholder=f"<{model.id} {quant_id} file>")


class MissingFile(NotFound):
    """The plan's pick names no file engineroom can fetch; ``placeholder`` stands in for it in a recipe."""

    def __init__(self, message: str, placeholder: str) -> None:
        super().__init__(message + ".")
        self.placeholder = placeholder


def pick_from_row(row: dict, model_id: str, source: str) -> Pick:
    """A plan row (``plan --json``'s "plans" entries, or ``plans_as_rows``) as a Pick."""
    try:
        engine, quant, ctx, seqs = row["engine"], row["quant"], int(row["ctx"]), int(row["seqs"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"the plan row has no usable {exc} field; make it with `engineroom plan MODEL --json`.") from None
    notes = []
    if row.get("spec"):
        notes.append(f"speculative decoding ({row['spec']}) is in the plan but not launched: engineroom does not "
                     "fetch draft models yet")
    if int(row.get("instances") or 1) > 1:
        notes.append(f"the plan runs {row['instances']} instances; one is launched")
    settings = dict(ctx=ctx, n_seqs=seqs, kv_unified=bool(row.get("kv_unified", False)), kv_dtype=row.get("kv"),
                    tp=int(row.get("tp") or 1))
    fmt = str(row.get("quant_format") or ("gguf" if engine in ("llama.cpp", "ik_llama.cpp") else ""))
    try:
        ref, missing = _serving_ref(model_id, quant, fmt), ""
    except MissingFile as exc:
        ref, missing = exc.placeholder, str(exc)
    return Pick(engine=engine, model_ref=ref, settings=settings, plan={**row, "model": model_id}, source=source,
                notes=tuple(notes), missing_file=missing)


def pick_from_plan(model: str, *, priority: str | None = None, rig: str | None = None,
                   pick: int = 1) -> Pick:
    """Plan ``model`` for ``rig`` (default: this machine) under ``priority`` and take plan ``pick``."""
    from .hardware import resolve_rig
    from .plan import plan as make_plan, plans_as_rows

    if pick < 1:
        raise BadInput(f"--pick counts plans from 1; got {pick}.")
    the_rig = resolve_rig(rig)
    plans = make_plan(model, the_rig, priority, limit=pick)
    if len(plans) < pick:
        raise NotFound(f"the plan has {len(plans)} configuration(s) for {model}; --pick {pick} is beyond them.")
    chosen = plans[pick - 1]
    row = plans_as_rows([chosen])[0]
    row.update(kv_unified=chosen.kv_unified, tp=chosen.tp, instances=chosen.instances,
               quant_format=chosen.quant_format, priority=chosen.priority)
    source = f"plan {model} --priority {chosen.priority} on {the_rig.label or 'this machine'}, pick {pick}"
    return pick_from_row(row, chosen.model, source)


def pick_from_file(path: Path, pick: int = 1) -> Pick:
    """Plan ``pick`` of a file written by ``engineroom plan MODEL --json > plan.json``."""
    import json

    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise NotFound(f"cannot read the plan file {path} ({exc.strerror}).") from None
    except ValueError:
        raise BadInput(f"{path} is not JSON; write it with `engineroom plan MODEL --json > {path}`.") from None
    plans = doc.get("plans") if isinstance(doc, dict) else None
    if not isinstance(plans, list) or not plans or not isinstance(doc.get("model"), str):
        raise BadInput(f"{path} holds no plans; write it with `engineroom plan MODEL --json > {path}` "
                       "(a how-to-choose table needs --priority).")
    if not 1 <= pick <= len(plans):
        raise BadInput(f"--pick {pick} is not among the {len(plans)} plan(s) in {path}.")
    row = plans[pick - 1]
    source = f"{path}, plan {pick} ({doc.get('priority', '?')} on {doc.get('rig', '?')})"
    return pick_from_row(row, doc["model"], source)


def apply_pick(pick: Pick, options: dict, given: Sequence[str]) -> dict:
    """The launch options of ``pick``, with every option the user typed winning over the plan's."""
    merged = dict(options)
    plan_to_option = {"ctx": "ctx", "n_seqs": "parallel", "kv_unified": "kv_unified", "kv_dtype": "kv_dtype",
                      "tp": "tp"}
    for field_name, option in plan_to_option.items():
        if option not in given:
            merged[option] = pick.settings[field_name]
    if "engine" not in given:
        merged["engine"] = pick.engine
    return merged


# --------------------------------------------------------------------------- predicted memory
@dataclass(frozen=True)
class Prediction:
    """fit's per-component prediction for exactly what is launched (or why there is none)."""

    components: dict                 # name -> bytes (devices and host summed), plus "total"
    request: dict                    # the FitRequest it was made for
    rig: str
    why_none: str = ""


def predict_memory(engine: str, arch, settings: dict, probe, *, model_id: str = "", quant: str = "") -> Prediction:
    """fit for the launched configuration on this machine (its probed CPU features), from the
    model file's header; without the file (a recipe), from the catalog's entry for ``model_id``
    ``quant`` (its inline architecture and the quant's catalog size)."""
    from dataclasses import asdict

    from .catalog import load_catalog
    from .fit import FitRequest, fit
    from .hardware import detect_rig

    features = frozenset(probe.usable) if probe.flags else None
    try:
        rig = detect_rig()
        cat = load_catalog().for_vendor(rig.vendor)   # the engine's build for this machine
        if arch is None:
            if not (model_id and quant):
                return Prediction({}, {}, "", "the model file is not here and the catalog does not describe it")
            from .plan import fit_one

            _, f = fit_one(model_id, rig, engine, quant, settings.get("kv_dtype") or "f16", int(settings["ctx"]),
                           n_seqs=int(settings.get("n_seqs") or 1), tp=int(settings.get("tp") or 1),
                           kv_unified=bool(settings.get("kv_unified")), rope_scaling=settings.get("rope_scaling"),
                           cpu_features=features, repack=bool(settings.get("repack", True)))
            req, basis = f.request, f"the catalog's {model_id} {quant} (the file is not downloaded)"
        else:
            req = FitRequest(engine=engine, ctx=int(settings["ctx"]), quant=(arch.file_type or None),
                             kv_dtype=settings.get("kv_dtype") or "f16", n_seqs=int(settings.get("n_seqs") or 1),
                             kv_unified=bool(settings.get("kv_unified")), repack=bool(settings.get("repack", True)),
                             cpu_features=features, rope_scaling=settings.get("rope_scaling"),
                             tp=int(settings.get("tp") or 1))
            f, basis = fit(arch, req, rig, catalog=cat), "the model file's header"
    except (EngineroomError, KeyError, TypeError, ValueError) as exc:
        return Prediction({}, {}, "", f"fit cannot size this launch ({str(exc).rstrip('.')})")
    comps: dict[str, int] = {}
    for g in f.per_gpu:
        for c in g.components:
            comps[c.name] = comps.get(c.name, 0) + c.bytes
    for c in f.host:
        comps[c.name] = comps.get(c.name, 0) + c.bytes
    if rig.gpus:                      # each GPU's whole use: what NVML reports for the engine's processes
        for g in f.per_gpu:
            comps[f"GPU{g.index}"] = g.used_bytes
    comps["total"] = f.total_bytes
    request = {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in asdict(req).items()}
    request.pop("cpu_features", None)
    request["basis"] = basis
    return Prediction(comps, request, rig.label or "this machine")


# --------------------------------------------------------------------------- prepare / start
@dataclass(frozen=True)
class Prepared:
    """Everything checked before anything is stopped or started (``switch`` relies on that)."""

    spec: LaunchSpec                 # the adapter's LaunchSpec
    options: dict                    # the launch options as the user gave them (kept for `switch`)
    prediction: Prediction | None = None
    pick: Pick | None = None
    binary_found: bool = True        # False: a recipe rendered without the engine installed
    key: apikey.LaunchKey | None = None   # the launch's API key: references, and the file the engine reads


def prepare(
    model_ref: str | ModelRef,
    *,
    ctx: int | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    threads: int | None = None,
    parallel: int | None = None,
    kv_unified: bool | None = None,
    kv_dtype: str | None = None,
    tp: int | None = None,
    engine_bin: str | None = None,
    chat_template_file: Path | None = None,
    tools_template: bool = False,
    extra_args: Sequence[str] = (),
    timeout: float = 300.0,
    engine: str = engines.DEFAULT_ENGINE,
    say: Callable[[str], None] | None = None,
    pick: Pick | None = None,
    download: bool = True,
    require_binary: bool = True,
    api_key: str | None = None,
    api_key_env: str | None = None,
    api_key_file: str | None = None,
) -> Prepared:
    """Resolve and pull the model, find and check the engine, render its LaunchSpec, predict
    its memory; start nothing. ``download=False, require_binary=False``: a recipe (what would run)."""
    from .cpuprobe import probe_cpu

    options = dict(ctx=ctx, port=port, host=host, threads=threads, parallel=parallel, kv_unified=kv_unified,
                   kv_dtype=kv_dtype, tp=tp,
                   engine_bin=str(engine_bin) if engine_bin else None,
                   chat_template_file=str(chat_template_file) if chat_template_file else None,
                   tools_template=tools_template, extra_args=list(extra_args), timeout=timeout, engine=engine)
    port = check_port(port)
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
    try:
        binary = adapter.find_binary(engine_bin)
        found = True
    except NotFound:
        if require_binary:
            raise
        binary, found = _placeholder_binary(adapter), False
    probe = probe_cpu()
    if found and require_binary:
        adapter.check_binary_cpu(binary, probe)
    if download:
        mref, path = models.local_model(model_ref, say)
        refusal = adapter.loads_refusal(path)
        if refusal:
            raise BadInput(refusal)
    elif pick is not None and pick.missing_file:   # a recipe for a file the catalog cannot name
        mref, path = None, Path(model_ref)
    else:                                 # a recipe: where the file is, or will be once pulled
        mref = models.resolve(model_ref)
        path = mref.served_path or Path(str(model_ref))
    arch = _read_arch(path)
    if ctx is not None and arch is not None:
        check_ctx(ctx, arch, extra_args, adapter)
    template = chat_template_file
    if tools_template:
        if template is not None:
            raise BadInput("give either --chat-template-file or --tools-template, not both.")
        if mref is None or mref.tool_template is None:
            raise BadInput(f"{getattr(model_ref, 'raw', model_ref)} has no tool-capable chat template in engineroom; pass --chat-template-file.")
        template = mref.tool_template
    changes = adapter.cpu_adjustments(probe, extra_args)
    if port is None:
        port = DEFAULT_PORT
    elif port == 0:
        port = launch.free_port(host)
    # the key by reference (apikey.py): a key after `--` is moved out of the argv; options keep references
    key = apikey.for_launch(api_key=api_key, api_key_env=api_key_env, api_key_file=api_key_file,
                            extra_args=extra_args, split=adapter.split_api_key, write=download)
    extra_args = key.extra_args
    options.update(key.options, extra_args=list(extra_args))
    try:
        lopts = LaunchOptions(
            model_path=path, model_name=mref.name if mref else str(pick.plan.get("model") if pick else ""), port=port, host=host, ctx=ctx, n_seqs=parallel,
            kv_unified=kv_unified, kv_dtype=kv_dtype, threads=threads, tp=tp or 1,
            chat_template_file=Path(template) if template else None, extra_args=tuple(extra_args),
            changes=tuple(changes), api_key_file=key.file,
        )
        spec = adapter.render(binary, lopts)
        settings = adapter.launch_settings(lopts)
        if settings.get("ctx") is None and arch is not None and arch.max_position:
            # no --ctx: the engine sizes its cache for the model's trained context
            settings["ctx"] = max(1, arch.max_position // max(int(settings.get("n_seqs") or 1), 1))
        model_id, quant = (str(pick.plan.get("model") or ""), str(pick.plan.get("quant") or "")) if pick else ("", "")
        if not model_id and mref is not None and getattr(mref, "catalog_id", None):
            model_id = mref.catalog_id or ""
        if settings.get("ctx") is None and arch is None:
            prediction = Prediction({}, {}, "", "no --ctx and no model file to read the trained context from")
        else:
            prediction = predict_memory(engine, arch, settings, probe, model_id=model_id, quant=quant)
    except BaseException:
        apikey.discard(key)
        raise
    return Prepared(spec, options, prediction, pick, found, key=key)


def _launch(prepared: Prepared, *, before: Callable[[], object] | None = None, **kwargs) -> launch.ServerState:
    """launch.up for ``prepared``, keeping engineroom's key files in step: the new launch's file
    is removed if it does not start, the older launches' files once it has."""
    try:
        if before:
            before()
        state = launch.up(prepared.spec, options=prepared.options, **kwargs)
    except BaseException:
        if prepared.key is not None:
            apikey.discard(prepared.key)
        raise
    apikey.keep_only(prepared.key.file if prepared.key else None)
    return state


def _placeholder_binary(adapter: engines.Engine):
    """A stand-in for an engine not installed here, so a recipe can still be rendered."""
    fn = adapter._hook("placeholder_binary")
    if fn is None:
        raise NotFound(f"{adapter.name} is not installed here and its adapter cannot render without it.")
    return fn()


def _read_arch(path: Path):
    """The architecture from the model file's header, or None when engineroom cannot describe it
    (the engine has the last word on such a file)."""
    from .arch import arch_from_gguf

    if not path.is_file():
        return None
    try:
        return arch_from_gguf(path)
    except (EngineroomError, OSError, ValueError):
        return None


def start(model_ref: str | ModelRef, *, timeout: float = 300.0,
          on_wait: Callable[[str, float], None] | None = None,
          on_spawn: Callable[[int], None] | None = None, pick: Pick | None = None,
          **options) -> launch.ServerState:
    """Pull if needed, check the engine for this machine, render its command line, start it; return once healthy."""
    if pick is not None and pick.missing_file:
        raise NotFound(pick.missing_file)
    prepared = prepare(model_ref, timeout=timeout, pick=pick, **options)
    state = _launch(prepared, timeout=timeout, on_wait=on_wait, on_spawn=on_spawn)
    return record_launch(state, prepared)


def switch(model_ref: str | ModelRef, *, given: Sequence[str] = (), on_wait: Callable[[str, float], None] | None = None,
           pick: Pick | None = None, **options) -> launch.ServerState:
    """Start MODEL in the managed server's place: checked first, stopped only once the new one is ready to go.

    Options the user did not give this time (``given`` lists the ones they did) are taken
    from the running server's launch, extra engine arguments included, and so is its port.
    """
    current = launch.read_state()
    previous = dict(current.options) if current and current.options else {}
    merged = dict(options)
    # a key given this time in any form (after `--` too) replaces the running server's reference whole
    split = engines.adapter(merged.get("engine") or engines.DEFAULT_ENGINE).split_api_key
    new_key = any(k in given for k in apikey.KEY_OPTIONS) or any(split(merged.get("extra_args") or ())[1:])
    for key, value in previous.items():
        if key in merged and key not in given and not (new_key and key in apikey.KEY_OPTIONS):
            merged[key] = value
    if current and "port" not in given:
        merged["port"] = current.port
    if "extra_args" not in given and MASK in (merged.get("extra_args") or ()):
        raise BadInput("the running server's engine arguments held a secret, which engineroom does not keep; "
                       "give them again after `--` (for an API key: --api-key-env VAR).")
    timeout = merged.pop("timeout", 300.0)
    prepared = prepare(model_ref, timeout=timeout, pick=pick, **merged)
    state = _launch(prepared, before=launch.down, timeout=timeout, on_wait=on_wait)
    return record_launch(state, prepared)


def record_launch(state: launch.ServerState, prepared: Prepared) -> launch.ServerState:
    """Keep fit's prediction beside what the engine reported, in the state file and the store."""
    from .memory import compare, rows_as_dicts

    pred = prepared.prediction
    measured = state.memory.get("measured") or {}
    memory = {
        "predicted": pred.components if pred else {},
        "fit_request": pred.request if pred else {},
        "predicted_for": pred.rig if pred else "",
        "prediction_missing": (pred.why_none if pred else "no prediction was made"),
        "measured": measured,
        "measured_source": state.memory.get("measured_source", ""),
        "rows": rows_as_dicts(compare(pred.components if pred else {}, measured)),
    }
    if prepared.pick is not None:
        memory["plan"] = {"source": prepared.pick.source, "row": {k: v for k, v in prepared.pick.plan.items()
                                                                   if k not in ("reasons", "tradeoffs")},
                          "notes": list(prepared.pick.notes)}
    state = launch.update_state(state, memory=memory)
    try:
        with Store() as store:
            run_id = store.start_run("launch", redact_data({
                "engine": state.engine, "engine_version": state.engine_version, "model": state.model,
                "model_path": state.model_path, "argv": state.argv, "launch_changes": list(state.changes),
                "host": host_summary(), **({"plan": memory["plan"]} if "plan" in memory else {}),
                "fit_request": memory["fit_request"], "predicted_for": memory["predicted_for"],
            }), label=f"up {state.model}")
            for row in memory["rows"]:
                store.add_record(run_id, "memory_component", row)
            store.finish_run(run_id, "OK", {"memory": memory["rows"], "measured_source": memory["measured_source"],
                                            "prediction_missing": memory["prediction_missing"] if not pred or
                                            pred.why_none else ""})
        state = launch.update_state(state, launch_run_id=run_id)
    except (sqlite3.Error, OSError, EngineroomError):
        pass   # the server is up; a results store that cannot be written must not take it down
    return state


def connect(url: str | None, api_key: str | None = None) -> ServerInfo:
    """ServerInfo for ``url``, or for the managed server when no URL is given."""
    from . import net

    target = url.rstrip("/") if url else launch.managed_url()
    if not target.startswith(("http://", "https://")):
        raise BadInput(f"--url must start with http:// or https:// (got {target!r}).")
    try:
        return engines.detect(target, api_key=api_key)
    except EngineroomError:
        try:       # a server that wants a key says 401 where the probes expected an answer
            auth = {"Authorization": f"Bearer {api_key}"} if api_key else None
            refused = net.get(f"{target}/v1/models", timeout=5.0, headers=auth).status_code == 401
        except Exception:  # noqa: BLE001 - the original error is the one to report
            refused = False
        if refused:
            raise BadInput(apikey.unauthorized_message(bool(api_key))) from None
        raise


def client_key(url: str | None, *, api_key: str | None = None, api_key_env: str | None = None) -> str | None:
    """The key verify / bench send: the one given, else, for the managed server, the key of the file it
    was launched with (so no shell needs the key again), else none."""
    server_key_file = None
    if not api_key and not api_key_env:
        state = launch.read_state()
        if state is not None and (url is None or url.rstrip("/") == state.url) and engines.has_adapter(state.engine):
            server_key_file = engines.adapter(state.engine).api_key_file_in(state.argv)
    return apikey.for_client(api_key=api_key, api_key_env=api_key_env, server_key_file=server_key_file)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_summary() -> dict[str, object]:
    """CPU / RAM / GPU of this machine for a run's conditions (hardware names, no identities)."""
    import psutil

    from .hardware import detect_rig

    summary: dict[str, object] = {
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
    }
    try:
        rig = detect_rig()
        summary["gpus"] = [{"name": g.name, "vram_bytes": g.vram_bytes} for g in rig.gpus]
    except Exception as exc:  # hardware detection must never break a run
        summary["gpus"] = []
        summary["gpu_note"] = f"GPU detection failed: {type(exc).__name__}"
    return summary


def run_conditions(info: ServerInfo) -> dict[str, object]:
    """What a measurement depends on: engine + version, model file, argv, host, and what engineroom changed."""
    cond: dict[str, object] = {
        "engine": info.engine, "engine_version": info.engine_version, "model_id": info.model_id,
        "url": info.url, "n_ctx": info.n_ctx, "total_slots": info.total_slots, "host": host_summary(),
    }
    from .cpuprobe import probe_cpu

    probe = probe_cpu()
    cond["cpu_probe"] = {"results": dict(probe.results), "forced": list(probe.forced)}
    state = launch.read_state()
    if state is not None and state.url == info.url:
        cond.update(model=state.model, model_path=state.model_path, argv=state.argv)
        if state.changes:
            cond["launch_changes"] = list(state.changes)
        if state.memory.get("rows"):      # fit's prediction beside the engine's report, for the card
            cond["memory"] = {k: state.memory.get(k) for k in ("rows", "measured_source", "predicted_for",
                                                                 "prediction_missing")}
        if state.engine_version:   # the binary's own --version beats a server's "b0-unknown"
            cond.update(engine_version=state.engine_version, engine_build_info=info.engine_version)
        model_file = Path(state.model_path)
        if model_file.is_file():
            cond["model_size_bytes"] = model_file.stat().st_size
            packaged = models.packaged_models().get(state.model)
            if packaged and packaged.size == cond["model_size_bytes"]:
                cond["model_sha256"] = packaged.sha256          # checked when it was pulled
            elif cond["model_size_bytes"] <= 4 * 1024**3:
                cond["model_sha256"] = models.sha256_file(model_file)
    return redact_data(cond)      # argv and URL are stored: no secret may ride along


# --------------------------------------------------------------------------- verify / bench
@contextlib.contextmanager
def _closing_run(store: Store, run_id: int) -> Iterator[None]:
    """A run that ends by Ctrl-C or an error is closed as INTERRUPTED / ERROR, never left 'running'."""
    try:
        yield
    except KeyboardInterrupt:
        store.finish_run(run_id, "INTERRUPTED")
        raise
    except Exception as exc:
        try:
            store.finish_run(run_id, "ERROR", {"error": f"{type(exc).__name__}: {exc}"})
        except Exception:  # the store itself failed; the original error is the one to report
            pass
        raise


@dataclass
class VerifyOutcome:
    run_id: int
    results: list
    failed: int


def verify(info: ServerInfo, store: Store, *, run_id: int | None = None,
           on_result: Callable[[object], None] | None = None, api_key: str | None = None) -> VerifyOutcome:
    """Run the smoke suite, storing each check as it finishes."""
    from dataclasses import asdict

    from .checks import run_smoke
    from .client import OpenAIClient

    own_run = run_id is None
    if own_run:
        run_id = store.start_run("verify", run_conditions(info))

    def record(result) -> None:
        store.add_record(run_id, "check", asdict(result))
        if on_result:
            on_result(result)

    with _closing_run(store, run_id), OpenAIClient(info.url, api_key=api_key) as client:
        results = run_smoke(client, info, on_result=record)
    failed = sum(1 for r in results if r.status == "FAIL")
    if own_run:
        counts = {s: sum(1 for r in results if r.status == s) for s in ("PASS", "FAIL", "SKIP")}
        store.finish_run(run_id, "OK" if failed == 0 else "FAILED", counts)
    return VerifyOutcome(run_id, results, failed)


@dataclass
class BenchOutcome:
    run_id: int
    summary: dict


def bench(info: ServerInfo, store: Store, plan, *, run_id: int | None = None,
          progress: Callable[[int, int, str], None] | None = None, api_key: str | None = None) -> BenchOutcome:
    """Run the bench plan, storing each request as it finishes; summary from the records."""
    from .bench import bench_conditions, run_bench
    from .client import OpenAIClient

    conditions = {**bench_conditions(info, plan), **run_conditions(info)}
    own_run = run_id is None
    if own_run:
        run_id = store.start_run("bench", conditions)
    with _closing_run(store, run_id), OpenAIClient(info.url, api_key=api_key) as client:
        result = run_bench(client, info, plan, progress=progress,
                           on_record=lambda rec: store.add_record(run_id, "bench_request", rec))
    if own_run:
        store.finish_run(run_id, result.status, result.summary)
    return BenchOutcome(run_id, result.summary)


@dataclass
class DemoOutcome:
    run_id: int
    card: str
    failed: int
    bench_status: str


def demo(store: Store, *, model: str = "smollm2-135m", port: int | None = None, ctx: int = 2048,
         threads: int | None = None, max_tokens: int = 256, warmup: int = 3, measured: int = 5,
         tools_template: bool = True, keep: bool = False, extra_args: Sequence[str] = (),
         on_spawn: Callable[[int], None] | None = None,
         say: Callable[[str], None] | None = None,
         on_wait: Callable[[str, float], None] | None = None,
         on_result: Callable[[object], None] | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> DemoOutcome:
    """pull -> up -> verify -> bench -> card -> down, all in one stored run."""
    from .bench import BenchPlan, default_workloads
    from .report import render_card

    say = say or (lambda _m: None)
    ref = models.resolve(model)          # resolved once; every stage below gets the same reference
    models.pull(ref, say)
    state = start(ref, ctx=ctx, port=port if port is not None else 0, threads=threads,
                  tools_template=tools_template and ref.tool_template is not None,
                  extra_args=extra_args, say=say, on_wait=on_wait, on_spawn=on_spawn)
    try:
        key = client_key(state.url)          # a key after `--` was moved to a file: read it back
        info = connect(state.url, api_key=key)
        plan = BenchPlan(workloads=default_workloads(max_tokens), warmup=warmup, measured=measured,
                         full_length=True)
        from .bench import bench_conditions

        run_id = store.start_run("demo", {**bench_conditions(info, plan), **run_conditions(info)},
                                 label=f"engineroom demo: {model}")
        with _closing_run(store, run_id):
            say("verify")
            checked = verify(info, store, run_id=run_id, on_result=on_result, api_key=key)
            say("bench")
            benched = bench(info, store, plan, run_id=run_id, progress=progress, api_key=key)
        status = "OK" if checked.failed == 0 and benched.summary.get("status") == "OK" else "FAILED"
        store.finish_run(run_id, status, {"verify_failed": checked.failed, "bench": benched.summary})
    finally:
        if not keep:
            launch.down()
    card = render_card(store.get_run(run_id), store.records(run_id))
    return DemoOutcome(run_id, card, checked.failed, benched.summary.get("status", "?"))
