"""A step's checks read the warehouse one after another: inside ``shared_reads`` they share one
read-only connection, and nothing one session leaves (a transaction, a temporary view, an error)
reaches the next; a write from the same thread still goes through, and the file is free for
other processes once the block ends."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

from recovery.lib.engine import shared_reads
from recovery.lib.engine.duckdb_engine import DuckDBEngine


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "wh.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(10)")
    con.close()
    return path


class Opens:
    """``duckdb.connect`` counted: the engine's ``connect`` hook."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, **kwargs):
        self.n += 1
        return duckdb.connect(**kwargs)


def engine_of(db: Path, opens: Opens) -> DuckDBEngine:
    return DuckDBEngine(str(db), busy_timeout_s=10, connect=opens)


def test_reads_in_a_row_share_one_open_and_the_block_closes_it(db):
    opens = Opens()
    with shared_reads():
        for _ in range(5):  # a new engine each time, as each check opens its own
            with engine_of(db, opens).session(read_only=True) as s:
                assert s.scalar("SELECT count(*) FROM t") == 10
    assert opens.n == 1
    for _ in range(2):
        with engine_of(db, opens).session(read_only=True) as s:
            s.scalar("SELECT 1")
    assert opens.n == 3  # outside the block, one open per session again
    # closed: another process can write the file
    code = f"import duckdb; c = duckdb.connect({str(db)!r}); c.execute('INSERT INTO t VALUES (99)'); c.close()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    "leftover",
    [
        "CREATE TEMP VIEW v AS SELECT 1 AS x",
        "CREATE TEMP TABLE tt AS SELECT 1 AS x",
        "BEGIN TRANSACTION",
    ],
)
def test_what_a_session_leaves_does_not_reach_the_next(db, leftover):
    opens = Opens()
    with shared_reads():
        with engine_of(db, opens).session(read_only=True) as s:
            s.execute(leftover)
        with engine_of(db, opens).session(read_only=True) as s:
            s.execute(leftover)  # would fail on the same connection: already exists / within a transaction
            s.execute("SELECT 1")
    assert opens.n == 2


def test_a_session_that_raised_gives_the_next_a_new_connection(db):
    opens = Opens()
    with shared_reads():
        with pytest.raises(duckdb.Error):
            with engine_of(db, opens).session(read_only=True) as s:
                s.execute("BEGIN TRANSACTION")
                s.execute("SELECT * FROM no_such_table")  # the transaction is aborted
        with engine_of(db, opens).session(read_only=True) as s:
            assert s.scalar("SELECT count(*) FROM t") == 10
    assert opens.n == 2


def test_a_write_inside_the_block_goes_through_and_the_next_read_sees_it(db):
    opens = Opens()
    engine = engine_of(db, opens)
    done = threading.Event()

    def write_then_read() -> None:
        with shared_reads():
            with engine.session(read_only=True) as s:
                assert s.scalar("SELECT count(*) FROM t") == 10
            with engine.transaction() as s:  # would wait for its own thread's reader
                s.execute("INSERT INTO t VALUES (10)")
            with engine.session(read_only=True) as s:
                assert s.scalar("SELECT count(*) FROM t") == 11
        done.set()

    worker = threading.Thread(target=write_then_read, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set(), "the write waited for the thread's own kept reader"
    assert opens.n == 3


def test_a_read_inside_a_write_of_the_process_is_not_kept(db):
    """A read joining this process's open writer runs in its own READ ONLY transaction; keeping that
    connection would keep the writer's instance open past its transaction."""
    opens = Opens()
    engine = engine_of(db, opens)
    with shared_reads(), engine.transaction() as w:
        w.execute("INSERT INTO t VALUES (10)")
        with engine.session(read_only=True) as s:
            assert s.scalar("SELECT count(*) FROM t") >= 10
    with engine.transaction() as w:  # nothing of the process still holds the file
        w.execute("INSERT INTO t VALUES (11)")
    with engine.session(read_only=True) as s:
        assert s.scalar("SELECT count(*) FROM t") == 12


def test_a_session_inside_another_has_its_own_connection_and_a_write_inside_one_is_refused(db):
    """Nesting keeps the meaning it has outside ``shared_reads``: the inner read does not end the
    outer one's transaction, and a write opened inside a read-only session is refused, not let
    through by closing the reader under it."""
    from recovery.lib.errors import RecoveryError

    opens = Opens()
    engine = engine_of(db, opens)
    with shared_reads():
        with engine.session(read_only=True) as outer:
            outer.execute("BEGIN TRANSACTION")
            with engine.session(read_only=True) as inner:
                assert inner.scalar("SELECT count(*) FROM t") == 10
            assert outer.scalar("SELECT count(*) FROM t") == 10  # its transaction and connection live on
            outer.execute("COMMIT")
            with pytest.raises(RecoveryError, match="inside a read-only session of the same thread"):
                with engine.transaction():
                    pass
            assert outer.scalar("SELECT count(*) FROM t") == 10
    assert opens.n == 2
