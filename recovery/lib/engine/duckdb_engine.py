"""DuckDB, the embedded default.

Hazards designed against (measured in docs/reliability.md):
- one read-write process per file: a second process cannot even open it, so every
  session is short and opening retries with bounded, jittered backoff;
- one configuration per file per process: DuckDB refuses a connection whose
  configuration (read-only flag, memory_limit, threads) differs from an open one
  ("different configuration"), so this process's opens are coordinated
  (:class:`_ProcessFiles`): a reader joins an open read-write instance inside a
  ``READ ONLY`` transaction, a writer waits for this process's readers to close;
- readers must not starve writers: a writer takes the file's turnstile
  (``<file>.turnstile``, an exclusive ``flock``) while it waits to open, and this
  package's readers pass the turnstile before opening, so new readers queue behind a
  waiting writer (in this process and in others);
- a busy writer starves a waiting one: it drops the turnstile and takes it again for its next
  transaction before a poller notices (figures: ``python -m bench fence``, bench/RESULTS.md).
  An urgent writer (the fence,
  :func:`~recovery.lib.engine.base.urgent`) first takes the file's urgent lane
  (``<file>.turnstile.urgent``, an exclusive ``flock``) and holds it until it has the turnstile;
  every writer checks the lane before each try at the turnstile and waits while it is held, so
  the urgent one waits for at most the transaction in progress;
- another process can open the file while a closing writer is still checkpointing it
  (two writer processes alternating under CPU load can lose an acknowledged append,
  or fail with "Could not read enough bytes"): a writer keeps
  the turnstile until this process's last connection to the file has closed, so no
  process of this package opens it during a close;
- replacement scans can resolve an unknown table to a Python variable: disabled on
  every connection;
- after an error inside a transaction every statement fails until ROLLBACK: the
  transaction context always rolls back on error;
- an open costs: 15-35 ms for a file of a few GB (its catalog is read), and a step's checks
  before its work (the spec, the incident, the runbook's order) each opened the file once:
  inside :func:`shared_reads` a thread's read-only sessions share one connection.
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import duckdb

from recovery.lib.engine.base import Engine, RetryableConflict, Session, is_urgent
from recovery.lib.errors import RecoveryError, WarehouseBusyError
from recovery.lib.identifiers import quote, string_literal
from recovery.lib.trace import trace

if TYPE_CHECKING:  # DuckDB loads pyarrow itself when a result is fetched as Arrow
    import pyarrow as pa


def _is_lock_error(err: BaseException) -> bool:
    text = str(err)
    return "Could not set lock" in text or "Conflicting lock" in text or "database is locked" in text


def _is_config_clash(err: BaseException) -> bool:
    return "different configuration" in str(err)


def _is_conflict(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, duckdb.TransactionException) or "Conflict" in text or "conflict" in text


class _EngineClock:
    """Seconds this process spent waiting on DuckDB statements (what a benchmark calls engine time)."""

    def __init__(self) -> None:
        self.total = 0.0

    @contextmanager
    def timing(self, sql: str = "", kind: str = "sql") -> Iterator[None]:
        """Time a statement (``kind`` "sql"), or opening or closing a connection ("connect",
        "close": DuckDB loads the catalog, and a writer's close checkpoints its log into the file)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self.total += took
            trace(kind, took, sql)


ENGINE_SECONDS = _EngineClock()


class _ProcessFiles:
    """This process's open connections per database file, so every connection to a file
    has the configuration of those already open (DuckDB refuses another).

    A read-only open joins an open read-write instance (the session then runs in a
    ``READ ONLY`` transaction); a read-write open waits until this process's read-only
    connections are closed, and while a writer waits, new readers wait behind it
    (writer preference: a polling reader thread cannot starve publish)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.files: dict[str, dict] = {}
        self.local = threading.local()  # read-only slots this thread holds, per file

    def acquire(self, path: str, read_only: bool, config: tuple, deadline: float) -> tuple[bool, bool]:
        """Claim a slot; returns (open read-write, joins an instance this process already has open)."""
        held = getattr(self.local, "ro", None)
        if held is None:
            held = self.local.ro = {}
        if not read_only and held.get(path):
            raise RecoveryError(
                f"a write to {path} was opened inside a read-only session of the same thread; "
                f"close the session first (it would wait for itself)"
            )
        with self.cond:
            st = self.files.setdefault(path, {"rw": None, "config": None, "n": 0, "writers": 0})
            if not read_only:
                st["writers"] += 1
            try:
                while True:
                    same = st["n"] == 0 or st["config"] == config
                    joined = st["n"] > 0
                    if read_only and same and st["n"] and st["rw"]:
                        st["n"] += 1
                        return True, True
                    if read_only and same and not st["writers"] and not st["rw"]:
                        st.update(rw=False, config=config, n=st["n"] + 1)
                        held[path] = held.get(path, 0) + 1
                        return False, joined
                    if not read_only and (st["n"] == 0 or (same and st["rw"])):
                        st.update(rw=True, config=config, n=st["n"] + 1)
                        return True, joined
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WarehouseBusyError(
                            f"warehouse {path} stayed in use by this process with another access "
                            f"mode or configuration; retry when its other work finishes"
                        )
                    self.cond.wait(min(left, 0.25))
            finally:
                if not read_only:
                    st["writers"] -= 1

    def hold(self, path: str, fd: int) -> None:
        """Keep the turnstile ``fd`` until this process's last connection to ``path`` closes."""
        with self.cond:
            self.files[path]["turnstile"] = fd

    def holds(self, path: str, fd: int) -> bool:
        with self.cond:
            return self.files.get(path, {}).get("turnstile") == fd

    def release(self, path: str, *, read_only_slot: bool = False) -> None:
        """Drop a slot; called after its connection closed, so the last one drops the turnstile
        only once the instance (and its checkpoint on close) is gone."""
        if read_only_slot:
            self.local.ro[path] -= 1
        with self.cond:
            st = self.files[path]
            st["n"] -= 1
            if st["n"] == 0:
                fd = st.pop("turnstile", None)
                if fd is not None:
                    os.close(fd)  # drops the flock
                st.update(rw=None, config=None)
            self.cond.notify_all()


PROCESS_FILES = _ProcessFiles()


def turnstile_path(location: str) -> str:
    return location + ".turnstile"


def urgent_path(location: str) -> str:
    return turnstile_path(location) + ".urgent"


def _lane_taken(lane: int | None) -> bool:
    """Whether an urgent writer holds the lane (a shared lock cannot be had while it does)."""
    if lane is None:
        return False
    try:
        fcntl.flock(lane, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(lane, fcntl.LOCK_UN)
    return False


def _take_turnstile(location: str, *, writer: bool, deadline: float) -> int | None:
    """Writers take the file's turnstile before they open (and keep it, see :meth:`_ProcessFiles.hold`);
    this package's readers pass it (take and drop it) before opening, so they queue behind a
    waiting or working writer. Readers never create the file: validation must write nothing.
    An urgent writer (:func:`~recovery.lib.engine.base.urgent`) holds the urgent lane while it
    waits; other writers do not try the turnstile while the lane is held (module docstring).
    Returns the open descriptor (``None`` where there is no turnstile to take)."""
    path = turnstile_path(location)
    try:
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if writer else os.O_RDONLY, 0o600)
    except OSError:
        return None  # no turnstile yet (no writer ever ran) or a read-only directory: nothing to queue behind
    lane: int | None = None
    urgent = writer and is_urgent()
    try:
        if writer:
            try:  # only an urgent writer creates the lane; without it there is nothing to give way to
                lane = os.open(urgent_path(location), (os.O_RDWR | os.O_CREAT) if urgent else os.O_RDONLY, 0o600)
            except OSError:
                lane = None
        if urgent and lane is not None:  # urgent writers queue among themselves on the lane
            while not _took(lane):
                _wait_a_moment(location, deadline)
        while (not urgent and _lane_taken(lane)) or not _took(fd):
            _wait_a_moment(location, deadline)
        if not writer:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return fd
    except BaseException:  # an interrupt included: a lost descriptor would keep the lock
        os.close(fd)
        raise
    finally:
        if lane is not None:
            os.close(lane)  # drops the lane (an urgent writer has the turnstile now)


def _took(fd: int) -> bool:
    """Whether this process now holds the exclusive lock of ``fd`` (never waits)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _wait_a_moment(location: str, deadline: float) -> None:
    """A few milliseconds before the next try, jittered; past ``deadline``, :func:`_busy` raises."""
    _busy(location, deadline)
    time.sleep(0.002 + random.random() * 0.003)


def _busy(location: str, deadline: float) -> None:
    if time.monotonic() >= deadline:
        raise WarehouseBusyError(
            f"warehouse {location}: a writer held its turnstile past the busy timeout; "
            f"retry when the other job finishes"
        ) from None


def fetch_row(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None) -> tuple:
    """The row of a statement that always returns one, on a raw connection: none is a ``RecoveryError``."""
    row = conn.execute(sql, params or []).fetchone()
    if row is None:
        raise RecoveryError(f"expected one row, got none from: {sql[:200]}")
    return row


class _SharedReads(threading.local):
    """This thread's :func:`shared_reads` depth and the read-only connections it keeps open, per
    (file, configuration): each with the stack that closes it and releases its slot."""

    def __init__(self) -> None:
        self.depth = 0
        self.open: dict[tuple[str, tuple], tuple[ExitStack, duckdb.DuckDBPyConnection]] = {}
        self.in_use: set[tuple[str, tuple]] = set()  # a session is reading through it now

    def drop(self, path: str | None = None) -> None:
        """Close the kept connections not in use (to ``path`` only, when given)."""
        for key in [k for k in self.open if (path is None or k[0] == path) and k not in self.in_use]:
            stack, _ = self.open.pop(key)
            stack.close()


_SHARED = _SharedReads()


@contextmanager
def shared_reads() -> Iterator[None]:
    """Inside it, this thread's read-only sessions of a DuckDB file share one connection, opened by
    the first and closed when the outermost ``shared_reads`` ends.

    For a run of short reads in a row (a step's checks of its spec, incident and the runbook's
    order): each would otherwise open and close the file. What a session leaves is checked when it
    ends: one that raised, left a transaction open or made a temporary object closes the
    connection, so the next session starts clean. A write to the file from this thread closes its
    kept connection first (a writer waits for this process's readers). Other processes cannot
    write the file while the connection is open, as during any read-only session: keep the block to
    reads that follow each other."""
    _SHARED.depth += 1
    try:
        yield
    finally:
        _SHARED.depth -= 1
        if _SHARED.depth == 0:
            _SHARED.drop()


def _left_clean(conn: duckdb.DuckDBPyConnection) -> bool:
    """No transaction open and no temporary table or view: the next session may use ``conn``."""
    try:
        conn.execute("BEGIN TRANSACTION")  # fails inside an open (or aborted) transaction
        conn.execute("ROLLBACK")
        row = conn.execute(
            "SELECT (SELECT count(*) FROM duckdb_tables() WHERE temporary) "
            "+ (SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal)"
        ).fetchone()
    except duckdb.Error:
        return False
    return row is not None and row[0] == 0


class DuckDBSession(Session):
    dialect = "duckdb"

    def __init__(self, conn: duckdb.DuckDBPyConnection, *, read_only_txn: bool = False):
        self.conn = conn
        self.read_only_txn = read_only_txn  # a reader sharing this process's read-write instance

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        if self.read_only_txn and sql.strip().upper().rstrip(";") in ("BEGIN", "BEGIN TRANSACTION", "COMMIT"):
            return  # already inside its READ ONLY transaction (one snapshot), ended when the session closes
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

    @contextmanager
    def joins_as_written(self) -> Iterator[None]:
        """DuckDB builds a hash join on whichever input it estimates smaller. Joining wide rows to a
        narrow index of as many keys, it may build the wide rows, the larger hash table; within this
        block the build side is the one the SQL names (the narrow index)."""
        before = str(fetch_row(self.conn, "SELECT current_setting('disabled_optimizers')")[0])
        off = ",".join([*filter(None, before.split(",")), "build_side_probe_side"])
        self.conn.execute(f"SET disabled_optimizers = {string_literal(off)}")
        try:
            yield
        finally:
            self.conn.execute(f"SET disabled_optimizers = {string_literal(before)}")

    def has_temp(self, name: str) -> bool:
        rows = self.conn.execute("SELECT 1 FROM duckdb_tables() WHERE temporary AND table_name = ?", [name]).fetchall()
        return bool(rows)

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

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"python_enable_replacements": False}
        if self.memory_limit:
            config["memory_limit"] = self.memory_limit
        if self.threads:
            config["threads"] = self.threads
        return config

    def _open_as(self, read_only: bool, want_read_only: bool, *, joined: bool = False) -> duckdb.DuckDBPyConnection:
        """Open a connection with the process's configuration for this file, retrying lock and
        configuration clashes with bounded, jittered backoff (see the module docstring)."""
        config = self._config()
        key = os.path.realpath(self.location)
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005 if not want_read_only else 0.02
        fd: int | None = None
        conn: duckdb.DuckDBPyConnection | None = None
        # Everything from taking the turnstile to handing it to PROCESS_FILES sits in one try: a
        # run's cancellation raises an interrupt at any bytecode, and a turnstile descriptor lost
        # on the way keeps its flock for the process's life: the process's next writer then waits
        # on its own lock (flocks of two descriptors conflict) and every other process on it, until
        # its busy timeout.
        try:
            # joining an instance this process already holds takes no file lock: no turnstile (a
            # reader inside its own process's write must never wait for another process's writer)
            fd = None if joined else _take_turnstile(self.location, writer=not want_read_only, deadline=deadline)
            while True:
                try:
                    with ENGINE_SECONDS.timing(self.location, kind="connect"):
                        conn = self._connect(database=self.location, read_only=read_only, config=config)
                    conn.execute("SET python_enable_replacements = false")
                    break
                except (duckdb.IOException, duckdb.ConnectionException) as err:
                    conn = None
                    retry = _is_lock_error(err) or _is_config_clash(err)
                    if not retry or time.monotonic() >= deadline:
                        if retry:
                            raise WarehouseBusyError(
                                f"warehouse {self.location} stayed locked by another process for "
                                f"{self.busy_timeout_s:.0f}s; retry when the other job finishes"
                            ) from err
                        raise
                    time.sleep(delay * (0.5 + random.random()))
                    # a writer holding the turnstile only waits for readers already in: poll it tightly
                    delay = min(delay * 1.6, 1.0 if want_read_only else 0.05)
            if fd is not None and not want_read_only:
                PROCESS_FILES.hold(key, fd)  # from here PROCESS_FILES closes it
        except BaseException:
            if fd is not None and not PROCESS_FILES.holds(key, fd):
                os.close(fd)
            if conn is not None:
                conn.close()
            raise
        if fd is not None and want_read_only:
            os.close(fd)  # a reader only passes the turnstile (already unlocked)
        return conn

    @contextmanager
    def _connection(self, read_only: bool) -> Iterator[tuple[duckdb.DuckDBPyConnection, bool]]:
        key = os.path.realpath(self.location)
        if not read_only:  # a kept reader of this thread would make the writer wait for itself (one in
            _SHARED.drop(key)  # use stays: the write inside a read-only session is refused below, as ever
        deadline = time.monotonic() + self.busy_timeout_s
        shared_rw, joined = PROCESS_FILES.acquire(key, read_only, tuple(sorted(self._config().items())), deadline)
        ro_slot = read_only and not shared_rw
        try:
            conn = self._open_as(ro_slot, read_only, joined=joined)
        except BaseException:
            PROCESS_FILES.release(key, read_only_slot=ro_slot)
            raise
        try:
            yield conn, read_only and shared_rw
        finally:
            try:
                with ENGINE_SECONDS.timing(self.location, kind="close"):
                    conn.close()
            finally:
                PROCESS_FILES.release(key, read_only_slot=ro_slot)

    @contextmanager
    def session(self, read_only: bool = False) -> Iterator[DuckDBSession]:
        key = (os.path.realpath(self.location), tuple(sorted(self._config().items())))
        # a session inside another on the kept connection opens its own, as outside shared_reads
        kept = self._kept_reader(key) if read_only and _SHARED.depth and key not in _SHARED.in_use else None
        if kept is not None:
            clean = False
            _SHARED.in_use.add(key)
            try:
                yield DuckDBSession(kept)
                clean = _left_clean(kept)
            finally:
                _SHARED.in_use.discard(key)
                if not clean:
                    _SHARED.drop(key[0])
            return
        with self._connection(read_only) as (conn, joined):
            if joined:
                conn.execute("BEGIN TRANSACTION READ ONLY")
            yield DuckDBSession(conn, read_only_txn=joined)

    def _kept_reader(self, key: tuple[str, tuple]) -> duckdb.DuckDBPyConnection | None:
        """This thread's kept read-only connection to the file with this configuration (``key``;
        :func:`shared_reads`), opened now if none is; None where a read joins this process's open
        writer (each such session has its own ``READ ONLY`` transaction, as outside ``shared_reads``)."""
        if key in _SHARED.open:
            return _SHARED.open[key][1]
        _SHARED.drop(key[0])  # another configuration's reader of the same file
        stack = ExitStack()
        conn, joined = stack.enter_context(self._connection(True))
        if joined:
            stack.close()
            return None
        _SHARED.open[key] = (stack, conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[DuckDBSession]:
        with self._connection(False) as (conn, _):
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

    def qualified(self, schema: str, name: str) -> str:
        return f"{quote(schema)}.{quote(name)}"


def duckdb_connection(s: Session) -> duckdb.DuckDBPyConnection:
    """The DuckDB connection under a session, for the paths that need DuckDB itself (GE's SQL
    datasource, the IO manager's type handlers): a DuckDB session's own; on another engine, the
    DuckDB control store's, which sees no data relation. Not part of :class:`Session`."""
    if isinstance(s, DuckDBSession):
        return s.conn
    control = getattr(s, "control", None)
    if isinstance(control, DuckDBSession):
        return control.conn
    raise RecoveryError(f"a {type(s).__name__} has no DuckDB connection; this path runs on DuckDB only")
