"""The results store: one SQLite file holding every run and every raw measurement.

Why SQLite and why a record per measurement: every figure engineroom prints is
recomputed from raw records, so the store keeps the records, not the summaries (a
summary is kept too, but only as a cache for listings). Each ``add_record`` commits on
its own, so a run that is interrupted (Ctrl-C, engine crash, power cut) still holds
everything it measured up to that point; such a run simply has no ``finished`` time.

Two tables:

- ``runs``: id, kind (``verify`` | ``bench`` | ``demo`` ...), created, finished, status,
  label, conditions (JSON), fingerprint (sha256 of the canonical JSON of the conditions
  minus volatile fields, so two runs under the same conditions share a fingerprint),
  summary (JSON, optional).
- ``records``: run_id, seq (1, 2, ... within the run), kind (``check`` |
  ``bench_request`` ...), created, payload (JSON).

The schema is versioned with ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes a
database from version ``i`` to ``i + 1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from engineroom.errors import BadInput

SCHEMA_VERSION = 1

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

_MIGRATIONS: list[str] = [
    # 0 -> 1
    """
    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        kind        TEXT NOT NULL,
        created     TEXT NOT NULL,
        finished    TEXT,
        status      TEXT NOT NULL DEFAULT 'running',
        label       TEXT NOT NULL DEFAULT '',
        conditions  TEXT NOT NULL DEFAULT '{}',
        fingerprint TEXT NOT NULL,
        summary     TEXT
    );
    CREATE INDEX runs_fingerprint ON runs (fingerprint);
    CREATE TABLE records (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        seq     INTEGER NOT NULL,
        kind    TEXT NOT NULL,
        created TEXT NOT NULL,
        payload TEXT NOT NULL,
        UNIQUE (run_id, seq)
    );
    CREATE INDEX records_run_kind ON records (run_id, kind);
    """,
]
assert len(_MIGRATIONS) == SCHEMA_VERSION


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


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
    return json.dumps(_plain(value), ensure_ascii=False, default=str)


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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), timeout=30, check_same_thread=False, isolation_level=None
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
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
            for target in range(version + 1, SCHEMA_VERSION + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _MIGRATIONS[target - 1].split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {target}")
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs -----------------------------------------------------------------------

    def start_run(self, kind: str, conditions: Mapping[str, Any], label: str = "") -> int:
        """Open a run and return its id; its status is ``running`` until ``finish_run``."""
        if not kind:
            raise BadInput("A run needs a kind (for example 'verify' or 'bench').")
        conditions = _plain(conditions)
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO runs (kind, created, status, label, conditions, fingerprint) "
                "VALUES (?, ?, 'running', ?, ?, ?)",
                (kind, _now(), label or "", _dumps(conditions), fingerprint(conditions)),
            )
            return int(cur.lastrowid)

    def finish_run(self, run_id: int, status: str, summary: Mapping[str, Any] | None = None) -> None:
        """Close a run with its final status (``OK``, ``REQ_ERRORS``, ``FAIL`` ...)."""
        with self._lock:
            run_id = self._require_run(run_id)["id"]
            self._db.execute(
                "UPDATE runs SET finished = ?, status = ?, summary = ? WHERE id = ?",
                (_now(), status, None if summary is None else _dumps(summary), run_id),
            )

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
            except BaseException:
                self._db.execute("ROLLBACK")
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

    @staticmethod
    def _run_dict(row: sqlite3.Row) -> dict[str, Any]:
        return {
            "id": row["id"],
            "kind": row["kind"],
            "created": row["created"],
            "finished": row["finished"],
            "status": row["status"],
            "label": row["label"],
            "conditions": json.loads(row["conditions"]),
            "fingerprint": row["fingerprint"],
            "summary": None if row["summary"] is None else json.loads(row["summary"]),
        }
