"""The node's local state in SQLite, under its data directory.

It is what lets a restarted agent (even after ``kill -9``) re-adopt its instances into
the ledger before it subscribes to anything. Every transition is written here before it
is announced, so the announcement never runs ahead of what a restart would recover.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from roost.bus.schemas import InstanceRecord, decode, encode
from roost.node.drivers import ProcessRef

_SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    instance_id TEXT PRIMARY KEY,
    launch_id   TEXT NOT NULL UNIQUE,
    record      BLOB NOT NULL,
    user_data   TEXT NOT NULL DEFAULT '',
    pid         INTEGER,
    start_ticks INTEGER
);
"""


@dataclass(frozen=True, slots=True)
class Stored:
    record: InstanceRecord
    user_data: str
    process: ProcessRef | None


class NodeState:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # User data may hold what its owner considers secret: the node's state is its
        # own (0700 directory, 0600 database; SQLite gives its WAL files the same mode).
        path.parent.chmod(0o700)
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        self._db = sqlite3.connect(path, isolation_level=None)
        # WAL with synchronous=NORMAL survives a process crash (kill -9), which is the
        # failure this state exists for; only an OS crash can lose the last commits.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def put(self, record: InstanceRecord, *, user_data: str | None = None) -> None:
        self._db.execute(
            "INSERT INTO instances (instance_id, launch_id, record, user_data)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (instance_id) DO UPDATE SET record = excluded.record",
            (record.instance_id, record.launch_id, encode(record), user_data or ""),
        )

    def delete(self, instance_id: str) -> None:
        self.delete_many([instance_id])

    def delete_many(self, instance_ids: list[str]) -> None:
        """Forget these instances in one transaction (one WAL commit, not one each)."""
        with self._db:
            self._db.executemany("DELETE FROM instances WHERE instance_id = ?",
                                 [(iid,) for iid in instance_ids])

    def set_user_data(self, instance_id: str, user_data: str) -> None:
        self._db.execute("UPDATE instances SET user_data = ? WHERE instance_id = ?",
                         (user_data, instance_id))

    def set_process(self, instance_id: str, ref: ProcessRef | None) -> None:
        self._db.execute(
            "UPDATE instances SET pid = ?, start_ticks = ? WHERE instance_id = ?",
            (ref.pid if ref else None, ref.start_ticks if ref else None, instance_id),
        )

    def _row(self, row: tuple[bytes, str, int | None, int | None]) -> Stored:
        rec, user_data, pid, ticks = row
        ref = ProcessRef(pid, ticks) if pid is not None and ticks is not None else None
        return Stored(decode(rec, InstanceRecord), user_data, ref)

    def get(self, instance_id: str) -> Stored | None:
        row = self._db.execute(
            "SELECT record, user_data, pid, start_ticks FROM instances WHERE instance_id = ?",
            (instance_id,),
        ).fetchone()
        return self._row(row) if row else None

    def by_launch(self, launch_id: str) -> Stored | None:
        row = self._db.execute(
            "SELECT record, user_data, pid, start_ticks FROM instances WHERE launch_id = ?",
            (launch_id,),
        ).fetchone()
        return self._row(row) if row else None

    def all(self) -> list[Stored]:
        rows = self._db.execute(
            "SELECT record, user_data, pid, start_ticks FROM instances ORDER BY rowid"
        ).fetchall()
        return [self._row(r) for r in rows]

    def close(self) -> None:
        self._db.close()
