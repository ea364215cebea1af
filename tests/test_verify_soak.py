"""verify --suite soak and --suite toolstream.

- Every soak verdict rule FAILs / WARNs for its stated reason on constructed per-turn records
  (``checks.soak.judge`` is pure), and INCONCLUSIVE says why.
- Against the named stand-in (tests/fixtures/standin_server.py), only for what no real engine
  does on demand: a leaking memory curve (its /metrics), 500s as the conversation grows, an
  engine that dies, streamed tool calls dropped one way or another.
- Against the REAL llama-server + SmolLM2-135M on the CPU: a quick soak in both modes with USS
  memory from the managed server's process tree, one through --url on a server engineroom did not
  launch (USS of the process listening on its port), and the stream tool-call probe over a few tries.
- Turns are stored raw (arrival times, bench's encoding); decode is recomputed from them, and old
  records that hold only ``decode_tps`` still summarise.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from fixtures.standin_server import LEAK_PER_REQUEST, MODEL, StandInServer

from engineroom.checks.context import RecordingClient
from engineroom.checks.soak import RULES, MemoryProbe, SoakOptions, judge, turn_decode_tps
from engineroom.checks.suites import run_suite
from engineroom.engines.base import Capabilities, ServerInfo
from engineroom.records.encoding import decode_arrivals, encode_arrivals

from conftest import cli

MiB = 1024 * 1024


# -- the verdict rules on constructed records ---------------------------------------------------


def turns(sessions: int = 4, steps: int = 5, **per: Any) -> list[dict[str, Any]]:
    """Per-turn records of a steady soak; ``per[field](session, step)`` overrides one field."""
    out = []
    for s in range(1, sessions + 1):
        for k in range(1, steps + 1):
            value = {name: fn(s, k) for name, fn in per.items()}
            out.append({"turn": len(out) + 1, "session": s, "step": k, "kind": "t", "prompt_tokens": 100 * k,
                        "wall_s": value.get("wall", 2.0), "ttft_s": value.get("ttft", 0.2),
                        "decode_tps": value.get("decode", 50.0),
                        "check": {"status": value.get("status", "ok"), "reason": value.get("reason", ""),
                                  "expected": value.get("expected", True)},
                        "memory": {"source": "uss", "bytes": value.get("mem", 800 * MiB),
                                   **({"host_bytes": value["host"]} if "host" in value else {})}})
    return out


def rule(verdict: dict, name: str) -> dict:
    return next(r for r in verdict["rules"] if r["rule"] == name)


def test_a_steady_soak_passes_every_rule():
    v = judge(turns(), "uss")
    assert v["verdict"] == "PASS", v["reason"]
    assert {r["rule"]: r["outcome"] for r in v["rules"]} == {
        "errors": "PASS", "silent_empty": "PASS", "memory_growth": "PASS", "memory_slope": "PASS",
        "memory_oscillation": "PASS", "decode_drift": "PASS", "ttft_growth": "PASS", "slow_turn": "PASS",
        "markup_in_content": "PASS", "quality_drift": "PASS"}
    assert v["reason"].startswith("20 turns over 4 sessions, no error, memory 0.0 MiB from the baseline (uss)")
    assert set(RULES) - {"host_memory_growth"} == {r["rule"] for r in v["rules"]}   # no host series here


# (what the records do, the rule, its outcome, the verdict, how the rule's reason starts)
RULE_CASES = [
    ("a 500 at turn 7", dict(status=lambda s, k: "error" if (s, k) == (2, 2) else "ok",
                             reason=lambda s, k: "HTTP 500: out of memory" if (s, k) == (2, 2) else ""),
     "errors", "FAIL", "FAIL", "1 of 20 turns failed; the first at turn 7 (session 2, 200 prompt tokens): HTTP 500"),
    ("half the turns silent", dict(status=lambda s, k: "silent_empty" if k % 2 else "ok"),
     "silent_empty", "FAIL", "FAIL", "12 of 20 turns (60%) came back 200 after >= 1 s with no token"),
    ("one turn silent", dict(status=lambda s, k: "silent_empty" if (s, k) == (3, 1) else "ok"),
     "silent_empty", "WARN", "WARN", "1 of 20 turns (5%) came back 200 after >= 1 s with no token (first: turn 11)"),
    ("memory +300 MiB", dict(mem=lambda s, k: (800 + (s - 1) * 100) * MiB),
     "memory_growth", "FAIL", "FAIL", "300.0 MiB from the baseline (800.0 MiB at the end of session 1)"),
    ("memory +20 MiB a session", dict(mem=lambda s, k: (800 + (s - 1) * 20) * MiB),
     "memory_slope", "WARN", "WARN", "20.0 MiB a session over the 3 session ends after the baseline (> 16.0 MiB: "
                                     "a slow leak)"),
    ("VRAM flat, host RAM +300 MiB", dict(host=lambda s, k: (300 + (s - 1) * 100) * MiB),
     "host_memory_growth", "FAIL", "FAIL", "the engine's host memory (USS) 300.0 MiB from 300.0 MiB at the end of "
                                           "session 1 to 600.0 MiB"),
    ("memory swinging 600 MiB", dict(mem=lambda s, k: (1400 if (s, k) == (3, 2) else 800) * MiB),
     "memory_oscillation", "WARN", "WARN", "readings after the baseline swing by 600.0 MiB (limit 500.0 MiB)"),
    ("decode down to 70%", dict(decode=lambda s, k: 50.0 if s <= 2 else 35.0),
     "decode_drift", "FAIL", "FAIL", "median decode 35.0 tok/s in the last 2 session(s) vs 50.0 in the first 2 (70%"),
    ("TTFT doubled", dict(ttft=lambda s, k: 0.2 if s <= 2 else 0.4),
     "ttft_growth", "WARN", "WARN", "median TTFT 0.400 s in the last 2 session(s) vs 0.200 s in the first 2 (2.00x"),
    ("a 31 s turn", dict(wall=lambda s, k: 31.0 if (s, k) == (4, 5) else 2.0),
     "slow_turn", "WARN", "WARN", "1 turn(s) took > 30 s; the slowest, turn 20, 31.0 s"),
    ("tool markup left in content", dict(status=lambda s, k: "markup" if (s, k) == (1, 2) else "ok",
                                         reason=lambda s, k: "tool-call markup in content ('<tool_call>' at char 0)"),
     "markup_in_content", "WARN", "WARN", "1 turn(s) left tool-call markup in content (first: turn 2"),
    ("answers degenerate late", dict(status=lambda s, k: "degenerate" if s > 2 else "ok"),
     "quality_drift", "WARN", "WARN", "good answers 0% in the last 2 session(s) vs 100% in the first 2 (fell >= 40%"),
]


@pytest.mark.parametrize(("what", "per", "name", "outcome", "verdict", "reason"), RULE_CASES,
                         ids=[c[0] for c in RULE_CASES])
def test_each_verdict_rule_fires_for_its_stated_reason(what, per, name, outcome, verdict, reason):
    v = judge(turns(**per), "uss")
    r = rule(v, name)
    assert (r["outcome"], v["verdict"]) == (outcome, verdict), (r, v["reason"])
    assert r["reason"].startswith(reason), r["reason"]
    assert v["reason"].startswith(f"{name}: {reason}"), v["reason"]
    others = {x["rule"] for x in v["rules"] if x["outcome"] in ("FAIL", "WARN")} - {name}
    assert others <= ({"memory_slope"} if name == "memory_growth" else set()), others   # a big leak has a slope too


def test_a_one_off_step_after_the_baseline_is_growth_not_a_slope():
    # measured on llama-server (benchmarks/verify_soak.md): +104 MiB once, in the second session, then flat
    v = judge(turns(sessions=5, mem=lambda s, k: (227 if s == 1 or (s == 2 and k < 4) else 331) * MiB), "uss")
    assert rule(v, "memory_slope")["outcome"] == "PASS" and rule(v, "memory_growth")["outcome"] == "PASS"
    assert v["memory"]["growth_bytes"] == 104 * MiB and v["verdict"] == "PASS"


def test_every_rule_has_a_case():
    assert {c[2] for c in RULE_CASES} == set(RULES)


def test_inconclusive_says_why_and_fail_outranks_it():
    none = judge(turns(), None, memory_note="no memory source: a --url server")
    assert none["verdict"] == "INCONCLUSIVE" and none["reason"] == "no memory source: a --url server"
    assert rule(none, "memory_growth")["outcome"] == "not judged"
    one = judge(turns(sessions=1), "uss")
    assert one["verdict"] == "INCONCLUSIVE"
    assert one["reason"].startswith("no session ran after the baseline (the end of session 1)")
    unread = judge(turns(mem=lambda s, k: None), "uss")
    assert (unread["verdict"], unread["reason"]) == ("INCONCLUSIVE", "no memory reading came back from the uss source")
    # no error-free session to take the baseline from: the errors are the finding (FAIL), the memory
    # rules say why they were not judged
    broken = judge(turns(status=lambda s, k: "error" if k == 5 else "ok", reason=lambda s, k: "HTTP 500"), "uss")
    assert broken["verdict"] == "FAIL"
    assert rule(broken, "memory_growth")["reason"] == "no error-free session to take the memory baseline from"


def test_drift_rules_need_two_complete_sessions_and_say_so():
    v = judge(turns(sessions=2, steps=5)[:7], "uss")       # the second session cut by --turns
    assert rule(v, "decode_drift")["outcome"] == "not judged"
    assert rule(v, "decode_drift")["reason"] == ("needs >= 2 complete sessions to compare the first with the last; "
                                                 "1 ran")


# -- the soak loop against the stand-in (memory curves and failures no real engine gives on demand) ----------


def standin_info(url: str, n_ctx: int = 8192) -> ServerInfo:
    return ServerInfo(url=url, engine="standin", model_id=MODEL, n_ctx=n_ctx, chat_template="{{ messages }}",
                      capabilities=Capabilities(tools=True))


def flat_memory() -> MemoryProbe:
    return MemoryProbe("uss", "a constructed flat curve (test)", lambda: {"bytes": 700 * MiB})


def soak_against(srv: StandInServer, mode: str, turns_: int, *, memory: MemoryProbe | None = None,
                 n_ctx: int = 8192, **kw: Any):
    seen: list[dict] = []
    [result] = run_suite("soak", RecordingClient(srv.url), standin_info(srv.url, n_ctx), fast=True,
                         soak=SoakOptions(mode, None, turns_), memory=memory or flat_memory(), on_turn=seen.append,
                         **kw)
    return result, seen


def test_continuous_soak_grows_one_conversation_on_the_models_own_tool_call_ids():
    with StandInServer() as srv:
        result, seen = soak_against(srv, "continuous", 10, n_ctx=4096)
        chats = [r["body"] for r in srv.requests if r["path"] == "/v1/chat/completions"]
    assert result.name == "soak_continuous" and result.status == "PASS", result.reason
    assert result.details["verdict"] == "PASS" and len(seen) == 10 == len(result.details["turn_records"])
    prompts = [t["prompt_tokens"] for t in seen]
    assert prompts[:5] == sorted(prompts[:5]) and prompts[4] > 4 * prompts[0]     # the conversation grows
    assert result.details["max_prompt_share_of_ctx"] <= 0.8                       # never beyond the context
    # turn 2 answers the stand-in's own call id (call_0) with the 1st attachment
    second = chats[1]["messages"]
    tool = [m for m in second if m["role"] == "tool"]
    assert tool and tool[0]["tool_call_id"] == "call_0" and len(tool[0]["content"]) > 1000
    assert chats[5]["messages"][0]["content"] != chats[0]["messages"][0]["content"]   # each session salted
    assert all(t["memory"] == {"source": "uss", "bytes": 700 * MiB} for t in seen)
    plan = result.details["plan"]
    assert plan["scaled"] is True and plan["calibration"].startswith("an assumed 3 chars a token")


def test_growing_conversation_hitting_a_memory_wall_fails_on_errors_with_the_depth():
    with StandInServer("500_long_prompt", long_chars=6000) as srv:
        result, seen = soak_against(srv, "continuous", 10)
    # turns 1-2 fit, turn 3 carries the second attachment past the stand-in's 6,000 chars: HTTP 500
    assert result.status == "FAIL", result.reason
    assert re.match(r"FAIL: errors: 3 of 10 turns failed; the first at turn 3 \(session 1, [\d,]+ chars of "
                    r"conversation, [\d,]+ prompt tokens the turn before\): HTTP 500: internal server error: out of "
                    r"memory", result.reason), result.reason
    # each session stops at its failed turn; the next session starts fresh
    assert [t["check"]["status"] for t in seen] == ["ok", "ok", "error"] * 3 + ["ok"]
    # the first turn's exchange and the failing turns' are kept with the result (the request behind the verdict)
    assert [e["turn"] for e in result.details["exchanges"]] == [1, 3, 6, 9]
    assert result.details["exchanges"][1]["response"]["status"] == 500
    assert rule(result.details, "memory_growth")["outcome"] == "not judged"


def test_an_engine_that_dies_ends_the_soak_and_says_so():
    with StandInServer("crash_long_prompt", long_chars=6000) as srv:
        result, seen = soak_against(srv, "continuous", 20)
    assert result.status == "FAIL" and result.details["stopped_by"] == "the engine stopped answering"
    assert seen[-1]["http"] is None and len(seen) < 20


def test_a_leaking_memory_curve_fails_memory_growth():
    def leaking() -> dict:
        leaking.n += 1          # type: ignore[attr-defined]
        return {"bytes": 700 * MiB + leaking.n * 30 * MiB}     # type: ignore[attr-defined]

    leaking.n = 0               # type: ignore[attr-defined]
    with StandInServer() as srv:
        result, _ = soak_against(srv, "fresh", 15, memory=MemoryProbe("uss", "constructed leak", leaking))
    assert result.status == "FAIL" and result.details["verdict"] == "FAIL"
    assert result.reason.startswith("FAIL: memory_growth: 300.0 MiB from the baseline (850.0 MiB at the end of "
                                    "session 1)"), result.reason


@pytest.mark.slow
def test_soak_bounds_by_minutes_and_skips_below_the_minimum_context():
    with StandInServer() as srv:
        t0 = time.perf_counter()
        [r] = run_suite("soak", RecordingClient(srv.url), standin_info(srv.url), fast=True,
                        soak=SoakOptions("fresh", 0.02, None), memory=flat_memory())
        took = time.perf_counter() - t0
        [small] = run_suite("soak", RecordingClient(srv.url), standin_info(srv.url, n_ctx=1024),
                            soak=SoakOptions("fresh"), memory=flat_memory())
    assert r.details["stopped_by"].startswith("the time bound (0.02 minutes, after ") and took < 30
    assert (small.status, small.reason) == ("SKIP", "needs >= 2,048 tokens of context; the server has 1,024")


def test_soak_cli_reads_the_engines_own_report_stores_turns_junit_card_and_baseline(tmp_path):
    import xml.etree.ElementTree as ET

    junit = tmp_path / "soak.xml"
    with StandInServer(report_memory=True) as good:
        first = cli("verify", "--url", good.url, "--suite", "soak", "--fast", "--turns", "10", "--json",
                    "--junit", str(junit), timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    out = json.loads(first.stdout)
    [res] = out["results"]
    d = res["details"]
    assert res["name"] == "soak_fresh" and d["verdict"] == "PASS", res["reason"]
    assert d["memory_source"] == "engine_report"
    assert d["memory_description"].startswith("the engine's own /metrics: process_resident_memory_bytes")
    assert [t["turn"] for t in d["turn_records"]] == list(range(1, 11))
    assert {"turn", "prompt_tokens", "completion_tokens", "ttft_s", "arrivals_us", "end_us", "check", "memory"} <= set(
        d["turn_records"][0])
    assert "decode_tps" not in d["turn_records"][0]      # raw: the verdict recomputes it from the arrivals
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "verify.soak" and suite.get("failures") == "0"
    with StandInServer("memory_leak", report_memory=True) as bad:
        second = cli("verify", "--url", bad.url, "--suite", "soak", "--fast", "--turns", "10", "--baseline",
                     str(out["run_id"]), timeout=300)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-2000:]
    flat = " ".join(second.stdout.split())
    assert "FAIL soak_fresh" in flat and "FAIL: memory_growth: " in flat
    assert "1 regressed (soak_fresh)" in second.stdout
    assert "soak turn 10 (session 2, arithmetic)" in " ".join(second.stderr.split())   # progress per turn
    card = cli("report", str(out["run_id"] + 1), check=True).stdout
    assert "## Soak (fresh)" in card and "| memory_growth | FAIL | " in card
    assert f"limit {200:.1f} MiB" in card and "| turn | session | kind |" in card
    assert "| 10 | 2 | arithmetic |" in card
    # the growth is what the stand-in's /metrics reported: 64 MiB a request, 5 requests after the baseline
    assert f"| memory_growth | FAIL | {5 * LEAK_PER_REQUEST / MiB:.1f} MiB from the baseline" in card


def test_soak_against_a_url_without_any_memory_source_is_inconclusive():
    with StandInServer() as srv:
        proc = cli("verify", "--url", srv.url, "--suite", "soak", "--fast", "--turns", "10", "--json",
                   timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    [res] = json.loads(proc.stdout)["results"]
    assert res["status"] == "FAIL" and res["details"]["verdict"] == "INCONCLUSIVE"
    assert res["reason"].startswith("INCONCLUSIVE: no memory source: ")
    # the stand-in listens inside the test process, which started the CLI: not an engine's process tree
    assert "no engine pid is known (a --url server: the process listening on port " in res["reason"]
    assert "is engineroom itself or the one that started it" in res["reason"]


BAD_FLAGS = [
    (("--suite", "soak", "--mode", "sideways"), "--mode must be one of fresh, continuous, not 'sideways'."),
    (("--suite", "soak", "--minutes", "0"), "--minutes must be a positive number of minutes, not 0.0."),
    (("--suite", "soak", "--turns", "0"), "--turns must be at least 1, not 0."),
    (("--suite", "soak", "--repeat", "2"), "the soak suite repeats by --turns / --minutes, not --repeat."),
    (("--suite", "full", "--mode", "fresh"), "--mode, --minutes and --turns go with --suite soak."),
    (("--suite", "toolstream", "--tries", "0"), "--tries must be between 1 and 10,000, not 0."),
    (("--suite", "soak", "--tries", "3"), "--tries goes with --suite toolstream."),
    (("--suite", "full", "--check", "usage,nope"), "no check named nope in the full suite (its checks: reachable, "),
    (("--check", "usage"), "no check named usage in the smoke suite"),
    (("--suite", "stress", "--check", "usage"), "--check goes with --suite smoke or full"),
]


@pytest.mark.parametrize(("flags", "sentence"), BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_bad_soak_and_toolstream_flags_are_one_sentence_before_any_server_is_asked(flags, sentence):
    proc = cli("verify", "--url", "http://127.0.0.1:9", *flags)      # nothing listens there
    assert proc.returncode not in (0, 1) and sentence in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# -- the stream tool-call probe against the stand-in -------------------------------------------------


def toolstream_against(misbehaviour: str | None, tries: int = 6, **info_kw: Any):
    with StandInServer(misbehaviour) as srv:
        info = ServerInfo(url=srv.url, engine="standin", model_id=MODEL, n_ctx=4096, chat_template="{{ messages }}",
                          capabilities=Capabilities(tools=True), **info_kw)
        [r] = run_suite("toolstream", RecordingClient(srv.url), info, tries=tries)
    return r


TOOL_DROPS = [
    (None, "PASS", "6/6 PASS, 0 DROP: every streamed tool call arrived whole", {}),
    ("stream_tool_drop", "FAIL", "3/6 PASS, 3 DROP (50%: 3 leaked); first at try 2 (time, tool_choice auto): "
                                 "leaked: '<tool_call>' left in content at char 0", {"leaked": 3}),
    ("split_tool_call_deltas", "FAIL", "0/6 PASS, 6 DROP (100%: 6 broken); first at try 1 (weather, tool_choice "
                                       "required): broken: arguments of get_weather do not parse", {"broken": 6}),
    # under tool_choice auto the stand-in answers prose (its Tokyo prompt, try 2, still gets its two calls)
    ("ignore_tools", "FAIL", "4/6 PASS, 2 DROP (33%: 2 lost); first at try 4 (email, tool_choice auto): lost: no "
                             "tool call (finish_reason=stop)", {"lost": 2}),
    ("tool_markup_in_content", "FAIL", "0/6 PASS, 6 DROP (100%: 6 leaked)", {"leaked": 6}),
    ("stream_drop", "FAIL", "0/6 PASS, 6 DROP (100%: 6 stream broke)", {"stream broke": 6}),
]


@pytest.mark.parametrize(("misbehaviour", "status", "reason", "kinds"), TOOL_DROPS,
                         ids=[str(m) for m, *_ in TOOL_DROPS])
@pytest.mark.slow
def test_stream_tool_call_probe_counts_pass_and_drop(misbehaviour, status, reason, kinds):
    r = toolstream_against(misbehaviour)
    assert r.name == "stream_tool_calls" and r.status == status, r.reason
    assert r.reason.startswith(reason), r.reason
    d = r.details
    assert d["tries"] == 6 and d["pass"] + d["drop"] + d["error"] == 6 and d["drop_kinds"] == kinds
    assert d["drop_rate"] == round(d["drop"] / 6, 4)
    assert [t["tool_choice"] for t in d["try_records"]] == ["required", "auto"] * 3
    assert d["exchanges"] and "forced" not in d


def test_stream_tool_call_probe_cycles_ten_prompts_two_multi_turn_and_four_tools():
    from engineroom.checks.toolstream import DEFAULT_TRIES, PROMPTS, TOOLS

    assert DEFAULT_TRIES == 30 and len(PROMPTS) == 10 and len(TOOLS) == 4
    assert sum(1 for _, messages, _ in PROMPTS if len(messages) > 1) == 2
    with StandInServer() as srv:
        info = standin_info(srv.url)
        run_suite("toolstream", RecordingClient(srv.url), info, tries=12)
        bodies = [r["body"] for r in srv.requests]
    assert len(bodies) == 12 and all(b["stream"] and len(b["tools"]) == 4 for b in bodies)
    assert bodies[0]["messages"] == bodies[10]["messages"] and bodies[0]["seed"] != bodies[10]["seed"]
    assert {b["temperature"] for b in bodies} == {0.6} and {b["max_tokens"] for b in bodies} == {512}


def test_toolstream_cli_json_and_junit(tmp_path):
    import xml.etree.ElementTree as ET

    junit = tmp_path / "ts.xml"
    with StandInServer("stream_tool_drop") as srv:
        proc = cli("verify", "--url", srv.url, "--suite", "toolstream", "--tries", "4", "--json", "--junit",
                   str(junit), timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    [res] = json.loads(proc.stdout)["results"]
    assert res["reason"].startswith("2/4 PASS, 2 DROP (50%: 2 leaked)")
    case = ET.parse(junit).getroot().find("testsuite/testcase[@name='stream_tool_calls']")
    assert case is not None and case.find("failure") is not None
    assert case.findtext("system-out") == "2 PASS, 2 DROP of 4 streamed tool calls"
    card = cli("report", str(json.loads(proc.stdout)["run_id"]), check=True).stdout
    assert "## Stream tool-call probe" in card and "**2/4 PASS, 2 DROP** (drop rate 50%: 2 leaked)" in card


# -- the real engine: llama-server + SmolLM2-135M on the CPU ----------------------------------------------

SLOW_CPU = 5.0
# On a shared CPU the latency rules follow the machine's other load, not the engine: a WARN from
# them (or, rarely, decode_drift) is the machine's. The rest is the engine's and is stated.
LOAD_RULES = {"slow_turn", "ttft_growth", "decode_drift"}


def test_quick_soak_on_real_smollm2_reads_uss_from_the_managed_servers_process_tree(managed_server):
    """The continuous mode on the managed server (its growing conversation is the only detector of accumulated-context
    OOM); the fresh mode, the default, runs on an unmanaged server in the --url test below, with the same rules."""
    mode = "continuous"
    t0 = time.perf_counter()
    proc = cli("verify", "--suite", "soak", "--mode", mode, "--fast", "--turns", "10", "--json", timeout=900)
    took = time.perf_counter() - t0
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    [res] = json.loads(proc.stdout)["results"]
    d = res["details"]
    assert d["memory_source"] == "uss", d["memory_description"]
    assert d["memory_description"].startswith(f"unique memory (USS) of the managed engine's process tree (pid "
                                              f"{managed_server['pid']}")
    assert d["turns"] == 10 and d["sessions"] == 2 and d["complete_sessions"] == 2
    outcomes = {r["rule"]: r["outcome"] for r in d["rules"]}
    # expected for SmolLM2 behind llama-server: every turn answered, no silent turn, memory flat within 200 MiB
    # (llama-server's prompt cache keeps each finished session's state in RAM: tens of MiB a session here)
    assert outcomes["errors"] == "PASS" and outcomes["silent_empty"] == "PASS", d["rules"]
    assert outcomes["memory_growth"] == "PASS" and outcomes["memory_oscillation"] == "PASS", d["rules"]
    # a 135M model loops on long answers now and then: degenerate answers are its own, not a soak failure,
    # and quality drift needs 4 sessions (not judged here); the model's ChatML template has no tool-call format,
    # so no tool-call markup reaches content
    assert outcomes["quality_drift"] == "not judged" and outcomes["markup_in_content"] == "PASS"
    assert outcomes["memory_slope"] == "not judged"
    fired = {r["rule"] for r in d["rules"] if r["outcome"] in ("FAIL", "WARN")}
    assert fired <= LOAD_RULES, d["rules"]
    assert d["verdict"] in ("PASS", "WARN") or fired == {"decode_drift"} | (fired & LOAD_RULES)
    assert d["plan"]["scaled"] and d["max_prompt_share_of_ctx"] <= 0.8
    assert d["turn_records"][4]["prompt_tokens"] > 3 * d["turn_records"][0]["prompt_tokens"]
    assert d["plan"]["calibration"] == "the engine's tokenizer on a sample of the attachments"
    assert all(isinstance(t["memory"]["bytes"], int) for t in d["turn_records"])
    print(f"\nsoak {mode} on real SmolLM2: {d['verdict']} in {took:.0f} s ({res['reason'][:160]})")


def test_stream_tool_call_probe_on_real_smollm2(tools_server, plain_server):
    from engineroom.engines import detect

    # behind engineroom's tool template (it tells the model to open with <tool_call>) llama-server's parser
    # assembles every streamed call: PASS, and the card says the format was forced
    info = detect(tools_server)
    [forced] = run_suite("toolstream", RecordingClient(tools_server), info, tries=4, fast=True,
                         timeout_scale=SLOW_CPU)
    assert forced.status == "PASS", forced.reason
    assert forced.reason.startswith("4/4 PASS, 0 DROP")
    assert forced.details["forced"].startswith("the served chat template is engineroom's own smollm2-tools.jinja")
    assert forced.details["drop"] == 0 and forced.details["by_tool_choice"] == {
        "required": {"tries": 2, "pass": 2}, "auto": {"tries": 2, "pass": 2}}
    # with the model's own ChatML template (no tool-call format) llama-server declares it cannot call tools
    # (/props chat_template_caps): the probe SKIPs with that reason, sending nothing
    info = detect(plain_server)
    [plain] = run_suite("toolstream", RecordingClient(plain_server), info, tries=2, fast=True,
                        timeout_scale=SLOW_CPU)
    assert (plain.status, plain.reason) == (
        "SKIP", "server declares no tools support (from /props chat_template_caps.supports_tool_calls = false)")
    print(f"\ntoolstream on real SmolLM2: forced template {forced.reason[:60]}; own template SKIP")


# -- which memory source the flow picks (no GPU here: NVML's answer is monkeypatched) ------------------


def test_memory_source_nvml_on_this_machines_gpus_uss_for_the_managed_pid_else_the_engines_report(monkeypatch):
    import os

    from engineroom import resources
    from engineroom.flows import engineproc

    calls: list[int] = []

    def fake_gpus():
        calls.append(1)
        return [{"index": 0, "name": "H200", "used_bytes": 5 * 1024 * MiB, "total_bytes": 140 * 1024 * MiB},
                {"index": 1, "name": "H200", "used_bytes": 1024 * MiB, "total_bytes": 140 * 1024 * MiB}]

    monkeypatch.setattr(resources, "gpu_memory", fake_gpus)
    local = ServerInfo(url="http://127.0.0.1:8080", engine="llama.cpp")
    probe, note, sampler = engineproc.soak_memory(local, None, None)
    assert probe is not None and probe.source == "nvml" and note == ""
    assert probe.description.startswith("total VRAM used on this machine's 2 GPU(s) (H200), through NVML")
    assert probe.read() == {"bytes": 6 * 1024 * MiB, "gpus": [
        {"index": 0, "used_bytes": 5 * 1024 * MiB, "total_bytes": 140 * 1024 * MiB},
        {"index": 1, "used_bytes": 1024 * MiB, "total_bytes": 140 * 1024 * MiB}]}
    assert sampler.gpus is True
    # the managed server on a GPU: its host memory is read beside VRAM (a prompt cache in RAM never shows in VRAM)
    probe, _, _ = engineproc.soak_memory(local, os.getpid(), None)
    assert probe is not None and probe.source == "nvml" and "host memory (USS of pid" in probe.description
    reading = probe.read()
    assert reading is not None and reading["bytes"] == 6 * 1024 * MiB and reading["host_bytes"] > 0
    # a server on another machine: this machine's GPUs say nothing of it, NVML is not even asked
    calls.clear()
    probe, note, _ = engineproc.soak_memory(ServerInfo(url="http://10.1.2.3:8000", engine="vllm"), None, None)
    assert probe is None and not calls
    assert note.startswith("no memory source: the server is not on this machine (NVML would not see it), no "
                           "engine pid is known (a --url server), and vllm's /metrics reports no process memory")
    # no GPU, a known pid (the managed server): the process tree's USS
    monkeypatch.setattr(resources, "gpu_memory", lambda: None)
    probe, _, sampler = engineproc.soak_memory(local, os.getpid(), None)
    assert probe is not None and probe.source == "uss" and sampler.pid == os.getpid()
    reading = probe.read()
    assert reading is not None and reading["bytes"] > 0 and reading["rss_bytes"] >= reading["bytes"]
    with StandInServer(report_memory=True) as srv:
        probe, _, _ = engineproc.soak_memory(ServerInfo(url=srv.url, engine="unknown"), None, None)
        assert probe is not None and probe.source == "engine_report"
        assert probe.read() == {"bytes": 512 * MiB, "series": 1}


def test_the_card_of_an_unfinished_soak_shows_the_turns_it_stored():
    from engineroom.report.verifycard import soak_section

    stored = [{"kind": "soak_turn", "payload": t} for t in turns(sessions=1)[:3]]
    lines = soak_section(stored)
    assert lines[:3] == ["## Soak (not finished)", "",
                         "The run ended after 3 turns, before the soak's verdict; the turns it stored:"]
    assert any(line.startswith("| 3 | 1 | t | 300 |") for line in lines), lines


# -- raw turns: arrival times kept, decode recomputed (old records: their stored decode_tps) -----------------


def raw(turn: dict[str, Any], tps: float, tokens: int = 64) -> dict[str, Any]:
    """``turn`` as the driver stores it now: no decode_tps, the arrivals of ``tokens`` chunks at ``tps``."""
    t0 = 1000.0
    ttft = float(turn["ttft_s"])
    times = [t0 + ttft + i / tps for i in range(tokens)]
    out = {k: v for k, v in turn.items() if k != "decode_tps"}
    return {**out, "completion_tokens": tokens, "arrivals_us": encode_arrivals(t0, times),
            "end_us": round((times[-1] + 0.001 - t0) * 1_000_000)}


def test_a_turns_decode_rate_is_recomputed_from_its_stored_arrivals():
    from engineroom.records.statistics import decode_rate

    [turn] = turns(sessions=1, steps=1)
    stored = raw(turn, 40.0)
    assert "decode_tps" not in stored and isinstance(stored["arrivals_us"][0], int)
    offsets = decode_arrivals(stored["arrivals_us"])
    assert len(offsets) == 64 and offsets[0] == 200_000                      # the first chunk at TTFT, 0.2 s
    wall, first = stored["end_us"] / 1e6, offsets[0] / 1e6
    expected = decode_rate(64, wall, first)[0]
    assert expected is not None and turn_decode_tps(stored) == pytest.approx(expected)
    assert turn_decode_tps(stored) == pytest.approx(64 / (wall - first))      # tokens / (wall - TTFT)
    # under the soak's 100 ms window, or one token: n/a, as before
    assert turn_decode_tps(raw(turn, 40.0, tokens=3)) is None
    assert turn_decode_tps({**stored, "arrivals_us": [], "ttft_s": None}) is None
    # a turn that streamed only tool-call deltas: no text arrival, the window starts at its recorded ttft_s
    tool_only = {**stored, "arrivals_us": [], "ttft_s": 0.2}
    assert turn_decode_tps(tool_only) == pytest.approx(64 / (wall - 0.2))
    # an old record, stored before arrivals were kept: its decode_tps read as is
    assert turn_decode_tps(turn) == 50.0


def test_the_verdict_reads_new_raw_turns_and_old_decode_tps_turns_alike():
    steady = judge(turns(), "uss")
    old = turns(decode=lambda s, k: 50.0 if s <= 2 else 30.0)                 # decode falls to 60%
    new = [raw(t, 50.0 if t["session"] <= 2 else 30.0) for t in turns()]
    mixed = old[:10] + new[10:]
    for records in (old, new, mixed):
        r = rule(judge(records, "uss"), "decode_drift")
        assert r["outcome"] == "FAIL" and r["measured"]["ratio"] == pytest.approx(0.6, abs=0.02), r
    assert rule(steady, "decode_drift")["outcome"] == "PASS"
    assert rule(judge([raw(t, 50.0) for t in turns()], "uss"), "decode_drift")["outcome"] == "PASS"


# -- a --url server on this machine: the process listening on its port ---------------------------------------


def test_the_listener_of_a_loopback_port_is_found_and_its_uss_read(tmp_path):
    import socket
    import subprocess
    import sys

    from engineroom.flows import engineproc

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert child.poll() is None and time.time() < deadline, "the listener did not start"
            time.sleep(0.05)
        found = engineproc.listening_engine(f"http://127.0.0.1:{port}/")
        assert found.pid == child.pid and found.why == "", found
        assert not found.managed and f"listening on port {port}" in found.tree
        probe_, note, _ = engineproc.soak_memory(ServerInfo(url=f"http://127.0.0.1:{port}", engine="unknown"),
                                                 found.pid, None, found)
        if probe_ is not None and probe_.source == "nvml":      # a GPU machine: the listener's host USS beside VRAM
            assert f"the process tree listening on port {port}" in probe_.description
        else:
            assert probe_ is not None and probe_.source == "uss", note
            assert probe_.description.startswith(f"unique memory (USS) of the process tree listening on port {port} "
                                                 f"(found by its port")
            reading = probe_.read()
            assert reading is not None and reading["bytes"] > 0
    finally:
        child.kill()
        child.wait()
    # not loopback: not looked up; nothing listening: no pid, and why
    assert engineproc.listening_engine("http://10.1.2.3:8000") == engineproc.EnginePid(None)
    gone = engineproc.listening_engine(f"http://127.0.0.1:{port}")
    assert gone.pid is None and gone.why == f"no process of this machine is seen listening on port {port}"


def test_a_listener_lookup_the_os_refuses_falls_back_and_says_why(monkeypatch):
    import psutil

    from engineroom import resources
    from engineroom.flows import engineproc

    def refuse(kind: str = "inet"):
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", refuse)
    monkeypatch.setattr(resources, "gpu_memory", lambda: None)
    found = engineproc.listening_engine("http://127.0.0.1:8080")
    assert found.pid is None and "psutil: access denied" in found.why and "needs root" in found.why
    probe, note, _ = engineproc.soak_memory(ServerInfo(url="http://127.0.0.1:9", engine="llama.cpp"), None, None, found)
    assert probe is None
    assert ("no engine pid is known (a --url server: the process listening on port 8080 could not be looked up "
            "(psutil: access denied") in note
    # the listener is this very process (an in-process stand-in): engineroom's own memory is not the engine's
    with StandInServer() as srv:
        port = int(srv.url.rsplit(":", 1)[1].split("/")[0])
        monkeypatch.undo()
        own = engineproc.listening_engine(srv.url)
    assert own.pid is None and own.why.startswith(f"the process listening on port {port} is engineroom itself")


def test_quick_soak_through_url_on_a_real_unmanaged_llama_server_reads_uss_by_its_port(plain_server):
    port = int(plain_server.rsplit(":", 1)[1].split("/")[0])
    t0 = time.perf_counter()
    # 6 turns: the first session (the baseline at its end) and one turn after it, the fewest that judge memory
    proc = cli("verify", "--url", plain_server, "--suite", "soak", "--fast", "--turns", "6", "--json",
               timeout=900)
    took = time.perf_counter() - t0
    assert proc.returncode in (0, 1) and proc.stdout.startswith("{"), proc.stderr[-3000:]
    [res] = json.loads(proc.stdout)["results"]
    d = res["details"]
    assert d["verdict"] != "INCONCLUSIVE", res["reason"]
    assert d["memory_source"] == "uss", d["memory_description"]
    assert d["memory_description"].startswith(f"unique memory (USS) of the process tree listening on port {port} "
                                              "(found by its port: a server engineroom did not launch) (pid ")
    assert d["turns"] == 6 and d["memory"]["baseline_session"] == 1, d["memory"]
    assert all(isinstance(t["memory"]["bytes"], int) and t["memory"]["bytes"] > 0 for t in d["turn_records"])
    assert d["plan"]["mode"] == "fresh"       # the default; the managed test above runs the continuous mode
    outcomes = {r["rule"]: r["outcome"] for r in d["rules"]}
    assert outcomes["errors"] == "PASS" and outcomes["memory_growth"] == "PASS", d["rules"]
    assert outcomes["silent_empty"] == "PASS" and outcomes["markup_in_content"] == "PASS", d["rules"]
    assert outcomes["quality_drift"] == "not judged" and outcomes["memory_slope"] == "not judged", d["rules"]
    fired = {r["rule"] for r in d["rules"] if r["outcome"] in ("FAIL", "WARN")}
    assert fired <= LOAD_RULES, d["rules"]
    # every turn raw: decode recomputed from its arrivals (tokens / (wall - first text chunk))
    rated = [t for t in d["turn_records"] if turn_decode_tps(t) is not None]
    assert rated, d["turn_records"][0]
    t = rated[0]
    first = decode_arrivals(t["arrivals_us"])[0] / 1e6
    assert turn_decode_tps(t) == pytest.approx(t["completion_tokens"] / (t["end_us"] / 1e6 - first))
    print(f"\nsoak through --url on a real unmanaged llama-server: {d['verdict']} in {took:.0f} s")


def test_the_card_shows_the_decode_rate_recomputed_from_a_raw_turns_arrivals():
    from engineroom.report.verifycard import soak_section

    turn = raw(turns(sessions=1)[0], tps=50.0)
    (row,) = [line for line in soak_section([{"kind": "soak_turn", "payload": turn}]) if line.startswith("| 1 |")]
    cells = [c.strip() for c in row.split("|")]
    assert "decode_tps" not in turn and abs(float(cells[7]) - 50.0) < 1.0, row
