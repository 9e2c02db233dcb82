"""A lakehouse table's data files as one DuckDB relation: ``read_parquet`` over a pinned list of files.

Column and partition pruning come from DuckDB's Parquet reader; Delta's partition values
(kept in the log, not in the files) are added as typed constants per group of files, so a
filter on the partition column drops whole groups. Every column is cast to the table's
own type, and a version with no file is an empty relation of the same shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from recovery.lib.errors import SpecError
from recovery.lib.identifiers import is_plain_identifier, quote, string_literal
from recovery.lib.lakehouse.formats import DataFile, iter_groups

if TYPE_CHECKING:
    import pyarrow as pa


def duckdb_columns(schema: pa.Schema, field: str) -> list[tuple[str, str]]:
    """(column, DuckDB type) of a table schema; a column name the package cannot quote is refused."""
    for name in schema.names:
        if not is_plain_identifier(name):
            raise SpecError(
                field,
                f"the table has a column named {name!r}, not a plain identifier",
                "rename it in the table (letters, digits, underscores)",
            )
    con = duckdb.connect()
    try:
        rel = con.from_arrow(schema.empty_table())
        return list(zip(rel.columns, [str(t) for t in rel.dtypes], strict=True))
    finally:
        con.close()


def files_sql(files: list[DataFile], columns: list[tuple[str, str]], *, filename: bool = False) -> str:
    """One SELECT over ``files`` with exactly ``columns`` (and the file's path as ``filename``)."""
    if not files:
        cols = [f"CAST(NULL AS {t}) AS {quote(c)}" for c, t in columns]
        return f"SELECT {', '.join(cols + (['CAST(NULL AS VARCHAR) AS filename'] if filename else []))} WHERE false"
    branches = []
    for parts, paths in iter_groups(files):
        constants = dict(parts)
        cols = [
            f"CAST({_constant(constants[c]) if c in constants else quote(c)} AS {t}) AS {quote(c)}" for c, t in columns
        ]
        listed = ", ".join(string_literal(p) for p in paths)
        branches.append(
            f"SELECT {', '.join(cols + (['filename'] if filename else []))} FROM read_parquet([{listed}], "
            f"union_by_name = true{', filename = true' if filename else ''})"
        )
    return " UNION ALL ".join(branches)


def _constant(value: str | None) -> str:
    return "NULL" if value is None else string_literal(value)
