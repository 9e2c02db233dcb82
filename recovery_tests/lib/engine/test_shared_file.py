"""One DuckDB file, many users: this package's connections to a file share one configuration
per process (a reader beside a writer in the same process no longer fails with "different
configuration"), a reader joining a writer's instance still cannot write, and this
package's readers queue behind a writer waiting at the file's turnstile."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import duckdb
import pytest

from recovery.lib.engine.base import urgent
from recovery.lib.engine.duckdb_engine import DuckDBEngine, turnstile_path, urgent_path
from recovery.lib.errors import RecoveryError, WarehouseBusyError


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "wh.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (i INTEGER)")
    con.close()
    return path


def test_a_reader_and_a_writer_in_one_process_both_succeed_every_time(db):
    engine = DuckDBEngine(str(db), busy_timeout_s=60)
    writes, reads, errors = 200, [], []
    done = threading.Event()

    def writer():
        try:
            for i in range(writes):
                with engine.transaction() as s:
                    s.execute("INSERT INTO t VALUES (?)", [i])
        except Exception as err:  # noqa: BLE001 - every error is an observation
            errors.append(f"writer: {err!r}")
        finally:
            done.set()

    def reader():
        while not done.is_set():
            try:
                with engine.session(read_only=True) as s:
                    reads.append(s.scalar("SELECT count(*) FROM t"))
            except Exception as err:  # noqa: BLE001
                errors.append(f"reader: {err!r}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    with engine.session(read_only=True) as s:
        assert s.scalar("SELECT count(*) FROM t") == writes
    assert len(reads) > 0 and all(0 <= n <= writes for n in reads)


def test_a_reader_joining_a_writers_instance_reads_but_cannot_write(db):
    engine = DuckDBEngine(str(db), busy_timeout_s=10)
    with engine.transaction() as w:
        w.execute("INSERT INTO t VALUES (1)")
        out = {}

        def read():
            with engine.session(read_only=True) as s:
                out["count"] = s.scalar("SELECT count(*) FROM t")  # the writer's insert is not committed yet
                s.execute("BEGIN TRANSACTION")  # a caller's own snapshot: still read-only
                try:
                    s.execute("INSERT INTO t VALUES (2)")
                except duckdb.Error as err:
                    out["write"] = str(err)
                s.execute("COMMIT")

        t = threading.Thread(target=read)
        t.start()
        t.join(timeout=30)
    assert out["count"] == 0 and "read-only" in out["write"]
    with engine.session(read_only=True) as s:
        assert s.fetchall("SELECT i FROM t") == [(1,)]


def test_a_write_opened_inside_a_read_only_session_of_the_same_thread_fails_at_once(db):
    engine = DuckDBEngine(str(db), busy_timeout_s=300)
    with engine.session(read_only=True):
        with pytest.raises(RecoveryError, match="inside a read-only session"):
            with engine.transaction():
                pass
    with engine.transaction() as s:  # and the slot was released
        s.execute("INSERT INTO t VALUES (3)")


def test_readers_queue_behind_a_writer_holding_the_turnstile_and_never_create_it(db):
    reader = DuckDBEngine(str(db), busy_timeout_s=0.3)
    with reader.session(read_only=True) as s:
        assert s.scalar("SELECT count(*) FROM t") == 0
    assert not Path(turnstile_path(str(db))).exists()  # a reader (validation) writes nothing

    with DuckDBEngine(str(db)).transaction() as s:  # a writer creates it
        s.execute("INSERT INTO t VALUES (1)")
    fd = os.open(turnstile_path(str(db)), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a writer waiting to open the file
        with pytest.raises(WarehouseBusyError, match="turnstile"):
            with reader.session(read_only=True):
                pass
    finally:
        os.close(fd)
    with reader.session(read_only=True) as s:  # the writer is in: readers pass again
        assert s.scalar("SELECT count(*) FROM t") == 1


def test_a_writer_keeps_the_turnstile_until_closed_and_its_own_readers_never_wait_for_it(db):
    """A writer holds the turnstile for its whole session and its close (another process must not
    open the file while this one checkpoints it on close); a reader inside the writer's own
    process joins its instance and never waits."""
    engine = DuckDBEngine(str(db), busy_timeout_s=0.3)
    other = os.open(turnstile_path(str(db)), os.O_RDWR | os.O_CREAT, 0o600)  # another process's writer
    try:
        with engine.transaction() as w:
            w.execute("INSERT INTO t VALUES (5)")
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it would wait for this session
            with engine.session(read_only=True) as s:  # joins this process's instance: no wait
                assert s.scalar("SELECT count(*) FROM t") == 0
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the reader's close kept it held
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # closed: the next writer goes in
    finally:
        os.close(other)


def test_writers_give_way_to_an_urgent_writer_waiting_for_the_turnstile(db):
    """A process writing back to back no longer starves a fence: while an urgent writer holds the
    urgent lane (waiting for the turnstile), other writers do not take the turnstile; an urgent
    writer goes in past a lane it does not hold only when the lane is free, and only it creates the lane."""
    engine = DuckDBEngine(str(db), busy_timeout_s=0.3)
    with engine.transaction() as s:
        s.execute("INSERT INTO t VALUES (1)")
    assert not Path(urgent_path(str(db))).exists()  # ordinary writers never create the lane
    with urgent(), engine.transaction() as s:
        s.execute("INSERT INTO t VALUES (2)")
    assert Path(urgent_path(str(db))).exists()
    lane = os.open(urgent_path(str(db)), os.O_RDWR)
    try:
        fcntl.flock(lane, fcntl.LOCK_EX)  # another process's fence, waiting for the turnstile
        with pytest.raises(WarehouseBusyError, match="turnstile"):
            with engine.transaction() as s:  # an ordinary writer waits behind it
                s.execute("INSERT INTO t VALUES (3)")
        with pytest.raises(WarehouseBusyError, match="turnstile"):
            with urgent(), engine.transaction() as s:  # a second urgent writer queues behind the first
                s.execute("INSERT INTO t VALUES (4)")
        with engine.session(read_only=True) as s:  # readers are not held up by the lane
            assert s.scalar("SELECT count(*) FROM t") == 2
    finally:
        os.close(lane)
    with engine.transaction() as s:  # the fence went in: writers take turns again
        s.execute("INSERT INTO t VALUES (5)")
    with engine.session(read_only=True) as s:
        assert sorted(r[0] for r in s.fetchall("SELECT i FROM t")) == [1, 2, 5]
