"""The results database survives damage (issue 17): a 0-byte or page-corrupted file is refused
with one sentence and recovered with `engineroom runs --recover` (the damaged file kept aside, its
readable runs and the newest backup's in a new one); backups before migrations and daily; a full
disk says "disk full" and keeps every record committed before it. No engine needed."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engineroom import storecare
from engineroom.cli import app
from engineroom.errors import BadInput, EngineroomError
from engineroom.store import SCHEMA_VERSION, Store


def _cli(*args: str) -> tuple[int, str]:
    """The command in-process; a user error's exit code and sentence as `engineroom` prints them."""
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, EngineroomError):
        return result.exception.exit_code, str(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def _filled(path: Path, runs: int = 6, records: int = 100) -> None:
    with Store(path) as store:
        for r in range(runs):
            run_id = store.start_run("bench", {"engine": "llama.cpp", "n": r}, label=f"run {r}")
            for i in range(records):
                store.add_record(run_id, "bench_request", {"i": i, "text": "x" * 200})
            store.finish_run(run_id, "OK")


@pytest.fixture()
def db(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    from engineroom.paths import db_path

    return db_path()


def test_a_store_with_runs_is_backed_up_once_a_day(db):
    _filled(db, runs=1, records=3)
    assert storecare.backups(db) == []            # the run arrived after this store was opened
    with Store(db):
        pass
    first = storecare.backups(db)
    assert len(first) == 1 and first[0].name.endswith("-daily.sqlite")
    with Store(db):                               # the same day: no second copy
        pass
    assert storecare.backups(db) == first
    copy = sqlite3.connect(first[0])
    assert copy.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 3
    assert copy.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    copy.close()


def test_backups_keep_the_newest_few(db):
    _filled(db, runs=1, records=1)
    with Store(db) as store:
        for i in range(storecare.KEEP_BACKUPS + 3):
            path = storecare.backup(store._db, db, f"test{i}")
            os.utime(path, (time.time() + i, time.time() + i))   # distinct times, newest last
    kept = storecare.backups(db)
    assert len(kept) == storecare.KEEP_BACKUPS
    assert kept[0].name.endswith(f"test{storecare.KEEP_BACKUPS + 2}.sqlite")


def test_a_migration_is_preceded_by_a_backup(db):
    _filled(db, runs=1, records=2)
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version = 2")      # as if written by the previous schema
    raw.close()
    with Store(db) as store:
        assert store.schema_version == SCHEMA_VERSION
    names = [p.name for p in storecare.backups(db)]
    assert any(n.endswith(f"before-v{SCHEMA_VERSION}.sqlite") for n in names), names


def test_a_zero_byte_database_is_refused_then_recovered_from_the_backup(db):
    _filled(db, runs=4, records=150)            # 600 records, as in the probe
    with Store(db):                             # opened again: today's backup
        pass
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"")                          # truncated to 0 bytes
    code, text = _cli("runs")
    assert code == 2 and "is damaged (it is empty: 0 bytes)" in text and "engineroom runs --recover" in text
    assert db.stat().st_size == 0               # nothing was written into it
    code, text = _cli("runs", "--recover")
    assert code == 0, text
    assert "600 records only the backup" in text
    aside = list(db.parent.glob(f"{db.name}{storecare.DAMAGED}*"))
    assert aside and aside[0].stat().st_size == 0           # the damaged file is kept, not deleted
    with Store(db) as store:
        runs = store.runs(50)
        assert len(runs) == 4 and sum(len(store.records(r["id"])) for r in runs) == 600


def _corrupt_middle_pages(path: Path) -> None:
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = raw.execute("PRAGMA page_size").fetchone()[0]
    pages = raw.execute("PRAGMA page_count").fetchone()[0]
    raw.close()
    with open(path, "r+b") as fh:                # garbage over a few pages in the middle
        for n in (pages // 2, pages // 2 + 1):
            fh.seek(n * page)
            fh.write(os.urandom(page))


def test_corrupt_pages_are_refused_and_the_readable_runs_salvaged(db):
    _filled(db, runs=8, records=60)
    _corrupt_middle_pages(db)
    with pytest.raises(BadInput, match=r"is damaged \(.*\); nothing was written to it"):
        Store(db)
    before = db.read_bytes()
    code, text = _cli("runs", "-n", "5")
    assert code == 2 and "runs --recover" in text
    assert db.read_bytes() == before             # refused: no write into the malformed file
    code, text = _cli("runs", "--recover", "--json")
    assert code == 0, text
    import json

    out = json.loads(text)
    assert out["kept_as"] and Path(out["kept_as"]).read_bytes() == before
    assert out["runs_salvaged"] >= 1 and out["records_salvaged"] >= 60   # most of it came back
    with Store(db) as store:                     # the new file passes the check and takes writes
        assert len(store.runs(50)) == out["runs_salvaged"]
        store.add_record(store.runs(1)[0]["id"], "note", {"after": "recovery"})


def test_a_full_disk_says_disk_full_and_keeps_what_was_committed(db):
    _filled(db, runs=1, records=5)
    with Store(db) as store:
        run_id = store.runs(1)[0]["id"]
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 1}")   # a disk with one page left
        committed = len(store.records(run_id))
        with pytest.raises(BadInput) as err:
            for i in range(200):
                store.add_record(run_id, "bench_request", {"i": i, "text": "y" * 3000})
                committed += 1
        message = str(err.value)
        assert message.startswith("disk full:") and "no transaction is active" not in message
        with pytest.raises(BadInput, match="^disk full:"):
            store.start_run("bench", {"big": "z" * 20000})
    with Store(db) as store:
        assert len(store.records(run_id)) == committed     # nothing committed was lost
        assert store.get_run(run_id)["status"] == "OK"
