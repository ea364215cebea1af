"""verify / bench / runs / report / demo through the real CLI against the real llama-server."""

from __future__ import annotations

import http.server
import json
import re
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

from engineroom import paths

from conftest import (
    MACHINE_CHECKS,
    as_in_a_terminal,
    assert_ok_or_invalid_on_the_machine_alone,
    cli,
    console_command,
    run_cli,
)


def _checks(out: dict) -> dict[str, dict]:
    return {r["name"]: r for r in out["results"]}


def test_verify_managed_server_with_its_own_template(managed_server):
    """SmolLM2's own template declares no tool support: tool checks SKIP with that reason."""
    proc = cli("verify", "--json", timeout=600)
    out = json.loads(proc.stdout)
    checks = _checks(out)
    assert checks["reachable"]["status"] == "PASS"
    assert checks["basic_answer"]["status"] == "PASS", checks["basic_answer"]
    assert checks["streaming"]["status"] == "PASS", checks["streaming"]
    assert checks["json_schema"]["status"] == "PASS", checks["json_schema"]
    assert checks["tool_call"]["status"] == "SKIP"
    assert "supports_tool_calls" in checks["tool_call"]["reason"]
    assert proc.returncode == out["failed"]
    assert out["engine"] == "llama.cpp"


def test_verify_tools_template_passes_tool_call(tools_server):
    proc = cli("verify", "--url", tools_server, "--json", timeout=600)
    checks = _checks(json.loads(proc.stdout))
    assert checks["tool_call"]["status"] == "PASS", checks["tool_call"]


def test_bench_stores_records_and_report_recomputes(managed_server):
    proc = cli("bench", "--warmup", "1", "--runs", "2", "--max-tokens", "24", "--json", timeout=600)
    out = json.loads(proc.stdout)
    # what this test is about is storage and the recomputed card (2 requests of 24 tokens)
    assert_ok_or_invalid_on_the_machine_alone(proc, out)
    run_id = out["run_id"]
    with sqlite3.connect(paths.db_path()) as db:
        n = db.execute("select count(*) from records where run_id = ? and kind = 'bench_request'",
                       (run_id,)).fetchone()[0]
        snaps = db.execute("select count(*) from records where run_id = ? and kind = 'engine_metrics'",
                           (run_id,)).fetchone()[0]
    assert n == 2 * (1 + 2)              # two workloads x (warm-up + measured), each stored
    assert snaps == 2                    # the engine's counters before and after
    from engineroom.store import Store

    with Store() as store:
        (res,) = [r["payload"] for r in store.records(run_id, "resources")]
    assert res["pid"] == managed_server["pid"]                               # the managed server's process tree
    uss = res["summary"]["engine_uss_bytes"]
    assert len(res["samples"]) >= 2 and 0 < uss["idle"] <= uss["peak"]     # the real llama-server's unique pages
    assert res["summary"]["engine_rss_bytes"]["peak"] >= uss["peak"]
    card = cli("report", str(run_id), check=True).stdout
    assert "## Resources during the run" in card and "engine memory, unique (USS)" in card
    assert "GPU: not measured (no NVML here)" in card or "GPU 0 memory used (NVML)" in card
    from engineroom.engines import llamacpp

    assert f"llama.cpp {llamacpp.binary_version(llamacpp.find_binary())}" in card
    assert "smollm2-135m" in card
    assert "ignore_eos: on" in card      # full-length runs say so
    assert "<model-dir>/" in card        # the model's folder never appears in a shared card
    listed = json.loads(cli("runs", "--json", check=True).stdout)
    assert any(r["id"] == run_id and r["kind"] == "bench" for r in listed)


def _last_bench_run() -> tuple[int, int]:
    """(id of the newest bench run, number of its request records); (0, 0) when there is none."""
    try:
        with sqlite3.connect(paths.db_path()) as db:
            row = db.execute("select max(id) from runs where kind = 'bench'").fetchone()
            if not row or row[0] is None:
                return 0, 0
            n = db.execute("select count(*) from records where run_id = ? and kind = 'bench_request'",
                           (row[0],)).fetchone()[0]
            return row[0], n
    except sqlite3.Error:
        return 0, 0


def test_ctrl_c_during_bench_keeps_measured_records(managed_server):
    before, _ = _last_bench_run()
    cli = subprocess.Popen([*console_command(), "bench", "--warmup", "0", "--runs", "50",
                            "--max-tokens", "32", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=as_in_a_terminal)
    deadline = time.time() + 180
    run_id, stored = 0, 0
    while time.time() < deadline and not (run_id > before and stored >= 2):
        time.sleep(0.5)
        run_id, stored = _last_bench_run()
    assert run_id > before and stored >= 2, "bench stored nothing while running"
    cli.send_signal(signal.SIGINT)
    _out, err = cli.communicate(timeout=60)
    assert cli.returncode == 130 and "interrupted" in err
    run = next(r for r in json.loads(run_cli("runs", "--json", check=True).stdout) if r["id"] == run_id)
    assert run["status"] == "INTERRUPTED"
    assert _last_bench_run()[1] >= stored          # what was measured is still there
    card = run_cli("report", str(run_id), check=True).stdout
    assert "INTERRUPTED" in card


def test_verify_unreachable_url():
    proc = cli("verify", "--url", "http://127.0.0.1:9")
    assert proc.returncode != 0 and "no server answers at http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_verify_non_openai_url(tmp_path):
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = cli("verify", "--url", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert proc.returncode != 0 and "not an OpenAI model list" in proc.stderr


def test_verify_without_server_or_url():
    proc = cli("verify", env={"ENGINEROOM_STATE_DIR": str(paths.state_dir() / "empty")})
    assert proc.returncode != 0 and "no managed server is running" in proc.stderr


@pytest.mark.parametrize("argv, says", [
    (("fit", "qwen3.6-27b", "--engine", "llama.cpp", "--kv", "q4_0", "--ctx", "1000"), "Missing option '--quant'"),
    (("bench", "--runs", "abc"), "Invalid value for '--runs'"),
    (("nosuch",), "No such command 'nosuch'"),
])
def test_usage_errors_are_one_clear_line_not_a_traceback(argv, says):
    """typer vendors click: its usage errors are not the click package's classes, and once
    escaped main()'s handler as a traceback."""
    proc = cli(*argv)
    assert proc.returncode == 2
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bad_url_scheme():
    proc = cli("bench", "--url", "localhost:8080")
    assert proc.returncode != 0 and "must start with http://" in proc.stderr


def test_demo_end_to_end(llama_server_binary, smollm2, er_home):
    """The README's main job, small: pull -> up -> verify -> bench -> card -> down.

    Run as on a machine whose CPU traps AMX (the probe's answer forced), with an extra engine
    argument after `--`: the card must show both the user's argument and engineroom's change.
    """
    proc = cli("demo", "--warmup", "1", "--runs", "2", "--max-tokens", "192", "--json", "--", "-b", "1024",
               env={"ENGINEROOM_STATE_DIR": str(er_home / "demo-state"), "ENGINEROOM_CPU_PROBE_FORCE": "amx=trap"},
               timeout=900)
    out = json.loads(proc.stdout)
    card = out["card"]
    assert " -b 1024" in card and " -nr" in card                   # the extra argument and the probe's change
    assert "| Changed by engineroom | added `-nr` (cpu probe): AMX does not run on this machine" in card
    assert "**verify 6/6** passed" in card
    assert "| tool_call | PASS |" in card and "| tool_call_streamed | PASS |" in card
    assert "| narrative | 2 / 2 |" in card and "| code | 2 / 2 |" in card
    for name in ("narrative", "code"):                              # one cross-check line each
        line = next(ln for ln in card.splitlines() if ln.startswith((f"- {name}:", f"- ⚠ {name}:")))
        assert "client inter-token" in line and "tok/s vs engine" in line, line   # cross-checked, always
    assert "<model-dir>/SmolLM2-135M-Instruct.Q4_1.gguf" in card    # the model folder is redacted
    counters = next(ln for ln in card.splitlines() if ln.startswith("Engine counters over the run"))
    engine_n, usage_n = re.search(r"generated tokens ([\d,]+) \(the requests' usage: ([\d,]+)\)", counters).groups()
    assert engine_n == usage_n, counters          # llama-server's /metrics agree with the stored records
    memory = card[card.index("## Memory: predicted vs measured"):]  # fit beside llama-server's own buffers
    kv = next(ln for ln in memory.splitlines() if ln.startswith("| kv_cache |"))
    assert float(kv.rstrip(" |").split("|")[-1].strip().rstrip("%")) == pytest.approx(0, abs=1.0), kv
    # 2 runs a workload on a 2-core VM: the bench may end INVALID on its spread alone (seen: code CV 10.1%);
    # any other failed check, a failed verify check, or an exit code that does not say so fails the test
    failed = {ln.split(":")[0].removeprefix("- ⚠ FAIL ") for ln in card.splitlines() if ln.startswith("- ⚠ FAIL ")}
    assert out["verify_failed"] == 0 and failed <= MACHINE_CHECKS, card
    assert (proc.returncode, out["bench_status"]) in ((0, "OK"), (1, "INVALID")), card
    # the stage runner's record of what ran, in order, each done (the stored run has it up to the bench)
    assert [(s["stage"], s["outcome"]) for s in out["stages"]] == [
        ("pull", "done"), ("launch", "done"), ("verify", "done"), ("bench", "done"), ("down", "done")]
    from engineroom.store import Store

    with Store() as store:
        summary = store.get_run(out["run_id"])["summary"]
    assert [s["stage"] for s in summary["stages"]] == ["pull", "launch", "verify", "bench"]
    status = cli("status", env={"ENGINEROOM_STATE_DIR": str(er_home / "demo-state")})
    assert status.returncode == 1      # demo leaves nothing running


def test_run_conditions_carry_the_binary_version(managed_server):
    """A managed server's runs record the binary's own --version (the sdist build says b0-unknown in /props)."""
    from engineroom import flows
    from engineroom.engines import llamacpp

    cond = flows.run_conditions(flows.connect(None))
    assert cond["engine_version"] == llamacpp.binary_version(llamacpp.find_binary())
    assert cond["model"] == "smollm2-135m" and cond["argv"][0].endswith("llama-server")
    assert cond["model_sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_sigkilled_bench_is_shown_interrupted_process_gone(managed_server):
    """kill -9 cannot be caught: the run is shown (and written back) as INTERRUPTED (process gone)
    by whoever reads it next, with every record it stored."""
    before, _ = _last_bench_run()
    cli = subprocess.Popen([*console_command(), "bench", "--warmup", "1", "--runs", "50",
                            "--max-tokens", "32", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    run_id, stored = 0, 0
    try:
        while time.time() < deadline and not (run_id > before and stored >= 2):
            time.sleep(0.5)
            run_id, stored = _last_bench_run()
        assert run_id > before and stored >= 2, "bench stored nothing while running"
        running = next(r for r in json.loads(run_cli("runs", "--json", check=True).stdout) if r["id"] == run_id)
        assert running["status"] == "running" and running["owner_pid"] == cli.pid   # alive: not mistaken
    finally:
        cli.kill()
        cli.wait(timeout=30)
    _, kept = _last_bench_run()
    assert kept >= stored                                   # every record survives
    run = next(r for r in json.loads(run_cli("runs", "--json", check=True).stdout) if r["id"] == run_id)
    assert (run["status"], run["end_reason"], run["finished"]) == ("INTERRUPTED", "process gone", None)
    table = run_cli("runs", check=True).stdout
    assert "INTERRUPTED (process gone)" in table
    card = run_cli("report", str(run_id), check=True).stdout
    assert card.startswith(f"# engineroom bench #{run_id}: INTERRUPTED (process gone)")
    assert f"Status: **INTERRUPTED (process gone)**: {kept} of 102 planned requests ran" in card
    assert "Status: **OK**" not in card


def test_up_verify_and_down_with_a_dead_proxy_in_the_environment(llama_server_binary, smollm2, er_home):
    """HTTP(S)_PROXY / ALL_PROXY pointing at a closed port and no NO_PROXY: loopback must bypass it."""
    from engineroom.launch import free_port

    proxy = "http://127.0.0.1:9"
    env = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"), proxy)
    env.update(NO_PROXY="", no_proxy="", ENGINEROOM_STATE_DIR=str(er_home / "proxy-state"))
    started = time.time()
    up = cli("up", "smollm2-135m", "--ctx", "2048", "--port", str(free_port()), "--threads", "2",
             "--timeout", "120", "--json", env=env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        assert time.time() - started < 120                  # healthy when healthy, not at the timeout
        verify = cli("verify", "--json", env=env, timeout=600)
        checks = _checks(json.loads(verify.stdout))
        assert checks["reachable"]["status"] == "PASS", checks["reachable"]
        assert checks["basic_answer"]["status"] == "PASS", checks["basic_answer"]
        status = cli("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["health"] == "ready"     # the health probe bypasses the proxy too
    finally:
        down = cli("down", env=env)
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize("argv, says", [
    (("bench", "huge"), "No such command 'huge'"),
    (("bench", "depth", "--prompts", "p.jsonl"), "No such option: --prompts"),
    (("bench", "--runs", "0"), "--runs must be at least 1, not 0."),
    (("bench", "long", "--runs", "0"), "--runs must be at least 1, not 0."),
    (("bench", "depth", "--warmup", "-1"), "--warmup must be at least 0, not -1."),
    (("bench", "--max-tokens", "0"), "--max-tokens must be at least 1, not 0."),
])
def test_bench_bad_options_are_one_sentence_before_any_request(argv, says):
    """Checked before the server is looked up: no server is needed to be told."""
    proc = cli(*argv, "--url", "http://127.0.0.1:9")
    assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "no server answers" not in proc.stderr


@pytest.mark.parametrize("argv", [
    ("try", "smollm2-135m"),
    ("tune", "smollm2-135m", "--random"),
    ("ab", "smollm2-135m", "--a", "threads=1", "--b", "threads=2"),
    ("bakeoff", "smollm2-135m", "--random"),
    ("up", "smollm2-135m"),
])
@pytest.mark.parametrize("timeout", ["0", "-5", "nan"])
def test_every_command_that_launches_takes_timeout_and_refuses_a_bad_one_before_any_work(argv, timeout, tmp_path):
    """A launch stopped at its wait says "Raise --timeout for slow loads": every command that launches takes
    --timeout (try, tune, ab and bakeoff did not: a 27B start on SGLang outlasted the 300 s wait three times, with
    no way to give it more), and a bad one is one sentence before anything is planned, written or started."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}
    folder = ("--folder", str(tmp_path / "files")) if argv[0] in ("try", "tune", "bakeoff") else ()
    proc = cli(*argv, *folder, "--timeout", timeout, env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--timeout must be a positive number of seconds, not {float(timeout)}." in proc.stderr, proc.stderr
    assert not (tmp_path / "files").exists() and "for this machine" not in proc.stderr     # nothing planned
    assert not list((tmp_path / "state").glob("**/*.json"))                                # nor started


def test_bench_takes_the_suites_shape_unless_told(managed_server):
    """Default: the quick suite (1 warm-up + 5 measured, 192 tokens); --max-tokens / --warmup / --runs
    override one value each; `bench long` is the 1000 / 800-token suite with 3 warm-ups. Tiny budgets
    here keep the real requests short; the stored conditions show what each command planned."""
    def planned(*argv):
        proc = cli("bench", *argv, "--json", timeout=600)
        out = json.loads(proc.stdout)
        assert_ok_or_invalid_on_the_machine_alone(proc, out)    # the shape is the subject (8-token runs: CI saw it)
        run = next(r for r in json.loads(cli("runs", "--json", check=True).stdout) if r["id"] == out["run_id"])
        bench = run["conditions"]["bench"]
        return bench["warmup"], bench["measured"], [w["max_tokens"] for w in bench["workloads"]], out

    warmup, measured, tokens, out = planned("--max-tokens", "8", "--runs", "3")
    assert (warmup, measured, tokens) == (1, 3, [8, 8])           # the quick suite's one warm-up
    for s in out["summary"]["workloads"].values():
        assert s["n"] == 3
        if s["n_usable"] >= 2:
            assert s["decode_tps"]["cv_pct"] is not None          # the spread is reported
    assert planned("long", "--max-tokens", "8", "--runs", "1")[:3] == (3, 1, [8, 8])   # long's 3 warm-ups
