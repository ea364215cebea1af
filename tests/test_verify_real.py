"""verify (and bench's reasoning split) against the REAL llama-server on the CPU, no stand-in.

- ``verify --suite stress --fast`` against Gemma 3 270M (32K trained context), launched by
  ``engineroom up`` in a state folder of its own, climbing to 0.92 of the context the engine
  reports (see GEMMA_CTX for why that is not 32K here);
- ``verify --suite full --fast`` (flows.verify, what the command runs: stored, carded) against the
  session's managed SmolLM2 on the model's own chat template (tests/test_verify_suites.py runs the
  suite behind engineroom's tool template), every check's outcome written down with its reason;
- reasoning on the real engine: engineroom's smollm2-think.jinja makes llama-server's own
  reasoning parser split SmolLM2's output (why the template must look as it does: its header),
  seen by verify's reasoning checks and by bench's reasoning-aware records.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engineroom.launch import free_port

from conftest import cli, real_llama_server
from test_verify_suites import REAL_EXPECTED, SLOW_CPU

# Gemma 3 270M is trained for 32,768 tokens, but the stress ladder's prefill is the cost on two
# cores: --fast sends about 3.7 x n_ctx prompt tokens (a needle at 0.25 of the context, the tool
# return at 0.8, the IDE prompt, the ceiling at 0.25 / 0.5 / 0.75 / 0.92; at 8,192: 30,151 prompt
# and ~1,150 generated tokens), and this machine prefills Gemma at about 250-290 tok/s on 2 idle
# threads (8,049- and 16,049-token prompts cost 55 and 129 s of the engine's CPU time). At 32K
# that is ~121K tokens, over 7 minutes of prefill alone; at 16K ~3.5-4 minutes. So the engine is
# booted at 8,192 tokens (the whole suite: 341-381 s of engine CPU on 2 threads in three runs, so
# about 3 minutes on 2 idle cores; 439-902 s wall here while other jobs shared the two cores): the
# ladder still reads the context from the engine and climbs to 0.92 of it.
GEMMA_CTX = 8192


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc): the engine's own work, whatever else
    shares the cores (wall time on a busy machine says little)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# What stress --fast says of Gemma 3 270M (the pretrained base model, served with llama-server's
# ChatML fallback: its GGUF has no chat template), and why.
QUALITY = "quality ceiling"
STRESS_ON_GEMMA = {
    # expected PASS with a quality ceiling: the base model does not answer the question, it goes on
    # writing the haystack's prose ("The sky over the old harbour was blue that morning, ...")
    "needle_ladder": ("PASS", "served every rung; recall missed at ~2,048 tokens (quality ceiling, the model's not "
                              "the server's)"),
    "big_tool_return": ("PASS", ""),          # the 100,000-char return scaled to 0.8 of the context
    "ide_system_prompt": ("PASS", "HTTP 200, "),
    "long_decode": ("PASS", "600 tokens decoded without a crash"),     # ignore_eos: the full --fast budget
    "context_ceiling": ("PASS", "filled to "),
}


def test_stress_fast_on_gemma_reaches_the_engines_real_context(gemma3, llama_server_binary, tmp_path):
    """`up gemma-3-270m-pt --ctx 8192` (its own state folder), `verify --suite stress --fast`: the
    ladder reads n_ctx from the engine and climbs to 0.92 of it; the engine serves every rung (the
    memory ceiling is the context), the model recalls no needle (no recall ceiling)."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    up = cli("up", "gemma-3-270m-pt", "--ctx", str(GEMMA_CTX), "--parallel", "1", "--threads", "2",
             "--port", str(free_port()), "--json", env=env, timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    pid = json.loads(up.stdout)["pid"]
    try:
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        proc = cli("verify", "--suite", "stress", "--fast", "--json", env=env, timeout=1800)
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    finally:
        cli("down", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]       # exit code = FAILs
    out = json.loads(proc.stdout)
    assert (out["engine"], out["model"], out["suite"]) == ("llama.cpp", "gemma-3-270m-pt", "stress")
    r = {x["name"]: x for x in out["results"]}
    got = {n: (x["status"], x["reason"]) for n, x in r.items()}
    wrong = {n: got.get(n) for n, (status, start) in STRESS_ON_GEMMA.items()
             if n not in got or got[n][0] != status or not got[n][1].startswith(start)}
    assert not wrong and set(got) == set(STRESS_ON_GEMMA), (wrong, got)
    assert all(not x["details"]["restarts"] and x["details"]["calibration"] == "the engine's tokenizer"
               for x in r.values())
    assert "(scaled from 100,000 to the 8,192-token context)" in got["big_tool_return"][1]
    ceiling = r["context_ceiling"]["details"]
    assert ceiling["n_ctx"] == GEMMA_CTX and ceiling["top_target"] == int(0.92 * GEMMA_CTX)
    curve = ceiling["curve"]
    assert [rung["target_tokens"] for rung in curve] == [2048, 4096, 6144, 7536]
    assert [rung["outcome"] for rung in curve] == [QUALITY] * 4 and not any(rung["cache_hit"] for rung in curve)
    # the memory ceiling is the engine's real context; recall has none (the reason: quality ceiling)
    assert ceiling["memory_ceiling_tokens"] >= 0.9 * GEMMA_CTX and ceiling["recall_ceiling_tokens"] is None
    assert f"recall ceiling none, memory ceiling {ceiling['memory_ceiling_tokens']} (prompt tokens) of 8,192" \
        in got["context_ceiling"][1]
    print(f"\nstress --fast on Gemma 3 270M at {GEMMA_CTX:,} tokens: {wall:.0f} s wall, the engine's CPU {cpu:.0f} s "
          f"on 2 threads; deepest rung {ceiling['memory_ceiling_tokens']:,} prompt tokens")


# -- verify --suite full through the CLI: SmolLM2 on its own chat template ---------------------------

# SmolLM2's own template has no tool-call format and no thinking block, so llama-server declares
# neither and those checks SKIP with the server's own words; every check that runs PASSes: with
# the model's own template a 135M model fails nothing here. (Behind engineroom's tool template the
# tool checks run, and three FAIL for the model's reasons: REAL_EXPECTED in test_verify_suites.py.)
NO_TOOLS = "server declares no tools support (from /props chat_template_caps.supports_tool_calls = false)"
NO_THINKING = "the served chat template has no thinking block nor switch"
# Every check that runs is shared with the tool-template table (REAL_EXPECTED, in its order); the
# tool checks and the two reasoning checks SKIP here with the server's words.
FULL_ON_OWN_TEMPLATE = {
    **REAL_EXPECTED,
    **dict.fromkeys(("tool_call", "tool_call_streamed", "tool_call_auto", "tool_call_in_reasoning",
                     "parallel_tool_calls", "tool_choice_named", "tool_choice_none", "tool_round_trip"),
                    ("SKIP", NO_TOOLS)),
    "reasoning_split": ("SKIP", f"the model does not reason: no reasoning field came back and {NO_THINKING}"),
    "thinking_off": ("SKIP", f"no thinking switch to test: {NO_THINKING}"),
}



def test_verify_full_on_the_managed_smollm2_states_every_outcome(managed_server):
    """`verify --suite full --fast` against the session's managed server, through flows.verify (what
    the command calls; here with the timeouts x5 of the other real-engine tests), stored, carded."""
    from engineroom import flows
    from engineroom.checks.full import FULL_CHECKS
    from engineroom.store import Store

    assert list(FULL_ON_OWN_TEMPLATE) == [name for name, _ in FULL_CHECKS]
    info = flows.connect(None)
    assert (info.engine, info.model_id, info.n_ctx) == ("llama.cpp", "smollm2-135m", 4096)
    with Store() as store:
        out = flows.verify(info, store, suite="full", fast=True, timeout_scale=SLOW_CPU)
        dialect = store.records(out.run_id, "verify_dialect")[0]["payload"]
    got = {r.name: (r.status, r.reason) for r in out.results}
    wrong = {n: got.get(n) for n, (status, start) in FULL_ON_OWN_TEMPLATE.items()
             if n not in got or got[n][0] != status or not got[n][1].startswith(start)}
    assert not wrong, wrong
    assert out.failed == 0 and not any("forced" in r.details for r in out.results)   # no engineroom template
    assert sorted(status for status, _ in got.values()) == ["PASS"] * 14 + ["SKIP"] * 12
    assert dialect["forced_tools"] == dialect["forced_reasoning"] == "" and dialect["reasons"] is False
    card = cli("report", str(out.run_id), check=True).stdout
    assert "| check | result | seconds | reason |" in card and "| long_prompt | PASS |" in card


# -- reasoning split by the engine's own parser: smollm2-think.jinja + --reasoning-budget -------------

THINK_BUDGET = 32          # llama-server's --reasoning-budget: SmolLM2 never writes </think> itself


@pytest.fixture(scope="module")
def think_server(llama_server_binary, smollm2, tmp_path_factory):
    """The real llama-server + SmolLM2 behind engineroom's think template, one slot, thinking
    ended by the engine after THINK_BUDGET tokens (the flags a user gives: README, verify)."""
    from engineroom.templates import template_path

    with real_llama_server(llama_server_binary, smollm2, "-np", "1", "--reasoning-budget", str(THINK_BUDGET),
                           template=template_path("smollm2-think.jinja"), ctx=4096,
                           log_path=tmp_path_factory.mktemp("llama") / "think.log") as url:
        yield url


def test_verify_reasoning_checks_see_the_engines_own_split(think_server):
    from engineroom.checks.context import RecordingClient
    from engineroom.checks.suites import make_ctx, run_suite
    from engineroom.engines import detect

    info = detect(think_server)
    client = RecordingClient(think_server)
    ctx = make_ctx(client, info, timeout_scale=SLOW_CPU, fast=True)
    assert ctx.dialect.reasons is True and ctx.dialect.switch == "enable_thinking"
    assert ctx.dialect.sources["reasons"] == "the served chat template contains '<think>'"
    assert ctx.dialect.forced_tools == ""              # this template forces no tool-call format
    r = {x.name: x for x in run_suite("full", client, info, ctx=ctx, only=("reasoning_split", "thinking_off"))}
    split = r["reasoning_split"]
    assert split.status == "PASS" and " chars of reasoning, separate content " in split.reason, split.reason
    assert split.details["forced"].startswith("the served chat template is engineroom's own smollm2-think.jinja")
    # the split is the engine's: its own JSON carries reasoning_content, and no tag in either field
    message = split.details["exchanges"][0]["response"]["body"]["choices"][0]["message"]
    assert message["reasoning_content"].strip() and message["content"].strip()
    assert not any(tag in message[f] for tag in ("<think>", "</think>") for f in ("content", "reasoning_content"))
    off = r["thinking_off"]
    assert off.status == "PASS", off.reason
    assert off.reason.startswith('{"chat_template_kwargs": {"enable_thinking": false}} switched reasoning off: ')
    assert "reasoning_content" not in off.details["exchanges"][0]["response"]["body"]["choices"][0]["message"]


def test_bench_records_time_to_first_content_token_apart_from_the_first_token(think_server):
    """bench standard on the think server: every streamed request is reasoning first (the
    engine's reasoning_content deltas), then content, and the records say when each began."""
    from engineroom.bench.stats import reasoning
    from engineroom.store import Store

    proc = cli("bench", "standard", "--url", think_server, "--runs", "1", "--warmup", "0",
               "--max-tokens", "64", "--json", timeout=600)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    run_id = json.loads(proc.stdout)["run_id"]
    with Store() as store:
        reqs = [r["payload"] for r in store.records(run_id, "bench_request") if not r["payload"].get("warmup")]
    assert len(reqs) == 2                                    # narrative and code, one measured each
    for rec in reqs:
        got = reasoning(rec)
        assert got["kinds_recorded"] and got["reasoning_chunks"] > 0 and got["content_chunks"] > 0, got
        assert [kind for kind, _ in rec["arrival_kinds"]] == ["r", "c"], rec["arrival_kinds"]
        assert rec["arrival_kinds"][0][1] <= THINK_BUDGET          # the engine's budget ended the block
        assert got["first_content_s"] > got["ttft_s"] > 0 and not got["thinking_exhausted"]
        assert rec["reasoning_chars"] > 0 and rec["content_chars"] > 0
    print("\nbench on the think server, token chunks by kind (r: reasoning_content, c: content):",
          [rec["arrival_kinds"] for rec in reqs])


def test_the_think_template_is_named_as_forcing_reasoning_not_tool_calls():
    """Honest about what passed: the dialect says a reasoning PASS behind smollm2-think.jinja is
    the server's parsing of a block the template opened (the tool template says the same of tools)."""
    from engineroom.checks.context import read_dialect
    from engineroom.engines.base import ServerInfo
    from engineroom.templates import template_path

    think = read_dialect(ServerInfo(url="http://x", engine="e",
                                    chat_template=template_path("smollm2-think.jinja").read_text()))
    assert think.forced_reasoning.startswith("the served chat template is engineroom's own smollm2-think.jinja, "
                                             "which opens the <think> block itself")
    assert think.forced_tools == "" and think.reasons is True and think.switch == "enable_thinking"
    assert think.thinking_off == {"chat_template_kwargs": {"enable_thinking": False}}
    tools = read_dialect(ServerInfo(url="http://x", engine="e",
                                    chat_template=template_path("smollm2-tools.jinja").read_text()))
    assert tools.forced_reasoning == "" and tools.forced_tools
