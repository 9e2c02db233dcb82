"""Dagster's SQLite storages, with one pooled SQLAlchemy engine per database file in this process.

Dagster's default (SQLite) instance builds a new SQLAlchemy engine and opens a new
connection for every statement it stores: per event, one for the run's own file and
one for ``index.db``. A recovery stores a planned and a materialized event per partition
of each ranged run, so that churn is paid per partition, many times over. Here the three SQLite storages
(runs, event log, schedules) get their engine from a small cache instead: one engine
per file, keeping its connections open between statements.

What stays as Dagster has it: every statement still runs in its own transaction (SQLite
in WAL mode, as Dagster sets it, so other processes, the daemon and the webserver,
read and write the same files as before); only this process reuses its connections.
One setting differs: the pooled connections commit with ``synchronous=NORMAL`` instead of
SQLite's ``FULL``, so a commit in WAL mode does not wait for the disk (an event stored on
its own is a commit to the run's file and one to ``index.db``). SQLite's documented
trade-off: the database stays consistent whatever happens; a power loss or OS crash (not
a process crash) may lose the last commits. A new file is put in WAL mode (Dagster's mode for
all its files) before Dagster creates its tables rather than just after, so its first commits
do not wait for the disk either. Dagster's files are the run history; the
recovery's own ledger is in the warehouse's control plane. ``RECOVERY_SQLITE_SYNC=full``
keeps ``FULL``.
Safeguards a long-lived process (a test session, a notebook, a code server) needs:

- a file that was deleted or replaced since its engine was made (a wiped or re-created
  instance at the same path) gets a new engine, never the old file's open handle;
- a forked child never uses its parent's connections (the cache is per process id);
- at most ``MAX_ENGINES`` files keep an engine (one per run for the run shards), the
  least recently used is disposed, so open files stay bounded.

A run's planned events (one per partition of a ranged run, written when the run is
created) and a step's materializations per partition are events Dagster sends as one batch
(``DagsterEventBatchMetadata``); its SQLite event storage stores a batch one event, one
transaction, at a time. Here such a batch is stored in one transaction per file (the run's
own, ``index.db``): the same rows, written together, seen by other processes at once. A
batch that fails is rolled back and Dagster stores its events one by one, as it does for
every storage whose batch write fails.

Each storage checks a file's schema revision against the head of Dagster's migration
scripts when it first opens it (every new run has a file of its own); the head is read from
the scripts once per process here rather than at each check.

Installed when ``recovery.orchestration`` is imported (the CLI, the code location and
the tests all import it); other instances (Postgres) are untouched. ``RECOVERY_SQLITE_POOL=off``
leaves Dagster as it ships (to compare, or should a Dagster release disagree with it).
If a Dagster release stops looking up ``create_engine`` in those modules, that module is
left as shipped and ``recovery_tests/orchestration/test_dagster_sqlite.py`` fails, so the hook is
re-examined then.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import sqlalchemy
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import QueuePool

MAX_ENGINES = 16
MAX_BATCH = 1000
"""The most events of one batch stored in one transaction per file (Dagster sends the rest as the next)."""
STORAGE_MODULES = (
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
)
_create_engine = sqlalchemy.create_engine


@dataclass
class _Cached:
    engine: Engine
    identity: tuple[int, int] | None  # (device, inode) of the file once it exists


class EngineCache:
    """Pooled engines by SQLite file, least recently used first."""

    def __init__(self, max_engines: int = MAX_ENGINES):
        self.max_engines = max_engines
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._engines: OrderedDict[str, _Cached] = OrderedDict()

    def __len__(self) -> int:
        return len(self._engines)

    def create_engine(self, url: Any, **kwargs: Any) -> Engine:
        """``sqlalchemy.create_engine`` as Dagster's SQLite storages call it; pooled for a file."""
        path = _sqlite_file(url)
        if path is None:
            return _create_engine(url, **kwargs)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's connections are not ours
                self._engines.clear()
                self._pid = os.getpid()
            identity = _identity(path)
            cached = self._engines.get(path)
            if cached is not None and cached.identity is not None and cached.identity != identity:
                self._engines.pop(path)
                _dispose(cached.engine)  # the file was deleted or replaced: never write to the old one
                cached = None
            if cached is None:
                cached = _Cached(self._pooled(url, kwargs), identity)
                self._engines[path] = cached
                while len(self._engines) > self.max_engines:
                    _, oldest = self._engines.popitem(last=False)
                    _dispose(oldest.engine)
            elif cached.identity is None:
                cached.identity = identity
            self._engines.move_to_end(path)
            return cached.engine

    def dispose_all(self) -> None:
        """Close every pooled connection (a process about to end: each file's last close checkpoints it)."""
        with self._lock:
            engines = [c.engine for c in self._engines.values()] if self._pid == os.getpid() else []
            self._engines.clear()
        for engine in engines:
            _dispose(engine)

    @staticmethod
    def _pooled(url: Any, kwargs: dict[str, Any]) -> Engine:
        kwargs = {k: v for k, v in kwargs.items() if k != "poolclass"}
        engine = _create_engine(url, poolclass=QueuePool, pool_size=1, max_overflow=8, **kwargs)
        if _synchronous() != "FULL":
            sqlalchemy.event.listen(engine, "connect", _set_synchronous)
        # Dagster disposes its per-statement engine after each use; this one outlives the statement
        engine.dispose = lambda *args, **kw: None  # type: ignore[method-assign]
        return engine


def _synchronous() -> str:
    """``NORMAL`` unless ``RECOVERY_SQLITE_SYNC=full``."""
    return "FULL" if os.environ.get("RECOVERY_SQLITE_SYNC", "").lower() == "full" else "NORMAL"


def _set_synchronous(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA synchronous={_synchronous()}")
        # Dagster puts every one of its files in WAL mode once it has created their tables (a
        # new run's file: about twenty statements, each its own commit); a new file is put in
        # WAL mode first, so those commits, too, do not wait for the disk
        if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            cursor.execute("PRAGMA journal_mode=WAL")
    finally:
        cursor.close()


def _sqlite_file(url: Any) -> str | None:
    parsed = make_url(str(url))
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return os.path.abspath(parsed.database)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _dispose(engine: Engine) -> None:
    Engine.dispose(engine)


ENGINES = EngineCache()


def install() -> None:
    """Route Dagster's SQLite storages through ``ENGINES`` and store an event batch in one
    transaction per file (idempotent)."""
    import importlib

    if os.environ.get("RECOVERY_SQLITE_POOL", "").lower() in ("off", "0", "false", "no"):
        return
    for name in STORAGE_MODULES:
        module = importlib.import_module(name)
        # a Dagster release that builds its engines another way keeps its own (slower, correct)
        # behaviour rather than failing every command at import; the test says so
        if hasattr(module, "create_engine"):
            module.create_engine = ENGINES.create_engine  # type: ignore[attr-defined]
        if hasattr(module, "check_alembic_revision"):
            module.check_alembic_revision = check_alembic_revision  # type: ignore[attr-defined]
    _install_event_batches()


def check_alembic_revision(alembic_config: Any, conn: Any) -> tuple[str | None, str | None]:
    """Dagster's ``check_alembic_revision`` (the file's schema revision and the installed
    migrations' head), with the head read once per process: Dagster reads every migration
    script again for each file it opens (each storage, each new run's file), and the
    installed scripts do not change while a process runs."""
    from alembic.runtime.migration import MigrationContext
    from dagster._core.storage import sql

    with sql._alembic_lock:
        db_revision = MigrationContext.configure(conn).get_current_revision()
    return db_revision, _head_revision(alembic_config)


@lru_cache(maxsize=8)
def _head_revision(alembic_config: Any) -> str | None:
    """The head of the migration scripts of one of Dagster's storages (its alembic configuration,
    one object per storage module: ``get_alembic_config`` is cached)."""
    from alembic.script import ScriptDirectory
    from dagster._core.storage import sql

    with sql._alembic_lock:
        head = ScriptDirectory.from_config(alembic_config).as_revision_number("head")
    return head if isinstance(head, str) or head is None else str(head)


@dataclass
class _Batch:
    """The connections of one event batch being stored, each in its open transaction, by shard."""

    storage: Any
    connections: dict[str, Any] = field(default_factory=dict)


_BATCH = threading.local()


def _install_event_batches() -> None:
    from dagster._core.instance.methods.event_methods import EventMethods
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    if getattr(SqliteEventLogStorage, "_recovery_batches", False):
        return
    shipped_connect = SqliteEventLogStorage._connect
    shipped_size = EventMethods._get_event_batch_size

    def batch_size(self: Any) -> int:
        """Dagster's (``DAGSTER_EVENT_BATCH_SIZE``, 0 by default) or, for a SQLite event storage, ``MAX_BATCH``."""
        size = shipped_size(self)
        return size or (MAX_BATCH if isinstance(self._event_storage_impl, SqliteEventLogStorage) else 0)

    @contextmanager
    def connect(self: Any, shard: str) -> Iterator[Any]:
        batch = getattr(_BATCH, "open", None)
        if batch is None or batch.storage is not self:
            with shipped_connect(self, shard) as conn:
                yield conn
            return
        conn = batch.connections.get(shard)
        if conn is None:
            conn = batch.connections[shard] = _begin(self, shard)
        yield conn

    def store_event_batch(self: Any, events: Sequence[Any]) -> None:
        if len(events) < 2 or getattr(_BATCH, "open", None) is not None:
            for event in events:
                self.store_event(event)
            return
        batch = _BATCH.open = _Batch(self)
        try:
            for event in events:
                self.store_event(event)
            for conn in batch.connections.values():  # the run's file first, then index.db, as store_event writes
                conn.commit()
        except BaseException:
            for conn in batch.connections.values():
                conn.rollback()
            raise
        finally:
            _BATCH.open = None
            for conn in batch.connections.values():
                conn.close()

    SqliteEventLogStorage._connect = connect  # type: ignore[method-assign]
    SqliteEventLogStorage.store_event_batch = store_event_batch  # type: ignore[method-assign]
    EventMethods._get_event_batch_size = batch_size  # type: ignore[method-assign]
    SqliteEventLogStorage._recovery_batches = True  # type: ignore[attr-defined]


def _begin(storage: Any, shard: str) -> Any:
    """A connection to ``shard`` in an open transaction, made as Dagster's ``_connect`` makes it."""
    from dagster._core.storage.event_log.sqlite import sqlite_event_log
    from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
    from sqlalchemy.pool import NullPool

    with storage._db_lock:
        engine = sqlite_event_log.create_engine(
            storage.conn_string_for_shard(shard),
            poolclass=NullPool,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
        )
        if shard not in storage._initialized_dbs:
            storage._initdb(engine)
            storage._initialized_dbs.add(shard)
    conn = engine.connect()
    conn.begin()
    return conn
