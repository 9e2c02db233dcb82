"""DuckDB, the embedded default.

Hazards designed against (measured in shared/RELIABILITY.md):
- one read-write process per file: a second process cannot even open it, so every
  session is short and opening retries with bounded, jittered backoff;
- replacement scans can resolve an unknown table to a Python variable: disabled on
  every connection;
- after an error inside a transaction every statement fails until ROLLBACK: the
  transaction context always rolls back on error.
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import duckdb
import pyarrow as pa

from recovery.lib.engine.base import Engine, RetryableConflict, Session
from recovery.lib.errors import WarehouseBusyError
from recovery.lib.identifiers import quote
from recovery.lib.trace import trace


def _is_lock_error(err: BaseException) -> bool:
    text = str(err)
    return "Could not set lock" in text or "Conflicting lock" in text or "database is locked" in text


def _is_conflict(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, duckdb.TransactionException) or "Conflict" in text or "conflict" in text


class _EngineClock:
    """Seconds this process spent waiting on DuckDB statements (what a benchmark calls engine time)."""

    def __init__(self) -> None:
        self.total = 0.0

    @contextmanager
    def timing(self, sql: str = "") -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self.total += took
            trace("sql", took, sql)


ENGINE_SECONDS = _EngineClock()


class DuckDBSession(Session):
    dialect = "duckdb"

    def __init__(self, conn: duckdb.DuckDBPyConnection):
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        with ENGINE_SECONDS.timing(sql):
            self.conn.execute(sql, params or [])

    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        with ENGINE_SECONDS.timing(sql):
            return self.conn.execute(sql, params or []).fetchall()

    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with ENGINE_SECONDS.timing(sql):
            return self.conn.sql(sql, params=list(params) if params else None).to_arrow_table()

    def arrow_batches(self, sql: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
        with ENGINE_SECONDS.timing(sql):
            reader = self.conn.sql(sql).to_arrow_reader(batch_rows)
        while True:
            with ENGINE_SECONDS.timing("-- next batch of: " + sql):
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
            yield batch

    def columns(self, table_sql: str) -> list[tuple[str, str]]:
        try:
            rows = self.conn.execute(f"DESCRIBE SELECT * FROM {table_sql}").fetchall()
        except duckdb.CatalogException:
            return []
        return [(r[0], r[1]) for r in rows]

    def relation_columns(self, select_sql: str) -> list[tuple[str, str]]:
        rows = self.conn.execute(f"DESCRIBE {select_sql}").fetchall()
        return [(r[0], r[1]) for r in rows]

    def object_kind(self, schema: str, name: str) -> str | None:
        rows = self.conn.execute(  # fetchall: a half-read result would block the next arrow() call
            "SELECT table_type FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
            [schema, name],
        ).fetchall()
        if not rows:
            return None
        return "view" if rows[0][0] == "VIEW" else "table"


class DuckDBEngine(Engine):
    """A DuckDB database file. Sessions are opened per unit of work and closed promptly."""

    dialect = "duckdb"

    def __init__(
        self,
        path: str,
        *,
        memory_limit: str | None = None,
        threads: int | None = None,
        busy_timeout_s: float = 300.0,
        connect: Callable[..., duckdb.DuckDBPyConnection] | None = None,
    ):
        self.location = path
        self.memory_limit = memory_limit
        self.threads = threads
        self.busy_timeout_s = busy_timeout_s
        self._connect = connect or duckdb.connect

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        config: dict[str, Any] = {"python_enable_replacements": False}
        if self.memory_limit:
            config["memory_limit"] = self.memory_limit
        if self.threads:
            config["threads"] = self.threads
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.02
        while True:
            try:
                conn = self._connect(database=self.location, read_only=read_only, config=config)
                conn.execute("SET python_enable_replacements = false")
                return conn
            except (duckdb.IOException, duckdb.ConnectionException) as err:
                if not _is_lock_error(err) or time.monotonic() >= deadline:
                    if _is_lock_error(err):
                        raise WarehouseBusyError(
                            f"warehouse {self.location} stayed locked by another process for "
                            f"{self.busy_timeout_s:.0f}s; retry when the other job finishes"
                        ) from err
                    raise
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 1.6, 1.0)

    @contextmanager
    def session(self, read_only: bool = False) -> Iterator[DuckDBSession]:
        conn = self._open(read_only)
        try:
            yield DuckDBSession(conn)
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[DuckDBSession]:
        conn = self._open(read_only=False)
        try:
            conn.execute("BEGIN TRANSACTION")
            try:
                yield DuckDBSession(conn)
                conn.execute("COMMIT")
            except BaseException as err:
                try:
                    conn.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                if isinstance(err, duckdb.Error) and _is_conflict(err):
                    raise RetryableConflict(str(err)) from err
                raise
        finally:
            conn.close()

    def qualified(self, schema: str, name: str) -> str:
        return f"{quote(schema)}.{quote(name)}"
