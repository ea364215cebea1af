"""The run card (recomputed from stored records) and redaction."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engineroom.engines import llamacpp
from engineroom.records.encoding import encode_arrivals
from engineroom.report import redact, render_card
from engineroom.store import Store

HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def bench_rec(workload, index, decode, *, warmup=False, engine_pps=None, tokens=64, ttft=0.2):
    """A raw record whose client decode tok/s and inter-token rate both equal ``decode``: chunks
    every 1 / decode s from ``ttft``, the stream ending where tokens / (wall - TTFT) = decode;
    the engine's own timings (through llama.cpp's adapter) at ``engine_pps``."""
    times = [ttft + i / decode for i in range(tokens)]
    wall = ttft + tokens / decode
    raw = None if engine_pps is None else {"predicted_n": tokens, "predicted_ms": (tokens - 1) / engine_pps * 1000,
                                           "prompt_n": 40, "prompt_ms": 20.0, "cache_n": 0}
    engine = llamacpp.normalise_timings(raw) if raw else None
    return {
        "workload": workload, "index": index, "warmup": warmup,
        "sent": {"max_tokens": 64, "sampler": {"temperature": 0.6}, "body": {"ignore_eos": True}},
        "sent_unix": 0.0, "status": 200, "error": None,
        "end_us": round(wall * 1e6), "arrivals_us": encode_arrivals(0.0, times),
        "completion_tokens": tokens, "prompt_tokens": 40, "cached_prompt_tokens": None,
        "finish_reason": "length", "chunks": tokens + 2, "content_chars": 300, "reasoning_chars": 0,
        "engine": None if engine is None else engine.as_dict(), "engine_raw": raw, "record_version": 3,
    }


CONDITIONS = {
    "engine": "llama.cpp",
    "engine_version": "b4567",
    "model": "smollm2-135m",
    "model_path": "/home/alice/models/smol/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_size_bytes": 90_000_000,
    "model_sha256": "0123456789abcdef" * 4,
    "model_id": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "argv": ["/root/llama-bin/llama-server", "-m",
             "/home/alice/models/smol/SmolLM2-135M-Instruct.Q4_1.gguf", "--port", "18201",
             "--api-key", "s3cr3t-value", "--hf-token", HF_TOKEN],
    "host": {"os": "Linux 6.8.0", "arch": "x86_64", "cpu": "AMD EPYC 7B13",
             "cpu_cores": 2, "ram_bytes": 8 * 1024**3, "gpus": [], "hostname": "build-box-7"},
    "bench": {"warmup": 1, "measured": 3, "full_length": True, "full_length_body": {"ignore_eos": True},
              "full_length_reason": "llama-server accepts the ignore_eos sampling parameter",
              "sampler": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 1234}},
}


@pytest.fixture
def stored_run(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("demo", CONDITIONS, label="card test")
    checks = [
        {"name": "reachable", "status": "PASS", "reason": "GET /v1/models 200", "seconds": 0.012},
        {"name": "basic answer", "status": "PASS", "reason": "mentions Paris", "seconds": 0.8},
        {"name": "tool call", "status": "FAIL", "reason": "no tool_calls; <tool_call> inlined in content",
         "seconds": 1.5},
        {"name": "thinking split", "status": "SKIP", "reason": "server declares reasoning: false",
         "seconds": 0.0},
    ]
    for c in checks:
        store.add_record(run_id, "check", c)
    store.add_record(run_id, "bench_request", bench_rec("narrative", 0, 500.0, warmup=True))
    for i, d in enumerate((40.0, 42.0, 44.0)):
        store.add_record(run_id, "bench_request", bench_rec("narrative", i, d, engine_pps=d * 1.2))
    store.add_record(run_id, "bench_request", bench_rec("code", 0, 30.0, warmup=True))
    for i, d in enumerate((30.0, 30.0, 33.0)):
        store.add_record(run_id, "bench_request", bench_rec("code", i, d, engine_pps=d * 1.01))
    # a stale stored summary must not be what the card prints
    store.finish_run(run_id, "FAIL", {"workloads": {"narrative": {"decode_tps": {"mean": 9999}}}})
    return store.get_run(run_id), store.records(run_id)


def test_card_header(stored_run):
    card = render_card(*stored_run)
    assert card.startswith("# engineroom demo #1: FAIL")
    assert "card test" in card
    assert "llama.cpp b4567" in card
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (85.8 MiB, sha256 0123456789ab)" in card
    assert "llama-server -m" in card and "--port 18201" in card
    assert "Linux 6.8.0, x86_64, AMD EPYC 7B13 (2 cores), 8.0 GiB RAM, no GPU" in card
    assert "fingerprint " + stored_run[0]["fingerprint"][:12] in card


def test_card_verify_section(stored_run):
    card = render_card(*stored_run)
    assert "**verify 2/3** passed (1 failed, 1 skipped)" in card
    assert "| reachable | PASS | 0.01 | GET /v1/models 200 |" in card
    assert "| tool call | FAIL | 1.50 |" in card
    assert "| thinking split | SKIP | 0.00 | server declares reasoning: false |" in card


def test_card_bench_section_recomputed_from_records(stored_run):
    card = render_card(*stored_run)
    assert "9999" not in card                       # the stored summary is not trusted
    # narrative: 40, 42, 44 -> mean 42, sample std 2, CV 4.8%; warm-up (500) excluded
    row = next(line for line in card.splitlines() if line.startswith("| narrative |"))
    assert "| 3 / 3 |" in row
    assert "42.00 ± 2.00 (4.8%)" in row
    assert "40.00–44.00" in row
    assert "500" not in row
    code_row = next(line for line in card.splitlines() if line.startswith("| code |"))
    assert "31.00 ± 1.73 (5.6%)" in code_row
    # agreement: narrative engine +20% -> warning; code +1% -> fine
    assert re.search(r"⚠ narrative: WARNING: engine-reported decode 50\.40 tok/s differs from the "
                     r"client-measured inter-token rate 42\.00 tok/s by \+20\.0%", card)
    assert ("- code: client inter-token 31.00 tok/s vs engine 31.31 tok/s "
            "(median per-request +1.0%, within 5%; n=3).") in card
    assert card.count("differs from the client-measured") == 1   # not repeated in the notes
    # inter-token gaps pooled over 40, 42, 44 tok/s: 25.0, 23.8, 22.7 ms, 63 of each
    assert "| 23.8 / 25.0 |" in row
    assert ("- Full length: ignore_eos: on sent with every request, so each generates exactly max_tokens "
            "(llama-server accepts the ignore_eos sampling parameter).") in card
    assert "temperature 0.6, top_p 0.95, top_k 20, min_p 0.0, seed 1234" in card
    # the engine's timings 20% off the client's fail the quick suite's checklist too: INVALID, and why
    assert "Status: **INVALID** (a check of the integrity checklist failed" in card
    assert "- ⚠ FAIL client_vs_engine: beyond 5%: narrative +20.00%" in card


def test_card_provenance_line(stored_run):
    card = render_card(*stored_run)
    prov = next(line for line in card.splitlines() if line.startswith("_Provenance:"))
    assert "client clock" in prov and "usage.completion_tokens" in prov and "inter-token ms" in prov
    # where the engine figure comes from is the adapter's sentence, stored with each record
    assert f"as its adapter reads it ({llamacpp.normalise_timings({'predicted_n': 2}).source})" in prov
    assert "12 raw records" in prov                  # 4 checks + 8 bench requests


def test_card_redacts_everything_it_prints(stored_run):
    card = render_card(*stored_run)
    assert "/home/alice" not in card and "alice" not in card
    assert "/root" not in card
    assert "~/llama-bin/llama-server" in card
    assert "<model-dir>/SmolLM2-135M-Instruct.Q4_1.gguf" in card
    assert "s3cr3t-value" not in card and "--api-key *** --hf-token ***`" in card
    assert HF_TOKEN not in card
    assert "--hf-token ***" in card


def test_card_of_unfinished_run_without_records(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", {"engine": "vllm"})
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert "unfinished" in card
    assert "No checks or bench requests were recorded" in card
    assert "## Bench" not in card and "## Verify" not in card


def test_card_bench_only_with_na_decode_and_no_engine_timings(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("bench", {"bench": {"full_length": True, "full_length_body": {},
                                                 "full_length_reason": "server does not say"}})
    # 64 tokens at 3,000 tok/s after a 1 s TTFT: the decode window is 2% of the wall time
    store.add_record(run_id, "bench_request", bench_rec("code", 0, 3000.0, ttft=1.0))
    store.finish_run(run_id, "OK")
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert "## Verify" not in card
    row = next(line for line in card.splitlines() if line.startswith("| code |"))
    assert "| n/a | n/a |" in row                   # decode mean and min-max
    assert "| 0.3 / 0.3 |" in row                   # inter-token gaps of 1/3 ms are still there
    assert "- code: not cross-checked: the engine reported no decode timings." in card
    assert "Full length: off (server does not say)" in card
    assert "decode TPS n/a for 1 request(s)" in card


def test_card_reads_no_alias_keys(tmp_path):
    """Only the keys the writers write: an old alias is not guessed at."""
    store = Store(tmp_path / "r.sqlite")
    run_id = store.start_run("verify", {"host": {"cores": 8, "ram_gb": 64, "cpu": "X"}, "model_size": 10**9})
    store.add_record(run_id, "check", {"check": "reachable", "outcome": "pass", "seconds": 0.5})
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert "| Host | X |" in card and "8 cores" not in card and "64 GB" not in card
    assert "| ? | ? | 0.50 |" in card and "GiB" not in card


def _planned_bench_run(store, *, kind="bench"):
    """A run planned as 2 workloads x (3 warm-up + 5 measured), as bench_conditions writes it."""
    cond = {**CONDITIONS, "bench": {**CONDITIONS["bench"], "warmup": 3, "measured": 5,
                                    "workloads": [{"name": "narrative", "max_tokens": 64},
                                                  {"name": "code", "max_tokens": 64}]}}
    return store.start_run(kind, cond)


def test_card_of_interrupted_bench_says_what_ran(tmp_path):
    """Ctrl-C after narrative's 3 warm-ups and 3 of its 5 measured requests; code never ran."""
    store = Store(tmp_path / "r.sqlite")
    run_id = _planned_bench_run(store)
    for i in range(3):
        store.add_record(run_id, "bench_request", bench_rec("narrative", i, 500.0, warmup=True))
    for i, d in enumerate((40.0, 42.0, 44.0)):
        store.add_record(run_id, "bench_request", bench_rec("narrative", i, d))
    store.finish_run(run_id, "INTERRUPTED")
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert card.startswith(f"# engineroom bench #{run_id}: INTERRUPTED")
    assert "Status: **OK**" not in card
    assert ("Status: **INTERRUPTED**: 6 of 16 planned requests ran (narrative 3 warm-up + 3 measured, "
            "code did not run); the figures below cover only those (those requests: OK).") in card
    row = next(line for line in card.splitlines() if line.startswith("| narrative |"))
    assert "| 3 / 3 of 5 planned |" in row and "42.00 ± 2.00 (4.8%)" in row
    assert "| code | not run | n/a | n/a | n/a | n/a | n/a | n/a | 64 |" in card
    assert "- 3 warm-up + 5 measured requests per workload;" not in card   # the plan is not what ran
    assert ("Planned 3 warm-up + 5 measured requests per workload; ran narrative 3 warm-up + 3 measured, "
            "code did not run.") in card


def test_card_of_complete_bench_keeps_the_plain_wording(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = _planned_bench_run(store)
    for name in ("narrative", "code"):
        for i in range(3):
            store.add_record(run_id, "bench_request", bench_rec(name, i, 500.0, warmup=True))
        for i in range(5):
            store.add_record(run_id, "bench_request", bench_rec(name, i, 40.0 + i))
    store.finish_run(run_id, "OK")
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert "Status: **OK**\n" in card and "planned" not in card and "not run" not in card
    assert "3 warm-up + 5 measured requests per workload; warm-ups are stored" in card


def test_card_of_killed_bench_says_process_gone(tmp_path):
    """A run whose owner is gone (pid reused by this process, another start time) and never finished."""
    import sqlite3

    store = Store(tmp_path / "r.sqlite")
    run_id = _planned_bench_run(store)
    store.add_record(run_id, "bench_request", bench_rec("narrative", 0, 500.0, warmup=True))
    con = sqlite3.connect(tmp_path / "r.sqlite")
    con.execute("UPDATE runs SET owner_started = owner_started - 3600")
    con.commit()
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert card.startswith(f"# engineroom bench #{run_id}: INTERRUPTED (process gone)")
    assert "Status: **INTERRUPTED (process gone)**: 1 of 16 planned requests ran" in card
    assert "narrative 1 warm-up + 0 measured, code did not run" in card


def test_card_of_demo_interrupted_before_its_bench(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    run_id = _planned_bench_run(store, kind="demo")
    store.add_record(run_id, "check", {"name": "reachable", "status": "PASS", "seconds": 0.01})
    store.finish_run(run_id, "INTERRUPTED")
    card = render_card(store.get_run(run_id), store.records(run_id))
    assert "## Bench\n\nNot run: the run ended (INTERRUPTED) before any bench request finished." in card


# -- redact -------------------------------------------------------------------------


def test_redact_home_paths():
    text = "model at /home/alice/models/x.gguf, bin /root/llama/llama-server, mac /Users/bob/m"
    out = redact(text, hostname="", username="", home="/nonexistent-home")
    assert out == "model at ~/models/x.gguf, bin ~/llama/llama-server, mac ~/m"
    assert redact("cd /root", hostname="", username="", home="/x") == "cd ~"
    assert redact("/rootfs/a", hostname="", username="", home="/x") == "/rootfs/a"
    # a folder named home inside a path is no home directory (the H200 bakeoff's page printed the engine as
    # /work/main/.ci-work/h200~/engines/..., its ENGINEROOM_HOME being .ci-work/h200/home)
    inner = "/work/x/.ci-work/h200/home/data/engines/llama-server and /srv/Users/bob/m"
    assert redact(inner, hostname="", username="", home="/x") == inner
    assert redact(r"C:\Users\carol\models", hostname="", username="", home="/x") == r"~\models"


def test_redact_this_machines_home_host_and_user():
    out = redact("/srv/users/dave/x on gpu-node-3.lab.example (gpu-node-3) by dave; llama-server ok",
                 hostname="gpu-node-3.lab.example", username="dave", home="/srv/users/dave")
    assert out == "~/x on <host> (<host>) by <user>; llama-server ok"


def test_redact_defaults_to_this_machines_names(monkeypatch):
    """Without arguments, redact() uses the machine's own hostname, user name and home."""
    import engineroom.redaction as redact_module

    monkeypatch.setattr(redact_module.socket, "gethostname", lambda: "build-box-7.corp")
    monkeypatch.setattr(redact_module.getpass, "getuser", lambda: "erin")
    monkeypatch.setenv("HOME", "/srv/erin-home")
    out = redact("erin@build-box-7:/srv/erin-home/models on build-box-7.corp")
    assert out == "<user>@<host>:~/models on <host>"


def test_redact_tokens_and_keys():
    text = (
        f"token {HF_TOKEN} and HF_TOKEN={HF_TOKEN}\n"
        "llama-server --api-key abc123 --api-key=def456\n"
        '["--api-key", "ghi789"]\n'
        "Authorization: Bearer xyz-secret\n"
        '{"Authorization": "Bearer jkl-secret"}\n'
        "OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx\n"
        "max_tokens=64 MAX_TOKENS=64 hf_short"
    )
    out = redact(text, hostname="", username="", home="/x")
    for secret in (HF_TOKEN, "abc123", "def456", "ghi789", "xyz-secret", "jkl-secret",
                   "sk-abcdefghijklmnopqrstuvwx"):
        assert secret not in out
    assert "token hf_***" in out
    assert "--api-key *** --api-key=***" in out
    assert "Authorization: Bearer ***" in out
    assert "max_tokens=64 MAX_TOKENS=64 hf_short" in out     # not secrets: left alone


def test_redact_named_paths_and_literal_secrets():
    out = redact("/data/models/a.gguf /data/models-old/b pw=hunter22",
                 paths={"/data/models": "<model-dir>"}, secrets=["hunter22"],
                 hostname="", username="", home="/x")
    assert out == "<model-dir>/a.gguf /data/models-old/b pw=***"


def test_report_command_prints_the_card_unwrapped(tmp_path):
    """`engineroom report N > card.md` is the card byte for byte: Rich must not wrap its
    long table rows at the 80 columns it assumes for a pipe."""
    from conftest import cli

    store = Store(tmp_path / "results.sqlite")           # where the CLI looks with this data dir
    run_id = store.start_run("bench", CONDITIONS, label="pipe test")
    for i, d in enumerate((40.0, 42.0, 44.0)):
        store.add_record(run_id, "bench_request", bench_rec("narrative", i, d, engine_pps=d))
    store.finish_run(run_id, "OK")
    card = render_card(store.get_run(run_id), store.records(run_id))
    store.close()
    assert max(len(line) for line in card.splitlines()) > 80          # there is something to wrap
    proc = cli("report", str(run_id), env={"ENGINEROOM_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == card + ("" if card.endswith("\n") else "\n")


def test_a_bakeoffs_aggregate_is_the_decode_while_every_stream_decodes(tmp_path, monkeypatch):
    """The H200 bakeoff of 2026-12-05 (its store, committed): the 27B's balanced pick has one slot, and the page
    gave it "33.9 @ 1" (a round's tokens over its wall, the 256-token prompt's prefill included) beside its
    single-stream 78.1. The aggregate is now the suite's own figure, the rate while every stream decodes."""
    import gzip
    import tarfile

    from engineroom.bench.suites.summary import round_figures
    from engineroom.report.bakeoff import bakeoff_page, page_markdown
    from engineroom.store import Store

    packed = Path(__file__).resolve().parent.parent / "benchmarks/data/h200_visit/2026-12-05/h200_bakeoff-qwen36.tgz"
    with tarfile.open(packed) as tar:
        member = tar.extractfile("./store.sqlite.gz")
        assert member is not None
        data = gzip.decompress(member.read())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "results.sqlite").write_bytes(data)
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    with Store() as store:
        page = bakeoff_page(store, 1)
        recs = [r["payload"] for r in store.records(6, "bench_request") if not r["payload"].get("warmup")]
    cell = page["cells"][0]
    point, single = cell["figures"]["concurrency"][0], cell["figures"]["single_stream"]["mean"]
    # that run was stored before a round of one stream had the figure: the page says what it shows instead
    assert point["streams"] == 1 and point["basis"] == "round wall time" and point["aggregate"] < 0.5 * single
    assert "aggregate decode tok/s @ N" in page_markdown(page) and "33.9 @ 1 (round wall time)" in page_markdown(page)
    # the same rounds summarised now: one stream's round has its decode while it decodes, near its single stream's
    rounds = round_figures(recs)
    assert len(rounds) == 2 and all(r["all_decoding_tps"] for r in rounds), rounds
    rates = [r["all_decoding_tps"] for r in rounds]
    assert all(abs(rate / single - 1) < 0.05 for rate in rates), (rates, single)
