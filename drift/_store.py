"""SQLite persistence of a monitor's state under one directory.

Why SQLite (stdlib): one file, transactions, and WAL mode make "written and committed" mean
"survives the process being killed". Each commit is one transaction, so a restart sees either
all of a batch's or pane's state or none of it. With `fsync=True` (synchronous=FULL) commits
also survive power loss; the default (synchronous=NORMAL in WAL mode) survives process crashes.
A lock file stops two monitors from writing the same directory.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drift._changes import TIER_DETAIL, TIER_FULL, TIER_OPEN, ChangeSet
from drift._encode import MISSING, OTHER
from drift._errors import StateError

try:  # POSIX advisory locks; elsewhere the lock is best-effort
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

DB_NAME = "monitor.sqlite"
LOCK_NAME = "monitor.lock"
SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS codes (col INTEGER, code INTEGER, kind TEXT, value TEXT,
                                  PRIMARY KEY (col, code));
CREATE TABLE IF NOT EXISTS panes (pane INTEGER PRIMARY KEY, tier INTEGER, blob BLOB);
CREATE TABLE IF NOT EXISTS deltas (seq INTEGER PRIMARY KEY AUTOINCREMENT, pane INTEGER,
                                   blob BLOB);
CREATE TABLE IF NOT EXISTS rollups (bucket INTEGER PRIMARY KEY, blob BLOB);
CREATE TABLE IF NOT EXISTS series (pane INTEGER PRIMARY KEY, data TEXT);
CREATE TABLE IF NOT EXISTS refs (name TEXT PRIMARY KEY, blob BLOB, info TEXT);
CREATE TABLE IF NOT EXISTS held (pane INTEGER PRIMARY KEY, blob BLOB);
"""


def _encode_value(value: object) -> tuple[str, str]:
    if value is MISSING:
        return "missing", ""
    if value is OTHER:
        return "other", ""
    if isinstance(value, bool):
        return "bool", "1" if value else "0"
    if isinstance(value, int):
        return "int", str(value)
    if isinstance(value, float):
        return "float", repr(value)
    return "str", str(value)


def _decode_value(kind: str, text: str) -> object:
    if kind == "missing":
        return MISSING
    if kind == "other":
        return OTHER
    if kind == "bool":
        return text == "1"
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


class Store:
    """The monitor's database; every write goes through `transaction()`."""

    def __init__(self, directory: str | os.PathLike, fsync: bool = False) -> None:
        self.directory = Path(directory)
        try:
            # the monitor's state holds attribute values (possibly personal data): this user only
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create directory {str(self.directory)!r}: {exc}") from exc
        self._lock_file = open(self.directory / LOCK_NAME, "a+")
        if fcntl is not None:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                self._lock_file.close()
                raise StateError(
                    f"directory {str(self.directory)!r} is in use by another Monitor "
                    "(close it first; one writer per directory)"
                ) from exc
        self.path = self.directory / DB_NAME
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self.conn.executescript(_DDL)
        # the database, its WAL and lock files: this user only (chmod, not umask: umask is the
        # whole process's, and a monitor replica runs other threads)
        for name in (LOCK_NAME, DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm"):
            if (self.directory / name).exists():
                os.chmod(self.directory / name, 0o600)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None  # type: ignore[assignment]
        if not self._lock_file.closed:
            if fcntl is not None:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()

    @property
    def closed(self) -> bool:
        return self.conn is None

    # ---------------------------------------------------------------- reading
    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}

    def codes(self) -> dict[int, list[object]]:
        out: dict[int, list[object]] = {}
        rows = self.conn.execute("SELECT col, code, kind, value FROM codes ORDER BY col, code")
        for col, code, kind, text in rows:
            values = out.setdefault(col, [])
            if code != len(values):
                raise StateError(f"code table of column {col} has a gap at code {code}")
            values.append(_decode_value(kind, text))
        return out

    def panes(self) -> list[tuple[int, int, bytes]]:
        return list(self.conn.execute("SELECT pane, tier, blob FROM panes ORDER BY pane"))

    def deltas(self) -> list[tuple[int, int, bytes]]:
        return list(self.conn.execute("SELECT seq, pane, blob FROM deltas ORDER BY seq"))

    def rollups(self) -> list[tuple[int, bytes]]:
        return list(self.conn.execute("SELECT bucket, blob FROM rollups ORDER BY bucket"))

    def series(self) -> dict[int, dict[str, Any]]:
        rows = self.conn.execute("SELECT pane, data FROM series ORDER BY pane")
        return {pane: json.loads(data) for pane, data in rows}

    def held(self) -> list[tuple[int, bytes]]:
        """Quarantined rows held per pane, waiting for the frontier (drift._frontier)."""
        return list(self.conn.execute("SELECT pane, blob FROM held ORDER BY pane"))

    def refs(self) -> list[tuple[str, bytes, dict[str, Any]]]:
        rows = self.conn.execute("SELECT name, blob, info FROM refs ORDER BY name")
        return [(name, blob, json.loads(info)) for name, blob, info in rows]

    def apply(self, cs: ChangeSet) -> None:
        """Write a change set in one transaction (all of it or, on any error, none)."""
        with self.transaction() as w:
            write_changes(w, cs)

    def size_bytes(self) -> int:
        return sum(
            p.stat().st_size
            for p in self.directory.glob(DB_NAME + "*")
            if p.is_file()
        )

    # ---------------------------------------------------------------- writing
    @contextmanager
    def transaction(self) -> Iterator[_Writer]:
        """One atomic write: everything inside commits together or not at all."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield _Writer(self.conn)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")


class _Writer:
    """Statements inside one transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def put_meta(self, key: str, value: Any) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value))
        )

    def add_codes(self, col: int, start: int, values: list[object]) -> None:
        rows = [(col, start + i, *_encode_value(v)) for i, v in enumerate(values)]
        self.conn.executemany(
            "INSERT OR REPLACE INTO codes (col, code, kind, value) VALUES (?, ?, ?, ?)", rows
        )

    def put_pane(self, pane: int, tier: int, blob: bytes) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO panes (pane, tier, blob) VALUES (?, ?, ?)", (pane, tier, blob)
        )
        self.conn.execute("DELETE FROM deltas WHERE pane = ?", (pane,))

    def delete_pane(self, pane: int) -> None:
        self.conn.execute("DELETE FROM panes WHERE pane = ?", (pane,))
        self.conn.execute("DELETE FROM deltas WHERE pane = ?", (pane,))

    def add_delta(self, pane: int, blob: bytes) -> None:
        self.conn.execute("INSERT INTO deltas (pane, blob) VALUES (?, ?)", (pane, blob))

    def put_rollup(self, bucket: int, blob: bytes) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO rollups (bucket, blob) VALUES (?, ?)", (bucket, blob)
        )

    def delete_rollup(self, bucket: int) -> None:
        self.conn.execute("DELETE FROM rollups WHERE bucket = ?", (bucket,))

    def delete_series(self, pane: int) -> None:
        self.conn.execute("DELETE FROM series WHERE pane = ?", (pane,))

    def delete_rollups_before(self, bucket: int) -> None:
        self.conn.execute("DELETE FROM rollups WHERE bucket < ?", (bucket,))

    def put_series(self, pane: int, data: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO series (pane, data) VALUES (?, ?)", (pane, json.dumps(data))
        )

    def delete_series_before(self, pane: int) -> None:
        self.conn.execute("DELETE FROM series WHERE pane < ?", (pane,))

    def put_ref(self, name: str, blob: bytes, info: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO refs (name, blob, info) VALUES (?, ?, ?)",
            (name, blob, json.dumps(info)),
        )

    def put_held(self, pane: int, blob: bytes) -> None:
        self.conn.execute("INSERT OR REPLACE INTO held (pane, blob) VALUES (?, ?)", (pane, blob))

    def delete_held(self, pane: int) -> None:
        self.conn.execute("DELETE FROM held WHERE pane = ?", (pane,))

    def delete_ref(self, name: str) -> None:
        self.conn.execute("DELETE FROM refs WHERE name = ?", (name,))


def write_changes(w: _Writer, cs: ChangeSet) -> None:
    """Every write of one change set, inside the caller's transaction (see drift._changes)."""
    for col, (start, values) in sorted(cs.codes.items()):
        w.add_codes(col, start, values)
    for pane, delta in cs.deltas:
        if pane not in cs.full_put and pane not in cs.open_put:
            w.add_delta(pane, delta.to_bytes())
    for p, s in sorted(cs.open_put.items()):
        w.put_pane(p, TIER_OPEN, s.to_bytes())
    for p, s in sorted(cs.full_put.items()):
        w.put_pane(p, TIER_FULL, s.to_bytes())
    for p in sorted(cs.full_drop | cs.detail_drop):
        if p not in cs.detail_put and p not in cs.full_put:
            w.delete_pane(p)
    for p, s in sorted(cs.detail_put.items()):
        w.put_pane(p, TIER_DETAIL, s.to_bytes())
    for b, s in sorted(cs.rollup_put.items()):
        w.put_rollup(b, s.to_bytes())
    for b in sorted(cs.rollup_drop):
        w.delete_rollup(b)
    for p, data in sorted(cs.series_put.items()):
        w.put_series(p, data)
    for p in sorted(cs.series_drop):
        w.delete_series(p)
    for p in sorted(cs.held_drop):
        if p not in cs.held_put:
            w.delete_held(p)
    for p, s in sorted(cs.held_put.items()):
        w.put_held(p, s.to_bytes())
    for name, (summary, info) in sorted(cs.refs_put.items()):
        w.put_ref(name, summary.to_bytes(), info)
    for key, value in cs.meta.items():
        w.put_meta(key, value)
