"""Engine interface: sessions that run SQL, and transactions that either all land or none."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import TableName, quote, quote_all

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa


_URGENT: ContextVar[bool] = ContextVar("recovery_urgent_write", default=False)


@contextmanager
def urgent() -> Iterator[None]:
    """Transactions opened inside go first: an engine that queues writers (DuckDB's turnstile) lets
    them ahead of other processes' next writes. For the fence, which must land while a backfill
    or ingestion keeps writing; anything else waits its turn."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


def is_urgent() -> bool:
    return _URGENT.get()


class Session(ABC):
    """One connection's worth of work. Statements run in the session's transaction, if any."""

    dialect: str
    # the DuckDB connection under the session (Spark: its control store's), for the DuckDB-only
    # paths: GE's SQL datasource, the IO manager's type handlers
    conn: duckdb.DuckDBPyConnection

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None: ...

    @abstractmethod
    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]: ...

    @abstractmethod
    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table: ...

    def fetchone(self, sql: str, params: Sequence[Any] | None = None) -> tuple | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None

    def fetchrow(self, sql: str, params: Sequence[Any] | None = None) -> tuple:
        """The row of a statement that always returns one (an aggregate without GROUP BY, a COPY's count)."""
        row = self.fetchone(sql, params)
        if row is None:
            raise RecoveryError(f"expected one row, got none from: {sql[:200]}")
        return row

    def scalar(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        row = self.fetchone(sql, params)
        return None if row is None else row[0]

    @abstractmethod
    def arrow_batches(self, sql: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Stream a query's result in record batches of at most ``batch_rows`` rows (bounded memory)."""

    @abstractmethod
    def columns(self, table_sql: str) -> list[tuple[str, str]]:
        """(name, type) of a table or view, in order; [] if it does not exist."""

    @abstractmethod
    def relation_columns(self, select_sql: str) -> list[tuple[str, str]]:
        """(name, type) of a SELECT without running it over the data."""

    @abstractmethod
    def object_kind(self, schema: str, name: str) -> str | None:
        """'table', 'view' or None."""

    def joins_as_written(self) -> AbstractContextManager[None]:
        """Within it, each hash join builds on the side its SQL puts on the right (where the engine
        lets a caller say so; elsewhere the engine plans as usual)."""
        return nullcontext()

    # ---- write primitives (ADR 0001): what a phase asks for, each engine doing it natively ----
    def replace_rows(
        self,
        table_sql: str,
        columns: Sequence[str],
        *,
        remove: str | None = None,
        insert: str | None = None,
        params: Sequence[Any] | None = None,
    ) -> None:
        """One change to a table: drop the rows the predicate ``remove`` matches, then add the rows of
        the SELECT ``insert`` (``params`` are its parameters), which gives ``columns`` in order.

        The writer's four modes are this with one side or both (append: ``insert`` only;
        delete_keys: ``remove`` only). A phase asks for the change rather than writing DML, so an
        engine without in-place DML (Spark on Parquet) makes it one new version of the table
        instead of parsing DuckDB's ``DELETE``/``INSERT`` back. Here: those two statements, in the
        caller's transaction. A row whose ``remove`` predicate is NULL is kept (SQL's ``WHERE``).
        """
        if remove is not None:
            self.execute(f"DELETE FROM {table_sql} WHERE {remove}")
        if insert is not None:
            self.execute(f"INSERT INTO {table_sql} ({quote_all(list(columns))}) {insert}", params)

    def adopt_table(self, table: TableName, namespace: str, add_columns: Sequence[tuple[str, str]] = ()) -> None:
        """Adoption's move, in the caller's transaction: the plain table ``table`` (another tool wrote
        it) becomes the table ``namespace`` of the same schema, its data as it is, and gains each
        (name, type) of ``add_columns``, NULL in every row. Nothing is left at ``table``: the caller
        points the public name at the namespace (:meth:`swap_pointer`) in the same transaction.
        Here: DuckDB's ``ALTER TABLE ... RENAME`` and ``ADD COLUMN``; Spark moves its catalog row."""
        self.execute(f"ALTER TABLE {table.sql()} RENAME TO {quote(namespace)}")
        for col, typ in add_columns:
            self.execute(f"ALTER TABLE {table.with_name(namespace).sql()} ADD COLUMN {quote(col)} {typ}")

    def release_table(self, public: TableName) -> None:
        """``release``'s move, in the caller's transaction: the managed view ``public`` becomes a plain
        table of the same name holding the rows the view shows now. Here: a staging table built from
        the view, the view dropped, the staging table renamed."""
        staging = public.with_name(f"{public.name}__released")
        self.execute(f"DROP TABLE IF EXISTS {staging.sql()}")
        self.execute(f"CREATE TABLE {staging.sql()} AS SELECT * FROM {public.sql()}")
        self.execute(f"DROP VIEW {public.sql()}")
        self.execute(f"ALTER TABLE {staging.sql()} RENAME TO {quote(public.name)}")

    def quantile_sql(self, value_sql: str, q: float) -> str:
        """The SQL of the continuous (interpolated) ``q`` quantile of ``value_sql``, an aggregate over
        data relations, for the statements this session runs. DuckDB: ``quantile_cont``."""
        return f"quantile_cont({value_sql}, {float(q)!r})"

    def mean_text_bytes(self, table_sql: str, columns: Sequence[str], sample_rows: int = 10_000) -> float:
        """Sum over ``columns`` (text) of their mean length in bytes, over a sample of about
        ``sample_rows`` rows: a size estimate (the backfill preview's bytes per row), not an answer.
        Here: DuckDB's reservoir sample; an engine without ``USING SAMPLE`` samples its own way."""
        if not columns:
            return 0.0
        avg = self.scalar(
            f"SELECT {' + '.join(f'coalesce(avg(strlen({quote(c)})), 0)' for c in columns)} "
            f"FROM (SELECT * FROM {table_sql} USING SAMPLE {int(sample_rows)} ROWS)"
        )
        return float(avg or 0)

    def swap_pointer(self, view_sql: str, select_sql: str) -> None:
        """Point the public name ``view_sql`` at ``select_sql`` (a namespace's columns), in the caller's
        transaction: the one change that publishes a namespace or rolls back to one."""
        self.execute(f"CREATE OR REPLACE VIEW {view_sql} AS {select_sql}")


class Engine(ABC):
    """A warehouse. ``session()`` reads; ``transaction()`` writes atomically."""

    dialect: str
    location: str
    busy_timeout_s: float  # how long opening the (control-plane) DuckDB file retries a lock

    @abstractmethod
    def session(self, read_only: bool = False) -> AbstractContextManager[Session]: ...

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Session]:
        """A read-write session inside one transaction: commit on exit, roll back on error.

        Write-write conflicts and lock contention surface as
        :class:`recovery.lib.engine.base.RetryableConflict` so callers can retry
        the whole transaction.
        """


class RetryableConflict(Exception):
    """The transaction lost a race (write-write conflict or lock); retrying it is safe."""
