"""Move a DuckDB warehouse's data plane into the Spark layout (the control plane stays).

Used to take a warehouse built on one machine (the worked example, a DuckDB pilot) to
Spark: every data relation (see :func:`~recovery.lib.engine.spark_sql.is_data_relation`)
becomes a Parquet directory registered in ``_recovery.spark_objects``, every view keeps
its SQL, and both leave the DuckDB file, so no name resolves in two places. Tables are
written by DuckDB's own ``COPY``; the catalog rows and the drops commit in one transaction.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import duckdb

from recovery.lib.engine.spark_engine import _CATALOG_DDL, CATALOG, SparkEngine
from recovery.lib.engine.spark_sql import is_data_relation, parse
from recovery.lib.identifiers import TableName


def import_duckdb_data_plane(engine: SparkEngine) -> list[str]:
    """Move every data relation of ``engine``'s control file into its data root. Returns their names."""
    spark = engine.spark()
    moved: list[str] = []
    conn = duckdb.connect(engine.location, config={"python_enable_replacements": False})
    try:
        for ddl in _CATALOG_DDL:
            conn.execute(ddl)
        tables = [
            (s, n)
            for s, n in conn.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() WHERE NOT internal ORDER BY 1, 2"
            ).fetchall()
            if is_data_relation(s, n)
        ]
        views = [
            (s, n, sql)
            for s, n, sql in conn.execute(
                "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1, 2"
            ).fetchall()
            if is_data_relation(s, n)
        ]
        rows: list[tuple[str, str, list[str], str | None, str | None]] = []
        for schema, name in tables:
            path = Path(engine.data_root) / schema / name / uuid.uuid4().hex
            path.mkdir(parents=True)
            conn.execute(
                f"COPY (SELECT * FROM {TableName(schema, name).sql()}) TO '{path}/part-0.parquet' (FORMAT parquet)"
            )
            shape = spark.read.parquet(str(path)).schema.json()
            rows.append((f"{schema}.{name}", "table", [str(path)], shape, None))
        for schema, name, sql in views:
            rows.append((f"{schema}.{name}", "view", [], None, parse(sql).expression.sql("duckdb")))
        conn.execute("BEGIN TRANSACTION")
        for schema, name, _ in views:
            conn.execute(f"DROP VIEW {TableName(schema, name).sql()}")
        for schema, name in tables:
            conn.execute(f"DROP TABLE {TableName(schema, name).sql()}")
        for row in rows:
            conn.execute(
                f"INSERT OR REPLACE INTO {CATALOG} (name, kind, dirs, schema_json, view_sql) VALUES (?, ?, ?, ?, ?)",
                list(row),
            )
            moved.append(row[0])
        conn.execute("COMMIT")
    finally:
        conn.close()
    return moved
