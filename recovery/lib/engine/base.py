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
    """One connection's worth of work. Statements run in the session's transaction, if any.

    **Dialect.** Every SQL text a session takes (``execute``, ``fetchall``, ``arrow``, the SELECTs
    and predicates handed to the write operations) is DuckDB SQL with ``?`` parameters, whatever
    the engine: ``dialect`` is ``"duckdb"`` on every session. DuckDB runs it as it is. Spark binds the
    parameters as literals and transpiles each *query* with sqlglot (``spark_sql.to_spark``, read
    ``duckdb``, written ``spark``) over temporary views of the relations it names; a statement that
    names no Spark relation runs unchanged in the control store (DuckDB).

    **Writes.** ``execute`` takes DDL and DML of the control plane (and anything on DuckDB). A write
    to a *data* relation (a dataset, a namespace, a consumer, a per-dataset log, a temporary table
    built from them) goes through a named operation: :meth:`create_table`, :meth:`materialize`, :meth:`temp_table`,
    :meth:`collect_table`, :meth:`replace_rows`,
    :meth:`update_rows`, :meth:`drop_relation`, :meth:`temp_view`, :meth:`swap_pointer`,
    :meth:`adopt_table`, :meth:`release_table`, :meth:`export_parquet`. Each is DuckDB's statement
    here and the engine's native write elsewhere; Spark refuses DML text that writes a data relation
    rather than parsing it back.
    """

    dialect: str

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        """Run one statement (DuckDB SQL, ``?`` parameters) for its effect: control-plane DDL/DML,
        or anything on DuckDB. Writes to data relations use the named operations below."""

    @abstractmethod
    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        """The rows of a query (DuckDB SQL, ``?`` parameters; transpiled for Spark)."""

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

    @abstractmethod
    def has_temp(self, name: str) -> bool:
        """Whether this session holds the temp relation ``name`` (bare), as :meth:`temp_table` makes it."""

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

    def materialize(
        self,
        table_sql: str,
        select_sql: str,
        params: Sequence[Any] | None = None,
        *,
        keep_existing: bool = False,
    ) -> None:
        """The table ``table_sql`` holds the rows of ``select_sql`` (``params`` its parameters), with
        its columns: replaced if it exists, or left as it is with ``keep_existing`` (a results table
        created on first use from ``SELECT ... LIMIT 0``). Here: ``CREATE [OR REPLACE] TABLE ... AS``;
        Spark writes the relation's new version, a control-plane table gets the rows Spark computed."""
        head = "CREATE TABLE IF NOT EXISTS" if keep_existing else "CREATE OR REPLACE TABLE"
        self.execute(f"{head} {table_sql} AS {select_sql}", params)

    def create_table(self, table_sql: str, columns_sql: str) -> None:
        """The empty table ``table_sql`` with the column definitions ``columns_sql`` (``"a VARCHAR, b
        DOUBLE"``), unless it exists. Here: ``CREATE TABLE IF NOT EXISTS``; Spark stages an empty
        version of that schema."""
        self.execute(f"CREATE TABLE IF NOT EXISTS {table_sql} ({columns_sql})")

    def temp_table(self, name: str, select_sql: str, params: Sequence[Any] | None = None) -> None:
        """A table of this session only, named ``name`` (bare), holding the rows of ``select_sql``;
        replaced if it exists. Here: ``CREATE OR REPLACE TEMP TABLE ... AS``; Spark writes a scratch
        directory under a temporary view when the query reads Spark relations, else the control
        store keeps it."""
        self.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {select_sql}", params)

    def collect_table(self, name: str, select_sql: str, params: Sequence[Any] | None = None) -> None:
        """:meth:`temp_table` of a small result that control-plane statements (``execute``) go on to
        read: Spark collects it into the control store, where they run. Here: a temp table."""
        self.temp_table(name, select_sql, params)

    def update_rows(
        self,
        table_sql: str,
        assignments: Sequence[tuple[str, str]],
        *,
        where: str | None = None,
        params: Sequence[Any] | None = None,
    ) -> None:
        """Set each (column, SQL expression) of ``assignments`` in the rows the predicate ``where``
        matches (every row without one); ``params`` are the parameters of the expressions, then of
        the predicate, in that order. A row whose predicate is NULL keeps its values (SQL's
        ``WHERE``). Here: ``UPDATE``; Spark writes the table's new version with each column a
        ``CASE`` over the predicate."""
        sets = ", ".join(f"{quote(c)} = {e}" for c, e in assignments)
        self.execute(f"UPDATE {table_sql} SET {sets}" + (f" WHERE {where}" if where else ""), params)

    def drop_relation(self, name_sql: str, *, view: bool = False) -> None:
        """Drop the table (``view``: the view) ``name_sql`` if it exists, in the caller's transaction."""
        self.execute(f"DROP {'VIEW' if view else 'TABLE'} IF EXISTS {name_sql}")

    def temp_view(self, name: str, select_sql: str) -> None:
        """A view of this session only, named ``name`` (bare), over ``select_sql``; replaced if it exists.
        Here: ``CREATE OR REPLACE TEMP VIEW``; Spark registers it as a temporary view."""
        self.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {select_sql}")

    def export_parquet(self, select_sql: str, path: str, params: Sequence[Any] | None = None) -> int:
        """Write the rows of ``select_sql`` to the Parquet file ``path`` (zstd); returns how many.
        Here: DuckDB's ``COPY``; Spark collects the (small) result and writes it with Arrow."""
        row = self.fetchrow(
            f"COPY ({select_sql}) TO ? (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)",
            [*(params or []), path],
        )
        return int(row[0])

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
