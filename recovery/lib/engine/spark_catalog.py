"""The Spark engine's catalog: which Parquet directories (or which SQL) make up each data relation.

A row of ``_recovery.spark_objects`` in the control-plane DuckDB file per relation; committing a
new version of a relation is changing its row in the control store's transaction. Also the types:
a Spark type under the name the phases' dialect gives it, and Arrow types Spark can take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from recovery.lib.engine.spark_sql import (
    CONTROL_SCHEMA,
)
from recovery.lib.errors import RecoveryError

CATALOG = f"{CONTROL_SCHEMA}.spark_objects"
_CATALOG_DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG} (
        name VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL, dirs VARCHAR[], schema_json VARCHAR, view_sql VARCHAR)""",
]


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
