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

Statements arrive in the phases' dialect. One that names no Spark relation runs in
the control store unchanged (full transactions, ``RETURNING``); any other runs its
query on Spark (control-plane tables it reads are shipped as small temporary views),
with DML rewritten as copy-on-write: ``INSERT`` appends a directory, ``DELETE`` and
``UPDATE`` write the relation's new content, ``CREATE TABLE AS`` writes a new version.
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
    Statement,
    bind,
    flat_name,
    full_name,
    is_data_relation,
    is_temp,
    parse,
    relations,
    statement,
    to_spark,
)
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import TableName

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
        self.conn = control.conn

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
            super().replace_rows(table_sql, columns, remove=remove, insert=insert, params=params)
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
        st = statement(sql)
        if not self._touches_spark(st.tree):
            yield from self.control.arrow_batches(sql, batch_rows)
            return
        # bounded memory: Spark writes the result, then it is read back a batch at a time
        path = self._write_dir(self._df(st.required_query), "_results", uuid.uuid4().hex, root=self.scratch)
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
        st = statement(sql)
        on_spark = self._touches_spark(st.tree) or (st.target is not None and self._on_spark(st.target))
        if st.kind == "create_table" and st.target is not None and not st.target.db and is_temp(st.tree):
            on_spark = st.query is not None and self._touches_spark(st.query)
        if st.kind == "create_view" and st.target is not None and not st.target.db:
            on_spark = st.query is not None and self._touches_spark(st.query)
        if not on_spark:
            return self._run_in_control(st, sql, params, want)
        st = statement(bind(sql, params))
        self._bind_variables(st.tree)
        if st.kind in ("update", "delete") and not self._on_spark(st.required_target):
            return self._run_in_control_pulling(st, want)
        handler = getattr(self, f"_spark_{st.kind}", None)
        if handler is None:
            raise NotImplementedError(f"the Spark engine cannot run this statement yet: {sql[:200]}")
        return handler(st, want)

    def _catalog_views(self, st: Statement, sql: str) -> str:
        """``information_schema.tables``/``columns`` answered for both stores: the control
        store's own rows plus one per Spark relation (and column), registered as relations."""
        wanted = {t.name.lower() for t in relations(st.tree) if (t.db or "").lower() == "information_schema"}
        if not wanted & {"tables", "columns"}:
            return sql
        objects = self.control.fetchall(f"SELECT name, kind FROM {CATALOG} ORDER BY name")
        tree = st.tree.copy()
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

    def _run_in_control_pulling(self, st: Statement, want: str):
        """A control-plane ``UPDATE``/``DELETE`` whose subqueries read Spark relations: each
        such subquery runs on Spark and its (small) result stands in for it in the control store."""
        tree = st.tree.copy()
        names = []
        candidates = [sub for sub in tree.find_all(exp.Subquery) if self._touches_spark(sub.this)]
        bodies = {id(sub.this) for sub in candidates}

        def inside_another(node: exp.Expression) -> bool:
            parent = node.parent
            while parent is not None:
                if id(parent) in bodies:
                    return True
                parent = parent.parent
            return False

        for sub in [c for c in candidates if not inside_another(c)]:  # an outer one is pulled whole
            try:
                rows = _shippable(self._df(sub.this).toArrow())
            except SparkStatementError as err:
                raise NotImplementedError(
                    f"a correlated subquery over Spark relations in a control-plane {st.kind.upper()}: {err}"
                ) from None
            name = f"__pulled_{uuid.uuid4().hex[:8]}"
            self.control.conn.register(name, rows)
            names.append(name)
            sub.set("this", parse(f"SELECT * FROM {name}"))
        try:
            text = tree.sql("duckdb")
            if self._touches_spark(parse(text)):
                raise NotImplementedError(
                    f"a control-plane {st.kind.upper()} reading Spark relations outside a subquery: {text[:300]}"
                )
            return self._run_in_control(statement(text), text, None, want)
        finally:
            for name in names:
                self.control.conn.unregister(name)

    def _run_in_control(self, st: Statement, sql: str, params, want: str):
        sql = self._catalog_views(st, sql)
        if st.kind not in ("select", "describe"):
            self.ship_epoch += 1
            if st.target is not None and not st.target.db and st.kind in ("create_table", "create_view"):
                self.spark_temps.pop(st.target.name, None)
        if want == "rows":
            return self.control.fetchall(sql, params)
        if want == "arrow":
            return self.control.arrow(sql, params)
        self.control.execute(sql, params)
        return None

    def _result(self, df, want: str):
        if want == "rows":
            with ENGINE_SECONDS.timing("-- spark collect"):
                return [tuple(r) for r in df.collect()]
        if want == "arrow":
            with ENGINE_SECONDS.timing("-- spark toArrow"):
                return df.toArrow()
        return None

    def _spark_select(self, st: Statement, want: str):
        return self._result(self._df(st.required_query), want)

    def _spark_describe(self, st: Statement, want: str):
        fields = self._df(st.required_query).schema.fields
        rows = [(f.name, duckdb_type(f.dataType), "YES", None, None, None) for f in fields]
        if want == "arrow":
            return pa.table(
                {
                    n: [r[i] for r in rows]
                    for i, n in enumerate(["column_name", "column_type", "null", "key", "default", "extra"])
                }
            )
        return rows

    def _spark_copy(self, st: Statement, want: str):
        files = st.tree.args.get("files") or []
        if not files:
            raise NotImplementedError("COPY without a destination")
        path = files[0].name if isinstance(files[0], exp.Literal) else files[0].this.name
        table = self._df(st.required_query).toArrow()
        with ENGINE_SECONDS.timing("-- copy to " + path):
            pq.write_table(table, path, compression="zstd")
        return [(table.num_rows,)] if want == "rows" else None

    def _target(self, st: Statement) -> tuple[str, str, str]:
        t = st.required_target
        return t.db, t.name, full_name(t.db, t.name)

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

    def _spark_insert(self, st: Statement, want: str):
        if not self._on_spark(st.required_target):  # control-plane target, rows computed on Spark
            rows = _shippable(self._df(st.required_query).toArrow())
            name = f"__shipped_{uuid.uuid4().hex[:8]}"
            self.control.conn.register(name, rows)
            try:
                tree = st.tree.copy()
                tree.set("expression", parse(f"SELECT * FROM {name}"))
                self.ship_epoch += 1
                return self._run_in_control(statement(tree.sql("duckdb")), tree.sql("duckdb"), None, want)
            finally:
                self.control.conn.unregister(name)
        schema, name, key = self._target(st)
        obj = self._relation(schema, name, key)
        cols = [c.name for c in st.tree.this.expressions] if isinstance(st.tree.this, exp.Schema) else None
        new = self._write_dir(self._aligned(self._df(st.required_query), obj, cols), schema, name)
        self._stage(key, SparkObject("table", obj.dirs + [new], obj.schema_json))
        return [] if want == "rows" else None

    def _relation(self, schema: str, name: str, key: str) -> SparkObject:
        if not schema:
            raise NotImplementedError(f"writing Spark temporary table {name} in place")
        obj = self.lookup(schema, name)
        if obj is None or obj.kind != "table":
            raise RecoveryError(f"table {key} does not exist in the Spark warehouse")
        return obj

    def _rewrite(self, st: Statement, obj: SparkObject, select: exp.Select) -> None:
        schema, name, key = self._target(st)
        new = self._write_dir(self._aligned(self._df(select), obj, None), schema, name)
        self._stage(key, SparkObject("table", [new], obj.schema_json))

    def _spark_delete(self, st: Statement, want: str):
        schema, name, key = self._target(st)
        obj = self._relation(schema, name, key)
        where = st.tree.args.get("where")
        source = st.required_target.copy()
        select = exp.select("*").from_(source)
        if where is not None:
            select = select.where(exp.not_(exp.func("coalesce", exp.paren(where.this.copy()), exp.false())))
        else:
            select = select.where(exp.false())
        self._rewrite(st, obj, select)
        return [] if want == "rows" else None

    def _spark_update(self, st: Statement, want: str):
        schema, name, key = self._target(st)
        obj = self._relation(schema, name, key)
        if st.tree.args.get("from_") or st.tree.args.get("returning"):
            raise NotImplementedError("UPDATE ... FROM / RETURNING on a Spark relation")
        from pyspark.sql.types import StructType

        fields = [f.name for f in StructType.fromJson(json.loads(obj.schema)).fields]
        sets = {e.this.name.lower(): e.expression for e in st.tree.expressions}
        where = st.tree.args.get("where")
        cond = exp.func("coalesce", exp.paren(where.this.copy()), exp.false()) if where is not None else exp.true()
        cols = []
        for f in fields:
            col: exp.Expression = exp.column(f, quoted=True)
            if f.lower() in sets:
                col = exp.Case(ifs=[exp.If(this=cond.copy(), true=sets[f.lower()].copy())], default=col)
            cols.append(exp.alias_(col, f, quoted=True))
        self._rewrite(st, obj, exp.select(*cols).from_(st.required_target.copy()))
        return [] if want == "rows" else None

    def _spark_create_table(self, st: Statement, want: str):
        schema, name, key = self._target(st)
        temp = not schema
        exists = name in self.spark_temps if temp else self.lookup(schema, name) is not None
        if exists and st.tree.args.get("exists"):
            return None
        if exists and not st.tree.args.get("replace"):
            raise RecoveryError(f"table {key} already exists")
        if st.query is not None:
            df = self._df(st.query)
        else:  # column definitions: let the control store's parser type them
            ddl = st.tree.copy()
            ddl.set("this", exp.Schema(this=exp.to_identifier("__shape"), expressions=st.tree.this.expressions))
            ddl.set("properties", None)
            ddl.set("exists", False)
            ddl.set("replace", False)
            import duckdb

            scratch = duckdb.connect()
            scratch.execute(ddl.sql("duckdb"))
            df = self._frame(scratch.sql("SELECT * FROM __shape").to_arrow_table())
            scratch.close()
        if temp:
            path = self._write_dir(df, "_temp", name, root=self.scratch)
            view = flat_name("t", str(id(self)), name)
            self.spark.read.parquet(path).createOrReplaceTempView(view)
            self.spark_temps[name] = view
            return None
        new = self._write_dir(df, schema, name)
        self._stage(key, SparkObject("table", [new], df.schema.json()))
        return None

    def _spark_create_view(self, st: Statement, want: str):
        schema, name, key = self._target(st)
        if not schema:
            view = flat_name("t", str(id(self)), name)
            sql = to_spark(st.required_query, self._view_for, self._star_columns)
            self.spark.sql(f"CREATE OR REPLACE TEMP VIEW `{view}` AS {sql}")
            self.spark_temps[name] = view
            return None
        if self.lookup(schema, name) is not None and not st.tree.args.get("replace"):
            if st.tree.args.get("exists"):
                return None
            raise RecoveryError(f"view {key} already exists")
        self._df(st.required_query).schema  # analyse now: a view that cannot resolve is refused here
        self._stage(key, SparkObject("view", view_sql=st.required_query.sql("duckdb")))
        return None

    def _spark_drop(self, st: Statement, want: str):
        schema, name, key = self._target(st)
        if not schema:
            view = self.spark_temps.pop(name, None)
            if view:
                self.spark.catalog.dropTempView(view)
            return None
        if self.lookup(schema, name) is None:
            if st.tree.args.get("exists"):
                return None
            raise RecoveryError(f"relation {key} does not exist")
        self._stage(key, None)
        return None


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
