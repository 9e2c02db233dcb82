"""IO managers for lakehouse targets, on dagster-deltalake's and dagster-iceberg's: stamped, and fenced.

An asset whose table is the lakehouse target of one of the configured specs is a
*managed* output: before anything is written the table's fence property is read and a
fenced generation's write fails the step with one sentence (not retried); otherwise its
rows get the run's generation and the write time in the target's metadata columns, and
the commit carries ``recovery.writer``, ``recovery.generation`` and the run id in its
commit properties, so the table's history says which generation wrote it and, after a
fence, the history sync applies exactly these commits (the concurrent ingestion the
repair replays). Every other asset is stored as the library stores it.

The generation is the run's (``recovery/generation`` tag, else ``backfill-<id>``, else
``run-<run id>``: ``recovery.lib.write.managed_output.generation_for_run``). On Delta the library's
own write runs with those commit properties; on Iceberg (whose library sets its own
snapshot properties only) the managed write goes through ``recovery.lib.lakehouse.writer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import dagster as dg
import pyarrow as pa
from dagster._core.storage.db_io_manager import DbTypeHandler, TableSlice
from dagster_deltalake import DeltaLakePyarrowIOManager
from dagster_deltalake.handler import DeltaLakePyArrowTypeHandler
from dagster_iceberg.io_manager.arrow import PyArrowIcebergIOManager, _PyArrowIcebergTypeHandler
from pydantic import Field

from recovery.lib.control.plane import utcnow
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.errors import FencedGenerationError
from recovery.lib.lakehouse.fence import fenced_generations
from recovery.lib.lakehouse.formats import open_log
from recovery.lib.lakehouse.writer import LakehouseMode, commit_properties, stamp, write
from recovery.lib.write.managed_output import generation_for_run

WRITER = "io_manager"


def _generation(context: dg.OutputContext) -> str:
    try:
        tags = context.step_context.dagster_run.tags
    except Exception:  # a context built outside a run (direct invocation) has no run and no tags
        tags = {}
    return generation_for_run(tags, context.run_id).generation


def _refuse_fenced(spec: DatasetSpec, generation: str) -> None:
    lake = spec.target.lakehouse
    assert lake is not None
    if generation in fenced_generations(open_log(lake).properties()):
        err = FencedGenerationError(generation, f"fenced on {lake.location}")
        raise dg.Failure(
            description=f"{spec.target.table}: generation {generation!r} is fenced on {lake.location}: its writes "
            f"are refused ({err}); nothing was written",
            allow_retries=False,
        )


class _WithProperties:
    """The output context as dagster-deltalake reads it, with the commit's properties in its metadata."""

    def __init__(self, context: dg.OutputContext, properties: dict[str, str]):
        self._context = context
        self._properties = properties

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    @property
    def definition_metadata(self) -> dict:
        meta = dict(self._context.definition_metadata or {})
        meta["custom_metadata"] = {**(meta.get("custom_metadata") or {}), **self._properties}
        return meta


class FencedDeltaTypeHandler(DeltaLakePyArrowTypeHandler):
    def __init__(self, managed: dict[str, DatasetSpec]):
        self.managed = managed

    def handle_output(self, context, table_slice: TableSlice, obj, connection) -> None:
        spec = self.managed.get(str(Path(connection.table_uri).resolve()))
        if spec is None or spec.target.lakehouse is None:
            return super().handle_output(context, table_slice, obj, connection)
        generation = _generation(context)
        _refuse_fenced(spec, generation)
        at: datetime = utcnow()
        props = commit_properties(spec.target.lakehouse, generation, at, WRITER, **{"recovery.run_id": context.run_id})
        rows = obj.read_all() if isinstance(obj, pa.RecordBatchReader) else obj
        stamped = cast(dg.OutputContext, _WithProperties(context, props))
        return super().handle_output(stamped, table_slice, stamp(spec, rows, generation, at), connection)


class FencedIcebergTypeHandler(_PyArrowIcebergTypeHandler):
    def __init__(self, managed: dict[str, DatasetSpec]):
        self.managed = managed

    def handle_output(self, context, table_slice: TableSlice, obj, connection) -> None:
        spec = self.managed.get(f"{table_slice.schema}.{table_slice.table}")
        if spec is None:
            return super().handle_output(context, table_slice, obj, connection)
        generation = _generation(context)
        _refuse_fenced(spec, generation)
        rows = obj.read_all() if isinstance(obj, pa.RecordBatchReader) else obj
        mode: LakehouseMode = "replace_partitions" if context.has_asset_partitions else "upsert"
        write(spec, generation, rows, mode=mode, writer=WRITER, run_id=context.run_id)


def _managed(specs: list[str], fmt: str) -> dict[str, DatasetSpec]:
    out = {}
    for path in specs:
        spec = parse_spec(path)
        lake = spec.target.lakehouse
        if lake is None or lake.format != fmt:
            continue
        out[str(lake.path) if fmt == "delta" else str(lake.identifier)] = spec
    return out


class FencedDeltaLakeIOManager(DeltaLakePyarrowIOManager):
    """dagster-deltalake's IO manager; a spec's Delta target is written stamped and fenced."""

    specs: list[str] = Field(default_factory=list, description="Dataset specs whose Delta targets are managed.")

    def type_handlers(self) -> Sequence[DbTypeHandler]:  # type: ignore[override]
        return [FencedDeltaTypeHandler(_managed(self.specs, "delta"))]


class FencedIcebergIOManager(PyArrowIcebergIOManager):
    """dagster-iceberg's IO manager; a spec's Iceberg target is written stamped and fenced."""

    specs: list[str] = Field(default_factory=list, description="Dataset specs whose Iceberg targets are managed.")

    def type_handlers(self) -> Sequence[DbTypeHandler]:  # type: ignore[override]
        return [FencedIcebergTypeHandler(_managed(self.specs, "iceberg"))]
