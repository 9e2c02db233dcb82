"""Classify each key of the damaged target against the expected rows, in SQL.

Expected rows E are the spec's transform over the source as of the snapshot
watermark; T is what the public name exposes now. One label per key, first match
wins (ARCHITECTURE.md "Damage vocabulary"). Timing facts come from the control
plane: the failed generations' start (registered, or inferred from their first
write), the delta log (what the target held before the backfill started, and
whether a concurrent generation had written a newer version before the failed
write clobbered it), and the source's ``ingested_at``.

Keys that differ from E without matching any rule are labelled ``unexplained``:
that is the signal that stops a repair from expanding.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.lib.control_plane import SCHEMA, delta_table
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.snapshot import expected_rows_sql, latest_versions_sql, str_list, ts_literal
from recovery.lib.spec import DatasetSpec

LABELS = (
    "duplicate", "resurrected", "unexpected", "missing", "deleted",
    "mispartitioned", "overwritten", "stale", "incorrectly_transformed", "unexplained",
)


@dataclass(frozen=True)
class ReconcileInputs:
    spec: DatasetSpec
    failed_generations: tuple[str, ...]
    watermark: datetime | None = None      # snapshot watermark; default: the source's max ingested_at
    incident_id: str = "adhoc"


def recon_table(spec: DatasetSpec) -> str:
    return f'{SCHEMA}."recon__{spec.dataset}"'


def partition_table(spec: DatasetSpec) -> str:
    return f'{SCHEMA}."recon_partitions__{spec.dataset}"'


def _failed_start(s: Session, spec: DatasetSpec, gens: list) -> datetime | None:
    """When the failed generations started: registered, else inferred from their first write."""
    registered = s.scalar(f"SELECT min(started_at) FROM {SCHEMA}.generations WHERE generation IN ({str_list(gens)})")
    if registered is not None:
        return registered
    return s.scalar(
        f"SELECT min({quote(spec.target.metadata.written_at)}) FROM {delta_table(spec.dataset)} "
        f"WHERE {quote(spec.target.metadata.generation)} IN ({str_list(gens)})"
    )


def stage(s: Session, inputs: ReconcileInputs) -> dict:
    """Build the temp relations the classification reads. Returns the resolved facts."""
    spec = inputs.spec
    src, meta = spec.source, spec.target.metadata
    gens = list(inputs.failed_generations)
    watermark = inputs.watermark or s.scalar(f"SELECT max({quote(src.ingested_at)}) FROM {src.table_name.sql()}")
    start = _failed_start(s, spec, gens)
    key = quote_all(spec.key)
    gen, sv, wat = quote(meta.generation), quote(meta.source_version), quote(meta.written_at)
    delta = delta_table(spec.dataset)
    s.execute(f"CREATE OR REPLACE TEMP TABLE __e AS {expected_rows_sql(spec, watermark)}")
    s.execute(f"CREATE OR REPLACE TEMP TABLE __t AS SELECT *, row_number() OVER () AS __rid FROM {spec.target.table_name.sql()}")
    s.execute(f"CREATE OR REPLACE TEMP TABLE __tn AS SELECT {key}, count(*) AS __n, min(__rid) AS __first FROM __t GROUP BY ALL")
    s.execute(
        f"CREATE OR REPLACE TEMP TABLE __latest AS SELECT {key}, {quote(src.version)} AS __v, {quote(src.op)} AS __op "
        f"FROM ({latest_versions_sql(spec, watermark, include_deleted=True)})"
    )
    s.execute(
        f"CREATE OR REPLACE TEMP TABLE __arrived AS SELECT {key}, {quote(src.version)} AS __v, {quote(src.ingested_at)} AS __at "
        f"FROM {src.table_name.sql()} WHERE {quote(src.ingested_at)} <= {ts_literal(watermark)}"
    )
    has_delta = s.object_kind(SCHEMA, f"delta__{spec.dataset}") is not None
    if has_delta and start is not None:
        s.execute(
            f"CREATE OR REPLACE TEMP TABLE __held AS SELECT {key} FROM ("
            f"SELECT {key}, _delta_op, row_number() OVER (PARTITION BY {key} ORDER BY _delta_seq DESC, _delta_op DESC) AS rn "
            f"FROM {delta} WHERE {wat} <= {ts_literal(start)}) WHERE rn = 1 AND _delta_op = 'upsert'"
        )
        s.execute(
            f"CREATE OR REPLACE TEMP TABLE __clobber AS SELECT {key}, max(_delta_seq) AS __seq FROM {delta} "
            f"WHERE {gen} IN ({str_list(gens)}) AND _delta_op = 'upsert' GROUP BY ALL"
        )
        s.execute(
            f"CREATE OR REPLACE TEMP TABLE __concurrent AS SELECT DISTINCT {', '.join(f'd.{quote(k)}' for k in spec.key)} "
            f"FROM {delta} d JOIN __clobber c USING ({key}) JOIN __t t USING ({key}) "
            f"WHERE d.{gen} NOT IN ({str_list(gens)}) AND d._delta_op = 'upsert' AND d.{sv} > t.{sv} AND d._delta_seq < c.__seq"
        )
    else:
        s.execute(f"CREATE OR REPLACE TEMP TABLE __held AS SELECT {key} FROM __e WHERE false")
        s.execute(f"CREATE OR REPLACE TEMP TABLE __concurrent AS SELECT {key} FROM __e WHERE false")
    return {"watermark": watermark, "failed_start": start}


def classification_sql(inputs: ReconcileInputs, start: datetime | None, columns: list[str]) -> str:
    """One row per key in T or E that differs, with its label and evidence."""
    spec = inputs.spec
    meta, part = spec.target.metadata, spec.target.partition
    gens = str_list(list(inputs.failed_generations))
    key = quote_all(spec.key)
    payload = [c for c in columns if c not in spec.key and c != meta.source_version]
    no_part = [c for c in payload if c != part]
    same = lambda cols: " AND ".join([f"t.{quote(c)} IS NOT DISTINCT FROM e.{quote(c)}" for c in cols] or ["true"])  # noqa: E731
    differing = ", ".join(f"CASE WHEN t.{quote(c)} IS DISTINCT FROM e.{quote(c)} THEN '{c}' END" for c in payload)
    gen, sv = quote(meta.generation), quote(meta.source_version)
    p = quote(part)
    after_start = f"a.__at > {ts_literal(start)}" if start else "false"
    by_failed = f"t.{gen} IN ({gens})"
    present_t = f"t.{quote(spec.key[0])} IS NOT NULL"
    present_e = f"e.{quote(spec.key[0])} IS NOT NULL"
    return f"""
    WITH t AS (SELECT __t.* FROM __t JOIN __tn ON __t.__rid = __tn.__first),
    j AS (
        SELECT {', '.join(f'coalesce(t.{quote(k)}, e.{quote(k)}) AS {quote(k)}' for k in spec.key)},
               t.{p} AS actual_partition, e.{p} AS expected_partition,
               t.{gen} AS generation, t.{sv} AS actual_version, e.{sv} AS expected_version,
               coalesce(n.__n, 0) AS rows_in_target,
               CASE
                 WHEN n.__n > 1 THEN 'duplicate'
                 WHEN {present_t} AND l.__op IN ({str_list(spec.source.delete_ops)}) THEN 'resurrected'
                 WHEN {present_t} AND l.__v IS NULL THEN 'unexpected'
                 WHEN NOT {present_t} AND {present_e} THEN CASE WHEN h.__held THEN 'deleted' ELSE 'missing' END
                 WHEN {present_t} AND {present_e} AND {same(no_part)} AND t.{p} IS DISTINCT FROM e.{p} THEN 'mispartitioned'
                 WHEN t.{sv} < e.{sv} AND {by_failed} AND {after_start} AND c.__concurrent THEN 'overwritten'
                 WHEN t.{sv} < e.{sv} AND {by_failed} THEN 'stale'
                 WHEN t.{sv} = e.{sv} AND NOT ({same(payload)}) THEN 'incorrectly_transformed'
                 WHEN {present_t} AND {present_e} AND ({same(payload)}) AND t.{sv} IS NOT DISTINCT FROM e.{sv} THEN NULL
                 WHEN NOT {present_t} AND NOT {present_e} THEN NULL
                 ELSE 'unexplained'
               END AS label,
               list_filter([{differing}], lambda x: x IS NOT NULL) AS differing_columns
        FROM t FULL OUTER JOIN __e e USING ({key})
        LEFT JOIN __tn n USING ({key})
        LEFT JOIN __latest l USING ({key})
        LEFT JOIN (SELECT {key}, true AS __held FROM __held) h USING ({key})
        LEFT JOIN (SELECT {key}, true AS __concurrent FROM __concurrent) c USING ({key})
        LEFT JOIN __arrived a ON {' AND '.join(f'a.{quote(k)} = e.{quote(k)}' for k in spec.key)} AND a.__v = e.{sv}
    )
    SELECT * FROM j WHERE label IS NOT NULL
    """


def reconcile(s: Session, inputs: ReconcileInputs) -> dict:
    """Classify keys and partitions into the control plane; the caller owns the transaction."""
    from recovery.lib.reconcile.partitions import partition_findings_sql

    spec = inputs.spec
    facts = stage(s, inputs)
    columns = [c for c, _ in s.columns("__e")]
    table, ptable = recon_table(spec), partition_table(spec)
    s.execute(f"CREATE OR REPLACE TEMP TABLE __recon AS {classification_sql(inputs, facts['failed_start'], columns)}")
    s.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT CAST(NULL AS VARCHAR) AS incident_id, * FROM __recon LIMIT 0")
    s.execute(f"DELETE FROM {table} WHERE incident_id = ?", [inputs.incident_id])
    s.execute(f"INSERT INTO {table} SELECT ?, * FROM __recon", [inputs.incident_id])
    s.execute(f"CREATE OR REPLACE TEMP TABLE __partitions AS {partition_findings_sql(inputs, facts['failed_start'])}")
    s.execute(f"CREATE TABLE IF NOT EXISTS {ptable} AS SELECT CAST(NULL AS VARCHAR) AS incident_id, * FROM __partitions LIMIT 0")
    s.execute(f"DELETE FROM {ptable} WHERE incident_id = ?", [inputs.incident_id])
    s.execute(f"INSERT INTO {ptable} SELECT ?, * FROM __partitions", [inputs.incident_id])
    return facts
