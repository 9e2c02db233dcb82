"""Which warehouse relations an evidence bundle copies, as SELECTs for DuckDB to write.

The bundle freezes what reconciliation and any later audit need: the whole source
change log, tombstones included, and the source as of each failed generation's
snapshot watermark and as of now, each as the (key, version) list of its rows in
that copy (:mod:`.snapshots`; any other watermark can be recomputed), every
generation's rows in the published namespace, the failed generations' own
namespaces and delta-log entries, the consumers' outputs, the control plane and
the catalog's columns. Nothing here moves a row through Python.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime

from recovery.lib.consumers.sql import CONSUMER_SCHEMA, consumer_table
from recovery.lib.control.plane import SCHEMA, control_plane_exists, delta_table, has_dataset_table
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.evidence.snapshots import CHANGE_LOG
from recovery.lib.identifiers import TableName, quote
from recovery.lib.incident.failed_generations import GenerationFacts
from recovery.lib.pointers.namespaces import current_namespace, namespace_sql
from recovery.lib.snapshot import source_snapshot_sql


@dataclass(frozen=True)
class TableCopy:
    path: str  # relative path inside the bundle
    sql: str  # one SELECT
    description: str
    params: list = field(default_factory=list)
    values_from: str | None = None  # a relation holding every value of the copy's columns (see hashed_select)
    about: dict = field(default_factory=dict)  # more of the manifest entry (a snapshot's: its watermark, ...)


def safe_name(text: str) -> str:
    """A file name for an arbitrary id: kept when plain, else made plain and suffixed with a hash."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100]
    if plain == text and not text.startswith("."):
        return text
    return f"{plain.lstrip('.') or 'id'}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _stamp(value: datetime) -> str:
    return value.strftime("%Y%m%dT%H%M%S")


def planned_copies(s: Session, spec: DatasetSpec, facts: list[GenerationFacts]) -> tuple[list[TableCopy], list[str]]:
    """Every relation the bundle holds, and notes on what could not be copied."""
    copies: list[TableCopy] = []
    notes: list[str] = []
    src = spec.source.table_name.sql()
    copies.append(
        TableCopy(
            CHANGE_LOG,
            f"SELECT * FROM {src}",
            "the whole source change log as of the bundle (tombstones included)",
        )
    )
    pair = [*spec.source.key, spec.source.version]

    def snapshot(rel: str, wm: datetime | None, what: str) -> TableCopy:
        return TableCopy(
            rel,
            f"SELECT {', '.join(quote(c) for c in pair)} FROM ({source_snapshot_sql(spec, wm)})",
            f"source snapshot as of {what}: the key and version of each key's latest non-deleted change; "
            f"its rows are those of {CHANGE_LOG} with these (see snapshot.rows)",
            values_from=f"SELECT * FROM {src}",
            about={
                "snapshot": {
                    "as_of": "now" if wm is None else str(wm),
                    "rows_of": CHANGE_LOG,
                    "key": list(spec.source.key),
                    "version": spec.source.version,
                }
            },
        )

    seen = set()
    for f in facts:
        wm, basis = f.snapshot_watermark
        if wm is None:
            notes.append(f"generation {f.generation}: no watermark known, so no source snapshot as of its read")
        elif wm not in seen:
            seen.add(wm)
            copies.append(
                snapshot(f"source/snapshot_at_{_stamp(wm)}.keys.parquet", wm, f"{wm} ({basis} of {f.generation})")
            )
    copies.append(snapshot("source/snapshot_now.keys.parquet", None, "the bundle"))

    gen = quote(spec.target.metadata.generation)
    current = current_namespace(s, spec) if control_plane_exists(s) else None
    ns, where = (namespace_sql(current), f"the published namespace {current}") if current else (None, "")
    if current is None and s.object_kind(spec.target.table_name.schema, spec.target.table_name.name) == "table":
        ns, where = spec.target.table_name.sql(), f"the plain table {spec.target.table} (not contained yet)"
        notes.append(f"{spec.target.table} was not contained when the bundle was built: its rows are copied as found")
    elif current is None:
        notes.append(f"{spec.target.table} has no published namespace in the control plane")
    if ns:
        # one file per failed generation, one for every other writer's rows (a target that a scheduler has
        # loaded for years holds thousands of generations: one file each would bury the evidence)
        failed = [f.generation for f in facts]
        for g in failed:
            copies.append(
                TableCopy(
                    f"target/current/{safe_name(g)}.parquet",
                    f"SELECT * FROM {ns} WHERE {gen} = ?",
                    f"rows of failed generation {g} in {where}",
                    [g],
                )
            )
        copies.append(
            TableCopy(
                "target/current/_other_generations.parquet",
                f"SELECT * FROM {ns} WHERE {gen} IS NULL OR {gen} NOT IN (SELECT unnest(CAST(? AS VARCHAR[])))",
                f"rows of every other generation (and rows with none) in {where}",
                [failed],
            )
        )
    if spec.registry is not None:
        copies.append(
            TableCopy(
                "registry/runs.parquet",
                f"SELECT * FROM {spec.registry.table_name.sql()}",
                f"the team's run registry {spec.registry.table} (generations, starts, watermarks)",
            )
        )
    for f in facts:
        if f.namespace and f.namespace != current:
            copies.append(
                TableCopy(
                    f"target/namespace/{safe_name(f.namespace)}.parquet",
                    f"SELECT * FROM {namespace_sql(f.namespace)}",
                    f"namespace {f.namespace} written by failed generation {f.generation}",
                )
            )
    delta = delta_table(spec.dataset)
    if has_dataset_table(s, "delta", spec.dataset):
        for f in facts:
            copies.append(
                TableCopy(
                    f"target/delta/{safe_name(f.generation)}.parquet",
                    f"SELECT * FROM {delta} WHERE {gen} = ?",
                    f"delta-log entries (inserted and removed rows) of failed generation {f.generation}",
                    [f.generation],
                )
            )
    else:
        notes.append(f"no delta log {delta}: the failed generations' removed rows are not recoverable from it")

    for c in spec.downstream:
        t = consumer_table(spec, c)
        if s.object_kind(t.schema, t.name):
            copies.append(
                TableCopy(
                    f"consumers/{c.name}.parquet",
                    f"SELECT * FROM {t.sql()}",
                    f"{c.kind} {c.name} (owner {c.owner}) as currently materialized",
                )
            )
    for (name,) in s.fetchall(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND table_type = 'BASE TABLE' "
        "AND table_name NOT LIKE 'delta\\_\\_%' ESCAPE '\\' AND table_name NOT LIKE 'expected\\_\\_%' ESCAPE '\\' "
        "ORDER BY 1",
        [SCHEMA],
    ):
        copies.append(
            TableCopy(
                f"control_plane/{safe_name(name)}.parquet",
                f"SELECT * FROM {TableName(SCHEMA, name).sql()}",
                f"control-plane table {SCHEMA}.{name}",
            )
        )
    schemas = sorted({spec.source.table_name.schema, spec.target.table_name.schema, SCHEMA, CONSUMER_SCHEMA})
    copies.append(
        TableCopy(
            "catalog/columns.parquet",
            "SELECT table_schema, table_name, column_name, ordinal_position, data_type, is_nullable "
            "FROM information_schema.columns WHERE table_schema IN (SELECT unnest(CAST(? AS VARCHAR[]))) "
            "ORDER BY 1, 2, 4",
            "the catalog's columns of the source, target, control-plane and consumer schemas",
            [schemas],
        )
    )
    return copies, notes
