"""The results store: round trips, interruption safety, fingerprints, bad input."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from engineroom.errors import BadInput
from engineroom.store import SCHEMA_VERSION, Store, fingerprint


@pytest.fixture
def db(tmp_path):
    return tmp_path / "results.sqlite"


def test_round_trip(db):
    store = Store(db)
    conditions = {"engine": "llama.cpp", "model_path": "/m/x.gguf", "bench": {"warmup": 1}}
    run_id = store.start_run("bench", conditions, label="first")
    assert store.add_record(run_id, "bench_request", {"workload": "code", "decode_tps": 12.5}) == 1
    assert store.add_record(run_id, "check", {"name": "reachable", "status": "PASS"}) == 2
    store.finish_run(run_id, "OK", {"status": "OK"})

    run = store.get_run(run_id)
    assert run["kind"] == "bench"
    assert run["status"] == "OK"
    assert run["label"] == "first"
    assert run["conditions"] == conditions
    assert run["summary"] == {"status": "OK"}
    assert run["finished"] is not None and run["created"] <= run["finished"]
    assert run["fingerprint"] == fingerprint(conditions)

    all_records = store.records(run_id)
    assert [r["seq"] for r in all_records] == [1, 2]
    assert all_records[0]["payload"] == {"workload": "code", "decode_tps": 12.5}
    checks = store.records(run_id, kind="check")
    assert len(checks) == 1 and checks[0]["payload"]["name"] == "reachable"
    assert store.runs()[0]["id"] == run_id
    store.close()


def test_runs_newest_first_and_limit(db):
    store = Store(db)
    ids = [store.start_run("verify", {"i": i}) for i in range(5)]
    listed = store.runs(limit=3)
    assert [r["id"] for r in listed] == ids[::-1][:3]
    assert all(r["status"] == "running" for r in listed)
    store.start_run("bench", {})
    assert [r["kind"] for r in store.runs(kind="bench")] == ["bench"]


def test_dataclass_payload_is_stored_as_dict(db):
    @dataclass
    class Outcome:
        workload: str
        tps: float | None

    store = Store(db)
    run_id = store.start_run("bench", {})
    store.add_record(run_id, "bench_request", Outcome("narrative", None))
    assert store.records(run_id)[0]["payload"] == {"workload": "narrative", "tps": None}


def test_records_survive_an_interrupted_run(db):
    """Records are committed one by one: a process that dies before finish_run keeps them."""
    script = textwrap.dedent(
        f"""
        import os
        from engineroom.store import Store
        s = Store({str(db)!r})
        run = s.start_run("bench", {{"engine": "x"}})
        for i in range(3):
            s.add_record(run, "bench_request", {{"index": i}})
        os._exit(9)   # no finish_run, no close, no cleanup: like a kill -9
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr

    reopened = Store(db)
    [run] = reopened.runs()
    # its owner is gone: shown (and written back) as interrupted, never as still running
    assert (run["status"], run["end_reason"]) == ("INTERRUPTED", "process gone")
    assert run["finished"] is None                      # when it died is not known
    assert [r["payload"]["index"] for r in reopened.records(run["id"])] == [0, 1, 2]
    raw = sqlite3.connect(db).execute("SELECT status, end_reason FROM runs").fetchone()
    assert raw == ("INTERRUPTED", "process gone")
    # the interrupted run can still be closed later
    reopened.finish_run(run["id"], "INTERRUPTED")
    assert reopened.get_run(run["id"])["status"] == "INTERRUPTED"


def test_a_run_of_a_live_process_stays_running(db):
    """This process owns the run and is alive: running, whoever reads it."""
    import os

    store = Store(db)
    run_id = store.start_run("bench", {})
    for reader in (store, Store(db)):
        run = reader.get_run(run_id)
        assert (run["status"], run["end_reason"], run["owner_pid"]) == ("running", None, os.getpid())


def test_a_reused_pid_is_not_mistaken_for_the_owner(db):
    """The run's pid is alive (it is this process) but started at another time: the owner is gone."""
    store = Store(db)
    run_id = store.start_run("bench", {})
    store.add_record(run_id, "bench_request", {"index": 0})
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET owner_started = owner_started - 3600 WHERE id = ?", (run_id,))
    con.commit()
    run = Store(db).get_run(run_id)
    assert (run["status"], run["end_reason"]) == ("INTERRUPTED", "process gone")
    assert len(store.records(run_id)) == 1


def test_a_run_from_another_host_is_left_alone(db):
    """Its owner cannot be checked from here: it keeps its status."""
    store = Store(db)
    run_id = store.start_run("bench", {})
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET owner_host = 'some-other-box', owner_pid = 999999999 WHERE id = ?", (run_id,))
    con.commit()
    assert Store(db).get_run(run_id)["status"] == "running"


def test_a_finished_run_is_never_rewritten(db):
    store = Store(db)
    run_id = store.start_run("bench", {})
    store.finish_run(run_id, "OK", {"status": "OK"})
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET owner_pid = 999999999 WHERE id = ?", (run_id,))   # owner long gone
    con.commit()
    run = Store(db).get_run(run_id)
    assert (run["status"], run["end_reason"]) == ("OK", None)


# Schema 2 as engineroom created it (migrations 0 -> 1 -> 2), written out here so the test does not
# depend on the code it checks.
SCHEMA_2 = [
    "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, created TEXT NOT NULL, "
    "finished TEXT, status TEXT NOT NULL DEFAULT 'running', label TEXT NOT NULL DEFAULT '', "
    "conditions TEXT NOT NULL DEFAULT '{}', fingerprint TEXT NOT NULL, summary TEXT, owner_pid INTEGER, "
    "owner_started REAL, owner_host TEXT, end_reason TEXT)",
    "CREATE INDEX runs_fingerprint ON runs (fingerprint)",
    "CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL REFERENCES runs (id) "
    "ON DELETE CASCADE, seq INTEGER NOT NULL, kind TEXT NOT NULL, created TEXT NOT NULL, payload TEXT NOT NULL, "
    "UNIQUE (run_id, seq))",
    "CREATE INDEX records_run_kind ON records (run_id, kind)",
]

# A bench run as the schema-2 runner stored it (field for field), against llama-server.
V2_CONDITIONS = {
    "engine": "llama.cpp", "engine_version": "b11434", "model_id": "smollm2-135m", "url": "http://127.0.0.1:8080",
    "bench": {"workloads": [{"name": "narrative", "max_tokens": 64, "prompt_sha256": "0123456789abcdef"}],
              "warmup": 0, "measured": 2, "full_length": True, "ignore_eos": True,
              "ignore_eos_reason": "full length requested; server supports ignore_eos "
                                   "(llama-server accepts the ignore_eos sampling parameter)",
              "sampler": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": None},
              "extra_body": {}, "timeout_s": 600.0, "min_decode_window_fraction": 0.05},
}


def v2_record(index, ttft, wall, last, predicted_ms):
    tokens = 64
    return {
        "workload": "narrative", "index": index, "warmup": False, "max_tokens": 64, "ignore_eos": True,
        "status": 200, "error": None, "ttft_s": ttft, "wall_s": wall, "last_token_s": last,
        "completion_tokens": tokens, "prompt_tokens": 40, "wall_tps": tokens / wall,
        "decode_tps": tokens / (wall - ttft), "decode_window_s": wall - ttft, "decode_na_reason": None,
        "finish_reason": "length", "chunks": 66, "content_chars": 301, "reasoning_chars": 0,
        "engine_timings": {"cache_n": 0, "prompt_n": 40, "prompt_ms": 16.0, "prompt_per_token_ms": 0.4,
                           "prompt_per_second": 2500.0, "predicted_n": tokens, "predicted_ms": predicted_ms,
                           "predicted_per_token_ms": predicted_ms / 63,
                           "predicted_per_second": 63 / (predicted_ms / 1000)},
        "started_unix": 1767225600.0 + index,
    }


def make_schema_2_db(path):
    con = sqlite3.connect(path)
    for statement in SCHEMA_2:
        con.execute(statement)
    con.execute("INSERT INTO runs (kind, created, finished, status, conditions, fingerprint) "
                "VALUES ('bench', 't0', 't1', 'OK', ?, 'old')", (json.dumps(V2_CONDITIONS),))
    old = [v2_record(0, 0.020, 0.620, 0.6195, 599.0), v2_record(1, 0.030, 0.640, 0.6390, 609.5)]
    for seq, payload in enumerate(old, start=1):
        con.execute("INSERT INTO records (run_id, seq, kind, created, payload) VALUES (1, ?, 'bench_request', 't', ?)",
                    (seq, json.dumps(payload)))
    con.execute("INSERT INTO records (run_id, seq, kind, created, payload) VALUES (1, 3, 'check', 't', ?)",
                (json.dumps({"name": "reachable", "status": "PASS", "reason": "ok", "seconds": 0.01}),))
    # a run against a server no adapter knows: its timings (none here) stay as they were
    con.execute("INSERT INTO runs (kind, created, conditions, fingerprint) VALUES ('bench', 't', ?, 'f')",
                (json.dumps({"engine": "unknown", "bench": {"ignore_eos": False, "ignore_eos_reason": "not asked"}}),))
    con.execute("INSERT INTO records (run_id, seq, kind, created, payload) VALUES (2, 1, 'bench_request', 't', ?)",
                (json.dumps({**v2_record(0, 0.02, 0.62, 0.6195, 599.0), "engine_timings": None, "ignore_eos": False}),))
    con.execute("PRAGMA user_version = 2")
    con.commit()
    con.close()
    return old


def test_version_1_database_is_migrated_and_keeps_its_runs(db):
    """A database written before owners were recorded: its runs stay as they were (no owner to check)."""
    con = sqlite3.connect(db)
    for statement in SCHEMA_2[:4]:
        con.execute(statement.replace(", owner_pid INTEGER, owner_started REAL, owner_host TEXT, end_reason TEXT", ""))
    con.execute("INSERT INTO runs (kind, created, conditions, fingerprint) VALUES ('bench', 't', '{}', 'f')")
    con.execute("INSERT INTO records (run_id, seq, kind, created, payload) VALUES (1, 1, 'bench_request', 't', '{}')")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    store = Store(db)
    assert store.schema_version == SCHEMA_VERSION == 3
    run = store.get_run(1)
    assert (run["status"], run["end_reason"], run["owner_pid"]) == ("running", None, None)
    assert [r["payload"] for r in store.records(1)] == [{}]       # not a bench record of any shape: left alone


def test_schema_2_bench_run_is_rewritten_raw_and_its_card_still_reads(db):
    """Old runs keep working: figures recomputed from the rewritten records equal the ones stored then,
    the engine's timings are read through llama.cpp's adapter, and inter-token latency says n/a."""
    from engineroom.records import statistics as st
    from engineroom.report import render_card

    old = make_schema_2_db(db)
    store = Store(db)
    assert store.schema_version == 3
    bench = store.records(1, kind="bench_request")
    for rec, before in zip(bench, old, strict=True):
        p = rec["payload"]
        for gone in ("ttft_s", "wall_s", "last_token_s", "decode_tps", "wall_tps", "decode_window_s",
                     "engine_timings", "ignore_eos", "max_tokens", "started_unix"):
            assert gone not in p
        assert p["arrivals_us"] is None and p["migrated_from"] == 2
        assert p["first_last_us"] == [round(before["ttft_s"] * 1e6), round(before["last_token_s"] * 1e6)]
        assert p["end_us"] == round(before["wall_s"] * 1e6)
        assert p["sent"] == {"max_tokens": 64, "body": {"ignore_eos": True},
                             "sampler": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}}
        assert p["engine_raw"] == before["engine_timings"]
        assert (p["engine"]["decode_tokens"], p["engine"]["decode_ms"], p["engine"]["decode_window"]) == \
            (64, before["engine_timings"]["predicted_ms"], "first_token_free")
        # the same rules give the same figures the old record stored
        assert st.decode_tps(p) == pytest.approx(before["decode_tps"])
        assert st.wall_tps(p) == pytest.approx(before["wall_tps"])
        assert st.engine_decode_tps(p) == pytest.approx(before["engine_timings"]["predicted_per_second"])
        assert st.engine_prompt_tps(p) == pytest.approx(before["engine_timings"]["prompt_per_second"])
    assert store.records(1, kind="check")[0]["payload"]["name"] == "reachable"      # other kinds untouched

    run = store.get_run(1)
    assert "ignore_eos" not in run["conditions"]["bench"]
    assert run["conditions"]["bench"]["full_length_body"] == {"ignore_eos": True}
    assert run["fingerprint"] == fingerprint(run["conditions"])
    other = store.records(2)[0]["payload"]
    assert other["engine"] is None and other["engine_raw"] is None and other["sent"]["body"] == {}
    assert store.get_run(2)["conditions"]["bench"] == {"full_length_body": {}, "full_length_reason": "not asked"}

    summary = st.summarize(bench)["workloads"]["narrative"]
    assert summary["inter_token_ms"]["p50"] is None
    assert summary["inter_token_ms"]["not_available"] == "recorded before arrival times were kept"
    assert summary["agreement"]["n"] == 2 and summary["agreement"]["warning"] is None
    card = render_card(run, store.records(1))
    row = next(line for line in card.splitlines() if line.startswith("| narrative |"))
    assert "| 2 / 2 |" in row and f"{st.describe(r['decode_tps'] for r in old)['mean']:.2f} ±" in row
    assert "| n/a |" in row
    assert "- Inter-token ms n/a: recorded before arrival times were kept." in card
    assert "- narrative: client inter-token" in card and "ignore_eos: on" in card
    store.close()
    assert Store(db).records(1, kind="bench_request") == bench        # migrated once, read the same after


def test_a_failed_migration_leaves_the_database_at_its_old_version(db, monkeypatch):
    """Each step is one transaction with the version bump inside it: a failure changes nothing."""
    import engineroom.store as store_module

    make_schema_2_db(db)
    before = sqlite3.connect(db).execute("SELECT payload FROM records ORDER BY id").fetchall()

    real = store_module._MIGRATIONS

    def half_done(con):
        real[2](con)                                    # every record rewritten ...
        con.execute("ALTER TABLE runs ADD COLUMN half INTEGER")
        raise RuntimeError("disk on fire")              # ... and then the step fails

    def third_step(step):
        monkeypatch.setattr(store_module, "_MIGRATIONS", [*real[:2], step])

    third_step(half_done)
    with pytest.raises(BadInput) as info:
        Store(db)
    assert str(info.value).endswith("from schema version 2 to 3 (RuntimeError: disk on fire); it is left at version 2.")
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    assert con.execute("SELECT payload FROM records ORDER BY id").fetchall() == before
    assert "half" not in [row[1] for row in con.execute("PRAGMA table_info(runs)")]
    con.close()
    # a list of statements: the same, and no statement is split at a ';' inside it
    third_step(["UPDATE runs SET label = 'a;b'", "NOT SQL AT ALL"])
    with pytest.raises(BadInput, match="left at version 2"):
        Store(db)
    assert sqlite3.connect(db).execute("SELECT DISTINCT label FROM runs").fetchall() == [("",)]
    third_step(["UPDATE runs SET label = 'a;b'"])
    assert Store(db).schema_version == 3
    assert sqlite3.connect(db).execute("SELECT DISTINCT label FROM runs").fetchall() == [("a;b",)]


def test_a_disk_that_fills_during_a_migration_says_disk_full(db, monkeypatch):
    """A migration step that runs out of space (SQLite's own SQLITE_FULL, from a page limit set on
    the connection) says "disk full" and leaves the database at its old version, unchanged."""
    import engineroom.store as store_module

    make_schema_2_db(db)
    before = sqlite3.connect(db).execute("SELECT payload FROM records ORDER BY id").fetchall()
    real = store_module._MIGRATIONS

    def no_room(con):
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        con.execute(f"PRAGMA max_page_count = {pages}")          # no page left to grow into
        con.execute("CREATE TABLE filler (x BLOB)")
        con.execute("INSERT INTO filler VALUES (zeroblob(1 << 20))")
        real[2](con)

    monkeypatch.setattr(store_module, "_MIGRATIONS", [*real[:2], no_room])
    with pytest.raises(BadInput, match="^disk full: the results database") as info:
        Store(db)
    assert "every record stored before this one is kept" in str(info.value)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    assert con.execute("SELECT payload FROM records ORDER BY id").fetchall() == before
    con.close()


def test_two_stores_on_one_file_see_each_other(db):
    writer, reader = Store(db), Store(db)
    run_id = writer.start_run("demo", {})
    writer.add_record(run_id, "check", {"name": "a"})
    assert len(reader.records(run_id)) == 1


@pytest.mark.parametrize("bad", [999, 0, -1, "abc", None])
def test_bad_run_id_is_one_sentence(db, bad):
    store = Store(db)
    store.start_run("verify", {})
    for call in (
        lambda: store.get_run(bad),
        lambda: store.records(bad),
        lambda: store.add_record(bad, "check", {}),
        lambda: store.finish_run(bad, "OK"),
    ):
        with pytest.raises(BadInput) as info:
            call()
        message = str(info.value)
        assert message.endswith(".") and "\n" not in message
        assert str(bad) in message


def test_string_run_id_is_accepted(db):
    store = Store(db)
    run_id = store.start_run("verify", {})
    store.add_record(str(run_id), "check", {"name": "a"})
    assert store.get_run(str(run_id))["id"] == run_id


def test_fingerprint_ignores_volatile_fields_only():
    base = {"engine": "vllm", "argv": ["a", "b"], "bench": {"warmup": 3, "started": "t1"}, "port": 8000}
    same = {"port": 9000, "bench": {"started": "t2", "warmup": 3}, "argv": ["a", "b"], "engine": "vllm"}
    different = {**base, "bench": {"warmup": 4, "started": "t1"}}
    assert fingerprint(base) == fingerprint(same)
    assert fingerprint(base) != fingerprint(different)
    assert len(fingerprint(base)) == 64


def test_schema_version_is_set_and_newer_db_refused(db):
    store = Store(db)
    assert store.schema_version == SCHEMA_VERSION
    store.close()
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    with pytest.raises(BadInput, match="newer"):
        Store(db)


def test_wal_mode_and_every_commit_synced(db):
    store = Store(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # synchronous is per connection: the store's own must be FULL (2), so a power cut keeps each record
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_default_path_follows_engineroom_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_HOME", str(tmp_path / "home"))
    for var in ("ENGINEROOM_DATA_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    store = Store()
    assert store.path == tmp_path / "home" / "data" / "results.sqlite"
    assert store.path.exists()


def test_unopenable_path_is_bad_input(tmp_path):
    not_a_db = tmp_path / "garbage.sqlite"
    not_a_db.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(BadInput, match=r"is damaged \(file is not a database\); nothing was written to it"):
        Store(not_a_db)
