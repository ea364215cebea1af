"""Every pick is a contract: what `plan` picks is exactly what `recipe` / `up` render.

Over the whole catalog x rig presets x priorities x engines, every pick (each engine's first, the
engine named as `--engine` does) is turned into its LaunchRequest and rendered to argv through the
adapter (`flows.prepare`, no download, no engine needed), and checked: the weights named are the
plan's quant (its repo or file, never the unquantized base for a quantized pick); every feature the
priority promises is turned on (tools -> tool parser, reasoning -> reasoning parser, vision ->
projector or the engine's own multimodal serving, a drafter counted in the speed band ->
speculative decoding in argv); no placeholder. The fork's argv is checked against its own --help
(tests/fixtures/ik_llamacpp/help.txt). The engines' own parsers on the same argv run in the
integration tier below (vLLM's, SGLang's ServerArgs, llama-server's --help), where installed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

# the engines' own parsers (integration tier): their install fixtures, shared with their own test modules
from engineroom import flows
from engineroom.catalog import load_catalog
from engineroom.engines.ikllamacpp.flags import parse_help
from engineroom.errors import BadInput
from engineroom.hardware import parse_rig
from engineroom.launchargs import LaunchArgs
from engineroom.plan import LaunchRequest, NothingFits, Weights, plan, plans_as_rows

RIGS = ("1x3090", "2x3090", "1xh200", "2x(8xh100)", "cpu:64GB", "m3max:128GB")
IK_HELP = Path(__file__).parent / "fixtures" / "ik_llamacpp" / "help.txt"
# each engine's flags for the features a pick promises (test code may name them; src/ may not)
SPEC_FLAGS = {"vllm": ("--speculative-config",), "sglang": ("--speculative-algorithm",),
              "llama.cpp": ("--spec-type",), "ik_llama.cpp": ("--spec-type", "-mtp")}
MODEL_FLAGS = {"vllm": "--model", "sglang": "--model-path", "llama.cpp": "-m", "ik_llama.cpp": "-m"}


@pytest.fixture(scope="module", autouse=True)
def _catalog_dirs_once():
    """The sweep renders ~500 picks; `plugins.catalog_dirs` scans every installed distribution's entry
    points on each catalog read (~40 ms, 5 reads a render), and nothing installs an adapter while
    this module runs: asked once here (the catalog it gives is the same)."""
    from engineroom import plugins

    dirs = plugins.catalog_dirs()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plugins, "catalog_dirs", lambda: dirs)
        yield


@cache
def _picks() -> tuple[tuple[str, str, str, str, object, flows.Pick], ...]:
    cat = load_catalog()
    out = []
    for model in cat.models:
        for rig_spec in RIGS:
            rig = parse_rig(rig_spec)
            for prio in cat.priorities:
                for engine in cat.engines:
                    try:
                        plans = plan(model.id, rig, prio.id, engine=engine.id, catalog=cat, limit=1)
                    except NothingFits:
                        continue
                    row = plans_as_rows(plans)[0]
                    pick = flows.pick_from_row(row, model.id, f"{model.id} {rig_spec} {prio.id}", prio.id)
                    # as `recipe --rig SPEC` makes it: a recipe for that rig's build of the engine
                    pick = replace(pick, other_rig=rig_spec, other_vendor=rig.vendor)
                    out.append((model.id, rig_spec, prio.id, engine.id, plans[0], pick))
    return tuple(out)


@cache
def _rendered() -> tuple[tuple[tuple[str, str, str, str, object, flows.Pick], flows.Prepared], ...]:
    out = []
    for case in _picks():
        pick = case[-1]
        assert isinstance(pick, flows.Pick)
        prepared = flows.prepare(pick.model_ref, download=False, require_binary=False, pick=pick)
        out.append((case, prepared))
    return tuple(out)


@pytest.mark.slow
def test_the_sweep_covers_every_engine_and_priority():
    cases = _picks()
    cat = load_catalog()
    assert {c[3] for c in cases} == {e.id for e in cat.engines}
    assert {c[2] for c in cases} == {p.id for p in cat.priorities}
    assert len(cases) > 100


@pytest.mark.slow
def test_every_pick_renders_the_plans_weights_and_no_placeholder():
    cat = load_catalog()
    for (model_id, rig, prio, engine, p, pick), prepared in _rendered():
        where = f"{model_id} {rig} {prio} {engine}"
        r, argv = pick.request, list(prepared.spec.argv)
        model = cat.model(model_id)
        quant = model.quant(p.quant)
        assert r.weights.quant == p.quant == quant.id and r.weights.size_gb == quant.size_gb, where
        assert r.weights.format == quant.format, where
        assert not any("<" in a and ">" in a for a in argv), (where, argv)
        served = argv[argv.index(MODEL_FLAGS[engine]) + 1]
        if quant.format == "gguf":
            name = quant.file or ""
            assert served.endswith(name) and (quant.pypi_package or quant.hf_repo in r.weights.ref), (where, served)
        else:
            assert served == quant.hf_repo, (where, served)   # the quant's own repo, never the base model's
            if quant.format != "bf16":
                assert served != model.hf_repo, (where, served)


def test_every_feature_a_priority_promises_is_on_in_argv():
    cat = load_catalog()
    for (model_id, rig, prio, engine, p, pick), prepared in _rendered():
        where = f"{model_id} {rig} {prio} {engine}"
        r, argv = pick.request, list(prepared.spec.argv)
        model, eng, priority = cat.model(model_id), cat.engine(engine), cat.priority(prio)
        promised = set(priority.constraints.features)
        parsers = eng.parsers.get(model.family or "")
        if "tools" in promised and eng.parsers:       # the planner offers no pick without the parser
            assert parsers and parsers.tool, where
        if "tools" in model.features and parsers and parsers.tool:   # the catalog knows it: always on
            assert parsers.tool in argv, (where, argv)
            if engine == "vllm":
                assert "--enable-auto-tool-choice" in argv, where
        elif "tools" in promised and engine == "ik_llama.cpp":
            assert "--jinja" in argv, where       # the fork reads tool calls from the Jinja template
        if "reasoning" in model.features and eng.parsers and parsers and parsers.reasoning:
            assert parsers.reasoning in argv, (where, argv)
        if "vision" in promised:
            assert r.vision, where
            if engine in ("llama.cpp", "ik_llama.cpp"):
                assert "--mmproj" in argv, (where, argv)
            assert "--language-model-only" not in argv, where
        elif "vision" in model.features:
            assert r.text_only and any(r.text_only in n for n in pick.notes), where   # said so
            if engine == "vllm":
                assert "--language-model-only" in argv, (where, argv)
            # SGLang has no text-only launch for it: the note says the tower is built, and fit sized it
            assert ("served text-only" in r.text_only) is eng.text_only_launch, (where, r.text_only)
            if not eng.text_only_launch:
                assert "its vision tower is built, and sized" in r.text_only and p.fit.request.vision, where
        if p.spec:                              # counted in the speed band -> launched
            assert r.spec_method and any(f in argv for f in SPEC_FLAGS[engine]), (where, argv)
            # drafted tokens a step (SGLang's verify block is one more: the adapter's count)
            assert r.spec_tokens == p.spec_tokens and ({str(p.spec_tokens), str(p.spec_tokens + 1)}
                                                       & set(" ".join(argv).replace(":", " ").replace("=", " ")
                                                             .replace(",", " ").replace("}", " ").split())), argv
            assert not any("does not fetch draft models" in n for n in pick.notes), where
        else:
            assert not any(f in argv for f in SPEC_FLAGS[engine]), (where, argv)


# each pool engine's flag for the share of the GPU it takes (test code may name them; src/ may not)
SHARE_FLAGS = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"}


def test_the_share_of_the_gpu_fit_sized_is_the_share_argv_gives():
    """A pool engine's KV pool is what its share of the GPU leaves: the plan sizes it at one share and the launch
    must ask for that share, not the engine's own default (SGLang 0.5.16 chose 0.768 on the H100 where the plan
    had sized 0.85, a pool 17% smaller than planned, 2026-12-06). SGLang's share follows its own rule for the GPU
    (on a 3090 far less than on an H100); vLLM's is its catalog default; the CPU build sizes its KV otherwise."""
    seen: dict[str, set[float]] = {"vllm": set(), "sglang": set()}
    for (model_id, rig, prio, engine, p, pick), prepared in _rendered():
        if engine not in SHARE_FLAGS:
            continue
        where = f"{model_id} {rig} {prio} {engine}"
        r, argv = pick.request, list(prepared.spec.argv)
        assert r.mem_fraction == p.fit.request.mem_fraction and r.mem_fraction is not None, where
        if not parse_rig(rig).gpus:
            assert SHARE_FLAGS[engine] not in argv, (where, argv)
            continue
        assert argv[argv.index(SHARE_FLAGS[engine]) + 1] == f"{r.mem_fraction:g}", (where, argv)
        seen[engine].add(r.mem_fraction)
    assert seen["vllm"] == {0.92}, seen
    assert len(seen["sglang"]) > 1 and max(seen["sglang"]) < 0.95 and min(seen["sglang"]) > 0.5, seen


def test_the_fork_gets_its_tested_flags_and_its_own_help_knows_every_flag():
    known = parse_help(IK_HELP.read_text())
    seen = 0
    for (model_id, rig, prio, engine, p, _pick), prepared in _rendered():
        if engine != "ik_llama.cpp":
            continue
        seen += 1
        argv = list(prepared.spec.argv)
        flags = [a for a in argv[1:] if a.startswith("-") and not a.lstrip("-").replace(".", "").isdigit()]
        # -a (the served name): the 0.1.5 fork's parser takes it though its --help does not list it
        # (flags.check_flags asks the binary itself for such a flag; the real ik runs pass it)
        # -sm (a layer split over several GPUs): a flag of the fork's GPU builds; the fixture is its CPU build's
        # -ngl (every layer on the GPU: the fork offloads none unless asked): its GPU builds' --help lists it
        nvidia = parse_rig(rig).vendor == "nvidia"
        assert ("-ngl" in argv) == nvidia, (model_id, rig, argv)
        gpu_build = ({"-sm"} if p.tp > 1 else set()) | ({"-ngl"} if nvidia else set())
        assert set(flags) - {"-a"} - gpu_build <= known, (model_id, prio, sorted(set(flags) - known))
        assert "--merge-qkv" in argv
        assert ("-khad" in argv and "-vhad" in argv) == (p.kv_dtype not in ("f16", "bf16", "f32")), argv
        # the tested set's fourth flag is absent from this release's --help, and the recipe says so
        assert "--parallel-tool-calls" not in known and "--parallel-tool-calls" not in argv
        assert any("--parallel-tool-calls is not passed: ik_llama.cpp 0.1.5" in n for n in prepared.spec.notes)
    assert seen


def test_a_pick_is_launchable_or_a_closest_miss_with_the_fix():
    """A quant whose weights the catalog cannot name is not a pick but a reasoned miss; one it names is
    launched by that very file."""
    # Q3_K_M names no public file: every llama.cpp pick is a quant with its file, loaded by that file
    picks = plan("qwen3.6-27b", parse_rig("1x3090"), "max-context", engine="llama.cpp")
    assert picks and "Q3_K_M" not in {p.quant for p in picks}
    for p in picks:
        assert p.request is not None and p.request.weights.file and p.request.weights.ref.endswith(
            p.request.weights.file), p.request
    # SGLang's fp8 / awq / gptq checkpoints name no repo: the closest miss on one 3090 says what to add (on
    # 2x3090 the AutoRound repo is SGLang's pick: the seed's re-test recipe)
    with pytest.raises(NothingFits, match=r"not launchable: the catalog names no repo holding the \S+ checkpoint.*"
                                          r"`engineroom up ORG/REPO --engine sglang`"):
        plan("qwen3.6-27b", parse_rig("1x3090"), "multi-tenant", engine="sglang")
    # the awq / gptq / fp8 checkpoints have no repo: never the bf16 base in their place
    for p in plan("qwen3.6-27b", parse_rig("2x3090"), "concurrent-throughput", engine="vllm"):
        assert p.request is not None and p.request.weights.ref != "Qwen/Qwen3.6-27B" or p.quant == "bf16"
        assert p.quant in ("autoround-int4", "bf16")
    # a drafter engineroom cannot name for the engine is not a pick either (DFlash on llama.cpp: the
    # catalog names its safetensors repo, no GGUF), while vLLM gets it by repo
    from engineroom.catalog import find_engine
    from engineroom.plan import drafter_miss

    cat = load_catalog()
    dflash = next(d for d in cat.drafters if d.method == "dflash")
    assert "not a GGUF" in (drafter_miss(dflash, find_engine(cat, "llama.cpp")) or "")
    assert drafter_miss(dflash, find_engine(cat, "vllm")) is None


def test_an_explicit_engine_is_planned_whatever_its_status_and_the_status_is_said():
    """SGLang is marked re-test pending: `--engine sglang` still plans it and says so."""
    ps = plan("qwen3.6-27b", parse_rig("1xh200"), "balanced", engine="sglang", limit=1)
    pick = flows.pick_from_row(plans_as_rows(ps)[0], "qwen3.6-27b", "test", "balanced")
    assert pick.engine == "sglang" and any("retest-pending" in n for n in pick.notes), pick.notes
    # the comparison's SGLang row (multi-tenant on 2x3090) is its re-test plan: TP=2, AutoRound INT4, fp8 KV,
    # no spec-decode; multi-tenant takes any status, and the status is still said
    ps = plan("qwen3.6-27b", parse_rig("2x3090"), "multi-tenant", engine="sglang", limit=1)
    pick = flows.pick_from_row(plans_as_rows(ps)[0], "qwen3.6-27b", "test", "multi-tenant")
    r = pick.request
    assert (r.engine, r.weights.quant, r.tp, r.kv_dtype, r.spec_method) == (
        "sglang", "autoround-int4", 2, "fp8_e4m3", None), r
    assert "sglang is marked retest-pending (seed: re-test pending" in " ".join(pick.notes), pick.notes
    # a priority that takes only tested engines plans it when named, and says why
    ps = plan("qwen3.6-27b", parse_rig("2x3090"), "balanced", engine="sglang", limit=1)
    pick = flows.pick_from_row(plans_as_rows(ps)[0], "qwen3.6-27b", "test", "balanced")
    assert any("planned because --engine named it" in n for n in pick.notes), pick.notes


def test_the_vllm_recipe_loads_the_quants_repo_with_mtp_and_parsers():
    """The issue's reproduction: `recipe qwen3.6-27b --rig 1x3090 --engine vllm` names the AutoRound
    repo (not the 55.6 GB bf16 base), and full-features launches MTP and both parsers."""
    pick = flows.pick_from_plan("qwen3.6-27b", priority="max-context", rig="1x3090", engine="vllm")
    argv = list(flows.prepare(pick.model_ref, download=False, require_binary=False, pick=pick).spec.argv)
    assert argv[argv.index("--model") + 1] == "Lorbus/Qwen3.6-27B-int4-AutoRound"
    pick = flows.pick_from_plan("qwen3.6-27b", priority="full-features", rig="1x3090")
    argv = list(flows.prepare(pick.model_ref, download=False, require_binary=False, pick=pick).spec.argv)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert "--language-model-only" not in argv     # full-features promises vision


def test_the_request_round_trips_and_typed_options_win_and_are_recorded():
    pick = flows.pick_from_plan("qwen3.6-27b", priority="full-features", rig="2x3090")
    r = pick.request
    assert LaunchRequest.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    mine = flows.typed_request(pick.model_ref, pick, LaunchArgs(ctx=8192), "llama.cpp")
    assert mine.ctx == 8192 and mine.parallel == r.parallel and mine.given == ("ctx",) and mine.weights == r.weights
    prepared = flows.prepare(pick.model_ref, LaunchArgs(ctx=8192), download=False, require_binary=False, pick=pick)
    argv = list(prepared.spec.argv)
    assert argv[argv.index("--max-model-len") + 1] == "8192" and prepared.request == mine
    assert prepared.args.ctx == 8192 and prepared.args.tp == r.tp     # kept for `switch`
    with pytest.raises(BadInput, match="unknown fields"):
        LaunchRequest.from_dict({**r.to_dict(), "seqs": 3})
    with pytest.raises(BadInput, match="no weights"):
        LaunchRequest.from_dict({"model": "x", "engine": "vllm"})
    # a saved plan or a server's state written before the rename (n_seqs, chat_template_file) loads as today's
    old = {k: v for k, v in r.to_dict().items() if k != "parallel"} | {"n_seqs": 3}
    assert LaunchRequest.from_dict(old) == replace(r, parallel=3)
    assert LaunchArgs.from_dict({"ctx": 512, "chat_template_file": "t.jinja"}) == LaunchArgs(ctx=512,
                                                                                           chat_template="t.jinja")
    plain = flows.typed_request("smollm2-135m", None, LaunchArgs(ctx=512), "llama.cpp")
    assert plain == LaunchRequest(model="smollm2-135m", engine="llama.cpp", weights=Weights(ref="smollm2-135m"),
                                  ctx=512, given=("ctx",))


def test_a_plan_row_without_its_request_is_refused_in_one_sentence(tmp_path):
    row = plans_as_rows(plan("smollm2-135m", parse_rig("cpu:64GB"), "balanced", limit=1))[0]
    with pytest.raises(BadInput, match="holds no launch request"):
        flows.pick_from_row({k: v for k, v in row.items() if k != "request"}, "smollm2-135m", "x")
    with pytest.raises(BadInput, match="does not match the row"):
        flows.pick_from_row({**row, "quant": "bf16"}, "smollm2-135m", "x")


def test_the_llama_cpp_family_renders_mtp_and_the_projector():
    from engineroom.engines import ikllamacpp, llamacpp
    from engineroom.engines.base import LaunchOptions

    o = LaunchOptions(model_path=Path("/m/x.gguf"), ctx=1024, parallel=1, spec_method="mtp", spec_tokens=2,
                      vision=True, projector=Path("/m/mmproj.gguf"), engine_options=("merge_qkv", "hadamard_kv"),
                      kv_dtype="q4_0")
    argv = list(llamacpp.render(llamacpp.placeholder_binary(), o).argv)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert argv[argv.index("--mmproj") + 1] == "/m/mmproj.gguf"
    ik = list(ikllamacpp.render(ikllamacpp.placeholder_binary(), o).argv)
    assert ik[ik.index("--spec-type") + 1] == "mtp:n_max=2,p_min=0.0"
    assert {"--merge-qkv", "-khad", "-vhad", "--mmproj"} <= set(ik)
    with pytest.raises(BadInput, match="projector"):
        llamacpp.render(llamacpp.placeholder_binary(), LaunchOptions(model_path=Path("/m/x.gguf"), vision=True))
    with pytest.raises(BadInput, match="no option"):
        ikllamacpp.render(ikllamacpp.placeholder_binary(),
                          LaunchOptions(model_path=Path("/m/x.gguf"), engine_options=("turbo",)))


@pytest.mark.integration
def test_llama_server_own_help_knows_every_flag_the_picks_render(llama_server_binary):
    """The built llama-server's --help lists every flag of every llama.cpp pick's argv."""
    from engineroom.engines.llamacpp.flags import known_flags

    known = known_flags(llama_server_binary)
    assert known, "llama-server --help gave no flags"
    for (model_id, rig, prio, engine, _p, _pick), prepared in _rendered():
        if engine != "llama.cpp":
            continue
        flags = {a for a in prepared.spec.argv[1:] if a.startswith("-") and not a.lstrip("-")[:1].isdigit()}
        assert flags <= known, (model_id, rig, prio, sorted(flags - known))
    o_mtp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--mmproj", "x.gguf"]
    assert {f for f in o_mtp if f.startswith("--")} <= known


def test_the_compose_file_of_a_pick_runs_the_same_command():
    """Where the engine has an image (catalog `docker:`), the compose file of a pick carries the pick's
    weights and features: the same adapter render, in the container's paths."""
    cat = load_catalog()
    done = set()
    for (model_id, rig, _prio, engine, _p, pick), prepared in _rendered():
        docker = cat.engine(engine).docker
        if engine in done or docker is None or not docker.image or pick.cluster or rig.startswith(("cpu", "m3")):
            continue
        out = flows.compose_recipe(pick.model_ref, pick=pick, check_cli=False)
        command = [str(a) for a in out.recipe.document["services"][out.recipe.service]["command"]]
        argv = list(prepared.spec.argv)
        flag = MODEL_FLAGS[engine]
        if pick.request.weights.format != "gguf":    # a repo: the same name inside the container
            assert command[command.index(flag) + 1] == argv[argv.index(flag) + 1], (model_id, engine)
        for f in SPEC_FLAGS[engine] + ("--tool-call-parser", "--reasoning-parser", "--language-model-only",
                                       "--merge-qkv"):
            assert (f in command) == (f in argv), (model_id, engine, f)
        done.add(engine)
    assert {"vllm", "sglang", "llama.cpp"} <= done, done


# --------------------------------------------------------------------------- the engines' own parsers
@pytest.mark.integration
def test_vllms_own_parser_accepts_every_vllm_pick(vllm_python):
    """vLLM's make_arg_parser (its installed CPU build) on every vLLM pick's argv: the GPU-rig picks
    render the same flags (the parser is the same; only the CPU build refuses spec-decode at render)."""
    from engineroom.engines import vllm

    picks = [(key[:3], prepared.spec.argv) for key, prepared in _rendered() if key[3] == "vllm"]
    assert picks
    misspelt = [*picks[0][1], "--max-num-seqz", "4"]
    *answers, refused = vllm.validate_many(vllm_python, [*(argv for _key, argv in picks), misspelt])  # one import
    assert [(key, a) for (key, _argv), a in zip(picks, answers, strict=True) if a is not None] == []
    assert refused and "--max-num-seqz" in refused     # the same parser, same batch, refuses it: the check can fail


@pytest.mark.integration
def test_sglangs_own_server_args_accept_every_sglang_pick(sglang_binary):
    from engineroom.engines import sglang

    picks = [(key[:3], prepared.spec.argv) for key, prepared in _rendered() if key[3] == "sglang"]
    assert picks
    answers = sglang.validate_many(sglang_binary, [argv for _key, argv in picks])  # one import of SGLang
    assert [(key, a) for (key, _argv), a in zip(picks, answers, strict=True) if a is not None] == []


def test_engineroom_tools_template_brings_the_engines_parser_for_its_call_format():
    """SmolLM2's tools template writes Hermes-style calls: served by vLLM, the request gets vLLM's
    hermes parser (without one vLLM refuses tool_choice auto); llama.cpp has no parser table (its
    jinja template is the parser); a parser the request already names is kept."""
    from engineroom import models
    from engineroom.flows.serving import with_template_parser

    ref = models.resolve("smollm2-135m")
    assert ref.tool_template is not None and ref.tool_template.is_file() and ref.tool_template_calls == "hermes"
    plain = LaunchRequest(model="smollm2-135m", engine="vllm", weights=Weights(ref="smollm2-135m"))
    assert with_template_parser(plain, ref.tool_template_calls).tool_parser == "hermes"
    assert with_template_parser(plain, None) == plain
    assert with_template_parser(replace(plain, engine="llama.cpp"), "hermes").tool_parser is None
    named = replace(plain, tool_parser="llama3_json")
    assert with_template_parser(named, "hermes") == named


def test_a_pick_says_why_its_context_and_sequences_are_what_they_are():
    """Issue 15 item 3 ('or says, per flag, why engineroom differs'): the comparison's 214K on one 3090
    and its 4 x 262K on two are not what engineroom picks; the pick's notes say why, from the plan."""
    def notes(rig: str, engine: str, priority: str) -> str:
        ps = plan("qwen3.6-27b", parse_rig(rig), priority, engine=engine, limit=1)
        return " | ".join(flows.pick_from_row(plans_as_rows(ps)[0], "qwen3.6-27b", "test", priority).notes)

    most = notes("1x3090", "vllm", "max-context")        # memory binds: where the memory went
    assert "tokens per sequence: the most that fits in memory; fit: " in most and "kv_cache" in most, most
    many = notes("2x3090", "vllm", "concurrent-throughput")
    assert "context 32,768 tokens per sequence: priority concurrent-throughput's workload context of " in many
    assert "sequences: as many as fit in memory at that context" in many, many
    assert "262,144 tokens per sequence: the model's trained context" in notes("1x3090", "llama.cpp", "max-context")
    # a context given with --ctx is said as asked, not as a size the priority chose (a bakeoff's --ctx said
    # "the most that fits in memory" on a 24 GiB VM)
    asked = flows.pick_from_plan("qwen3.6-27b", priority="balanced", rig="1x3090", engine="llama.cpp", ctx=16384)
    assert "context 16,384 tokens per sequence: as --ctx asked" in asked.notes, asked.notes


def test_the_in_process_pick_is_the_plans_own_request_and_a_json_row_gives_the_same(monkeypatch):
    """`up --priority` launches the Plan's LaunchRequest object itself (no `plan --json` row parsed back in
    the same process); `up --from-plan FILE` reads the row, and gets a request equal field by field."""
    from dataclasses import fields

    for model, rig, prio, engine in (("smollm2-135m", "cpu:64GB", "balanced", None),
                                     ("qwen3.6-27b", "1x3090", "full-features", "vllm"),
                                     ("qwen3.6-27b", "1x3090", "max-context", "llama.cpp")):
        chosen = plan(model, parse_rig(rig), prio, engine=engine, limit=1)[0]
        assert chosen.request is not None
        pick = flows.pick_of(chosen, "test")
        assert pick.request is chosen.request            # the object itself, not a copy through JSON
        for f in fields(LaunchRequest):
            assert getattr(pick.request, f.name) == getattr(chosen.request, f.name), f.name
        # what `plan --json > plan.json; up --from-plan plan.json` launches: the same request, the same notes
        row = json.loads(json.dumps(plans_as_rows([chosen])[0]))
        from_file = flows.pick_from_row(row, chosen.model, "test", prio)
        assert from_file.request == chosen.request and from_file.notes == pick.notes
        assert pick.plan == from_file.plan           # the row kept for the launch's record and card
    # the in-process path never reads a request back from JSON
    monkeypatch.setattr(LaunchRequest, "from_dict", classmethod(lambda cls, data: pytest.fail("parsed from JSON")))
    picked = flows.pick_from_plan("smollm2-135m", priority="balanced", rig="cpu:64GB")
    again = plan("smollm2-135m", parse_rig("cpu:64GB"), "balanced", limit=1)[0].request
    assert picked.request == again and picked.source.endswith("pick 1")
