"""Spark: the data plane on Spark SQL over Parquet, the control plane in a transactional store.

ADR 0001 explains the split. Datasets, namespaces, consumers and the per-dataset logs
(``_recovery.<kind>__<dataset>``) are Parquet directories that Spark reads and writes;
which directories make up each relation is a row of ``_recovery.spark_objects`` in the
control-plane DuckDB file, next to generations, fences, pointers and the clock.

A write follows the commit protocol of table formats: Spark **stages** the relation's
new version in a fresh directory no reader knows about; the control-plane transaction
that also took the clock and compare-and-set the generation's fence **commits** it by
changing the relation's row; later sessions **expose** it by registering the row's
directories as the view the SQL reads. A fence committed first makes the
compare-and-set fail, the transaction rolls back, and the staged directory is deleted
unseen: fencing is still enforced at write time. Publishing is one pointer move, the
``CREATE OR REPLACE VIEW`` row committed with the pointer row.

Statements arrive in the phases' dialect (DuckDB SQL, see :class:`~recovery.lib.engine.base.Session`).
One that names no Spark relation runs in the control store unchanged (full transactions,
``RETURNING``); a query that reads Spark relations is transpiled by sqlglot and runs on Spark
(control-plane tables it reads are shipped as small temporary views). Writes to Spark
relations are never SQL text: the named operations (``materialize``, ``replace_rows``,
``update_rows``, ``swap_pointer``, ...) write each new version as Parquet directories, and
DML text naming a Spark relation is refused.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot.expressions as exp

from recovery.lib.engine.base import Engine, Session
from recovery.lib.engine.duckdb_engine import ENGINE_SECONDS, DuckDBEngine, DuckDBSession
from recovery.lib.engine.spark_sql import (
    CONTROL_SCHEMA,
    bind,
    flat_name,
    full_name,
    is_data_relation,
    is_query,
    parse,
    query_of,
    relations,
    to_spark,
)
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import TableName, quote_all

CATALOG = f"{CONTROL_SCHEMA}.spark_objects"
_CATALOG_DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG} (
        name VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL, dirs VARCHAR[], schema_json VARCHAR, view_sql VARCHAR)""",
]

# one Spark unit of work at a time per process: temporary views are global to the
# SparkSession, and the control store admits one writing process anyway
_PROCESS_LOCK = threading.RLock()
_SPARK: dict[str, Any] = {}


def spark_session(master: str, conf: dict[str, str]):
    """The process's SparkSession (started once; local mode needs only Java)."""
    if "session" not in _SPARK:
        try:
            from pyspark.sql import SparkSession
        except ImportError as err:  # pragma: no cover - depends on the install
            raise RecoveryError(
                "warehouse.engine is 'spark' but pyspark is not installed; "
                "install the extra: pip install 'backfill-recovery[spark]'"
            ) from err
        builder = (
            SparkSession.builder.master(master)
            .appName("backfill-recovery")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.timestampType", "TIMESTAMP_NTZ")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        )
        for k, v in conf.items():
            builder = builder.config(k, v)
        try:
            session = builder.getOrCreate()
        except Exception as err:  # JVM could not start
            raise RecoveryError(
                f"Spark could not start ({err}); warehouse.engine 'spark' needs Java 17 or newer on PATH or JAVA_HOME"
            ) from err
        session.sparkContext.setLogLevel("ERROR")
        _SPARK["session"] = session
        _SPARK["registered"] = {}
    return _SPARK["session"]


class SparkStatementError(RecoveryError):
    """Spark refused a statement; the message shows it in both dialects."""


@dataclass
class SparkObject:
    """A relation of the data plane: a table's Parquet directories, or a view's SQL."""

    kind: str  # 'table' or 'view'
    dirs: list[str] = field(default_factory=list)
    schema_json: str | None = None
    view_sql: str | None = None

    @property
    def schema(self) -> str:
        """A table's Spark schema (JSON); every table row of the catalog has one."""
        if self.schema_json is None:
            raise RecoveryError(f"the Spark catalog row of this {self.kind} has no schema")
        return self.schema_json

    @property
    def query_sql(self) -> str:
        """A view's SQL; every view row of the catalog has one."""
        if self.view_sql is None:
            raise RecoveryError(f"the Spark catalog row of this {self.kind} has no SQL")
        return self.view_sql


def duckdb_type(dt) -> str:
    """A Spark data type under the name the phases' dialect gives it."""
    from pyspark.sql import types as T

    simple = {
        T.StringType: "VARCHAR",
        T.LongType: "BIGINT",
        T.IntegerType: "INTEGER",
        T.ShortType: "SMALLINT",
        T.ByteType: "TINYINT",
        T.DoubleType: "DOUBLE",
        T.FloatType: "FLOAT",
        T.BooleanType: "BOOLEAN",
        T.DateType: "DATE",
        T.TimestampNTZType: "TIMESTAMP",
        T.TimestampType: "TIMESTAMP WITH TIME ZONE",
        T.BinaryType: "BLOB",
        T.NullType: "NULL",
    }
    for cls, name in simple.items():
        if isinstance(dt, cls):
            return name
    if isinstance(dt, T.DecimalType):
        return f"DECIMAL({dt.precision},{dt.scale})"
    if isinstance(dt, T.ArrayType):
        return f"{duckdb_type(dt.elementType)}[]"
    if isinstance(dt, T.StructType):
        return "STRUCT(" + ", ".join(f'"{f.name}" {duckdb_type(f.dataType)}' for f in dt.fields) + ")"
    if isinstance(dt, T.MapType):
        return f"MAP({duckdb_type(dt.keyType)}, {duckdb_type(dt.valueType)})"
    return dt.simpleString().upper()


def _shippable(table: pa.Table) -> pa.Table:
    """Arrow types Spark cannot take (unsigned integers) widened to ones it can."""
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_uint64(t):
            t = pa.decimal128(20, 0)
        elif pa.types.is_uint32(t):
            t = pa.int64()
        elif pa.types.is_uint16(t):
            t = pa.int32()
        elif pa.types.is_uint8(t):
            t = pa.int16()
        fields.append(pa.field(f.name, t))
    schema = pa.schema(fields)
    return table if schema == table.schema else table.cast(schema)


class SparkWarehouseSession(Session):
    """One unit of work: a control-store session plus the Spark relations it staged."""

    dialect = "duckdb"  # the dialect the phases write; translated for Spark here

    def __init__(self, engine: SparkEngine, control: DuckDBSession, *, transactional: bool):
        self.engine = engine
        self.control = control
        self.transactional = transactional
        self.spark = engine.spark()
        self.staged: dict[str, SparkObject | None] = {}
        self.new_dirs: list[str] = []
        self.spark_temps: dict[str, str] = {}  # temp name -> Spark view name
        self.scratch = engine.data_root / "_scratch" / uuid.uuid4().hex
        self.ship_epoch = 0
        self._shipped: dict[str, int] = {}
        self._cache: dict[str, SparkObject | None] = {}

    # ---- catalog ----------------------------------------------------------------------
    def lookup(self, schema: str, name: str) -> SparkObject | None:
        key = full_name(schema, name)
        if key in self.staged:
            return self.staged[key]
        if key not in self._cache:
            row = self.control.fetchone(
                f"SELECT kind, dirs, schema_json, view_sql FROM {CATALOG} WHERE name = ?", [key]
            )
            self._cache[key] = None if row is None else SparkObject(row[0], list(row[1] or []), row[2], row[3])
        return self._cache[key]

    def _stage(self, key: str, obj: SparkObject | None) -> None:
        self.staged[key] = obj
        if not self.transactional:
            self.commit_catalog()

    def commit_catalog(self) -> None:
        """Write the staged versions into the control store (inside its transaction, if any)."""
        for key, obj in self.staged.items():
            if obj is None:
                self.control.execute(f"DELETE FROM {CATALOG} WHERE name = ?", [key])
                continue
            values = [obj.kind, obj.dirs, obj.schema_json, obj.view_sql, key]
            if self.control.scalar(f"SELECT count(*) FROM {CATALOG} WHERE name = ?", [key]):
                self.control.execute(
                    f"UPDATE {CATALOG} SET kind = ?, dirs = ?, schema_json = ?, view_sql = ? WHERE name = ?", values
                )
            else:
                self.control.execute(
                    f"INSERT INTO {CATALOG} (kind, dirs, schema_json, view_sql, name) VALUES (?, ?, ?, ?, ?)", values
                )
            self._cache[key] = obj
        self.staged.clear()
        self.new_dirs.clear()

    def discard(self) -> None:
        """Roll back: staged directories were never named by a committed row; delete them."""
        for d in self.new_dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.staged.clear()
        self.new_dirs.clear()

    def close(self) -> None:
        for view in self.spark_temps.values():
            self.spark.catalog.dropTempView(view)
        shutil.rmtree(self.scratch, ignore_errors=True)

    # ---- routing ----------------------------------------------------------------------
    def _on_spark(self, t: exp.Table) -> bool:
        if t.db:
            return is_data_relation(t.db, t.name)
        return t.name in self.spark_temps

    def _touches_spark(self, tree: exp.Expression) -> bool:
        return any(self._on_spark(t) for t in relations(tree))

    def _view_for(self, t: exp.Table) -> str:
        """The Spark view standing for a relation, registered (or refreshed) now."""
        registered = _SPARK["registered"]
        if not t.db and t.name in self.spark_temps:
            return self.spark_temps[t.name]
        if t.db and is_data_relation(t.db, t.name):
            obj = self.lookup(t.db, t.name)
            if obj is None:
                raise RecoveryError(
                    f"relation {full_name(t.db, t.name)} does not exist in the Spark warehouse {self.engine.data_root}"
                )
            view = flat_name("d", t.db, t.name)
            if obj.kind == "view":
                sql = to_spark(parse(obj.query_sql), self._view_for, self._star_columns)
                with ENGINE_SECONDS.timing("-- view " + view):
                    self.spark.sql(f"CREATE OR REPLACE TEMP VIEW `{view}` AS {sql}")
                registered.pop(view, None)
                return view
            token: tuple = ("table", tuple(obj.dirs), obj.schema_json)
            if registered.get(view) != token:
                self._read(obj).createOrReplaceTempView(view)
                registered[view] = token
            return view
        # a control-plane table or a control-store temp table: ship its rows
        view = flat_name("c", t.db, t.name)
        token = (id(self), self.ship_epoch)
        if registered.get(view) != token:
            rows = _shippable(
                self.control.arrow(f"SELECT * FROM {exp.table_(t.name, db=t.db or None, quoted=True).sql('duckdb')}")
            )
            self._frame(rows).createOrReplaceTempView(view)
            registered[view] = token
        return view

    def _star_columns(self, t: exp.Expression) -> list[str]:
        if isinstance(t, exp.Subquery):
            return self._df(t.this).columns
        if not isinstance(t, exp.Table):
            raise NotImplementedError(f"the columns of {t.sql('duckdb')[:200]}")
        if self._on_spark(t):
            return self.spark.table(self._view_for(t)).columns
        return [c for c, _ in self.control.columns(exp.table_(t.name, db=t.db or None, quoted=True).sql("duckdb"))]

    def _frame(self, table: pa.Table):
        """An Arrow table as a DataFrame (an empty one keeps its schema)."""
        table = _shippable(table)
        if table.num_rows == 0:
            from pyspark.sql.pandas.types import from_arrow_schema

            return self.spark.createDataFrame([], from_arrow_schema(table.schema))
        return self.spark.createDataFrame(table)

    def _read(self, obj: SparkObject):
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(json.loads(obj.schema))
        if not obj.dirs:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*obj.dirs)

    def _df(self, query: exp.Expression):
        """A DataFrame of a bound query: on Spark, or computed in the control store and shipped."""
        if self._touches_spark(query):
            if isinstance(query, exp.Values):  # Spark takes no subqueries in VALUES: one SELECT per row
                rows = [
                    exp.select(*[exp.alias_(e.copy(), f"col{i + 1}") for i, e in enumerate(row.expressions)])
                    for row in query.expressions
                ]
                query = rows[0]
                for row in rows[1:]:
                    query = exp.union(query, row, distinct=False)
            sql = to_spark(query, self._view_for, self._star_columns)
            with ENGINE_SECONDS.timing("-- spark: " + sql[:2000]):
                try:
                    return self.spark.sql(sql)
                except Exception as err:
                    raise SparkStatementError(
                        f"{type(err).__name__}: {str(err).splitlines()[0]}\n"
                        f"  phase SQL: {query.sql('duckdb')[:1500]}\n  Spark SQL: {sql[:1500]}"
                    ) from None
        text = query.sql("duckdb")
        if isinstance(query, exp.Values):
            text = f"SELECT * FROM ({text})"
        return self._frame(self.control.arrow(text))

    def _write_dir(self, df, schema: str, name: str, root: Path | None = None) -> str:
        path = (root or self.engine.data_root / schema / name) / uuid.uuid4().hex
        with ENGINE_SECONDS.timing(f"-- spark write {schema}.{name}"):
            df.write.mode("errorifexists").parquet(str(path))
        self.new_dirs.append(str(path))
        return str(path)

    # ---- write primitives --------------------------------------------------------------
    def replace_rows(
        self,
        table_sql: str,
        columns: Sequence[str],
        *,
        remove: str | None = None,
        insert: str | None = None,
        params: Sequence[Any] | None = None,
    ) -> None:
        """One new version of a Spark relation: the rows kept (rewritten only when some are removed)
        and the rows added, each a directory, staged as one catalog change. A control-plane table
        takes the control store's statements."""
        t = exp.to_table(table_sql, dialect="duckdb")
        if not self._on_spark(t):
            query = self._query(insert, params) if insert is not None else None
            if query is None or not self._touches_spark(query):
                super().replace_rows(table_sql, columns, remove=remove, insert=insert, params=params)
                return
            if remove is not None:
                super().replace_rows(table_sql, columns, remove=remove)
            self._into_control(f"INSERT INTO {table_sql} ({quote_all(list(columns))})", query)
            return
        schema, name, key = t.db, t.name, full_name(t.db, t.name)
        obj = self._relation(schema, name, key)
        dirs = list(obj.dirs)
        if remove is not None:
            kept = parse(f"SELECT * FROM {table_sql} WHERE NOT coalesce(({remove}), false)")
            self._bind_variables(kept)
            dirs = [self._write_dir(self._aligned(self._df(kept), obj, None), schema, name)]
        if insert is not None:
            query = parse(bind(insert, params))
            self._bind_variables(query)
            dirs.append(self._write_dir(self._aligned(self._df(query), obj, list(columns)), schema, name))
        self._stage(key, SparkObject("table", dirs, obj.schema_json))

    def _query(self, select_sql: str, params: Sequence[Any] | None = None) -> exp.Expression:
        """A SELECT of the phases' dialect, its parameters and session variables bound."""
        query = parse(bind(select_sql, params))
        self._bind_variables(query)
        return query

    def _into_control(self, head: str, query: exp.Expression) -> None:
        """``head`` (a control-plane ``INSERT INTO t (...)`` or ``CREATE ... AS``) over rows Spark
        computed: the result is collected and registered in the control store for the statement."""
        rows = _shippable(self._df(query).toArrow())
        name = f"__shipped_{uuid.uuid4().hex[:8]}"
        self.control.conn.register(name, rows)
        try:
            self._control(f"{head} SELECT * FROM {name}")
        finally:
            self.control.conn.unregister(name)

    def _control(self, sql: str, params: Sequence[Any] | None = None, want: str = "none"):
        """A statement for the control store, as it is: what it reads may have changed."""
        self.ship_epoch += 1
        return self._in_control(parse(sql), sql, params, want)

    def _drop_spark_temp(self, name: str) -> None:
        view = self.spark_temps.pop(name, None)
        if view:
            self.spark.catalog.dropTempView(view)

    def materialize(
        self,
        table_sql: str,
        select_sql: str,
        params: Sequence[Any] | None = None,
        *,
        keep_existing: bool = False,
    ) -> None:
        """A Spark relation's new version: the rows written as one directory, staged as its catalog
        row. A control-plane table takes the control store's statement, over rows Spark computed
        when the query reads Spark relations."""
        t = exp.to_table(table_sql, dialect="duckdb")
        query = self._query(select_sql, params)
        if not self._on_spark(t):
            if not self._touches_spark(query):
                super().materialize(table_sql, select_sql, params, keep_existing=keep_existing)
                return
            head = "CREATE TABLE IF NOT EXISTS" if keep_existing else "CREATE OR REPLACE TABLE"
            self._into_control(f"{head} {table_sql} AS", query)
            return
        key = full_name(t.db, t.name)
        if keep_existing and self.lookup(t.db, t.name) is not None:
            return
        df = self._df(query)
        new = self._write_dir(df, t.db, t.name)
        self._stage(key, SparkObject("table", [new], df.schema.json()))

    def create_table(self, table_sql: str, columns_sql: str) -> None:
        """A Spark relation: an empty version whose schema is the column definitions as DuckDB types
        them (a scratch in-memory DuckDB reads them), staged as its catalog row."""
        t = exp.to_table(table_sql, dialect="duckdb")
        if not self._on_spark(t):
            super().create_table(table_sql, columns_sql)
            return
        if self.lookup(t.db, t.name) is not None:
            return
        import duckdb

        scratch = duckdb.connect()
        try:
            scratch.execute(f"CREATE TABLE __shape ({columns_sql})")
            df = self._frame(scratch.sql("SELECT * FROM __shape").to_arrow_table())
        finally:
            scratch.close()
        new = self._write_dir(df, t.db, t.name)
        self._stage(full_name(t.db, t.name), SparkObject("table", [new], df.schema.json()))

    def temp_table(self, name: str, select_sql: str, params: Sequence[Any] | None = None) -> None:
        """Over Spark relations: the result written to the session's scratch directory and read back
        as a temporary view of that name. Otherwise a control-store temp table."""
        bare = exp.to_table(name, dialect="duckdb").name
        query = self._query(select_sql, params)
        self._drop_spark_temp(bare)
        if not self._touches_spark(query):
            super().temp_table(name, select_sql, params)
            return
        path = self._write_dir(self._df(query), "_temp", bare, root=self.scratch)
        view = flat_name("t", str(id(self)), bare)
        self.spark.read.parquet(path).createOrReplaceTempView(view)
        self.spark_temps[bare] = view

    def collect_table(self, name: str, select_sql: str, params: Sequence[Any] | None = None) -> None:
        """The (small) result collected into a control-store temp table."""
        bare = exp.to_table(name, dialect="duckdb").name
        query = self._query(select_sql, params)
        self._drop_spark_temp(bare)
        if not self._touches_spark(query):
            super().temp_table(name, select_sql, params)
            return
        self._into_control(f"CREATE OR REPLACE TEMP TABLE {name} AS", query)

    def temp_view(self, name: str, select_sql: str) -> None:
        """Over Spark relations: a Spark temporary view of the transpiled query. Otherwise the control store's."""
        bare = exp.to_table(name, dialect="duckdb").name
        query = self._query(select_sql)
        self._drop_spark_temp(bare)
        if not self._touches_spark(query):
            super().temp_view(name, select_sql)
            return
        view = flat_name("t", str(id(self)), bare)
        sql = to_spark(query, self._view_for, self._star_columns)
        self.spark.sql(f"CREATE OR REPLACE TEMP VIEW `{view}` AS {sql}")
        self.spark_temps[bare] = view

    def drop_relation(self, name_sql: str, *, view: bool = False) -> None:
        """A Spark relation's catalog row goes (its directories stay until a vacuum); a temporary
        one its view; anything else the control store drops."""
        t = exp.to_table(name_sql, dialect="duckdb")
        if not t.db and t.name in self.spark_temps:
            self._drop_spark_temp(t.name)
            return
        if t.db and is_data_relation(t.db, t.name):
            if self.lookup(t.db, t.name) is not None:
                self._stage(full_name(t.db, t.name), None)
            return
        super().drop_relation(name_sql, view=view)

    def update_rows(
        self,
        table_sql: str,
        assignments: Sequence[tuple[str, str]],
        *,
        where: str | None = None,
        params: Sequence[Any] | None = None,
    ) -> None:
        """A Spark relation's new version, each assigned column a ``CASE`` over the predicate (a NULL
        predicate keeps the row's value). A control-plane table takes ``UPDATE`` as it is."""
        t = exp.to_table(table_sql, dialect="duckdb")
        if not self._on_spark(t):
            super().update_rows(table_sql, assignments, where=where, params=params)
            return
        from pyspark.sql.types import StructType

        obj = self._relation(t.db, t.name, full_name(t.db, t.name))
        shape = self._query(
            f"SELECT {', '.join(e for _, e in assignments)} FROM {table_sql}" + (f" WHERE {where}" if where else ""),
            params,
        )
        sets = {c.lower(): e for (c, _), e in zip(assignments, shape.expressions)}
        found = shape.args.get("where")
        cond = exp.func("coalesce", exp.paren(found.this.copy()), exp.false()) if found is not None else exp.true()
        cols = []
        for f in StructType.fromJson(json.loads(obj.schema)).fields:
            col: exp.Expression = exp.column(f.name, quoted=True)
            if f.name.lower() in sets:
                col = exp.Case(ifs=[exp.If(this=cond.copy(), true=sets[f.name.lower()].copy())], default=col)
            cols.append(exp.alias_(col, f.name, quoted=True))
        select = exp.select(*cols).from_(t.copy())
        new = self._write_dir(self._aligned(self._df(select), obj, None), t.db, t.name)
        self._stage(full_name(t.db, t.name), SparkObject("table", [new], obj.schema_json))

    def export_parquet(self, select_sql: str, path: str, params: Sequence[Any] | None = None) -> int:
        """Over Spark relations: the result collected as Arrow and written with zstd."""
        query = self._query(select_sql, params)
        if not self._touches_spark(query):
            return super().export_parquet(select_sql, path, params)
        table = self._df(query).toArrow()
        with ENGINE_SECONDS.timing("-- export to " + path):
            pq.write_table(table, path, compression="zstd")
        return table.num_rows

    def adopt_table(self, table: TableName, namespace: str, add_columns: Sequence[tuple[str, str]] = ()) -> None:
        """The table's catalog row moves to the namespace's name, its directories untouched (no
        data is copied); an added column is a field of its schema that no file holds, which Parquet
        reads as NULL. Staged with the caller's control-store transaction."""
        if not is_data_relation(table.schema, table.name):
            super().adopt_table(table, namespace, add_columns)
            return
        from pyspark.sql.types import StructField, StructType

        obj = self._relation(table.schema, table.name, full_name(table.schema, table.name))
        schema = StructType.fromJson(json.loads(obj.schema))
        for col, typ in add_columns:
            spark_type = exp.DataType.build(typ, dialect="duckdb").sql("spark")
            dtype = self.spark.sql(f"SELECT CAST(NULL AS {spark_type}) AS c").schema.fields[0].dataType
            schema = StructType(list(schema.fields) + [StructField(col, dtype, True)])
        self._stage(full_name(table.schema, table.name), None)
        self._stage(full_name(table.schema, namespace), SparkObject("table", list(obj.dirs), schema.json()))

    def release_table(self, public: TableName) -> None:
        """The view's rows written as the table's one directory, staged under the public name."""
        if not is_data_relation(public.schema, public.name):
            super().release_table(public)
            return
        df = self._df(parse(f"SELECT * FROM {public.sql()}"))
        new = self._write_dir(df, public.schema, public.name)
        self._stage(full_name(public.schema, public.name), SparkObject("table", [new], df.schema.json()))

    def quantile_sql(self, value_sql: str, q: float) -> str:
        """Spark's exact interpolated quantile is ``percentile`` (its ``percentile_cont`` takes
        ``WITHIN GROUP``, which the phases' dialect does not write)."""
        return f"percentile({value_sql}, {float(q)!r})"

    def mean_text_bytes(self, table_sql: str, columns: Sequence[str], sample_rows: int = 10_000) -> float:
        """The first ``sample_rows`` rows Spark reads stand for the sample (Spark's ``TABLESAMPLE
        (n ROWS)`` is the same limit); bytes are ``octet_length``, DuckDB's ``strlen``."""
        query = parse(f"SELECT * FROM {table_sql}")
        if not columns or not self._touches_spark(query):
            return super().mean_text_bytes(table_sql, columns, sample_rows)
        from pyspark.sql import functions as F

        sample = self._df(query).limit(int(sample_rows))
        means = sample.agg(*[F.coalesce(F.avg(F.octet_length(F.col(f"`{c}`"))), F.lit(0.0)) for c in columns])
        return float(sum(means.collect()[0]))

    def swap_pointer(self, view_sql: str, select_sql: str) -> None:
        """A view over a Spark namespace is a catalog row (its SQL), resolved before it is staged."""
        t = exp.to_table(view_sql, dialect="duckdb")
        query = parse(select_sql)
        if not t.db or not (self._on_spark(t) or self._touches_spark(query)):
            super().swap_pointer(view_sql, select_sql)
            return
        self._df(query).schema  # analyse now: a view that cannot resolve is refused here
        self._stage(full_name(t.db, t.name), SparkObject("view", view_sql=query.sql("duckdb")))

    # ---- Session ----------------------------------------------------------------------
    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        self._run(sql, params)

    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        return self._run(sql, params, want="rows")

    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        return self._run(sql, params, want="arrow")

    def arrow_batches(self, sql: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
        query = parse(sql)
        if not self._touches_spark(query):
            yield from self.control.arrow_batches(sql, batch_rows)
            return
        # bounded memory: Spark writes the result, then it is read back a batch at a time
        path = self._write_dir(self._df(query), "_results", uuid.uuid4().hex, root=self.scratch)
        files = sorted(Path(path).glob("*.parquet"))
        for f in files:
            yield from pq.ParquetFile(f).iter_batches(batch_rows)

    def columns(self, table_sql: str) -> list[tuple[str, str]]:
        query = parse(f"SELECT * FROM {table_sql}")
        if not self._touches_spark(query):
            return self.control.columns(table_sql)
        try:
            df = self._df(query)
        except RecoveryError:
            return []
        return [(f.name, duckdb_type(f.dataType)) for f in df.schema.fields]

    def relation_columns(self, select_sql: str) -> list[tuple[str, str]]:
        query = parse(select_sql)
        if not self._touches_spark(query):
            return self.control.relation_columns(select_sql)
        return [(f.name, duckdb_type(f.dataType)) for f in self._df(query).schema.fields]

    def object_kind(self, schema: str, name: str) -> str | None:
        if is_data_relation(schema, name):
            obj = self.lookup(schema, name)
            return None if obj is None else obj.kind
        return self.control.object_kind(schema, name)

    # ---- statements -------------------------------------------------------------------
    def _run(self, sql: str, params: Sequence[Any] | None, want: str = "none"):
        """A query reading Spark relations runs on Spark (transpiled); any statement that names no
        Spark relation runs in the control store as it is. A write to a Spark relation as SQL text
        is refused: the named operations of :class:`Session` make it."""
        tree = parse(sql)
        if not self._touches_spark(tree):
            if not is_query(tree):
                self.ship_epoch += 1
                target = tree.this.this if isinstance(tree, exp.Create) and isinstance(tree.this, exp.Schema) else None
                target = tree.this if isinstance(tree, exp.Create) and isinstance(tree.this, exp.Table) else target
                if isinstance(target, exp.Table) and not target.db:  # a control-store temp now stands for the name
                    self._drop_spark_temp(target.name)
            return self._in_control(tree, sql, params, want)
        if query_of(tree) is None:
            raise SparkStatementError(
                "a statement that writes a Spark relation goes through a Session operation (create_table, "
                "materialize, temp_table, collect_table, replace_rows, update_rows, drop_relation, temp_view, "
                f"swap_pointer, export_parquet), not SQL text: {sql[:300]}"
            )
        bound = parse(bind(sql, params))
        self._bind_variables(bound)
        query = query_of(bound)
        assert query is not None  # the same statement, its parameters bound
        if isinstance(tree, exp.Describe):
            return self._spark_describe(query, want)
        return self._result(self._df(query), want)

    def _in_control(self, tree: exp.Expression, sql: str, params: Sequence[Any] | None, want: str):
        sql = self._catalog_views(tree, sql)
        if want == "rows":
            return self.control.fetchall(sql, params)
        if want == "arrow":
            return self.control.arrow(sql, params)
        self.control.execute(sql, params)
        return None

    def _catalog_views(self, tree: exp.Expression, sql: str) -> str:
        """``information_schema.tables``/``columns`` answered for both stores: the control
        store's own rows plus one per Spark relation (and column), registered as relations."""
        wanted = {t.name.lower() for t in relations(tree) if (t.db or "").lower() == "information_schema"}
        if not wanted & {"tables", "columns"}:
            return sql
        objects = self.control.fetchall(f"SELECT name, kind FROM {CATALOG} ORDER BY name")
        tree = tree.copy()
        for name in wanted & {"tables", "columns"}:
            own = self.control.arrow(f"SELECT * FROM information_schema.{name}")
            rows: list[dict] = []
            for full, kind in objects:
                schema, _, rel = full.partition(".")
                if name == "tables":
                    rows.append(
                        {
                            "table_schema": schema,
                            "table_name": rel,
                            "table_type": "VIEW" if kind == "view" else "BASE TABLE",
                        }
                    )
                else:
                    for i, (col, typ) in enumerate(self.columns(exp.table_(rel, db=schema, quoted=True).sql("duckdb"))):
                        rows.append(
                            {
                                "table_schema": schema,
                                "table_name": rel,
                                "column_name": col,
                                "ordinal_position": i + 1,
                                "data_type": typ,
                                "is_nullable": "YES",
                            }
                        )
            extra = pa.Table.from_pylist(
                rows, schema=pa.schema([own.schema.field(k) for k in (rows[0] if rows else {})])
            )
            combined = pa.concat_tables([own, extra], promote_options="default")
            alias = f"__info_{name}_{uuid.uuid4().hex[:8]}"
            self.control.conn.register(alias, combined)
            for t in tree.find_all(exp.Table):
                if (t.db or "").lower() == "information_schema" and t.name.lower() == name:
                    t.set("alias", exp.TableAlias(this=exp.to_identifier(t.alias or name)))
                    t.set("this", exp.to_identifier(alias))
                    t.set("db", None)
        return tree.sql("duckdb")

    def _bind_variables(self, tree: exp.Expression) -> None:
        """``getvariable('name')`` (a control-store session variable) as its current value."""
        for node in list(tree.find_all(exp.Anonymous)):
            if str(node.this).lower() == "getvariable":
                value = self.control.scalar(f"SELECT {node.sql('duckdb')}")
                node.replace(
                    exp.Literal.string(value)
                    if isinstance(value, str)
                    else parse(f"SELECT {bind('?', [value])}").expressions[0]
                )

    def _result(self, df, want: str):
        if want == "rows":
            with ENGINE_SECONDS.timing("-- spark collect"):
                return [tuple(r) for r in df.collect()]
        if want == "arrow":
            with ENGINE_SECONDS.timing("-- spark toArrow"):
                return df.toArrow()
        return None

    def _spark_describe(self, query: exp.Expression, want: str):
        fields = self._df(query).schema.fields
        rows = [(f.name, duckdb_type(f.dataType), "YES", None, None, None) for f in fields]
        if want == "arrow":
            return pa.table(
                {
                    n: [r[i] for r in rows]
                    for i, n in enumerate(["column_name", "column_type", "null", "key", "default", "extra"])
                }
            )
        return rows

    def _aligned(self, df, obj: SparkObject, columns: list[str] | None):
        """The rows cast to the relation's schema, by name (column list) or by position."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(json.loads(obj.schema))
        if columns is None:
            if len(df.columns) != len(schema.fields):
                raise RecoveryError(f"INSERT gives {len(df.columns)} columns for a relation of {len(schema.fields)}")
            source = dict(zip([f.name.lower() for f in schema.fields], df.columns))
        else:
            source = dict(zip([c.lower() for c in columns], df.columns))
        return df.select(
            [
                (F.col(f"`{source[f.name.lower()]}`") if f.name.lower() in source else F.lit(None))
                .cast(f.dataType)
                .alias(f.name)
                for f in schema.fields
            ]
        )

    def _relation(self, schema: str, name: str, key: str) -> SparkObject:
        if not schema:
            raise NotImplementedError(f"writing Spark temporary table {name} in place")
        obj = self.lookup(schema, name)
        if obj is None or obj.kind != "table":
            raise RecoveryError(f"table {key} does not exist in the Spark warehouse")
        return obj


class SparkEngine(Engine):
    """A warehouse whose data plane is Spark and whose control plane is a DuckDB file."""

    dialect = "spark"

    def __init__(
        self,
        control_path: str,
        data_path: str,
        *,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
        busy_timeout_s: float = 300.0,
        memory_limit: str | None = None,
        threads: int | None = None,
    ):
        self.location = control_path
        self.data_root = Path(data_path)
        self.master = master
        self.conf = dict(conf or {})
        self.control = DuckDBEngine(
            control_path, memory_limit=memory_limit, threads=threads, busy_timeout_s=busy_timeout_s
        )
        self._ready = False

    @property
    def busy_timeout_s(self) -> float:
        return self.control.busy_timeout_s

    @busy_timeout_s.setter
    def busy_timeout_s(self, value: float) -> None:  # the lock is the control-plane file's
        self.control.busy_timeout_s = value

    def spark(self):
        return spark_session(self.master, self.conf)

    def _ensure_catalog(self) -> None:
        if self._ready:
            return
        self.data_root.mkdir(parents=True, exist_ok=True)
        with self.control.transaction() as s:
            for ddl in _CATALOG_DDL:
                s.execute(ddl)
        self._ready = True

    @contextmanager
    def session(self, read_only: bool = False) -> Iterator[SparkWarehouseSession]:
        self._ensure_catalog()
        with _PROCESS_LOCK, self.control.session(read_only) as control:
            s = SparkWarehouseSession(self, control, transactional=False)
            try:
                yield s
            finally:
                s.close()

    @contextmanager
    def transaction(self) -> Iterator[SparkWarehouseSession]:
        self._ensure_catalog()
        with _PROCESS_LOCK:
            s: SparkWarehouseSession | None = None
            try:
                with self.control.transaction() as control:
                    s = SparkWarehouseSession(self, control, transactional=True)
                    yield s
                    s.commit_catalog()  # same control-store transaction as the fence and the clock
            except BaseException:
                if s is not None:
                    s.discard()
                raise
            finally:
                if s is not None:
                    s.close()
