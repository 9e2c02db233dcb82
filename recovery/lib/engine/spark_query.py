"""The Spark session's reads: routing each statement by the relations it names, queries transpiled
to Spark, the catalog versions a unit of work stages. Writes are :mod:`spark_writes`."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot.expressions as exp

from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import ENGINE_SECONDS, DuckDBSession
from recovery.lib.engine.spark_catalog import CATALOG, SparkObject, SparkStatementError, _shippable, duckdb_type
from recovery.lib.engine.spark_sql import (
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
from recovery.lib.engine.spark_start import _SPARK
from recovery.lib.errors import RecoveryError


class SparkWarehouse(Protocol):
    """What a session needs of its engine (:class:`~recovery.lib.engine.spark_engine.SparkEngine`,
    which imports this module): the data root and the process's SparkSession."""

    data_root: Path

    def spark(self) -> Any: ...


class SparkQuerySession(Session):
    """One unit of work: a control-store session plus the Spark relations it staged."""

    dialect = "duckdb"  # the dialect the phases write; translated for Spark here

    def __init__(self, engine: SparkWarehouse, control: DuckDBSession, *, transactional: bool):
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

    def has_temp(self, name: str) -> bool:
        """A Spark temp view of that name (a temp over Spark relations), else the control store's temp table."""
        return name in self.spark_temps or self.control.has_temp(name)

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
            if not is_query(tree):  # it may change what a shipped control-plane table holds
                self.ship_epoch += 1
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
