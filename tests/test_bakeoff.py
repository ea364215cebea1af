"""`engineroom bakeoff` (issue 20): every engine here on one model through the same suites, one stored
comparison; `report --bakeoff ID` (markdown, JSON, one HTML file checked in a real headless Chromium);
resumed after a kill -9; `--compare` of two bakeoffs with the noise band."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from test_vllm import NO_PARSER, TOOL_CHECKS

from engineroom.engines import ikllamacpp as ik
from engineroom.errors import BadInput
from engineroom.flows.bakeoff import DEFAULT_SUITES, SUITES, check_suites
from engineroom.report.bakeoff import machine_line

from conftest import cli, console_command, run_cli

ARTIFACTS = Path(__file__).resolve().parent.parent / ".ci-work" / "artifacts"
SHORT = ("--suites", "verify-full,bench-quick,concurrency", "--short", "--ctx", "2048", "--busy-ok")



def test_suites_and_settings_are_refused_in_one_sentence_before_anything_runs():
    assert set(DEFAULT_SUITES) <= set(SUITES)
    with pytest.raises(BadInput, match="no bakeoff suite named warp"):
        check_suites(["verify-full", "warp"])
    assert check_suites(["depth", "depth", "stress"]) == ("depth", "stress")
    said = cli("bakeoff")
    assert said.returncode == 2 and "give MODEL for a new bakeoff, or --resume ID" in said.stderr, said.stderr
    said = cli("bakeoff", "--resume", "3", "--short")
    assert said.returncode == 2 and "give no other settings with it" in said.stderr, said.stderr
    said = cli("bakeoff", "smollm2-135m", "--engine-args", "-O0")
    assert said.returncode == 2 and "ENGINE=ARGS" in said.stderr, said.stderr
    said = cli("bakeoff", "smollm2-135m", "--engines", "llama.cpp,foo")      # not a cell "not installed"
    assert said.returncode == 2 and "no engine named 'foo'" in said.stderr, said.stderr
    said = cli("bakeoff", "smollm2-135m", "--engine-args", "vlm=-O0")
    assert said.returncode == 2 and "no engine named 'vlm'" in said.stderr, said.stderr
    said = cli("report")
    assert said.returncode == 2 and "give one of RUN, --bakeoff ID or --runs IDS" in said.stderr, said.stderr
    said = cli("report", "--runs", "a,b")
    assert said.returncode == 2 and "--runs takes run ids" in said.stderr, said.stderr


def _env(tmp: Path) -> dict[str, str]:
    """A store and a server state of the bakeoff's own: the session's managed server may be running."""
    return {"ENGINEROOM_STATE_DIR": str(tmp / "state"), "ENGINEROOM_DATA_DIR": str(tmp / "data")}


@pytest.fixture(scope="module")
def four_engines(llama_server_binary, ik_binary, smollm2, vllm_python, tmp_path_factory):
    """One real bakeoff of SmolLM2-135M over the four engines, short suites (the full verify suite at --fast):
    llama.cpp, vLLM (at -O0, as every vLLM test boot here) and ik_llama.cpp (its server on the wheel's kernels,
    `engines install ik_llama.cpp --prebuilt`) run; SGLang (no accelerator) gets a row that says why."""
    env = {**_env(tmp_path_factory.mktemp("bakeoff")), ik.ENV_BINARY: str(ik_binary.path)}
    t0 = time.monotonic()
    proc = cli("bakeoff", "smollm2-135m", "--engines", "llama.cpp,vllm,ik_llama.cpp,sglang", *SHORT,
               "--engine-args", "vllm=-O0", "--json", env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = json.loads(proc.stdout)
    page["_env"], page["_stderr"], page["_seconds"] = env, proc.stderr, time.monotonic() - t0
    return page


def test_a_real_bakeoff_compares_the_engines_that_run_and_says_why_the_others_do_not(four_engines):
    page = four_engines
    cells = {c["engine"]: c for c in page["cells"]}
    assert list(cells) == ["llama.cpp", "vllm", "ik_llama.cpp", "sglang"]        # grid order, one engine at a time
    for engine in ("llama.cpp", "vllm", "ik_llama.cpp"):
        c = cells[engine]
        assert c["status"] == "done", c
        assert set(c["runs"]) == {"verify-full", "bench-quick", "concurrency"}, c
        assert [s["stage"] for s in c["stages"]] == ["launch", "verify-full", "bench-quick", "concurrency", "down"]
        f = c["figures"]
        assert f["single_stream"]["mean"] > 0 and f["single_stream"]["run"] == c["runs"]["bench-quick"]
        assert f["aggregate"]["aggregate"] > 0 and f["aggregate"]["streams"] == c["pick"]["parallel"]
        assert f["memory"]["measured"] > 0 and f["memory"]["run"] == c["launch_run"]
        tools = f["features"]["tools"]
        assert tools["status"] in ("PASS", "FAIL") and tools["check"] == "tool_call_auto", tools
        assert f["features"]["reasoning"]["check"] == "reasoning_split" and f["api"]["of"] >= 10
        assert f["cold_start_s"] > 0
        assert "--host 127.0.0.1" in c["command"] or "127.0.0.1" in c["command"]
        assert c["pick"]["ctx"] == 2048
    # vLLM behind engineroom's tool template launches with its parser (the template's call format, from the
    # catalog), so requests with tools are served and verify's tool checks judge the calls that come back
    # (without the parser vLLM answers 400 and they SKIP: NO_PARSER); tool_choice required (the parallel
    # check) goes through vLLM's structured outputs
    argv = cells["vllm"]["argv"]
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in argv
    assert argv[argv.index("--chat-template") + 1].endswith("smollm2-tools.jinja")
    db = Path(page["_env"]["ENGINEROOM_DATA_DIR"]) / "results.sqlite"
    with sqlite3.connect(db) as con:
        checks = {json.loads(p)["name"]: json.loads(p) for (p,) in con.execute(
            "select payload from records where run_id = ? and kind = 'check'", (cells["vllm"]["runs"]["verify-full"],))}
    assert set(TOOL_CHECKS) <= set(checks), sorted(checks)
    assert not [n for n in checks if checks[n]["reason"].startswith(NO_PARSER)], checks
    assert "-O0" in cells["vllm"]["command"]                    # --engine-args reached vLLM's argv alone
    assert "-O0" not in cells["llama.cpp"]["command"]
    assert cells["llama.cpp"]["model_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert cells["ik_llama.cpp"]["model_file"] == cells["llama.cpp"]["model_file"]      # the same file
    assert cells["vllm"]["model_file"].startswith("SmolLM2-135M-Instruct.Q4_1")   # the same file, converted
    # the fork runs its own pick: its server, with its defaults spelt out where they differ from mainline's
    assert cells["ik_llama.cpp"]["argv"][0].endswith(f"/v{ik.SOURCE_VERSION}-prebuilt/build/bin/llama-server")
    assert cells["ik_llama.cpp"]["command"] != cells["llama.cpp"]["command"]
    sg = cells["sglang"]
    assert sg["status"] == "not run here" and "cannot serve on this machine" in sg["why"], sg
    uses = {r["use"]: r for r in page["choose"]}
    fastest = uses["one user, fastest replies"]
    assert fastest["pick"] in ("llama.cpp (balanced)", "vllm (balanced)", "ik_llama.cpp (balanced)")
    assert fastest["runner_up"] and fastest["runner_up"] != fastest["pick"]
    assert fastest["verdict"] in ("real difference", "within noise"), fastest
    md = page["markdown"]
    assert "| engine | priority | status |" in md and "## How to choose" in md and "## Not measured" in md
    assert "To run it: `engineroom bakeoff MODEL --engines sglang, on a machine with the GPU it names`" in md
    assert "(short sizes: a first look, not figures to publish)" in md
    for line in ("cell 1/4: llama.cpp / balanced", "llama.cpp: verify-full", "cell 2/4: vllm / balanced",
                 "cell 3/4: ik_llama.cpp / balanced"):
        assert line in page["_stderr"], page["_stderr"][-2000:]
    print(f"bakeoff of four engines took {page['_seconds']:.0f} s")


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_html_page_renders_its_matrix_and_every_plot_in_a_real_browser(four_engines, tmp_path):
    html = tmp_path / "bakeoff.html"
    proc = cli("report", "--bakeoff", str(four_engines["bakeoff"]), "--html", str(html), "--json",
               env=four_engines["_env"])
    assert proc.returncode == 0, proc.stderr
    text = html.read_text()
    assert not re.search(r"""(src|href)=["']https?:""", text)                   # nothing fetched at view time
    plots = re.findall(r'<div class="plot" id="plot-(\w+)">', text)
    assert {"throughput", "memory"} <= set(plots), plots
    # the same page of stored runs given by id: one cell per engine and model, the figures of the same runs
    llama = next(c for c in four_engines["cells"] if c["engine"] == "llama.cpp")
    ids = ",".join(str(i) for i in llama["runs"].values())
    by_ids = cli("report", "--runs", ids, "--json", env=four_engines["_env"])
    assert by_ids.returncode == 0, by_ids.stderr
    cells = json.loads(by_ids.stdout)["cells"]
    assert [(c["engine"], c["priority"]) for c in cells] == [("llama.cpp", "smollm2-135m")], cells
    assert cells[0]["figures"]["single_stream"] == llama["figures"]["single_stream"]
    assert cells[0]["figures"]["memory"]["measured"] == llama["figures"]["memory"]["measured"]
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium): the page's rendering was not checked")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "bakeoff.png"
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*base, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'data-plots-drawn="{len(plots)}"' in dom.stdout, re.findall(r"data-plots-drawn=\"\d+\"", dom.stdout)
    matrix = dom.stdout[dom.stdout.index('<table id="matrix"'):]
    matrix = matrix[:matrix.index("</table>")]
    for engine in ("llama.cpp", "vllm", "ik_llama.cpp", "sglang"):
        assert f">\n{engine}</td>" in matrix or f">{engine}</td>" in matrix, engine
    errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)]
    assert not errors, errors
    snap = subprocess.run([*base, f"--screenshot={shot}", "--window-size=1400,2400", html.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert snap.returncode == 0 and shot.stat().st_size > 10_000, snap.stderr[-2000:]


def _store_counts(db: Path, run_id: int | None, after: int) -> tuple[int | None, int, list[int]]:
    """The newest bakeoff after run ``after``: its id, its cells ended, its engines' pids."""
    with sqlite3.connect(db) as con:
        if run_id is None:
            row = con.execute("select id from runs where kind = 'bakeoff' and id > ? order by id desc limit 1",
                              (after,)).fetchone()
            if row is None:
                return None, 0, []
            run_id = row[0]
        cells = con.execute("select count(*) from records where run_id = ? and kind = 'bakeoff_cell'",
                            (run_id,)).fetchone()[0]
        pids = [json.loads(p)["pid"] for (p,) in con.execute(
            "select payload from records where run_id = ? and kind = 'bakeoff_server' order by seq", (run_id,))]
    return run_id, cells, pids


def _wait_for(proc: subprocess.Popen, db: Path, after: int, cells: int, servers: int,
              run_id: int | None = None) -> tuple[int, list[int]]:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        run_id, done, pids = _store_counts(db, run_id, after)
        if run_id is not None and done == cells and len(pids) == servers:
            return run_id, pids
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the bakeoff never reached {cells} cell(s) ended and {servers} engine(s) started")


def _suite_ended(proc: subprocess.Popen, db: Path, run_id: int, priority: str, suite: str) -> int:
    """Wait until the bakeoff's ``priority`` cell has finished ``suite``: the suite's stored run."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as con:
            for (payload,) in con.execute("select payload from records where run_id = ? and kind = 'bakeoff_suite'",
                                          (run_id,)):
                p = json.loads(payload)
                if (p["priority"], p["suite"]) == (priority, suite):
                    return int(p["run"])
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the {priority} cell never finished its {suite} suite")


def test_a_crash_is_its_cells_result_and_a_bakeoff_killed_outright_resumes_where_it_stopped(
        llama_server_binary, smollm2, four_engines, tmp_path):
    """Three llama.cpp cells. The second cell's engine is killed during its full verify suite: that cell ends
    failed, saying the engine exited, and the next cell runs. The bakeoff itself is killed (-9) in the third
    cell, after its verify suite ended: `--resume` keeps the two cells that ended, stops the engine the kill
    left running, launches the third again and runs only its bench suite, keeping the verify run it had.
    Then `report --compare` sets the resumed bakeoff beside the four engines' one."""
    # the four engines' store (their bakeoff is compared with this one below), a server state of its own
    env = {**four_engines["_env"], "ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    db = Path(env["ENGINEROOM_DATA_DIR"]) / "results.sqlite"
    after = four_engines["bakeoff"]
    proc = subprocess.Popen([*console_command(), "bakeoff", "smollm2-135m", "--engines", "llama.cpp",
                             "--priority", "balanced", "--priority", "leanest-vram", "--priority",
                             "concurrent-throughput", "--suites", "verify-full,bench-quick", "--short", "--ctx", "2048",
                             "--busy-ok", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})
    run_id, pids = _wait_for(proc, db, after, cells=1, servers=2)
    time.sleep(2.0)                                  # into the second cell's full verify suite
    os.kill(pids[1], signal.SIGKILL)
    run_id, pids = _wait_for(proc, db, after, cells=2, servers=3, run_id=run_id)
    verified = _suite_ended(proc, db, run_id, "concurrent-throughput", "verify-full")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    left_running = pids[2]
    assert psutil.pid_exists(left_running)       # kill -9 left the third cell's engine behind
    with sqlite3.connect(db) as con:
        before = [json.loads(p) for (p,) in con.execute(
            "select payload from records where run_id = ? and kind = 'bakeoff_cell' order by seq", (run_id,))]
    resumed = run_cli("bakeoff", "--resume", str(run_id), "--json", env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming bakeoff {run_id}: 2 cell(s) done are kept" in resumed.stderr
    assert f"stopping the llama.cpp server (pid {left_running})" in resumed.stderr
    assert not psutil.pid_exists(left_running) or psutil.Process(left_running).status() == psutil.STATUS_ZOMBIE
    page = json.loads(resumed.stdout)
    assert page["bakeoff"] == run_id and page["status"] == "OK"
    assert [(c["priority"], c["status"]) for c in page["cells"]] == [
        ("balanced", "done"), ("leanest-vram", "failed"), ("concurrent-throughput", "done")], page["cells"]
    crashed = page["cells"][1]
    assert crashed["why"].startswith("the engine exited during the verify-full suite"), crashed["why"]
    assert [c["runs"] for c in page["cells"][:2]] == [c["runs"] for c in before]    # the cells kept as measured
    third = page["cells"][2]
    assert third["runs"]["verify-full"] == verified and third["runs"]["bench-quick"] > verified, third["runs"]
    assert f"verify-full: kept from the interrupted launch (run {verified})" in resumed.stderr
    kept = "verify-full: measured by the launch an interruption stopped"
    assert any(n.startswith(kept) for n in third["pick"]["notes"]), third["pick"]["notes"]
    assert "| llama.cpp | leanest-vram | failed (below) |" in page["markdown"]
    # what changed between two bakeoffs: the one cell both ran to its end, each figure with its noise band
    diff = run_cli("report", "--bakeoff", str(run_id), "--compare", str(after), "--json", env=env)
    assert diff.returncode == 0, diff.stderr
    out = json.loads(diff.stdout)
    assert {r["cell"] for r in out["compared"]} == {"llama.cpp (balanced)"}, out["compared"]
    decode = next(r for r in out["compared"] if r["metric"].startswith("decode_tps"))
    assert decode["runs"] == [four_engines["cells"][0]["figures"]["single_stream"]["run"],
                              page["cells"][0]["figures"]["single_stream"]["run"]]
    assert decode["verdict"] in ("real difference", "within noise") and decode["band_pct"] > 0, decode
    assert "## What changed" in out["markdown"]


def test_an_engine_not_installed_gets_a_row_with_the_command_that_installs_it(smollm2, tmp_path, monkeypatch):
    """A data folder without the fork's build (and no $ENGINEROOM_IK_LLAMA_SERVER): its cell is not run, in one
    sentence, with the command that installs it; nothing is launched."""
    monkeypatch.delenv(ik.ENV_BINARY, raising=False)
    proc = cli("bakeoff", "smollm2-135m", "--engines", "ik_llama.cpp", "--suites", "bench-quick", "--short",
               "--busy-ok", "--json", env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = json.loads(proc.stdout)
    [cell] = page["cells"]
    assert (cell["status"], cell["why"], cell["fix"]) == (
        "not run here", "ik_llama.cpp is not installed here.", "engineroom engines install ik_llama.cpp"), cell
    assert "To run it: `engineroom engines install ik_llama.cpp`" in page["markdown"]
    assert "launch" not in [s["stage"] for s in cell.get("stages") or []]
    # `--resume ID --engines`: an engine added to the stored bakeoff, as it was asked; the cell not run here is
    # tried again (its reason may be gone) and the page holds each cell once, in the grid's order
    assert cli("bakeoff", "--resume", str(page["bakeoff"]), "--engines", "sglang", "--ctx", "1024",
               env=_env(tmp_path)).returncode == 2
    proc = cli("bakeoff", "--resume", str(page["bakeoff"]), "--engines", "sglang,ik_llama.cpp", "--json",
               env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resuming bakeoff {page['bakeoff']}: 0 cell(s) done are kept; engines added: sglang" in proc.stderr
    assert "cell 1/2: ik_llama.cpp / balanced" in proc.stderr, proc.stderr
    grown = json.loads(proc.stdout)
    assert [(c["engine"], c["status"]) for c in grown["cells"]] == [
        ("ik_llama.cpp", "not run here"), ("sglang", "not run here")], grown["cells"]
    assert len({c["machine_key"] for c in grown["cells"]}) == 1 and grown["markdown"].count("2 machines") == 0
    with sqlite3.connect(tmp_path / "data" / "results.sqlite") as con:
        (stored,) = con.execute("select conditions from runs where id = ?", (page["bakeoff"],)).fetchone()
    assert json.loads(stored)["engines"] == ["ik_llama.cpp", "sglang"]


def test_the_h200_bakeoff_resumed_on_another_lease_says_so_on_its_page(tmp_path):
    """The 27B bakeoff of benchmarks/h200_bakeoff.md as stored (llama.cpp's cell from one lease, ik_llama.cpp's
    added by `--resume 1 --engines ik_llama.cpp` on another): the page names both machines, says the two random
    files differ in bytes, sets both aggregates on the one basis both runs have (llama.cpp's run predates the
    every-stream-decoding window), and draws the fork's INVALID depth run dashed, saying so."""
    import gzip
    import tarfile

    from engineroom.report.bakeoff import bakeoff_page
    from engineroom.report.bakeoffhtml import plots
    from engineroom.store import Store

    raw = Path(__file__).resolve().parent.parent / "benchmarks/data/h200_visit/2026-12-05-ik/h200b_poll-1083.tgz"
    with tarfile.open(raw) as tar:
        packed = tar.extractfile("./store.sqlite.gz")
        assert packed is not None
        (tmp_path / "results.sqlite").write_bytes(gzip.decompress(packed.read()))
    with Store(tmp_path / "results.sqlite") as store:
        page = bakeoff_page(store, 1)
    assert [(c["engine"], c["status"]) for c in page["cells"]] == [("llama.cpp", "done"), ("ik_llama.cpp", "done")]
    assert [m["engines"] for m in page["machines"]] == [["llama.cpp"], ["ik_llama.cpp"]]
    assert machine_line(page).startswith("2 machines, the figures compare across them: ")
    assert page["files_note"] == ("Not one file: qwen3.6-27b-Q4_K_M-random.gguf was sha256 70ff7d403ab0 (llama.cpp), "
                                  "sha256 b7cdde2dd1db (ik_llama.cpp). The same name, not the same bytes: the "
                                  "figures compare different files.")
    aggregates = {c["engine"]: c["figures"]["aggregate"] for c in page["cells"]}
    assert {a["basis"] for a in aggregates.values()} == {"round wall time"}, aggregates
    assert round(aggregates["ik_llama.cpp"]["aggregate"], 1) == 30.7          # not its 79.7 while decoding
    [many] = [r for r in page["choose"] if r["use"] == "many users, most throughput"]
    assert many["metric"] == "aggregate decode tok/s (round wall time)" and many["runner_up"], many
    assert "ik_llama.cpp (balanced): INVALID (run 18)" in plots(page)["depth"]


def test_a_page_whose_cells_ran_on_two_machines_says_so_with_each_machines_engines():
    """A bakeoff resumed on another machine (even one of the same description): the machine line names each
    machine with its engines and says the figures compare across them."""
    h200 = {"cpu": "Xeon", "cpu_cores": 16, "ram_bytes": 126 * 2**30, "gpus": [{"name": "NVIDIA H200"}]}
    one = {"machine": h200, "machines": [{"host": h200, "engines": ["llama.cpp", "vllm"]}]}
    assert machine_line(one) == "Xeon, 16 cores, 126 GiB RAM, NVIDIA H200"
    two = {**one, "machines": [*one["machines"], {"host": h200, "engines": ["ik_llama.cpp"]}]}
    assert machine_line(two) == ("2 machines, the figures compare across them: Xeon, 16 cores, 126 GiB RAM, "
                                 "NVIDIA H200 (llama.cpp, vllm); Xeon, 16 cores, 126 GiB RAM, NVIDIA H200 "
                                 "(ik_llama.cpp)")


def test_a_random_weight_bakeoff_serves_one_file_and_says_what_random_weights_make_meaningless(
        llama_server_binary, smollm2, vllm_python, tmp_path):
    """`--random`: one random-weight GGUF of the model's exact shape, written once and deleted at the end, served
    by every engine that loads GGUF; vLLM's pick (16-bit safetensors) runs on weights vLLM makes itself from a file
    of the same shape and tokenizer (its dummy loading), said in its notes; the page marks the answer-quality cells
    n/a and keeps memory and speed."""
    files = tmp_path / "files"
    proc = cli("bakeoff", "smollm2-135m", "--engines", "llama.cpp,vllm", "--random", "--folder", str(files),
               "--suites", "verify-smoke,bench-quick", "--short", "--ctx", "1024", "--engine-args", "vllm=-O0",
               "--busy-ok", "--json", env=_env(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = json.loads(proc.stdout)
    llama, vllm = page["cells"]
    assert llama["status"] == "done" and llama["model_file"] == "smollm2-135m-Q4_1-random.gguf", llama
    assert any(n.startswith("random weights: smollm2-135m-Q4_1-random.gguf") for n in llama["pick"]["notes"])
    assert llama["figures"]["single_stream"]["mean"] > 0 and llama["figures"]["memory"]["measured"] > 0
    assert vllm["status"] == "done" and vllm["pick"]["quant"] == "bf16", vllm
    assert any("dummy loading" in n and "smollm2-135m-F16-random.gguf" in n for n in vllm["pick"]["notes"]), vllm
    assert "--load-format" in (vllm["command"] or "") and vllm["figures"]["single_stream"]["mean"] > 0, vllm
    assert page["random"] and "Random weights (`--random`)" in page["markdown"]
    row = next(line for line in page["markdown"].splitlines() if line.startswith("| llama.cpp |"))
    assert row.count("| n/a |") >= 1 and "smoke" not in row.split("|")[3], row
    assert "agents and tools" not in {r["use"] for r in page["choose"]}
    assert "write smollm2-135m-Q4_1-random.gguf" in proc.stderr
    assert not list(files.rglob("*.gguf"))                                   # deleted at the end
