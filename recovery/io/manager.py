"""``ManagedDuckDBIOManager``: dagster-duckdb's IO manager, with managed datasets written through the writer.

An asset whose table (``schema.table`` from its key prefix or ``schema`` metadata, as
dagster-duckdb resolves it) is the target of one of the configured dataset specs is a
*managed* output: its frame is staged in the warehouse by the type handler, then written
by :func:`recovery.lib.write.managed_output.write_output`, stamped with the run's generation
(``recovery/generation`` tag, else ``backfill-<id>`` in a Dagster backfill, else
``run-<run id>``), the fence checked in the write's own transaction, a partitioned asset
replacing its partitions only, and the source watermark the output applied recorded with
the write (what the asset reported as ``recovery/source_watermark`` output metadata, else
the source as the run started: see :func:`~recovery.lib.write.managed_output.output_watermark`).
A fenced generation's write fails the step with one sentence and is not retried. Every other
asset is stored exactly as ``DuckDBIOManager`` stores it; reading a managed asset reads its
public name (the managed view).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import dagster as dg
from dagster._core.storage.db_io_manager import DbIOManager, DbTypeHandler, TablePartitionDimension, TableSlice
from dagster_duckdb import DuckDBIOManager
from dagster_duckdb.io_manager import DuckDbClient
from pydantic import Field

from recovery.defs.resources import warehouse_resource
from recovery.io.handlers import ArrowTypeHandler, PandasTypeHandler, RelationTypeHandler
from recovery.lib.control.plane import utcnow
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine.duckdb_engine import duckdb_connection
from recovery.lib.errors import FencedGenerationError, RecoveryError
from recovery.lib.write.managed_output import (
    SOURCE_WATERMARK_KEY,
    STAGE_SCHEMA,
    clear_superseded,
    drop_stage,
    generation_for_run,
    output_watermark,
    stage_table,
    write_output,
)

PARENT_RUN_TAG, ROOT_RUN_TAG = "dagster/parent_run_id", "dagster/root_run_id"  # a re-execution's earlier runs
WRITE_MODE_KEY = "recovery/write_mode"
"""Asset metadata choosing how an output is written: replace_partitions (default for a
partitioned asset), upsert_keys (default otherwise) or append."""


class ManagedDbIOManager(DbIOManager):
    def __init__(self, *, managed: dict[str, str], **kwargs):
        super().__init__(**kwargs)
        self._managed = managed  # "schema.table" -> spec path

    def _table(self, context: dg.OutputContext | dg.InputContext, metadata) -> str | None:
        if not context.has_asset_key:
            return None
        path = context.asset_key.path
        schema = (metadata or {}).get("schema") or self._schema or (path[-2] if len(path) > 1 else "public")
        return f"{schema}.{path[-1]}"

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        table = self._table(context, context.definition_metadata)
        spec_path = self._managed.get(table) if table else None
        if spec_path is None:
            return super().handle_output(context, obj)
        problem = None
        engine_kind = parse_spec(spec_path).warehouse.engine
        if obj is None:
            problem = (
                "returned None; a managed dataset's asset must return a frame (pandas, pyarrow or a DuckDB relation)"
            )
        elif context.has_asset_partitions and isinstance(context.asset_partitions_def, dg.MultiPartitionsDefinition):
            problem = (
                "has multi-dimensional partitions; partition a managed dataset's asset by the spec's "
                "target.partition only"
            )
        elif engine_kind != "duckdb":
            problem = (
                f"is a {engine_kind} dataset and ManagedDuckDBIOManager writes DuckDB warehouses only; "
                f"write it with recovery.lib.write.writer.Writer (see README, Running on Spark)"
            )
        if problem:
            raise dg.Failure(
                description=f"{table}: asset {context.asset_key.to_user_string()} {problem}", allow_retries=False
            )
        self._check_supported_type(type(obj))
        partitions = list(context.asset_partition_keys) if context.has_asset_partitions else None
        dagster_run = context.step_context.dagster_run
        run_tags = dagster_run.tags
        run = generation_for_run(run_tags, context.run_id)
        writer = warehouse_resource(spec_path).writer(actor=f"io_manager:{context.asset_key.to_user_string()}")
        stage = stage_table(context.run_id, context.step_key)
        schema, name = stage.split(".", 1)
        try:
            watermark, basis = output_watermark(
                _unwrap((context.output_metadata or {}).get(SOURCE_WATERMARK_KEY)), _run_started(context), utcnow()
            )
            # a re-execution of a run killed (or failed) before its cleanup: that attempt's stage and empty generation
            clear_superseded(
                writer,
                run,
                context.run_id,
                context.step_key,
                [
                    dagster_run.parent_run_id or run_tags.get(PARENT_RUN_TAG),
                    dagster_run.root_run_id or run_tags.get(ROOT_RUN_TAG),
                ],
            )
            with writer.engine.transaction() as s:
                s.execute(f"CREATE SCHEMA IF NOT EXISTS {STAGE_SCHEMA}")
                s.drop_relation(stage)  # a stage a killed attempt left: never added to
                handler_metadata = self._resolve_handler(type(obj)).handle_output(
                    context, TableSlice(table=name, schema=schema), obj, duckdb_connection(s)
                )
            result = write_output(
                writer,
                stage,
                run=run,
                run_id=context.run_id,
                partitions=partitions,
                mode=(context.definition_metadata or {}).get(WRITE_MODE_KEY),
                code_version=_code_version(context),
                source_watermark=watermark,
                watermark_basis=f"IO-manager run {context.run_id[:8]} of {context.asset_key.to_user_string()}: {basis}",
            )
        except FencedGenerationError as err:
            # contained: a retry would only be refused again
            raise dg.Failure(
                description=f"{table}: {err}; contained by the incident that fenced it, nothing was written",
                allow_retries=False,
            ) from err
        except RecoveryError as err:  # rows the dataset refuses: the same rows would be refused again
            raise dg.Failure(description=f"{table}: {err}; nothing was written", allow_retries=False) from err
        finally:
            drop_stage(writer, stage)
        context.add_output_metadata(
            {
                **(handler_metadata or {}),
                "dagster/table_name": table,
                "recovery/generation": run.generation,
                "recovery/write_seq": result.seq,
                "recovery/rows_inserted": result.rows_inserted,
                "recovery/rows_deleted": result.rows_deleted,
                "recovery/namespace": result.namespace,
                SOURCE_WATERMARK_KEY: watermark.isoformat(sep=" "),
            }
        )

    def load_input(self, context: dg.InputContext) -> object:
        upstream = cast(dg.OutputContext, context.upstream_output)
        table = self._table(context, upstream.definition_metadata if upstream else None)
        spec_path = self._managed.get(table) if table else None
        if spec_path is None:
            return super().load_input(context)
        spec = parse_spec(spec_path)
        load_type = context.dagster_type.typing_type
        if load_type is Any:
            load_type = self._default_load_type
        self._check_supported_type(load_type)
        dims = (
            [TablePartitionDimension(spec.target.partition, list(context.asset_partition_keys))]
            if context.has_asset_partitions
            else []
        )
        slice_ = TableSlice(
            table=spec.target.table_name.name,
            schema=spec.target.table_name.schema,
            partition_dimensions=dims,
            columns=(context.definition_metadata or {}).get("columns"),
        )
        engine = warehouse_resource(spec_path).engine()
        with engine.session(read_only=True) as s:
            return self._resolve_handler(load_type).load_input(context, slice_, duckdb_connection(s))


def _unwrap(value: object) -> object:
    """A metadata entry's plain value (``dg.MetadataValue.timestamp`` holds POSIX seconds)."""
    return value.value if isinstance(value, dg.MetadataValue) else value


def _run_started(context: dg.OutputContext) -> datetime | None:
    """When the output's run started (naive UTC), if the instance recorded it."""
    try:
        record = context.step_context.instance.get_run_record_by_id(context.run_id)
    except Exception:  # a context built outside a run
        return None
    started = record.start_time if record else None
    return datetime.fromtimestamp(started, UTC).replace(tzinfo=None) if started else None


def _code_version(context: dg.OutputContext) -> str | None:
    try:
        return context.asset_spec.code_version
    except Exception:  # an op output, or a context built outside a run
        return None


class AtomicDuckDbClient(DuckDbClient):
    """dagster-duckdb's client, with each output's delete-then-insert in one transaction, and the
    connection closed when the step fails too. Its own deletes the slice's partitions, then inserts,
    each committed apart, and closes only after a clean exit: a failed insert (a column added to the
    table by hand) left the partitions empty, and the file open in the run's process."""

    @staticmethod
    @contextmanager
    def connect(context, table_slice):
        with DuckDbClient.connect(context, table_slice) as conn:
            conn.begin()
            try:
                yield conn
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                conn.close()

    @staticmethod
    def delete_table_slice(context, table_slice: TableSlice, connection) -> None:
        # dagster-duckdb's own ignores the error a missing table raises, which inside a transaction
        # aborts it: ask the catalog first
        found = connection.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            [table_slice.schema, table_slice.table],
        ).fetchall()[0][0]
        if found:
            DuckDbClient.delete_table_slice(context, table_slice, connection)


class ManagedDuckDBIOManager(DuckDBIOManager):
    """dagster-duckdb's ``DuckDBIOManager`` for a team's assets; the tables of ``specs`` are managed.

    ``database`` is the DuckDB file for unmanaged assets (usually the specs' warehouse)."""

    specs: list[str] = Field(
        default_factory=list,
        description="Dataset spec YAML files whose target tables this IO manager writes through the writer.",
    )

    @staticmethod
    def type_handlers() -> Sequence[DbTypeHandler]:
        return [PandasTypeHandler(), ArrowTypeHandler(), RelationTypeHandler()]

    @staticmethod
    def default_load_type() -> type | None:
        import pandas as pd

        return pd.DataFrame

    def managed_tables(self) -> dict[str, str]:
        """``schema.table`` -> spec path of every managed dataset (each table managed by one spec)."""
        managed: dict[str, str] = {}
        for path in self.specs:
            spec = parse_spec(path)
            table = str(spec.target.table_name)
            if table in managed:
                raise RecoveryError(f"specs {managed[table]} and {path} both manage {table}; keep one")
            managed[table] = str(path)
        return managed

    def create_io_manager(self, context) -> DbIOManager:
        return ManagedDbIOManager(
            managed=self.managed_tables(),
            db_client=AtomicDuckDbClient(),
            database=self.database,
            schema=self.schema_,
            type_handlers=self.type_handlers(),
            default_load_type=self.default_load_type(),
            io_manager_name="ManagedDuckDBIOManager",
        )
