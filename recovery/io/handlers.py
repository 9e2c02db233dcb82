"""Type handlers for the managed IO manager: pandas frames, Arrow tables, DuckDB relations.

They implement dagster's ``DbTypeHandler`` like dagster-duckdb-pandas and -pyarrow do,
but register the object on the connection by name instead of relying on DuckDB's
replacement scans (reading a Python variable by name), which every engine connection of
this package disables. Each copies the object into the table slice in one statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

import duckdb
from dagster import InputContext, OutputContext
from dagster._core.storage.db_io_manager import DbTypeHandler, TableSlice
from dagster_duckdb.io_manager import DuckDbClient

if TYPE_CHECKING:  # pandas and pyarrow load when a run stores or loads a frame, not with the code location
    import pandas as pd
    import pyarrow as pa

_VIEW = "__recovery_io_output"


def _store(obj, table_slice: TableSlice, connection: duckdb.DuckDBPyConnection) -> Mapping[str, object]:
    """Append the rows to the slice's table, created from them if missing, as dagster-duckdb's own
    handlers do: the IO manager has already deleted the slice's partitions, and the table keeps the
    other partitions (replacing the table would drop them)."""
    table = f"{table_slice.schema}.{table_slice.table}"
    connection.register(_VIEW, obj)
    try:
        connection.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM {_VIEW} LIMIT 0")
        rows = connection.execute(f"INSERT INTO {table} SELECT * FROM {_VIEW}").fetchall()[0][0]
    except duckdb.Error:
        with suppress(duckdb.Error):  # in an aborted transaction: the insert's own error is the one to tell
            connection.unregister(_VIEW)
        raise
    connection.unregister(_VIEW)
    return {"dagster/row_count": int(rows)}


class PandasTypeHandler(DbTypeHandler["pd.DataFrame"]):
    def handle_output(self, context: OutputContext, table_slice: TableSlice, obj: pd.DataFrame, connection):
        return _store(obj, table_slice, connection)

    def load_input(self, context: InputContext, table_slice: TableSlice, connection) -> pd.DataFrame:
        return connection.execute(DuckDbClient.get_select_statement(table_slice)).df()

    @property
    def supported_types(self) -> Sequence[type[object]]:
        import pandas as pd

        return [pd.DataFrame]


class ArrowTypeHandler(DbTypeHandler["pa.Table"]):
    def handle_output(self, context: OutputContext, table_slice: TableSlice, obj: pa.Table, connection):
        return _store(obj, table_slice, connection)

    def load_input(self, context: InputContext, table_slice: TableSlice, connection) -> pa.Table:
        return connection.sql(DuckDbClient.get_select_statement(table_slice)).to_arrow_table()

    @property
    def supported_types(self) -> Sequence[type[object]]:
        import pyarrow as pa

        return [pa.Table]


class RelationTypeHandler(DbTypeHandler[duckdb.DuckDBPyRelation]):
    """A relation may belong to another connection (or file), so it crosses as Arrow."""

    def handle_output(self, context: OutputContext, table_slice: TableSlice, obj: duckdb.DuckDBPyRelation, connection):
        return _store(obj.to_arrow_table(), table_slice, connection)

    def load_input(self, context: InputContext, table_slice: TableSlice, connection) -> duckdb.DuckDBPyRelation:
        # the IO manager's connection closes after loading: hand over a relation over the data itself
        return duckdb.from_arrow(connection.sql(DuckDbClient.get_select_statement(table_slice)).to_arrow_table())

    @property
    def supported_types(self) -> Sequence[type[object]]:
        return [duckdb.DuckDBPyRelation]
