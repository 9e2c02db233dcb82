"""A run cancelled mid-open must not keep the warehouse: Dagster delivers a cancellation as an
exception at any bytecode, and a turnstile descriptor lost between taking it and handing it over
kept its flock for the life of the process (its next writer, and every other process, waited
on it: a cancelled backfill run and the containment, 300 s each, in CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from recovery.lib.engine import duckdb_engine
from recovery.lib.engine.duckdb_engine import DuckDBEngine

OTHER_PROCESS_WRITES = """
import sys
from recovery.lib.engine.duckdb_engine import DuckDBEngine
with DuckDBEngine(sys.argv[1], busy_timeout_s=5).transaction() as s:
    s.execute("INSERT INTO t VALUES (2)")
"""


class Cancelled(BaseException):
    """Stands for Dagster's DagsterExecutionInterruptedError (a BaseException too)."""


def _engine(path: Path, **kw) -> DuckDBEngine:
    return DuckDBEngine(str(path), busy_timeout_s=3, **kw)


def _interrupt_before(real):
    """``real``, whose first call is interrupted before it runs."""
    calls: list[object] = []

    def wrapper(*args, **kwargs):
        if not calls:
            calls.append(1)
            raise Cancelled()
        return real(*args, **kwargs)

    return wrapper


class _InterruptedOnFirstStatement:
    """A connection DuckDB opened, interrupted on its first statement (it stays open unless closed)."""

    def __init__(self, conn: duckdb.DuckDBPyConnection):
        self.conn = conn

    def execute(self, *args, **kwargs):
        raise Cancelled()

    def close(self) -> None:
        self.conn.close()


def _connect_interrupted_once():
    calls: list[object] = []

    def connect(*args, **kwargs):
        conn = duckdb.connect(*args, **kwargs)
        if not calls:
            calls.append(1)
            return _InterruptedOnFirstStatement(conn)
        return conn

    return connect


@pytest.mark.parametrize("where", ["first_statement_after_connect", "handing_over_the_turnstile"])
def test_an_interrupt_while_opening_leaves_the_warehouse_to_the_next_writer_here_and_elsewhere(
    where: str, tmp_path: Path, monkeypatch
):
    path = tmp_path / "w.duckdb"
    with _engine(path).transaction() as s:
        s.execute("CREATE TABLE t (x INT)")
    if where == "first_statement_after_connect":  # before: the open connection kept the file from others
        engine = _engine(path, connect=_connect_interrupted_once())
    else:  # where CI's cancelled run was interrupted: connected, the turnstile not yet handed over
        engine = _engine(path)
        monkeypatch.setattr(duckdb_engine.PROCESS_FILES, "hold", _interrupt_before(duckdb_engine.PROCESS_FILES.hold))
    # kept, as Dagster keeps a failed attempt's error (with its traceback's frames) for the retry
    with pytest.raises(Cancelled) as interrupted:
        with engine.transaction() as s:
            s.execute("INSERT INTO t VALUES (0)")
    with engine.transaction() as s:  # the same process writes again (before: waited on its own lock)
        s.execute("INSERT INTO t VALUES (1)")
    other = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS_WRITES, str(path)], capture_output=True, text=True, timeout=60
    )
    assert other.returncode == 0, other.stderr[-2000:]
    assert interrupted.type is Cancelled
    with engine.session(read_only=True) as s:
        assert s.fetchall("SELECT x FROM t ORDER BY x") == [(1,), (2,)]
