"""Keeping the results database whole: the check on open, backups, recovery, a full disk.

- **Check on open** (``check``): a file that is not a database, fails SQLite's ``PRAGMA
  quick_check`` (every page and index read, no cross-checks: a fraction of a second for a
  database of tens of megabytes), or was cut to 0 bytes (a database that once held runs: a backup
  of it exists, or it is older than a brand-new file being created) is **damaged**. Nothing is
  written into it: ``Store()`` raises ``StoreDamaged``, one sentence with the recovery command.
- **Recovery** (``recover``, ``engineroom runs --recover``): the damaged file (with its ``-wal``
  and ``-shm``) is kept aside as ``results.sqlite.damaged-<time>``, never deleted; a new
  database is made, every run and record still readable in the damaged file is copied into it
  (row by row, so one bad page costs only the rows on it), and what only the newest backup holds
  is added from there. Explicit rather than automatic: the user sees what was damaged and what
  came back before anything is written again.
- **Backups** (``backup``): SQLite's online backup API (a consistent copy while others write)
  into ``data_dir()/backups``, before every schema migration and at most once a day when the
  store is opened; the newest ``KEEP_BACKUPS`` are kept.
- **A full disk** (``disk_full``): SQLite's "database or disk is full" becomes "disk full: ...";
  a failed write is rolled back (only when a transaction is still open: SQLite rolls back on its
  own after SQLITE_FULL), so every record committed before it stays.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BadInput

BACKUP_DIR = "backups"
KEEP_BACKUPS = 5
BACKUP_EVERY_S = 24 * 3600
DAMAGED = ".damaged-"
FRESH_FILE_S = 5.0     # a 0-byte file younger than this may be a store another process is creating


class StoreDamaged(BadInput):
    """The results database cannot be trusted; ``engineroom runs --recover`` makes a new one."""


def backup_dir(db: Path) -> Path:
    return Path(db).parent / BACKUP_DIR


def backups(db: Path) -> list[Path]:
    """The backups of ``db``, newest first."""
    folder = backup_dir(db)
    if not folder.is_dir():
        return []
    return sorted(folder.glob(f"{Path(db).stem}-*.sqlite"), key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)


def damaged_sentence(db: Path, why: str) -> str:
    newest = backups(db)
    kept = f"the newest backup ({newest[0].name}) adds what it alone holds" if newest else "there is no backup yet"
    return (f"The results database {db} is damaged ({why}); nothing was written to it. Run `engineroom runs "
            f"--recover`: it keeps the file aside as {Path(db).name}{DAMAGED}<time> and copies every readable run "
            f"into a new one ({kept}).")


def empty_but_known(db: Path) -> bool:
    """A 0-byte file that was a database: a backup of it exists, or it is not a file being created now."""
    try:
        st = db.stat()
    except OSError:
        return False
    if st.st_size != 0:
        return False
    return bool(backups(db)) or time.time() - st.st_mtime > FRESH_FILE_S


def check(conn: sqlite3.Connection, db: Path) -> None:
    """Raise StoreDamaged unless ``conn``'s database passes ``PRAGMA quick_check``."""
    try:
        rows = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        raise StoreDamaged(damaged_sentence(db, str(exc))) from None
    if rows != ["ok"]:
        raise StoreDamaged(damaged_sentence(db, f"SQLite's quick_check: {'; '.join(map(str, rows[:3]))}"))


def disk_full(exc: BaseException, db: Path) -> BadInput | None:
    """The one sentence for a write refused by a full disk (or a size limit), or None."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc):
        return BadInput(f"disk full: the results database {db} could not be written ({exc}); every record "
                        "stored before this one is kept. Free some space and run the command again.")
    return None


def backup(conn: sqlite3.Connection, db: Path, reason: str) -> Path:
    """A consistent copy of ``conn``'s database (SQLite's online backup) into ``backups/``; keeps
    the newest KEEP_BACKUPS."""
    folder = backup_dir(db)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{Path(db).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{reason}.sqlite"
    n = 1
    while target.exists():
        n += 1
        target = folder / f"{Path(db).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{reason}-{n}.sqlite"
    tmp = target.with_suffix(".tmp")
    dest = sqlite3.connect(str(tmp))
    try:
        conn.backup(dest)
    finally:
        dest.close()
    os.replace(tmp, target)
    for old in [p for p in backups(db) if p != target][KEEP_BACKUPS - 1:]:
        old.unlink(missing_ok=True)
    return target


def backup_due(db: Path) -> bool:
    newest = backups(db)
    return not newest or time.time() - newest[0].stat().st_mtime > BACKUP_EVERY_S


@dataclass
class Recovered:
    """What ``recover`` did: where the damaged file went, what came back from where."""

    kept_as: Path | None
    runs_salvaged: int = 0
    records_salvaged: int = 0
    from_backup: str = ""
    runs_from_backup: int = 0
    records_from_backup: int = 0
    unreadable: list[str] = field(default_factory=list)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def _insert(dst: sqlite3.Connection, table: str, cols: list[str], row: tuple) -> int:
    """INSERT OR IGNORE one row (rows already there win); 1 when it was added."""
    return dst.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES "
                       f"({', '.join('?' * len(cols))})", tuple(row)).rowcount


def _read_one(src: sqlite3.Connection, sql: str, args: tuple, out: Recovered, what: str, *,
              salvage: bool) -> tuple | None:
    """One row, or None when it is not there or cannot be read (noted in ``out`` when salvaging)."""
    try:
        return src.execute(sql, args).fetchone()
    except sqlite3.DatabaseError as exc:
        if salvage:
            out.unreadable.append(f"{what}: {exc}")
        return None


def _copy_rows(src: sqlite3.Connection, dst: sqlite3.Connection, out: Recovered, *, salvage: bool) -> tuple[int, int]:
    """Copy runs and records from ``src`` into ``dst`` (INSERT OR IGNORE: rows already there win),
    a run at a time and, when a run's records cannot be read at once, a record at a time."""
    runs_cols = [c for c in _columns(src, "runs") if c in set(_columns(dst, "runs"))]
    rec_cols = [c for c in _columns(src, "records") if c in set(_columns(dst, "records"))]
    select_run = f"SELECT {', '.join(runs_cols)} FROM runs WHERE id = ?"
    select_recs = f"SELECT {', '.join(rec_cols)} FROM records WHERE run_id = ?"
    n_runs = n_recs = 0
    top = src.execute("SELECT MAX(id) FROM runs").fetchone()[0] or 0
    for run_id in range(1, int(top) + 1):
        row = _read_one(src, select_run, (run_id,), out, f"run {run_id}", salvage=salvage)
        if row is None:
            continue
        n_runs += _insert(dst, "runs", runs_cols, row)
        try:
            recs = src.execute(select_recs + " ORDER BY seq", (run_id,)).fetchall()
        except sqlite3.DatabaseError:
            recs = []
            while True:                       # one at a time: stop at the first seq that is gone
                seq = len(recs) + 1
                one = _read_one(src, select_recs + " AND seq = ?", (run_id, seq), out,
                                f"run {run_id} record {seq}", salvage=salvage)
                if one is None:
                    break
                recs.append(one)
        for rec in recs:
            n_recs += _insert(dst, "records", rec_cols, rec)
    return n_runs, n_recs


def recover(db: Path, schema_version: int, open_new: type) -> Recovered:
    """Keep ``db`` aside, make a new database (``open_new(db)``: the Store class, so the schema is
    the current one) and copy into it what the damaged file and the newest backup still hold."""
    db = Path(db)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = db.with_name(f"{db.name}{DAMAGED}{stamp}")
    out = Recovered(kept_as=aside if db.exists() else None)
    if db.exists():
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{db}{suffix}")
            if part.exists():
                os.replace(part, Path(f"{aside}{suffix}"))
    store = open_new(db)
    dst: sqlite3.Connection = store._db
    try:
        sources: list[tuple[Path, bool]] = []
        if out.kept_as is not None and aside.stat().st_size > 0:
            sources.append((aside, True))
        newest = backups(db)
        if newest:
            sources.append((newest[0], False))
        for path, salvage in sources:
            src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)   # opening reads nothing yet
            try:
                version = src.execute("PRAGMA user_version").fetchone()[0]
                if version != schema_version:
                    out.unreadable.append(f"{path.name}: schema version {version}, not {schema_version}; left as it is")
                    continue
                dst.execute("BEGIN IMMEDIATE")
                runs, recs = _copy_rows(src, dst, out, salvage=salvage)
                dst.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                if dst.in_transaction:
                    dst.execute("COMMIT")      # keep what was copied before the unreadable part
                out.unreadable.append(f"{path.name}: {exc}")
                continue
            finally:
                src.close()
            if salvage:
                out.runs_salvaged, out.records_salvaged = runs, recs
            else:
                out.from_backup, out.runs_from_backup, out.records_from_backup = path.name, runs, recs
    finally:
        store.close()
    return out


__all__ = ["BACKUP_DIR", "KEEP_BACKUPS", "Recovered", "StoreDamaged", "backup", "backup_due", "backups", "check",
           "damaged_sentence", "disk_full", "empty_but_known", "recover"]
