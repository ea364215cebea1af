"""The adapter seam: entry-point discovery, the protocol, engine names kept in their adapter,
the plan driving the launch, and fit's prediction stored beside what the engine reported."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from engineroom import engines, flows, launch
from engineroom.client import ChatResult, StreamResult
from engineroom.engines import base, llamacpp
from engineroom.engines.base import UNKNOWN_FAILURE, Capabilities, EngineAdapter, HealthState, LaunchOptions, Settled
from engineroom.errors import NotFound
from engineroom.launchargs import LaunchArgs
from engineroom.memory import compare, rows_as_dicts

from conftest import cli, run_cli

SRC = Path(__file__).resolve().parents[1] / "src" / "engineroom"
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- discovery / protocol
def test_builtin_adapter_is_registered_through_the_entry_point_group():
    from importlib import metadata

    eps = {ep.name: ep.value for ep in metadata.entry_points(group=engines.GROUP)}
    assert eps.get("llama.cpp") == "engineroom.engines.llamacpp"
    assert engines.adapter("llama.cpp").origin.startswith("entry point llama.cpp = engineroom.engines.llamacpp")


def test_every_adapter_meets_the_protocol():
    for eng in engines.all_engines():
        assert isinstance(eng.impl, EngineAdapter), eng
        assert eng.name == eng.impl.ENGINE


def _string_literals(path: Path) -> list[tuple[int, str, bool]]:
    """Every string constant of a module that is not a docstring (messages count: they are code),
    with whether it is a key of a dict display (``{"timings": ...}``: a record engineroom writes)."""
    tree = ast.parse(path.read_text())
    docstrings, dict_keys = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
        if isinstance(node, ast.Dict):
            dict_keys.update(id(k) for k in node.keys if k is not None)
    return [(n.lineno, n.value, id(n) in dict_keys) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def _uses(literal: str, name: str) -> bool:
    """Whether a string literal uses an engine's name: a flag as an argument or inside a command
    line; a field name as the whole literal, quoted in a message, or dotted. Whole words only:
    ``normalise_timings`` or ``engine_timings`` do not use ``timings``."""
    if name.startswith("-"):   # a flag: as an argument, or inside a command line
        return literal == name or literal.startswith(name + "=") or f" {name} " in f" {literal} "
    return (literal == name or f"'{name}'" in literal or f'"{name}"' in literal
            or re.search(rf"\.{re.escape(name)}\b", literal) is not None)


# engineroom's own words (Capabilities' fields, the client's result fields): spelt like an engine's
# field, they are not the engine's when they key a record engineroom writes (``{"timings": ...}`` in
# a capability's reasons or a check's record); read from an answer (``body["timings"]``,
# ``.get("timings")``) or quoted in a message they still are.
NEUTRAL_WORDS = ({f.name for f in dataclasses.fields(Capabilities)} | {f.name for f in dataclasses.fields(ChatResult)}
                 | {f.name for f in dataclasses.fields(StreamResult)})


def test_the_name_matcher_takes_whole_words_and_reads_not_records():
    assert _uses("timings", "timings") and _uses('the answer has no "timings" field', "timings")
    assert _uses("r.timings is empty", "timings")
    assert not _uses("normalise_timings", "timings") and not _uses("engine_timings", "timings")
    assert not _uses("server.normalise_timings", "timings") and not _uses("x.timings_field", "timings")
    assert "timings" in NEUTRAL_WORDS and "predicted_n" not in NEUTRAL_WORDS
    assert _uses("--kv-unified", "--kv-unified") and not _uses("--kv-unified/--no-kv-unified", "--kv-unified")


# (file, name): why that one file may hold the name
EXEMPT = {("records/schema2.py", "ignore_eos"): "store schema 2 named its own keys after it; the migration reads them",
          ("engines/sglang/server.py", "ignore_eos"): "SGLang's chat API takes the same sampling parameter",
          ("engines/vllm/server.py", "ignore_eos"): "vLLM's sampling parameters include the same one"}


@pytest.mark.slow
def test_engine_specific_names_occur_only_in_their_adapter():
    offenders = []
    for eng in engines.all_engines():
        own = getattr(eng.impl, "OWN_NAMES", ())
        home = Path(eng.impl.__file__).resolve()
        home_dir = home.parent if hasattr(eng.impl, "__path__") else None   # an adapter package: all of it
        assert own, f"{eng.name}'s adapter declares no OWN_NAMES"
        # an adapter of the same family (FAMILY names the adapter it imports from) may use its names
        kin = [Path(e.impl.__file__).resolve().parent for e in engines.all_engines()
               if getattr(e.impl, "FAMILY", None) == eng.name and hasattr(e.impl, "__path__")]
        for path in SRC.rglob("*.py"):
            if path.resolve() == home or (home_dir is not None and home_dir in path.resolve().parents):
                continue
            if any(k in path.resolve().parents for k in kin):
                continue
            for line, literal, record_key in _string_literals(path):
                rel = str(path.relative_to(SRC))
                offenders += [f"{rel}:{line} uses {n!r} ({eng.name})" for n in own
                              if _uses(literal, n) and (rel, n) not in EXEMPT
                              and not (record_key and literal in NEUTRAL_WORDS)]
    assert not offenders, "\n".join(offenders)


class _MinimalAdapter:
    """An out-of-tree adapter with the required members only, its health in plain strings."""

    ENGINE = "minimal"

    def find_binary(self, explicit=None):
        raise NotFound("not here")

    def render(self, binary, options):
        raise NotFound("not here")

    def health_state(self, status_code):
        return "ready" if status_code == 200 else "warming up"

    def classify_failure(self, log_text):
        return UNKNOWN_FAILURE

    def probe(self, url, timeout=5.0):        # predates API keys
        return None


def test_a_plugin_without_the_optional_hooks_gets_their_neutral_defaults():
    impl = _MinimalAdapter()
    assert isinstance(impl, EngineAdapter)
    assert not any(isinstance(impl, hook) for hook in (base.ReportsMemory, base.NormalisesTimings,
                                                          base.NormalisesMetrics, base.Installs, base.ListsInstalls))
    eng = engines.Engine(impl)
    assert eng.health_state(200) is HealthState.READY and eng.health_state(200) == "ready"
    assert eng.health_state(None) is HealthState.LOADING          # a word the enum lacks: not ready
    assert eng.probe("http://127.0.0.1:1") is None                 # no api_key passed to it
    assert eng.memory_report("any log") is None and eng.normalise_timings({"x": 1}) is None
    assert eng.metrics("http://127.0.0.1:1") is None and eng.timings_field is None
    assert eng.installed() == [] and not eng.can_install and eng.start_timeout == 300.0
    with pytest.raises(NotFound, match="cannot install minimal"):
        eng.install()
    assert eng.launch_settings(LaunchOptions(model_path=Path("m"), ctx=512)) == Settled(ctx=512, parallel=1)


def test_the_builtin_health_states_are_the_enum_and_still_equal_their_strings():
    for eng in engines.all_engines():
        for code in (None, 200, 503, 500):
            state = eng.impl.health_state(code)
            assert isinstance(state, HealthState) and state == str(state)


def test_the_timings_block_is_found_by_the_field_the_adapter_names():
    assert engines.adapter("llama.cpp").timings_field == llamacpp.TIMINGS_FIELD
    block = {"predicted_n": 3, "predicted_ms": 20.0}
    fields = {llamacpp.TIMINGS_FIELD: block, "some_other_engine_field": 1}
    assert engines.timings_block(fields) == block
    assert engines.timings_block({"some_other_engine_field": 1}) is None
    timings = engines.adapter("llama.cpp").normalise_timings(engines.timings_block(fields) or {})
    assert timings is not None and timings.decode_tokens == 3


def test_a_broken_plugin_is_reported_and_the_rest_still_work(tmp_path, monkeypatch):
    _plugin(tmp_path, "broken", entry="engineroom_broken_engine:ADAPTER", body="raise ImportError('no such lib')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    engines.reload()
    try:
        assert "llama.cpp" in engines.names()
        why = [p.why for p in engines.problems() if "engineroom_broken_engine" in p.entry_point]
        assert why and why[0].startswith("does not import (ImportError: no such lib)")
    finally:
        monkeypatch.undo()
        engines.reload()


# --------------------------------------------------------------------------- an out-of-tree engine
PLUGIN_ADAPTER = '''
"""A third-party adapter: llama-server under another engine name, with its own catalog entry."""
from pathlib import Path

from engineroom.engines import llamacpp

ENGINE = "llama-server-plugin"
OWN_NAMES = ("--plugin-only-flag",)
find_binary = llamacpp.find_binary
health_state = llamacpp.health_state
classify_failure = llamacpp.classify_failure
memory_report = llamacpp.memory_report
launch_settings = llamacpp.launch_settings
loads_refusal = llamacpp.loads_refusal
cpu_adjustments = llamacpp.cpu_adjustments      # llama-server's needs on this CPU (--no-repack where AMX traps)
crash_fallback = llamacpp.crash_fallback


def render(binary, options):
    from dataclasses import replace
    return replace(llamacpp.render(binary, options), engine=ENGINE)


def probe(url, timeout=5.0):
    return None          # let llama.cpp's own adapter claim the running server


def catalog_dir():
    return Path(__file__).parent / "catalog"
'''


def _plugin(root: Path, name: str, *, entry: str, body: str, catalog: str | None = None) -> None:
    pkg = root / f"engineroom_{name}_engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    if catalog:
        (pkg / "catalog" / "engines").mkdir(parents=True)
        (pkg / "catalog" / "engines" / "plugin.yaml").write_text(catalog)
    dist = root / f"engineroom_{name}_engine-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: engineroom-{name}-engine\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[engineroom.engines]\n{name} = {entry}\n")


def _plugin_catalog() -> str:
    """The plugin's engine entry: llama.cpp's catalog entry under the plugin's id."""
    import yaml

    entry = yaml.safe_load((SRC / "engines" / "llamacpp" / "catalog" / "engines" / "llama.cpp.yaml").read_text())
    entry.update(id="llama-server-plugin", name="llama-server (plugin)", aliases=[])
    return yaml.safe_dump(entry)


def test_a_plugins_catalog_folder_is_read_as_the_built_in_adapters_are(tmp_path, monkeypatch):
    """One layout: a plugin's ``catalog_dir()`` and each built-in adapter package's ``catalog/`` hold
    ``engines/<id>.yaml``; the catalog reads both (the built-in ones by path, first), keyed by the files
    of both, and an error in the plugin's entry names its file."""
    from engineroom import paths, plugins
    from engineroom.catalog import CATALOG_DIR, load_catalog
    from engineroom.catalog.load import _load_cached, _stored_path
    from engineroom.errors import BadInput

    _plugin(tmp_path, "plugin", entry="engineroom_plugin_engine", body=textwrap.dedent(PLUGIN_ADAPTER),
            catalog=_plugin_catalog())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(paths, "cache_dir", lambda: tmp_path / "cache")
    engines.reload()
    try:
        own = plugins.builtin_catalog_dirs()
        folder = tmp_path / "engineroom_plugin_engine" / "catalog"
        assert plugins.catalog_dirs() == (*own, folder)
        cat = load_catalog()
        assert [e.id for e in cat.engines] == ["ik_llama.cpp", "llama.cpp", "sglang", "vllm", "llama-server-plugin"]
        assert engines.resolve("llama-server-plugin") == "llama-server-plugin"
        assert _stored_path(str(CATALOG_DIR), tuple(map(str, plugins.catalog_dirs()))) != \
            _stored_path(str(CATALOG_DIR), tuple(map(str, own)))
        entry = folder / "engines" / "plugin.yaml"
        entry.write_text(entry.read_text() + "cold_strat_s: 1\n")
        _load_cached.cache_clear()
        with pytest.raises(BadInput, match=rf"^catalog file {re.escape(str(entry))}: unknown key 'cold_strat_s'; "
                                           r"did you mean 'cold_start_s'\?"):
            load_catalog()
    finally:
        monkeypatch.undo()
        engines.reload()
        _load_cached.cache_clear()


def test_an_out_of_tree_adapter_is_discovered_and_launched(tmp_path, llama_server_binary, smollm2):
    _plugin(tmp_path, "plugin", entry="engineroom_plugin_engine", body=textwrap.dedent(PLUGIN_ADAPTER),
            catalog=_plugin_catalog())
    # a process of its own: the plugin is found on the PYTHONPATH it starts with; its own state folder:
    # a session-wide managed server may be running beside it
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH", "")])),
           "ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    listed = run_cli("engines", "--json", env=env)
    rows = {r["engine"]: r for r in json.loads(listed.stdout)}
    assert rows["llama-server-plugin"]["adapter"].endswith("(engineroom-plugin-engine 0.1)")
    up = run_cli("up", "smollm2-135m", "--engine", "llama-server-plugin", "--port", "0", "--ctx", "1024",
                 "-t", "2", "--json", env=env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads(up.stdout)
        assert state["engine"] == "llama-server-plugin"
        rows = {r["component"]: r for r in state["memory"]["rows"]}
        # fit sized it from the catalog entry the plugin shipped: no per-engine code in fit
        assert rows["kv_cache"]["predicted_bytes"] and rows["kv_cache"]["measured_bytes"]
        assert abs(rows["kv_cache"]["error_pct"]) < 1.0
    finally:
        run_cli("down", env=env)


@pytest.fixture
def own_state(tmp_path, monkeypatch) -> dict:
    """A state folder of the test's own (in-process and for the CLI): the session's managed server
    may be running beside it."""
    state = tmp_path / "own-state"
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(state))
    return {"ENGINEROOM_STATE_DIR": str(state)}


# --------------------------------------------------------------------------- memory the engine reports
def test_memory_report_reads_the_cuda_buffers_and_breakdown_of_a_real_h200_log():
    data = json.loads((ROOT / "benchmarks" / "data" / "cuda_fit_and_speed.json").read_text())
    lines = next(r["breakdown"] for r in data["mem"] if r.get("breakdown"))   # raw lines of the H200 run
    report = llamacpp.memory_report("\n".join(lines) + "\nload_tensors:   CUDA0 model buffer size = 13832.00 MiB\n"
                                    "load_tensors:   CPU_Mapped model buffer size =   682.00 MiB\n")
    assert report is not None and report.device == "cuda"
    assert report.component("weights") == 13832 * 2**20
    assert report.component("weights_embedding") == 682 * 2**20      # the host-side embeddings, as fit names them
    # | - CUDA0 (H200) | total = free + (self = model + context + compute) + unaccounted |: self is the third number
    cuda = [c for c in report.components if c.name == "total:CUDA0"]
    assert cuda and cuda[0].bytes % 2**20 == 0 and cuda[0].bytes > report.component("weights")


def test_comparison_rows_say_which_side_is_missing():
    rows = rows_as_dicts(compare({"weights": 100, "kv_cache": 50, "recurrent_state": 0, "total": 160},
                                 {"weights": 100, "kv_cache": 40, "output": 5, "total:Host": 140}))
    by = {r["component"]: r for r in rows}
    assert by["kv_cache"]["error_pct"] == 25.0 and by["weights"]["error_pct"] == 0.0
    assert by["output"]["predicted_bytes"] is None and by["output"]["error_pct"] is None
    assert "recurrent_state" not in by                               # neither side has any
    # like with like: the components both sides have (output, which fit did not predict, is its own row;
    # not the MiB-truncated table either)
    assert by["total"]["measured_bytes"] == 140 and by["total"]["predicted_bytes"] == 150
    assert "total:Host" not in by


# --------------------------------------------------------------------------- plan -> launch
def test_render_from_plan_settings_is_explicit(llama_server_binary, smollm2):
    # llama.cpp named: balanced may rank vLLM's assumed CPU band first on a quiet machine (its KV 'auto')
    pick = flows.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp")
    r = pick.request
    opts = flows.launch_options(r, model_path=smollm2, port=1)
    argv = list(llamacpp.render(llama_server_binary, opts).argv)
    assert argv[argv.index("-np") + 1] == str(r.parallel)
    assert argv[argv.index("-c") + 1] == str(r.ctx * r.parallel)
    if r.kv_dtype not in (None, "f16"):
        assert argv[argv.index("-ctk") + 1] == r.kv_dtype == argv[argv.index("-ctv") + 1]


def _priorities() -> list[str]:
    from engineroom.catalog import load_catalog

    return [p.id for p in load_catalog().priorities]


@pytest.mark.parametrize("priority", _priorities())
def test_each_priority_on_this_machine_launches_its_pick_or_says_why(priority, llama_server_binary, smollm2,
                                                                      own_state):
    """Every priority's pick for SmolLM2 on this CPU: launched by the real llama-server when it is
    an engine engineroom drives; otherwise one sentence naming the engine."""
    from engineroom.errors import NotFound

    try:
        pick = flows.pick_from_plan("smollm2-135m", priority=priority)
    except NotFound as exc:              # e.g. full-features: SmolLM2 has no tool calling
        assert str(exc).startswith("no configuration of SmolLM2-135M-Instruct fits") and "closest miss" in str(exc)
        return
    if not engines.has_adapter(pick.engine):
        with pytest.raises(Exception) as info:
            flows.start(pick.model_ref, LaunchArgs(port=0, threads=2), pick=pick)
        assert f"no adapter for {pick.engine}" in str(info.value)
        return
    args = LaunchArgs(threads=2, port=0)      # the pick's request fills the rest (flows.prepare)
    if pick.engine != engines.DEFAULT_ENGINE:
        # another engine's pick (vLLM for max-context): launched where that engine is installed and its
        # files can be had; here it may be neither (not installed yet, a Hugging Face repo offline), and
        # then the launch ends in one sentence that names what is missing, never a crash
        from engineroom.errors import EngineroomError

        try:
            state = flows.start(pick.model_ref, args, pick=pick)
        except EngineroomError as exc:
            sentence = str(exc).strip()
            assert sentence and "\n" not in sentence and "Traceback" not in sentence, sentence
            assert pick.engine in sentence or pick.model_ref in sentence, sentence
            return
    else:
        state = flows.start(pick.model_ref, args.with_fields(timeout=120), pick=pick)
    try:
        assert launch.probe_health(state.url, state.health_path) == 200
        assert state.memory["plan"]["source"].startswith(f"plan smollm2-135m --priority {priority}")
    finally:
        launch.down()


def test_up_priority_launches_the_plan_and_shows_predicted_vs_measured(llama_server_binary, smollm2, own_state):
    # llama.cpp named: on a quiet machine with a fast probe, balanced may rank vLLM's bf16 first on
    # its assumed CPU band (seen: 36-66 vs 40-52 t/s); this test is about llama-server's buffers
    proc = cli("up", "smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp", "--port", "0", "-t", "2",
               "--json", timeout=300, env=own_state)
    assert proc.returncode == 0, proc.stderr
    try:
        state = json.loads(proc.stdout)
        pick = flows.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp")
        argv = state["argv"]
        assert argv[argv.index("-np") + 1] == str(pick.request.parallel)
        assert argv[argv.index("-c") + 1] == str(pick.request.ctx * pick.request.parallel)
        rows = {r["component"]: r for r in state["memory"]["rows"]}
        for name in ("weights", "kv_cache", "compute"):       # fit matches llama-server's own buffer lines
            assert rows[name]["measured_bytes"] > 0 and abs(rows[name]["error_pct"]) < 1.0, rows[name]
        assert rows["total"]["measured_bytes"] > 0
        text = cli("status", env=own_state).stdout
        assert "fit's prediction vs the engine's report" in text and "kv_cache" in text
        from engineroom.store import Store

        with Store() as store:
            run = store.get_run(state["launch_run_id"])
            assert run["kind"] == "launch"
            # the stage runner's record of what ran to launch it (flows.stages.up)
            assert [(s["stage"], s["outcome"]) for s in run["summary"]["stages"]] == [("plan", "done"),
                                                                                     ("launch", "done")]
            stored = {r["payload"]["component"]: r["payload"] for r in store.records(run["id"], "memory_component")}
        assert stored["kv_cache"]["measured_bytes"] == rows["kv_cache"]["measured_bytes"]
        card = cli("report", str(state["launch_run_id"]), env=own_state).stdout
        assert "## Memory: predicted vs measured" in card and "| kv_cache |" in card
        # at exit llama-server prints its memory breakdown: `down` keeps it with the launch's record
        assert cli("down", env=own_state).returncode == 0
        with Store() as store:
            at_exit = store.records(state["launch_run_id"], "memory_at_exit")
        assert at_exit and at_exit[0]["payload"]["totals"]["total:Host"] > 0
    finally:
        cli("down", env=own_state)


def test_explicit_flags_override_the_plan(llama_server_binary, smollm2, own_state):
    proc = cli("up", "smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp", "--ctx", "1024",
               "--port", "0", "-t", "2", "--json", timeout=300, env=own_state)
    try:
        assert proc.returncode == 0, proc.stderr
        argv = json.loads(proc.stdout)["argv"]
        pick = flows.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp")
        assert argv[argv.index("-c") + 1] == str(1024 * pick.request.parallel)
    finally:
        cli("down", env=own_state)


def test_recipe_prints_the_launch_without_running_it(tmp_path, own_state):
    proc = cli("recipe", "smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp", "--json", env=own_state)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["engine"] == "llama.cpp" and "-np" in out["argv"] and out["predicted_memory"]["total"] > 0
    assert launch.read_state() is None                       # nothing was started
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(cli("plan", "smollm2-135m", "--priority", "balanced", "--engine", "llama.cpp",
                             "--json").stdout)
    same = json.loads(cli("recipe", "--from-plan", str(plan_file), "--json").stdout)
    assert same["argv"][1:] == out["argv"][1:]
    # a layer split over two GPUs survives the round trip through a saved plan
    two = ("smollm2-135m", "--priority", "non-nvidia", "--rig", "2x3090")
    plan2 = tmp_path / "plan2.json"
    plan2.write_text(cli("plan", *two, "--json").stdout)
    direct = json.loads(cli("recipe", *two, "--json", env=own_state).stdout)["argv"]
    saved = json.loads(cli("recipe", "--from-plan", str(plan2), "--json", env=own_state).stdout)["argv"]
    assert saved == direct and "-sm" in saved
    elsewhere = cli("recipe", "qwen3.6-27b", "--priority", "non-nvidia", "--rig", "2xH200", "--json")
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert json.loads(elsewhere.stdout)["model_present"] is False
    # a model folder on this machine is present: no "not downloaded yet" line for it
    folder = tmp_path / "SmolLM2-135M"
    folder.mkdir()
    config = Path(__file__).parent / "fixtures" / "configs" / "smollm2-135m.json"
    (folder / "config.json").write_text(config.read_text())
    local = cli("recipe", str(folder), "--engine", "sglang", "--rig", "1xH100", "--ctx", "4096", "--json")
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["model_present"] is True
    assert "not downloaded" not in cli("recipe", str(folder), "--engine", "sglang", "--rig", "1xH100",
                                       "--ctx", "4096").stdout


@pytest.mark.parametrize("args, sentence", [
    (("recipe", "--from-plan", "/no/such/plan.json"), "cannot read the plan file"),
    (("recipe", "smollm2-135m", "--pick", "2"), "--pick chooses among a plan's configurations"),
    (("up", "--priority", "balanced"), "name the model to plan"),
])
def test_plan_launch_mistakes_get_one_sentence(args, sentence):
    proc = cli(*args)
    assert proc.returncode != 0 and sentence in proc.stderr and "Traceback" not in proc.stderr


def test_a_tied_output_head_is_sized_as_llama_server_repacks_it(tmp_path, llama_server_binary, smollm2, own_state):
    """A tied Q4_0 model: llama-server loads token_embd a second time as the output matmul, and
    repacks that copy (found by this very comparison on a launch: 3.80 MiB measured vs 0.42 MiB
    predicted before fit knew it)."""
    from dataclasses import replace

    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    base = SHAPES["dense-s"]
    tiny = replace(base, name="tiny-tied", n_layers=4, layer_kinds=base.layer_kinds[:4], hidden_size=128,
                   intermediate_size=384, n_heads=2, n_kv_heads=1, head_dim=64, tie_embeddings=True)
    path = write_synthetic_gguf(tiny, "Q4_0", tmp_path / "tiny-tied.gguf", tokenizer_gguf=smollm2)
    proc = cli("up", str(path), "--ctx", "1024", "--port", "0", "-t", "2", "--json", env=own_state, timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        from engineroom.memory import PROCESS

        rows = {r["component"]: r for r in json.loads(proc.stdout)["memory"]["rows"]}
        # the process row is fit's whole prediction beside the engine's USS (the runtime included): not
        # a buffer the engine logs, so it is not held to the components' 1%
        process = rows.pop(PROCESS)
        assert process["measured_bytes"] > 0 and process["predicted_bytes"] == rows["total"]["predicted_bytes"], process
        for row in rows.values():
            assert row["predicted_bytes"] is not None and row["measured_bytes"] is not None, row
            assert abs(row["error_pct"]) < 1.0, row
        if "weights_repack" in rows:      # CPUs with AVX2 repack Q4_0; the head is most of it here
            assert rows["weights_repack"]["measured_bytes"] > rows["weights"]["measured_bytes"] * 0.9
    finally:
        cli("down", env=own_state)


def test_metrics_are_read_with_the_reference_parser_into_neutral_names(plain_server):
    """llama-server's /metrics (Prometheus text) through the adapter: the counters move by what a
    request generated, under engineroom's names."""
    from engineroom.client import OpenAIClient

    eng = engines.adapter("llama.cpp")
    before = eng.metrics(plain_server)
    assert before is not None and "generated_tokens_total" in before and "prompt_tokens_total" in before
    with OpenAIClient(plain_server) as client:
        reply = client.chat({"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 16,
                             "temperature": 0})
    after = eng.metrics(plain_server)
    assert after is not None
    assert after["generated_tokens_total"] - before["generated_tokens_total"] == reply.usage["completion_tokens"]
    assert not any(k.startswith("llamacpp:") for k in after)


def test_one_resolver_for_engine_names_serves_fit_plan_recipe_and_up():
    """`recipe --engine llamacpp` once said "no adapter for llamacpp yet" while `fit --engine llamacpp`
    worked: every catalog alias of an engine now names its adapter, and a launch records the id."""
    from engineroom.catalog import load_catalog
    from engineroom.flows.picks import typed_request

    for entry in load_catalog().engines:
        if not engines.has_adapter(entry.id):
            continue
        for alias in (entry.id, entry.name, *entry.aliases):
            assert engines.resolve(alias) == entry.id, alias
            assert engines.adapter(alias).name == entry.id
            assert typed_request("m", None, LaunchArgs(engine=alias), "llama.cpp").engine == entry.id
    assert engines.resolve("nosuch") == "nosuch" and not engines.has_adapter("nosuch")


def test_a_pick_with_a_projector_serves_an_image_on_the_real_llama_server(llama_server_binary, smollm2, tmp_path,
                                                                          own_state):
    """Issue 15's vision test: a projector written for SmolLM2 (synth.write_random_projector: a random
    LLaVA-style mmproj of 576-wide output) carried by the pick's request (vision, projector) is launched
    as --mmproj; llama-server declares vision, an image request is answered, and verify's image_input
    check runs on it instead of SKIPping (what a random projector makes the model say is its own: the
    check may FAIL on the colour, never on the request)."""
    from engineroom import synth
    from engineroom.plan import LaunchRequest, Weights

    projector = synth.write_random_projector(tmp_path / "mmproj-smollm2-random.gguf", 576)
    request = LaunchRequest(model="smollm2-135m", engine="llama.cpp", weights=Weights(ref=str(smollm2)), ctx=2048,
                            parallel=1, vision=True, projector=str(projector))
    pick = flows.Pick(request=request, plan={}, source="test: a pick with a projector")
    state = flows.start(str(smollm2), LaunchArgs(port=0, threads=2, timeout=120), pick=pick)
    try:
        assert state.argv[state.argv.index("--mmproj") + 1] == str(projector)
        out = json.loads(cli("verify", "--suite", "full", "--fast", "--json", timeout=600, env=own_state).stdout)
        image = next(r for r in out["results"] if r["name"] == "image_input")
        assert image["status"] == "PASS" or (image["status"] == "FAIL" and "does not say red" in image["reason"]), \
            image
    finally:
        launch.down()
