"""The results store: round trips, interruption safety, fingerprints, bad input."""

from __future__ import annotations

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


def test_version_1_database_is_migrated_and_keeps_its_runs(db):
    """A database written before owners were recorded: its runs stay as they were (no owner to check)."""
    from engineroom.store import _MIGRATIONS

    con = sqlite3.connect(db)
    con.executescript(_MIGRATIONS[0])
    con.execute("INSERT INTO runs (kind, created, conditions, fingerprint) VALUES ('bench', 't', '{}', 'f')")
    con.execute("INSERT INTO records (run_id, seq, kind, created, payload) VALUES (1, 1, 'bench_request', 't', '{}')")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    store = Store(db)
    assert store.schema_version == SCHEMA_VERSION == 2
    run = store.get_run(1)
    assert (run["status"], run["end_reason"], run["owner_pid"]) == ("running", None, None)
    assert len(store.records(1)) == 1


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


def test_wal_mode(db):
    Store(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


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
    with pytest.raises(BadInput, match="Cannot open"):
        Store(not_a_db)
