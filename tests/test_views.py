"""The views (views.py) on constructed data: the cells and lines the commands print.

The CLI tests run whole commands against the catalog; these pin what each view makes of
data chosen to reach its edges (a device list, a missing measurement, a pick with no plan,
brackets in text that comes from outside), without a catalog search or an engine.
"""

from __future__ import annotations

from types import SimpleNamespace

from rich.table import Table
from rich.text import Text

from engineroom import views
from engineroom.checks.smoke import CheckResult
from engineroom.cpuprobe import CpuProbe
from engineroom.engines.base import LaunchSpec
from engineroom.fit import Component, Fit, FitRequest, GpuFit, Verdict
from engineroom.flows import Pick
from engineroom.hardware import GpuSpec, Rig
from engineroom.launch import ServerState, Status
from engineroom.plan import Choice, LaunchRequest, Plan, SpeedBand, Weights
from engineroom.units import GB, GiB, MiB

from conftest import run_cli


def cells(table: Table) -> list[list[str]]:
    """The table's rows as the strings handed to rich (markup still in them)."""
    columns = [list(c.cells) for c in table.columns]
    return [list(row) for row in zip(*columns, strict=True)]


def plain(items) -> list[str]:
    return [i.plain for i in items if isinstance(i, Text)]


def _plan(**over) -> Plan:
    band = SpeedBand(low=30.4, high=40.6, roofline_tps=60.0, bytes_per_token=1, bandwidth_gbs=936.0,
                     efficiency=(0.5, 0.7), efficiency_source="test")
    fields = dict(rank=1, priority="balanced", model="qwen3.6-27b", engine="llama.cpp", quant="Q4_K_M",
                  quant_format="gguf", kv_dtype="q8_0", ctx=32768, max_ctx=65536, parallel=1, spec=None, spec_tokens=0,
                  tp=2, instances=1, multi_gpu_mode="layer_split", per_gpu_bytes=(12 * GiB, int(11.25 * GiB)),
                  capacity_bytes=(24 * GB, 24 * GB), breakdown=(), verdict=Verdict.FITS, binding="", decode=band,
                  aggregate_tps=None, metrics={}, reasons=("fast [enough]",), tradeoffs=("one trade-off",))
    return Plan(**{**fields, **over})


RIG = Rig(gpus=(GpuSpec("RTX 3090", 24 * GB, 936.0, "8.6", hw_class="3090"),) * 2, label="2x3090")
CATALOG_MODEL = SimpleNamespace(in_catalog=True, source="catalog", estimates=(),
                                model=SimpleNamespace(id="qwen3.6-27b"))
ADHOC_MODEL = SimpleNamespace(in_catalog=False, source="GGUF header of x.gguf",
                              estimates=("params from tensor shapes",), model=SimpleNamespace(id="x"))


def test_plan_table_cells_use_units_and_the_layout():
    table = views.plan_table("qwen3.6-27b", CATALOG_MODEL, RIG, [_plan(), _plan(rank=2, decode=None, spec="mtp",
                                                                                  aggregate_tps=91.6, tp=1)])
    assert table.title == "qwen3.6-27b on 2x3090 — priority balanced"
    assert cells(table) == [
        ["1", "llama.cpp", "Q4_K_M", "q8_0", "32,768", "1", "-", "split x2", "12.0 / 11.2", "30-41", "?"],
        ["2", "llama.cpp", "Q4_K_M", "q8_0", "32,768", "1", "mtp", "1 device", "12.0 / 11.2", "?", "92"],
    ]


def test_plan_view_reasons_follow_the_table_and_an_adhoc_model_is_noted():
    out = views.plan_view("x.gguf", ADHOC_MODEL, RIG, [_plan()])
    assert isinstance(out[0], Table) and out[0].title == "x.gguf (not in the catalog) on 2x3090 — priority balanced"
    assert plain(out) == ["note: x is not in the catalog; read from the GGUF header of x.gguf.",
                          "  - params from tensor shapes",
                          "#1 llama.cpp Q4_K_M q8_0", "  - fast [enough]", "  ! one trade-off"]


def test_how_to_choose_escapes_text_from_outside_and_says_nothing_fits():
    rows = [Choice("balanced", "Balanced (default)", _plan(spec="mtp")),
            Choice("full-features", "Full feature set", None, why_none="no [tools] here")]
    table = views.how_to_choose_table("qwen3.6-27b", CATALOG_MODEL, RIG, rows)
    assert cells(table) == [
        ["Balanced (default)", "llama.cpp Q4_K_M + KV q8_0 + mtp (split x2)", "32,768 x 1", "12.0 / 11.2", "30-41",
         "fast \\[enough]"],
        ["Full feature set", "[red]nothing fits[/]", "", "", "", "no \\[tools] here"],
    ]


def _fit(verdict=Verdict.TIGHT) -> Fit:
    gpu = GpuFit(index=1, capacity_bytes=24 * GB,
                 components=(Component("weights", int(1.5 * GiB), "layers 0-31"),
                             Component("kv_cache", 512 * MiB, "q8_0")))
    return Fit(request=FitRequest(engine="llama.cpp", ctx=8192, parallel=2, kv_unified=True), rig_label="1x3090",
               per_gpu=(gpu,), host=(Component("output", 970 * 1024, "logits"),), verdict=verdict,
               binding="GPU1: 2.00 GiB of 22.35 GiB", max_ctx=131072, max_parallel=None)


def test_fit_view_tables_verdict_and_launch():
    out = views.fit_view("Qwen3.6-27B", CATALOG_MODEL, RIG, _fit(), engine="llama.cpp", quant="Q4_K_M", kv="q8_0",
                         ctx=8192, launch_line="engineroom up MODEL --ctx 8192 --parallel 2 --kv-unified")
    table = out[0]
    assert table.title == "Qwen3.6-27B · llama.cpp · Q4_K_M · KV q8_0 · 8,192 ctx on 2x3090 — GPU1"
    assert cells(table) == [["weights", "1.5 GiB", "layers 0-31"], ["kv_cache", "512.0 MiB", "q8_0"],
                            ["[bold]total[/]", "[bold]2.0 GiB[/]", "of 22.4 GiB (24.0 GB)"]]
    assert plain(out) == [
        "host: output 970.0 KiB (logits)",
        "verdict: tight — GPU1: 2.00 GiB of 22.35 GiB",
        "slots: 2 x 8,192 tokens, KV unified (one cache shared by the slots); the same launch: "
        "engineroom up MODEL --ctx 8192 --parallel 2 --kv-unified",
        "max fillable context at 2 seq(s): 131,072 tokens (fit.max_context)",
    ]
    verdict = out[2]
    assert [(s.start, s.end, s.style) for s in verdict.spans] == [(9, 14, "yellow")]
    cpu = views.fit_view("Qwen3.6-27B", CATALOG_MODEL, Rig(gpus=(), label="cpu:64GB"), _fit(Verdict.DOES_NOT_FIT),
                         engine="llama.cpp", quant="Q4_K_M", kv="q8_0", ctx=8192, launch_line="")
    assert cpu[0].title.endswith("— RAM") and cpu[2].spans[0].style == "red"


def test_memory_table_marks_what_was_not_measured():
    memory = {"rows": [{"component": "weights", "predicted_bytes": 92 * MiB, "measured_bytes": None, "error_pct": None},
                       {"component": "total", "predicted_bytes": 201.5 * MiB, "measured_bytes": 200 * MiB,
                        "error_pct": 0.75}],
              "predicted_for": "this machine", "measured_source": "llama-server -lv 4"}
    table = views.memory_table(memory)
    assert cells(table) == [["weights", "92.00 MiB", "—", "—"], ["total", "201.50 MiB", "200.00 MiB", "+0.75%"]]
    assert table.caption == "predicted by fit for this machine; measured: llama-server -lv 4"
    assert views.memory_view({"rows": [], "prediction_missing": "no [fit] for vllm"})[0].plain == \
        "memory: no prediction (no [fit] for vllm)"
    assert views.memory_view({}) == []


def _state(**over) -> ServerState:
    return ServerState(**{**dict(pid=42, port=8080, host="127.0.0.1", engine="llama.cpp",
                                 argv=["llama-server", "--api-key", "sk-secret", "-c", "4096"], model="smollm2-135m",
                                 model_path="/m.gguf", log_path="/logs/server.log", started_at=100.0, ready_at=101.25,
                                 changes=[{"args": ["-nr"], "why": "AMX traps"}]), **over})


def test_started_and_status_lines_redact_the_key():
    assert plain(views.started_lines(_state(), picked_port=True)) == [
        "port 0: picked free port 8080", "changed: added -nr: AMX traps",
        "ready smollm2-135m at http://127.0.0.1:8080 (pid 42, healthy after 1.2 s)", "log: /logs/server.log"]
    lines = plain(views.status_lines(Status(True, _state(), "ready", 61.4)))
    assert lines[0] == "smollm2-135m on http://127.0.0.1:8080: ready (pid 42, up 61 s)"
    assert lines[1].startswith("argv: llama-server --api-key ") and "sk-secret" not in lines[1]
    assert plain(views.status_lines(Status(False, None, "stopped", None))) == ["no managed server running (stopped)."]
    assert views.down_line(None).plain == "no managed server was running."
    assert views.down_line(_state()).plain == "stopped smollm2-135m (pid 42, port 8080)."


def test_recipe_lines_are_a_shell_script():
    spec = LaunchSpec(engine="llama.cpp", argv=("llama-server", "-m", "<x file>"), port=8080,
                      env={"LD_LIBRARY_PATH": "/a b"}, model="x", model_path="/nowhere/x.gguf")
    pick = Pick(request=LaunchRequest(model="x", engine="llama.cpp", weights=Weights(ref="x")), plan={},
                source="plan x --priority balanced, pick 1", notes=("a note",))
    absent = "not validated: llama.cpp is not installed here (`engineroom engines install llama.cpp`)"
    assert views.recipe_lines(spec, list(spec.argv), pick, checked=absent, model_present=False, model="x") == [
        "# plan x --priority balanced, pick 1", "# note: a note", "LD_LIBRARY_PATH='/a b' \\",
        "llama-server -m '<x file>'", f"# {absent}", "# the model is not downloaded yet: `engineroom models pull x`"]
    assert views.recipe_lines(spec, ["llama-server"], None, checked="validated: ...", model_present=False,
                              model="x") == [
        "LD_LIBRARY_PATH='/a b' \\", "llama-server", "# validated: ...",
        "# the model is not downloaded yet: `engineroom models pull x`"]


def test_recipe_comments_stay_comments_on_a_narrow_terminal():
    """A wrapped "# note" would put its tail on a line of its own, which a shell runs as a command."""
    proc = run_cli("recipe", "qwen3.6-27b", "--priority", "balanced", "--rig", "1x3090", env={"COLUMNS": "60"},
                   check=True)
    lines = proc.stdout.splitlines()
    assert any(line.startswith("# note: speculative decoding") for line in lines), proc.stdout
    assert all(line.startswith("#") or "=" in line.split()[0] or line.split()[0] in ("python", "llama-server")
               for line in lines), proc.stdout


def test_check_line_and_verify_summary():
    line = views.check_line(CheckResult("tool_call", "SKIP", "no [tools] declared", 0.0))
    assert line.plain == "SKIP tool_call              0.00 s  no [tools] declared"
    assert line.spans[0].style == "yellow"
    outcome = SimpleNamespace(run_id=7, results=[CheckResult("a", "PASS", ""), CheckResult("b", "FAIL", ""),
                                                 CheckResult("c", "SKIP", "")])
    info = SimpleNamespace(engine="llama.cpp", engine_version="b11434")
    assert views.verify_summary(info, outcome).plain == \
        "verify 1/2 passed on llama.cpp b11434 (run 7; `engineroom report 7`)"


def test_runs_and_engines_tables():
    rows = [{"id": 3, "kind": "bench", "status": "INTERRUPTED", "end_reason": "process gone", "created": "2026-12-01",
             "conditions": {"engine": "llama.cpp", "model_id": "smollm2-135m"}, "label": None}]
    assert cells(views.runs_view(rows)) == [["3", "bench", "INTERRUPTED (process gone)", "2026-12-01", "llama.cpp",
                                             "smollm2-135m", ""]]
    assert views.runs_view([]).plain == "no runs stored yet."
    engines = [{"engine": "llama.cpp", "found": True, "path": "/b/llama-server", "origin": "engineroom engines install",
                "version": "b11434", "install": {"built_at": "2026-12-01", "build_seconds": 302.6, "backend": "cpu",
                                                 "jobs": 2}},
               {"engine": "vllm", "found": False, "error": "not on PATH [pip install vllm]",
                "tested": "real: CPU build",
                "runs_here": {"verify": {"run": 9, "kind": "verify", "status": "OK", "passed": "6/6"},
                              "bench": {"run": 10, "kind": "bench", "status": "OK", "decode_tps": 21.5}}},
               {"engine": "sglang", "found": True, "path": "/e/python", "origin": "engineroom engines install (0.5.23)",
                "version": "0.5.23", "install": {"installed_at": "2026-12-01", "install_seconds": 95.4,
                                                 "installer": "venv + pip"}}]
    assert cells(views.engines_table(engines)) == [
        ["llama.cpp", "b11434", "/b/llama-server", "engineroom engines install, built 2026-12-01 in 303 s (cpu, -j2)",
         "", "no runs"],
        ["vllm", "[red]not found[/]", "not on PATH \\[pip install vllm]", "", "real: CPU build",
         "verify OK 6/6 (run 9), bench OK 21.5 tok/s (run 10)"],
        ["sglang", "0.5.23", "/e/python",
         "engineroom engines install (0.5.23), installed 2026-12-01 in 95 s (venv + pip)", "", "no runs"]]


def test_hardware_view_gpus_in_gib_and_what_executes():
    rig = Rig(gpus=(GpuSpec("RTX 3090", 24 * GiB, 936.0, "8.6", free_bytes=20 * GiB, hw_class="3090"),
                    GpuSpec("RTX 4090", 24 * GiB, None, None)),
              cpu_ram_bytes=64 * GiB, cpu_cores=16, cpu_model="EPYC", driver="550.1", p2p=False, label="this machine")
    ran = CpuProbe(model="EPYC", arch="x86_64", flags=frozenset(), results={"avx2": "ok", "amx": "trap: SIGILL"},
                   forced=("amx",))
    out = views.hardware_view(rig, ran)
    assert out[0].title == "driver 550.1"
    assert cells(out[0]) == [["0", "RTX 3090", "24.0 GiB", "20.0 GiB", "8.6", "936 GB/s", "3090"],
                             ["1", "RTX 4090", "24.0 GiB", "?", "?", "?", "-"]]
    assert plain(out) == ["P2P: False; NVLink: unknown", "CPU: EPYC, 16 cores; RAM 64.0 GiB",
                          "CPU memory bandwidth: unknown (no probe result and no catalog default)",
                          "CPU instructions, executed in a child process (flags can lie): avx2 ok, "
                          "amx trap: SIGILL (forced)"]


def test_models_views():
    pm = SimpleNamespace(name="smollm2-135m", package="smollm2-gguf==1.0", size=90_000_000, description="tiny")
    assert cells(views.packaged_table({"smollm2-135m": pm, "smollm2": pm})) == [
        ["smollm2-135m", "PyPI smollm2-gguf==1.0", "85.8 MiB", "tiny"]]
    cached = SimpleNamespace(name="m", architecture="llama", file_type="Q4_1", params="135M", context_length=None,
                             size=1536)
    assert cells(views.cached_models([cached], "/cache")) == [["m", "llama", "Q4_1", "135M", "?", "1.5 KiB"]]
    assert views.cached_models([], "/cache").plain == "no models cached; try `engineroom models pull smollm2-135m`."
    assert views.pulled_line("hf:o/r/[x].gguf", "/p", 512).plain == "ok hf:o/r/[x].gguf -> /p (512 B)"


def test_an_install_says_how_it_was_made_and_on_whose_kernels():
    native = {"build_seconds": 486.1, "built_at": "2026-12-05T08:41:00Z", "backend": "cpu", "jobs": 2}
    assert views.install_summary(native) == "built 2026-12-05T08:41:00Z in 486 s (cpu, -j2)"
    prebuilt = {**native, "build_seconds": 189.1,
                "kernels": {"from": "ik_llama_cpp_python-0.1.5-cp311-cp311-manylinux_2_28_x86_64.whl"}}
    assert views.install_summary(prebuilt) == ("built 2026-12-05T08:41:00Z in 189 s (cpu, -j2, kernels from "
                                               "ik_llama_cpp_python-0.1.5-cp311-cp311-manylinux_2_28_x86_64.whl)")
    pip = {"install_seconds": 230.5, "installed_at": "2026-12-05T06:15:18Z", "installer": "venv + pip"}
    assert views.install_summary(pip) == "installed 2026-12-05T06:15:18Z in 230 s (venv + pip)"
