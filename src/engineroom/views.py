"""Rendering of command results for the terminal (rich tables and lines); commands live in cli.py.

Views take the plain data a command already computed (dicts as stored, dataclasses) and
return a renderable, or a list of them to print in order; they never compute a figure that
the data does not hold, never talk to an engine or the store, and never print, so a test
can read their cells and cli.py stays the place that decides JSON or text and exit codes.
Every byte count goes through ``units``, the project's one byte formatter.

A line is a ``Text``: ``Text.from_markup`` where the line carries colour (whatever came from
outside is escaped first), plain ``Text`` otherwise, so a model name or path holding
brackets prints as written.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .redaction import redact_argv
from .units import capacity, gib, mem, mib

if TYPE_CHECKING:
    from rich.progress import Progress

    from .checks.smoke import CheckResult
    from .cpuprobe import CpuProbe
    from .engines.base import LaunchSpec, ServerInfo
    from .fit.request import Fit
    from .flows import Pick, VerifyOutcome
    from .hardware import Rig
    from .launch import ServerState, Status
    from .models import CachedModel
    from .plan import Choice, Plan, ResolvedModel
    from .refs import ModelRef, PackagedModel

Lines = list[RenderableType]


def _markup(text: str) -> Text:
    return Text.from_markup(text)


# --- engines ---------------------------------------------------------------------------------

def install_summary(manifest: Mapping[str, Any]) -> str:
    """One phrase for an install manifest: a source build (seconds, backend, jobs) or an
    environment pip/uv made (seconds, installer)."""
    if "build_seconds" in manifest:
        kernels = manifest.get("kernels") or {}     # `--prebuilt`: the server on the kernels of a package's wheel
        on = f", kernels from {kernels['from']}" if kernels.get("from") else ""
        return (f"built {manifest.get('built_at', '?')} in {manifest['build_seconds']:.0f} s "
                f"({manifest.get('backend', '?')}, -j{manifest.get('jobs', '?')}{on})")
    if "install_seconds" in manifest:
        return (f"installed {manifest.get('installed_at', '?')} in {manifest['install_seconds']:.0f} s "
                f"({manifest.get('installer', '?')})")
    return "installed"


def _runs_here(runs: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for kind in ("launch", "verify", "bench", "demo"):
        run = runs.get(kind)
        if not run:
            continue
        extra = run.get("passed") or (f"{run['decode_tps']} tok/s" if run.get("decode_tps") else "")
        parts.append(f"{kind} {run['status']}" + (f" {extra}" if extra else "") + f" (run {run['run']})")
    return ", ".join(parts) or "no runs"


def engines_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """``engineroom engines``: one row per adapter, found or not (its error in the path column),
    how engineroom tests it, and the latest runs this machine's store holds for it."""
    table = Table("engine", "version", "path", "found via", "how engineroom tests it", "runs here")
    for r in rows:
        tested, here = escape(r.get("tested") or ""), _runs_here(r.get("runs_here") or {})
        if r["found"]:
            origin = r["origin"]
            if r.get("install"):
                origin += ", " + install_summary(r["install"])
            table.add_row(r["engine"], r["version"], r["path"], origin, tested, here)
        else:
            table.add_row(r["engine"], "[red]not found[/]", escape(r["error"]), "", tested, here)
    return table


def built_line(name: str, manifest: Mapping[str, Any]) -> Text:
    where = escape(str(manifest.get("bin_dir") or manifest.get("root") or ""))
    tag = manifest.get("tag", manifest.get("version", ""))
    return _markup(f"[green]{'built' if 'build_seconds' in manifest else 'installed'}[/] {name} {tag}: "
                   f"{install_summary(manifest)}: {where}")


def request_progress(console: Console) -> Progress:
    """The bar of bench and demo: requests done of planned, gone when the card prints."""
    # imported here: only bench and demo draw it, and every command imports this module
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


# --- models ----------------------------------------------------------------------------------

def pulled_line(ref: str, path: str, size: int) -> Text:
    return _markup(f"[green]ok[/] {escape(ref)} -> {escape(path)} ({mem(size)})")


def packaged_table(packaged: Mapping[str, PackagedModel]) -> Table:
    """``models list --available``: each packaged model once (aliases map to the same entry)."""
    table = Table("name", "source", "size", "description")
    for name, pm in packaged.items():
        if name != pm.name:
            continue  # an alias
        table.add_row(name, f"PyPI {pm.package}", mem(pm.size), pm.description)
    return table


def cached_models(rows: Sequence[CachedModel], folder: str) -> RenderableType:
    """``models list``: the cache's models with what their GGUF headers say, or how to get one."""
    if not rows:
        return _markup("no models cached; try `engineroom models pull smollm2-135m`.")
    table = Table("name", "architecture", "type", "params", "ctx", "size", title=folder)
    for m in rows:
        table.add_row(m.name, m.architecture, m.file_type, m.params, str(m.context_length or "?"), mem(m.size))
    return table


def resolved_line(ref: str, mref: ModelRef) -> Text:
    repo = f"{mref.repo}@{mref.revision}" if mref.revision else mref.repo
    target = mref.path or mref.url or repo or mref.catalog_id
    return Text(f"{ref}: {mref.kind} -> {target} (local: {mref.is_local})")


# --- the managed server ------------------------------------------------------------------------

def pick_lines(pick: Pick) -> Lines:
    """What `up --priority` is about to launch, said before the wait so the user sees the choice."""
    r = pick.request
    out: Lines = [_markup(f"launching the plan's pick: {escape(r.engine)} {escape(r.weights.quant)} "
                          f"({escape(r.weights.ref)}), KV {escape(str(r.kv_dtype))}, {r.ctx or 0:,} ctx x "
                          f"{r.parallel} seq ({escape(pick.source)})")]
    out += [_markup(f"[yellow]note:[/] {escape(note)}") for note in pick.notes]
    return out


def memory_view(memory: Mapping[str, Any]) -> Lines:
    """fit's prediction beside the engine's own report, or why there is no prediction."""
    table = memory_table(memory)
    if table is not None:
        return [table]
    if memory.get("prediction_missing"):
        return [_markup(f"memory: no prediction ({escape(memory['prediction_missing'])})")]
    return []


def started_lines(state: ServerState, picked_port: bool) -> Lines:
    """``up`` / ``switch`` once healthy: where it listens, what engineroom changed, memory, the log."""
    took = (state.ready_at or state.started_at) - state.started_at
    out: Lines = [Text(f"port 0: picked free port {state.port}")] if picked_port else []
    out += [_markup(f"[yellow]changed:[/] added {escape(' '.join(c.get('args', [])))}: {escape(str(c.get('why', '')))}")
            for c in state.changes or ()]
    out.append(_markup(f"[green]ready[/] {escape(state.model)} at {state.url} (pid {state.pid}, "
                       f"healthy after {took:.1f} s)"))
    out += [_markup(f"[yellow]note:[/] {escape(n)}") for n in state.notes]
    placed = state.memory.get("placement") or {}
    if placed.get("detail"):      # the engine's placement against the plan's (flows.serving.record_launch)
        colour = {"as_planned": "green", "accepted": "yellow"}.get(str(placed.get("status")), "dim")
        out.append(_markup(f"[{colour}]placement:[/] {escape(str(placed['detail']))}"))
    return out + memory_view(state.memory) + [Text(f"log: {state.log_path}")]


def status_lines(st: Status) -> Lines:
    """``status``: health, the argv with secrets redacted, memory rows, the log."""
    if not st.running or st.state is None:
        return [_markup(f"no managed server running ({st.health}).")]
    s = st.state
    asked = f"{s.host}:{s.port}"
    bound = [Text(f"listening on: {', '.join(st.bound)}" + ("" if asked in st.bound else f" (engineroom asked for "
                                                              f"{asked})"))] if st.bound else []
    return [_markup(f"{escape(s.model)} on {s.url}: [bold]{st.health}[/] (pid {s.pid}, up {st.uptime_s:.0f} s)"),
            *bound, *[_markup(f"[yellow]note:[/] {escape(n)}") for n in s.notes],
            Text("argv: " + " ".join(redact_argv(list(s.argv)))),
            *memory_view(s.memory),
            Text(f"log: {s.log_path}")]


def down_line(state: ServerState | None) -> Text:
    if state is None:
        return _markup("no managed server was running.")
    return Text(f"stopped {state.model} (pid {state.pid}, port {state.port}).")


def recipe_lines(spec: LaunchSpec, argv: Sequence[str], pick: Pick | None, *, checked: str,
                 model_present: bool, model: str) -> list[str]:
    """``recipe``: a shell script (comments, environment, the command); print each line unwrapped,
    since a comment wrapped onto a second line would run as a command."""
    lines: list[str] = []
    if pick is not None:
        lines.append(f"# {pick.source}")
        lines += [f"# note: {note}" for note in pick.notes]
    lines += [f"# note: {note}" for note in spec.notes]   # what the adapter added beyond the options, and why
    # what engineroom added for this machine (the adapter's cpu_adjustments), as `up` says it
    lines += [f"# changed: added {' '.join(c.get('args', []))}: {c.get('why', '')}" for c in spec.changes]
    lines += [f"{key}={shlex.quote(value)} \\" for key, value in spec.env.items()]
    lines.append(shlex.join(argv))
    lines.append(f"# {checked}")      # what the engine's own parser said (engines.argvcheck), or why not asked
    if not model_present:
        lines.append(f"# the model is not downloaded yet: `engineroom models pull {model}`")
    return lines


def cluster_recipe_lines(specs: Sequence[LaunchSpec], pick: Pick, *, head_given: bool) -> list[str]:
    """``recipe`` of a pick spanning machines: one block per node, rank 0 (the head) first."""
    from .redaction import redact_argv, redact_data

    c = pick.cluster or {}
    lines = [f"# {pick.source}",
             f"# {c.get('nodes')} nodes x {c.get('gpus_per_node')} GPUs; run each block on its node, in this order"]
    lines += [f"# note: {note}" for note in pick.notes]
    if not head_given:
        lines.append("# replace head-node with the head's address on the cluster network (or pass --head-addr)")
    for spec in specs:
        lines.append(f"# --- node {spec.node}" + (f": {spec.role}" if spec.role else ""))
        lines += [f"{key}={shlex.quote(value)} \\" for key, value in redact_data(spec.env).items()]
        lines.append(shlex.join(redact_argv(list(spec.argv))))
    return lines


# --- verify / runs -----------------------------------------------------------------------------

_STATUS_STYLE = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}


def check_line(result: CheckResult) -> Text:
    """One check as it finishes: PASS / FAIL / SKIP, its time and the reason (a soak's reason starts
    with its verdict: WARN is a PASS, INCONCLUSIVE a FAIL)."""
    style = _STATUS_STYLE.get(result.status, "white")
    if result.details.get("verdict") == "WARN":
        style = "yellow"
    return _markup(f"[{style}]{result.status:4}[/] {result.name:<20} {result.seconds:6.2f} s  {escape(result.reason)}")


def soak_turn_line(rec: Mapping[str, Any]) -> Text:
    """One soak turn as it ends: tokens, TTFT, decode, the answer's check, memory."""
    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else "n/a"

    check = rec.get("check") or {}
    mem_rec = rec.get("memory") or {}
    memory = (f"{mem_rec.get('source')} {mib(mem_rec['bytes'], 1)}" if isinstance(mem_rec.get("bytes"), int)
              else "memory n/a")
    status = str(check.get("status") or "?")
    style = "green" if status == "ok" else "red" if status == "error" else "yellow"
    return _markup(f"  soak turn {rec.get('turn')} (session {rec.get('session')}, {rec.get('kind')}): "
                   f"{num(rec.get('prompt_tokens'), 'd')} + {num(rec.get('completion_tokens'), 'd')} tok, "
                   f"TTFT {num(rec.get('ttft_s'), '.2f')} s, {num(rec.get('decode_tps'), '.1f')} tok/s, "
                   f"[{style}]{escape(status)}[/], {escape(memory)}")


def verify_summary(info: ServerInfo, outcome: VerifyOutcome) -> Text:
    """Passed of the checks that ran (a SKIP did not run), and where the stored run is."""
    passed = sum(1 for r in outcome.results if r.status == "PASS")
    ran = sum(1 for r in outcome.results if r.status != "SKIP")
    return _markup(f"verify {passed}/{ran} passed on {info.engine} {info.engine_version} "
                   f"(run {outcome.run_id}; `engineroom report {outcome.run_id}`)")


def runs_view(rows: Sequence[Mapping[str, Any]]) -> RenderableType:
    """``runs``: stored runs, newest first, with the engine and model their conditions name."""
    if not rows:
        return _markup("no runs stored yet.")
    table = Table("run", "kind", "status", "created", "engine", "model", "label")
    for r in rows:
        cond = r.get("conditions") or {}
        status = str(r.get("status") or "?") + (f" ({r['end_reason']})" if r.get("end_reason") else "")
        table.add_row(str(r["id"]), r["kind"], status, str(r["created"]),
                      str(cond.get("engine", "")), str(cond.get("model") or cond.get("model_id") or ""),
                      r.get("label") or "")
    return table


# --- plan / fit / hardware ---------------------------------------------------------------------

def rig_notes(rig: Rig) -> Lines:
    """What the rig's detection or spec could not know (printed on stderr, before the answer)."""
    return [_markup(f"[yellow]note:[/] {escape(note)}") for note in rig.notes]


def model_notes(subject: ResolvedModel) -> Lines:
    """For a model outside the catalog: where its facts were read, and which are estimates."""
    if subject.in_catalog:
        return []
    return [Text(f"note: {subject.model.id} is not in the catalog; read from the {subject.source}."),
            *(Text(f"  - {line}") for line in subject.estimates)]


def _not_in_catalog(subject: ResolvedModel) -> str:
    return "" if subject.in_catalog else " (not in the catalog)"


def per_device(per_gpu_bytes: Sequence[int]) -> str:
    """Each device's GiB, for a column whose header says the unit."""
    return " / ".join(gib(b, unit=False) for b in per_gpu_bytes)


def _decode(p: Plan) -> str:
    return f"{p.decode.low:.0f}-{p.decode.high:.0f}" if p.decode else "?"


def speed_bases(plans: Sequence[Plan | None]) -> Lines:
    """Where the decode speeds shown come from, one line per engine: calibrated by runs measured on this
    machine, or the catalog's efficiency alone."""
    seen: dict[str, str] = {}
    for p in plans:
        if p is not None and p.decode is not None and p.decode.basis:
            seen.setdefault(p.engine, p.decode.basis)
    return [Text(f"decode speeds, {engine}: {basis}") for engine, basis in seen.items()]


def plan_table(model: str, subject: ResolvedModel, rig: Rig, plans: Sequence[Plan]) -> Table:
    table = Table("#", "engine", "quant", "KV", "ctx", "parallel", "spec", "layout", "GiB / device", "decode t/s",
                  "aggregate t/s",
                  title=f"{escape(model)}{_not_in_catalog(subject)} on {rig.label} — priority {plans[0].priority}")
    for p in plans:
        table.add_row(str(p.rank), p.engine, p.quant, p.kv_dtype, f"{p.ctx:,}", str(p.parallel), p.spec or "-",
                      p.layout, per_device(p.per_gpu_bytes), _decode(p),
                      f"{p.aggregate_tps:.0f}" if p.aggregate_tps else "?")
    return table


def plan_view(model: str, subject: ResolvedModel, rig: Rig, plans: Sequence[Plan], reasons_for: int = 3) -> Lines:
    """``plan --priority``: the ranked table, then every reason and trade-off of the first few."""
    out: Lines = [plan_table(model, subject, rig, plans), *speed_bases(plans), *model_notes(subject)]
    for p in plans[:reasons_for]:
        out.append(_markup(f"[bold]#{p.rank} {p.engine} {p.quant} {p.kv_dtype}[/]"))
        out += [Text(f"  - {line}") for line in p.reasons]
        out += [Text(f"  ! {line}") for line in p.tradeoffs]
    return out


def how_to_choose_table(model: str, subject: ResolvedModel, rig: Rig, rows: Sequence[Choice]) -> Table:
    table = Table("your priority", "pick", "ctx x parallel", "GiB / device", "decode t/s", "why",
                  title=f"How to choose: {escape(model)}{_not_in_catalog(subject)} on {rig.label}", show_lines=True)
    for r in rows:
        p = r.plan
        if p is None:
            table.add_row(r.label, "[red]nothing fits[/]", "", "", "", escape(r.why_none))
            continue
        pick = f"{p.engine} {p.quant} + KV {p.kv_dtype}" + (f" + {p.spec}" if p.spec else "") + f" ({p.layout})"
        table.add_row(r.label, escape(pick), f"{p.ctx:,} x {p.parallel}", per_device(p.per_gpu_bytes), _decode(p),
                      escape(p.reasons[0] if p.reasons else ""))
    return table


def how_to_choose_view(model: str, subject: ResolvedModel, rig: Rig, rows: Sequence[Choice]) -> Lines:
    """``plan`` without --priority: every priority's pick, and how to see the rest."""
    return [how_to_choose_table(model, subject, rig, rows), *speed_bases([r.plan for r in rows]), *model_notes(subject),
            Text("Ranked alternatives and every reason: engineroom plan MODEL --priority ID")]


def fit_tables(title: str, f: Fit, on_gpus: bool) -> list[Table]:
    """One table per device: components, then the total against the device's capacity."""
    tables = []
    for g in f.per_gpu:
        dev = f"GPU{g.index}" if on_gpus else "RAM"
        table = Table("component", "size", "how", title=f"{title} — {dev}")
        for c in g.components:
            table.add_row(c.name, mem(c.bytes), c.note)
        table.add_row("[bold]total[/]", f"[bold]{gib(g.used_bytes)}[/]", f"of {capacity(g.capacity_bytes)}")
        tables.append(table)
    return tables


def fit_view(model_name: str, subject: ResolvedModel, rig: Rig, f: Fit, *, engine: str, quant: str, kv: str,
             ctx: int, launch_line: str) -> Lines:
    """``fit``: per-device tables, host memory, the verdict, and the `up` launch it sized; the
    title names engine, quant and KV as the user typed them."""
    from .fit import Verdict  # here, not at the top: every command imports views, few need fit

    slots, unified = f.request.parallel, f.request.kv_unified
    title = (f"{escape(model_name)}{_not_in_catalog(subject)} · {engine} · {quant} · KV {kv} · "
             f"{ctx:,} ctx on {rig.label}")
    out: Lines = [*fit_tables(title, f, bool(rig.gpus))]
    out += [Text(f"host: {c.name} {mem(c.bytes)} ({c.note})") for c in f.host]
    out += model_notes(subject)
    out += [_markup(f"[yellow]note:[/] {escape(n)}") for n in f.notes]
    style = {Verdict.FITS: "green", Verdict.TIGHT: "yellow"}.get(f.verdict, "red")
    out.append(_markup(f"verdict: [{style}]{f.verdict}[/] — {escape(f.binding)}"))
    out.append(Text(f"slots: {slots} x {ctx:,} tokens, KV "
                    f"{'unified (one cache shared by the slots)' if unified else 'per slot'}"
                    f"; the same launch: {launch_line}"))
    out.append(_markup(f"max fillable context at {slots} seq(s): {f.max_ctx:,} tokens (fit.max_context)"))
    if f.max_parallel is not None:
        out.append(_markup(f"max concurrent sequences at {ctx:,} tokens each: {f.max_parallel} (fit.max_concurrency)"))
    return out


def _known(value: object) -> str:
    return "unknown" if value is None else str(value)


def hardware_view(rig: Rig, ran: CpuProbe) -> Lines:
    """``hardware``: GPUs, the CPU, the bandwidth plan assumes (and its source), what executes."""
    out: Lines = []
    if rig.gpus:
        table = Table("#", "GPU", "VRAM", "free", "SM", "bandwidth", "class", title=f"driver {rig.driver or '?'}")
        for i, g in enumerate(rig.gpus):
            table.add_row(str(i), g.name, gib(g.vram_bytes), gib(g.free_bytes), g.compute_capability or "?",
                          f"{g.bandwidth_gbs:g} GB/s" if g.bandwidth_gbs else "?", g.hw_class or "-")
        out.append(table)
        if rig.n_gpus > 1:
            out.append(_markup(f"P2P: {_known(rig.p2p)}; NVLink: {_known(rig.nvlink)}"))
    out.append(_markup(f"CPU: {escape(rig.cpu_model or 'unknown model')}, {rig.cpu_cores} cores; "
                       f"RAM {gib(rig.cpu_ram_bytes)}"))
    if rig.cpu_bandwidth_gbs:
        per = ", ".join(f"{t} thread(s) {v:g} GB/s" for t, v in rig.cpu_bandwidth_by_threads)
        out.append(_markup(f"CPU memory bandwidth plan assumes: {rig.cpu_bandwidth_gbs:g} GB/s at {rig.cpu_threads} "
                           f"thread(s)" + (f" (measured: {per})" if per else "")
                           + f" — {escape(rig.cpu_bandwidth_source)}"))
    else:
        out.append(_markup("CPU memory bandwidth: unknown (no probe result and no catalog default)"))
    out.append(Text("CPU instructions, executed in a child process (flags can lie): "
                    + ", ".join(f"{k} {v}" + (" (forced)" if k in ran.forced else "") for k, v in ran.results.items())))
    return out


# --- memory rows (status, up) ------------------------------------------------------------------

def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}%"


def memory_table(memory: Mapping[str, Any],
                 title: str = "memory: fit's prediction vs the engine's report") -> Table | None:
    """Predicted vs measured per component (rows as ``memory.rows_as_dicts`` stores them)."""
    rows = memory.get("rows") or []
    if not rows:
        return None
    table = Table("component", "predicted", "measured", "error", title=title)
    for r in rows:
        table.add_row(r["component"],
                      mem(r.get("predicted_bytes"), 2, missing="—"),
                      mem(r.get("measured_bytes"), 2, missing="—"),
                      _pct(r.get("error_pct")))
    src = memory.get("measured_source")
    if src or memory.get("predicted_for"):
        table.caption = (f"predicted by fit for {memory.get('predicted_for') or '?'}; "
                         f"measured: {src or 'nothing reported'}")
    return table

