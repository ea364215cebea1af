"""The results store: one SQLite file holding every run and every raw measurement.

Why SQLite and why a record per measurement: every figure engineroom prints is recomputed from
raw records, so the store keeps the records, not the summaries (a summary is kept too, but only as
a cache for listings). Each ``add_record`` commits on its own, so a run that is interrupted (Ctrl-C,
engine crash, power cut) still holds everything it measured up to that point; such a run simply has
no ``finished`` time. A power cut too: the WAL journal runs with ``synchronous=FULL``, so a commit
returns only after the WAL is synced to disk. The cost (``benchmarks/store_durability.md``): one
fsync per record, +0.2 ms a record on the 2-core CI VM, against a request of 0.1 s to minutes.

A run killed outright (SIGKILL, a crash, a power cut) cannot close itself. Every run
records the process that opened it, so a reader that finds a ``running`` run whose owner
is gone shows it as ``INTERRUPTED`` with ``end_reason`` "process gone", and writes that
back (best effort; ``finished`` stays empty, since when it died is not known). Its
records are never touched. A run opened on another host is left as it is: its owner
cannot be checked from here.

Two tables:

- ``runs``: id, kind (``verify`` | ``bench`` | ``demo`` ...), created, finished, status, label,
  conditions (JSON), fingerprint (sha256 of the canonical conditions minus volatile fields: two runs
  under the same conditions share it), summary (JSON); owner_pid / owner_started / owner_host (the
  opening process: its pid, its psutil ``create_time`` so a reused pid is not mistaken for it, its
  host); end_reason (why a run ended other than by ``finish_run``).
- ``records``: run_id, seq (1, 2, ... within the run), kind (``check`` | ``bench_request`` ...),
  created, payload (JSON).

The schema is versioned with ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes a database from
version ``i`` to ``i + 1`` (SQL statements, or a function of the connection for a step that rewrites
data), each step in one explicit transaction with the version bump inside it, so a step that fails
leaves the database unchanged. Version 3 rewrote bench request records into ``records.request``' shape.

Damage, backups and a full disk are ``storecare``'s: every open runs SQLite's quick check and
refuses a damaged file with the recovery command (``engineroom runs --recover``); a backup is
taken before each migration and at most daily; a full disk is "disk full", never a hidden error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sqlite3
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engineroom import storecare
from engineroom.errors import BadInput

SCHEMA_VERSION = 3

STATUS_RUNNING = "running"
STATUS_INTERRUPTED = "INTERRUPTED"
PROCESS_GONE = "process gone"
# psutil create_time of one process read twice can differ by clock-tick rounding and a
# re-read boot time; a pid reused by another process starts well over a second later.
_CREATE_TIME_TOLERANCE_S = 1.0

# Keys (at any depth of the conditions) that change from one run to the next without
# changing what was measured: times, process ids, ports, free-form labels.
VOLATILE_CONDITION_KEYS = frozenset(
    {
        "created",
        "started",
        "finished",
        "timestamp",
        "time",
        "date",
        "pid",
        "port",
        "url",
        "base_url",
        "label",
        "run_id",
        "uptime_s",
        "log_path",
    }
)

def _bench_records_to_v3(db: sqlite3.Connection) -> None:
    """2 -> 3: bench records into the raw shape (arrival lists, neutral engine timings).

    The engine's timings are normalised by the adapter the run's conditions name; a run of an
    engine no adapter knows keeps its block raw. Conditions are rewritten with the same
    module, and their fingerprint recomputed so it still matches them.
    """
    from engineroom import engines
    from engineroom.records import schema2

    def loaded(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            return None          # not JSON: nothing this step can read, so nothing it rewrites

    for run in db.execute("SELECT id, conditions FROM runs").fetchall():
        conditions = loaded(run[1])
        if not isinstance(conditions, dict):
            continue
        engine = conditions.get("engine")
        normalise = engines.timings_normaliser(engine) if isinstance(engine, str) else None
        for rec in db.execute("SELECT id, payload FROM records WHERE run_id = ? AND kind = 'bench_request'",
                              (run[0],)).fetchall():
            payload = loaded(rec[1])
            if isinstance(payload, dict) and schema2.is_v2_payload(payload):
                upgraded = schema2.upgrade_payload(payload, conditions, normalise)
                db.execute("UPDATE records SET payload = ? WHERE id = ?", (_dumps(upgraded), rec[0]))
        upgraded_conditions = schema2.upgrade_conditions(conditions)
        if upgraded_conditions != conditions:
            db.execute("UPDATE runs SET conditions = ?, fingerprint = ? WHERE id = ?",
                       (_dumps(upgraded_conditions), fingerprint(upgraded_conditions), run[0]))


Migration = list[str] | Callable[[sqlite3.Connection], None]   # SQL statements, or a data step

_MIGRATIONS: list[Migration] = [
    # 0 -> 1
    [
        """CREATE TABLE runs (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            kind        TEXT NOT NULL,
            created     TEXT NOT NULL,
            finished    TEXT,
            status      TEXT NOT NULL DEFAULT 'running',
            label       TEXT NOT NULL DEFAULT '',
            conditions  TEXT NOT NULL DEFAULT '{}',
            fingerprint TEXT NOT NULL,
            summary     TEXT
        )""",
        "CREATE INDEX runs_fingerprint ON runs (fingerprint)",
        """CREATE TABLE records (
            id      INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            seq     INTEGER NOT NULL,
            kind    TEXT NOT NULL,
            created TEXT NOT NULL,
            payload TEXT NOT NULL,
            UNIQUE (run_id, seq)
        )""",
        "CREATE INDEX records_run_kind ON records (run_id, kind)",
    ],
    # 1 -> 2: the process that owns a run, so a killed run can be told from a running one
    [
        "ALTER TABLE runs ADD COLUMN owner_pid INTEGER",
        "ALTER TABLE runs ADD COLUMN owner_started REAL",
        "ALTER TABLE runs ADD COLUMN owner_host TEXT",
        "ALTER TABLE runs ADD COLUMN end_reason TEXT",
    ],
    # 2 -> 3: bench records keep arrival times and neutral engine timings, not derived rates
    _bench_records_to_v3,
]
assert len(_MIGRATIONS) == SCHEMA_VERSION


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _plain(value: Any) -> Any:
    """Dataclasses become dicts so callers can hand records over as they are."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _dumps(value: Any, *, canonical: bool = False) -> str:
    if canonical:
        return json.dumps(
            _plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
    # compact: a bench record's arrival list is most of its bytes, and ", " would add a fifth
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False, default=str)


def _strip_volatile(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            str(k): _strip_volatile(v)
            for k, v in value.items()
            if str(k) not in VOLATILE_CONDITION_KEYS
        }
    if isinstance(value, (list, tuple)):
        return [_strip_volatile(v) for v in value]
    return value


def _this_process() -> tuple[int, float | None, str]:
    """(pid, psutil create_time, host name) of the calling process."""
    import psutil

    pid = os.getpid()
    try:
        started: float | None = psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        started = None
    return pid, started, socket.gethostname()


def owner_alive(pid: int | None, started: float | None, host: str | None) -> bool | None:
    """Whether the process that opened a run still runs: True, False, or None (cannot tell:
    no owner recorded, or it ran on another host)."""
    import psutil

    if pid is None or host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(pid))
        if started is None:
            return True
        if abs(proc.create_time() - float(started)) > _CREATE_TIME_TOLERANCE_S:
            return False         # the pid now belongs to another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except (psutil.AccessDenied, OSError):
        return True              # it exists; whose it is cannot be read, so assume ours


def fingerprint(conditions: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``conditions`` minus volatile keys (at any depth)."""
    stable = _strip_volatile(json.loads(_dumps(conditions)))
    return hashlib.sha256(_dumps(stable, canonical=True).encode("utf-8")).hexdigest()


class Store:
    """The results database. ``Store()`` opens (and creates) ``paths.db_path()``.

    Safe to share between threads of one process (one connection behind a lock), and
    between processes (WAL journal, busy timeout).
    """

    def __init__(self, path: str | Path | None = None):
        if path is None:
            from engineroom.paths import db_path

            path = db_path()
        self.path = Path(path).expanduser()
        self._lock = threading.RLock()
        if storecare.empty_but_known(self.path):
            raise storecare.StoreDamaged(storecare.damaged_sentence(self.path, "it is empty: 0 bytes"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), timeout=30, check_same_thread=False, isolation_level=None
            )
            self._db.row_factory = sqlite3.Row
            try:
                storecare.check(self._db, self.path)
                self._db.execute("PRAGMA journal_mode=WAL")
            except sqlite3.DatabaseError as exc:
                if storecare.disk_full(exc, self.path) is not None:
                    raise
                raise storecare.StoreDamaged(storecare.damaged_sentence(self.path, str(exc))) from None
            except BaseException:
                self._db.close()
                raise
            self._db.execute("PRAGMA synchronous=FULL")   # durable at each commit (module docstring)
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            self._scheduled_backup()
        except sqlite3.DatabaseError as exc:
            full = storecare.disk_full(exc, self.path)
            if full is not None:
                raise full from None
            raise BadInput(f"Cannot open the results database {self.path}: {exc}.") from exc
        except OSError as exc:
            raise BadInput(f"Cannot create the results database {self.path}: {exc.strerror}.") from exc

    # -- schema ---------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise BadInput(
                    f"The results database {self.path} has schema version {version}, newer than "
                    f"this engineroom understands ({SCHEMA_VERSION}); upgrade engineroom."
                )
            if 0 < version < SCHEMA_VERSION:   # a copy of the old schema's data, before it is rewritten
                storecare.backup(self._db, self.path, f"before-v{SCHEMA_VERSION}")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    # another process may have migrated while this one waited for the lock
                    if self._db.execute("PRAGMA user_version").fetchone()[0] >= target:
                        self._db.execute("COMMIT")
                        continue
                    step = _MIGRATIONS[target - 1]
                    if callable(step):
                        step(self._db)
                    else:
                        for statement in step:
                            self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {target}")
                    self._db.execute("COMMIT")
                except BaseException as exc:
                    if self._db.in_transaction:    # SQLite has already rolled back after a full disk
                        self._db.execute("ROLLBACK")
                    # a full disk goes up as it is: opening the store says "disk full" in one sentence
                    if isinstance(exc, Exception) and self._full(exc) is exc:
                        raise BadInput(
                            f"Cannot upgrade the results database {self.path} from schema version "
                            f"{target - 1} to {target} ({type(exc).__name__}: {exc}); "
                            f"it is left at version {target - 1}."
                        ) from exc
                    raise

    def _scheduled_backup(self) -> None:
        """At most one backup a day (``storecare.BACKUP_EVERY_S``), once the store holds a run."""
        try:
            if storecare.backup_due(self.path) and self._db.execute("SELECT 1 FROM runs LIMIT 1").fetchone():
                storecare.backup(self._db, self.path, "daily")
        except (OSError, sqlite3.Error):
            pass   # a backup that cannot be made (a full disk) never keeps the store from opening

    def _full(self, exc: BaseException) -> BaseException:
        """A full disk as its one sentence; any other error as it was."""
        return storecare.disk_full(exc, self.path) or exc

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs -----------------------------------------------------------------------

    def start_run(self, kind: str, conditions: Mapping[str, Any], label: str = "") -> int:
        """Open a run and return its id, ``running`` until ``finish_run``, owned by this process (module doc)."""
        if not kind:
            raise BadInput("A run needs a kind (for example 'verify' or 'bench').")
        conditions = _plain(conditions)
        pid, started, host = _this_process()
        with self._lock:
            try:
                cur = self._db.execute(
                    "INSERT INTO runs (kind, created, status, label, conditions, fingerprint, "
                    "owner_pid, owner_started, owner_host) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                    (kind, _now(), label or "", _dumps(conditions), fingerprint(conditions),
                     pid, started, host),
                )
            except sqlite3.OperationalError as exc:
                raise self._full(exc) from None
            assert cur.lastrowid is not None    # an INSERT always sets it
            return cur.lastrowid

    def finish_run(self, run_id: int, status: str, summary: Mapping[str, Any] | None = None) -> None:
        """Close a run with its final status (``OK``, ``REQ_ERRORS``, ``FAIL`` ...)."""
        with self._lock:
            run_id = self._require_run(run_id)["id"]
            try:
                self._db.execute(
                    "UPDATE runs SET finished = ?, status = ?, summary = ? WHERE id = ?",
                    (_now(), status, None if summary is None else _dumps(summary), run_id),
                )
            except sqlite3.OperationalError as exc:
                raise self._full(exc) from None

    def reopen_run(self, run_id: int, conditions: Mapping[str, Any] | None = None) -> None:
        """A run that ended short of its work (a bakeoff stopped part way) open again, owned by this process;
        ``conditions``: what it asks now, when that grew (a bakeoff given more engines)."""
        pid, started, host = _this_process()
        with self._lock:
            run = self._require_run(run_id)
            cond = _plain(conditions) if conditions is not None else json.loads(run["conditions"])
            self._db.execute("UPDATE runs SET status = ?, finished = NULL, end_reason = NULL, owner_pid = ?, "
                             "owner_started = ?, owner_host = ?, conditions = ?, fingerprint = ? WHERE id = ?",
                             (STATUS_RUNNING, pid, started, host, _dumps(cond), fingerprint(cond), run["id"]))

    def runs(self, limit: int = 50, *, kind: str | None = None) -> list[dict[str, Any]]:
        """The newest runs first."""
        sql = "SELECT * FROM runs"
        args: list[Any] = []
        if kind:
            sql += " WHERE kind = ?"
            args.append(kind)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(int(limit))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [self._run_dict(r) for r in rows]

    def get_run(self, run_id: int) -> dict[str, Any]:
        with self._lock:
            return self._run_dict(self._require_run(run_id))

    # -- records --------------------------------------------------------------------

    def add_record(self, run_id: int, kind: str, payload: Mapping[str, Any]) -> int:
        """Append one raw measurement to a run and commit it at once; returns its seq."""
        payload = _plain(payload)
        text = _dumps(payload)
        with self._lock:
            run_id = self._require_run(run_id)["id"]
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._db.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM records WHERE run_id = ?", (run_id,)
                ).fetchone()[0]
                self._db.execute(
                    "INSERT INTO records (run_id, seq, kind, created, payload) VALUES (?, ?, ?, ?, ?)",
                    (run_id, seq, kind, _now(), text),
                )
                self._db.execute("COMMIT")
            except BaseException as exc:
                # after SQLITE_FULL SQLite has rolled back already: a second ROLLBACK would only say
                # "no transaction is active" and hide the real error
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise self._full(exc) from None
                raise
            return int(seq)

    def records(self, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        """A run's records in the order they were written.

        Each is ``{"run_id", "seq", "kind", "created", "payload": dict}``.
        """
        with self._lock:
            run_id = self._require_run(run_id)["id"]
            if kind is None:
                rows = self._db.execute(
                    "SELECT * FROM records WHERE run_id = ? ORDER BY seq", (run_id,)
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM records WHERE run_id = ? AND kind = ? ORDER BY seq",
                    (run_id, kind),
                ).fetchall()
        return [
            {
                "run_id": r["run_id"],
                "seq": r["seq"],
                "kind": r["kind"],
                "created": r["created"],
                "payload": json.loads(r["payload"]),
            }
            for r in rows
        ]

    # -- helpers --------------------------------------------------------------------

    def _require_run(self, run_id: Any) -> sqlite3.Row:
        if isinstance(run_id, bool) or not isinstance(run_id, int):
            try:
                run_id = int(str(run_id).strip())
            except ValueError:
                raise BadInput(f"Run id {run_id!r} is not a number.") from None
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise BadInput(f"There is no run {run_id} in {self.path}.")
        return row

    def _mark_gone(self, run_id: int) -> None:
        """Write a dead owner's run back as INTERRUPTED; only a still-open run, never its records."""
        try:
            with self._lock:
                self._db.execute(
                    "UPDATE runs SET status = ?, end_reason = ? "
                    "WHERE id = ? AND status = ? AND finished IS NULL",
                    (STATUS_INTERRUPTED, PROCESS_GONE, run_id, STATUS_RUNNING),
                )
        except sqlite3.Error:
            pass   # a read-only or busy database: the reader still shows it as interrupted

    def _run_dict(self, row: sqlite3.Row) -> dict[str, Any]:
        status, end_reason = row["status"], row["end_reason"]
        if (status == STATUS_RUNNING and row["finished"] is None
                and owner_alive(row["owner_pid"], row["owner_started"], row["owner_host"]) is False):
            status, end_reason = STATUS_INTERRUPTED, PROCESS_GONE
            self._mark_gone(row["id"])
        return {
            "id": row["id"],
            "kind": row["kind"],
            "created": row["created"],
            "finished": row["finished"],
            "status": status,
            "end_reason": end_reason,       # None, or "process gone" for a run killed outright
            "owner_pid": row["owner_pid"],
            "label": row["label"],
            "conditions": json.loads(row["conditions"]),
            "fingerprint": row["fingerprint"],
            "summary": None if row["summary"] is None else json.loads(row["summary"]),
        }
