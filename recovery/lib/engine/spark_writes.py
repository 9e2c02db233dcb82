"""The Spark session's writes: each named operation of :class:`~recovery.lib.engine.base.Session`
as a new version of the relation (Parquet directories staged as its catalog row), a temporary
view, or the control store's statement over rows Spark computed. No DML text is read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq
import sqlglot.expressions as exp

from recovery.lib.engine.duckdb_engine import ENGINE_SECONDS
from recovery.lib.engine.spark_catalog import SparkObject
from recovery.lib.engine.spark_query import SparkQuerySession
from recovery.lib.engine.spark_sql import (
    bind,
    flat_name,
    full_name,
    is_data_relation,
    parse,
    to_spark,
)
from recovery.lib.identifiers import TableName, quote_all


class SparkWarehouseSession(SparkQuerySession):
    """One unit of work on Spark: :class:`SparkQuerySession`'s reads plus the named writes."""

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

    def _spark_query_or_control_temp(
        self, name: str, select_sql: str, params: Sequence[Any] | None
    ) -> tuple[str, exp.Expression | None]:
        """The temp relation's bare name and the parsed query when it reads Spark relations; otherwise the
        control store's temp table is made here (replacing a Spark temp of that name) and the query is None."""
        bare = exp.to_table(name, dialect="duckdb").name
        query = self._query(select_sql, params)
        if self._touches_spark(query):
            return bare, query
        self._drop_spark_temp(bare)
        super().temp_table(name, select_sql, params)
        return bare, None

    def temp_table(self, name: str, select_sql: str, params: Sequence[Any] | None = None) -> None:
        """Over Spark relations: the result written to the session's scratch directory and read back
        as a temporary view of that name. Otherwise a control-store temp table."""
        bare, query = self._spark_query_or_control_temp(name, select_sql, params)
        if query is None:
            return
        # written before the name moves: the query may read the relation it replaces
        path = self._write_dir(self._df(query), "_temp", bare, root=self.scratch)
        self._drop_spark_temp(bare)
        view = flat_name("t", str(id(self)), bare)
        self.spark.read.parquet(path).createOrReplaceTempView(view)
        self.spark_temps[bare] = view

    def collect_table(self, name: str, select_sql: str, params: Sequence[Any] | None = None) -> None:
        """The (small) result collected into a control-store temp table."""
        bare, query = self._spark_query_or_control_temp(name, select_sql, params)
        if query is None:
            return
        self._into_control(f"CREATE OR REPLACE TEMP TABLE {name} AS", query)
        self._drop_spark_temp(bare)

    def temp_view(self, name: str, select_sql: str) -> None:
        """Over Spark relations: a Spark temporary view of the transpiled query. Otherwise the control store's."""
        bare = exp.to_table(name, dialect="duckdb").name
        query = self._query(select_sql)
        if not self._touches_spark(query):
            self._drop_spark_temp(bare)
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

    def swap_pointer(self, view_sql: str, select_sql: str) -> None:
        """A view over a Spark namespace is a catalog row (its SQL), resolved before it is staged."""
        t = exp.to_table(view_sql, dialect="duckdb")
        query = parse(select_sql)
        if not t.db or not (self._on_spark(t) or self._touches_spark(query)):
            super().swap_pointer(view_sql, select_sql)
            return
        self._df(query).schema  # analyse now: a view that cannot resolve is refused here
        self._stage(full_name(t.db, t.name), SparkObject("view", view_sql=query.sql("duckdb")))
