"""The package's own writer to a lakehouse table: fenced-aware, and stamped so its history says who wrote.

Every commit carries ``recovery.writer`` and ``recovery.generation`` (plus the spec's
``generation_property`` and ``written_at_property``) in its commit properties, and its rows
carry the generation and time in the target's metadata columns. Before committing it reads
the table's fence property and refuses a fenced generation in one sentence; on Delta a fence
committed between that read and this commit makes this commit conflict (a metadata change),
and the write fails rather than land. After the fence, the history sync applies exactly these
commits (the concurrent ingestion a repair replays) and keeps every other writer's out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import pyarrow as pa

from recovery.lib.control.plane import utcnow
from recovery.lib.dataset_spec.lakehouse import LakehouseTable
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.errors import FencedGenerationError, RecoveryError
from recovery.lib.lakehouse.fence import FENCE_PROPERTY, fenced_generations
from recovery.lib.lakehouse.formats import DeltaLog, IcebergLog, open_log
from recovery.lib.lakehouse.history import GENERATION_PROPERTY, WRITER_PROPERTY

LakehouseMode = Literal["append", "upsert", "replace_partitions"]


def commit_properties(
    table: LakehouseTable, generation: str, at: datetime, writer: str, **extra: str
) -> dict[str, str]:
    props = {WRITER_PROPERTY: writer, GENERATION_PROPERTY: generation, table.generation_property: generation, **extra}
    if table.written_at_property:
        props[table.written_at_property] = at.isoformat()
    return props


def stamp(spec: DatasetSpec, data: pa.Table, generation: str, at: datetime) -> pa.Table:
    """The rows with the target's generation and written-at columns set to this write's."""
    meta = spec.target.metadata
    for name, value, typ in [(meta.generation, generation, pa.string()), (meta.written_at, at, pa.timestamp("us"))]:
        column = pa.array([value] * data.num_rows, type=typ)
        i = data.schema.get_field_index(name)
        data = data.set_column(i, name, column) if i >= 0 else data.append_column(name, column)
    return data


def write(
    spec: DatasetSpec,
    generation: str,
    data: pa.Table,
    *,
    mode: LakehouseMode,
    writer: str = "lakehouse_writer",
    at: datetime | None = None,
    run_id: str | None = None,
) -> int:
    """Commit ``data`` (the target's payload and source-version columns) as ``generation``; returns the version.

    ``append`` adds the rows; ``upsert`` replaces the rows of the same keys (Delta MERGE; Iceberg upsert);
    ``replace_partitions`` overwrites the partitions the rows fall in."""
    table = spec.target.lakehouse
    if table is None:
        raise RecoveryError(
            f"dataset {spec.dataset!r} has no lakehouse target: write through recovery.lib.write.writer"
        )
    log = open_log(table)
    if generation in fenced_generations(log.properties()):
        raise FencedGenerationError(generation, f"fenced on {table.location} (table property {FENCE_PROPERTY})")
    when = at or utcnow()
    extra = {"recovery.run_id": run_id} if run_id else {}
    props = commit_properties(table, generation, when, writer, **extra)
    rows = stamp(spec, data, generation, when).select(log.schema().names).cast(log.schema())
    part = spec.target.partition
    if isinstance(log, DeltaLog):
        from deltalake import CommitProperties, DeltaTable, write_deltalake

        committed = CommitProperties(custom_metadata=props)
        if mode == "upsert":
            on = " AND ".join(f"t.{k} = s.{k}" for k in spec.key)
            DeltaTable(str(log.root)).merge(
                rows, predicate=on, source_alias="s", target_alias="t", commit_properties=committed
            ).when_matched_update_all().when_not_matched_insert_all().execute()
        else:
            parts = log.partition_columns() or None
            if mode == "append":
                write_deltalake(str(log.root), rows, mode="append", partition_by=parts, commit_properties=committed)
            else:
                listed = ", ".join("'" + v.replace("'", "''") + "'" for v in _values(rows, part))
                write_deltalake(
                    str(log.root),
                    rows,
                    mode="overwrite",
                    predicate=f"{part} IN ({listed})",
                    partition_by=parts,
                    commit_properties=committed,
                )
    else:
        assert isinstance(log, IcebergLog)
        from pyiceberg.expressions import In

        if mode == "append":
            log.tbl.append(rows, snapshot_properties=props)
        elif mode == "upsert":
            tx = log.tbl.transaction()
            tx.upsert(rows, join_cols=spec.key, snapshot_properties=props)
            tx.commit_transaction()
        else:
            log.tbl.overwrite(
                rows, overwrite_filter=In(term=part, literals=_values(rows, part)), snapshot_properties=props
            )
    head = open_log(table).head()
    assert head is not None
    return head


def _values(rows: pa.Table, column: str) -> tuple[str, ...]:
    return tuple(sorted({str(v) for v in rows.column(column).to_pylist()}))
