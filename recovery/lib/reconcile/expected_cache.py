"""The expected rows at a watermark, resolved once per dataset and then caught up key by key.

A recovery resolves the whole change log to the expected rows again and again: impact
assessment, the repair's fixed snapshot, restatement's check against the source,
every convergence verification, each a pass over the whole log. The source is an
append-only change log, so the expected rows at watermark W never move, and those at a
later watermark W' differ only in the keys that changed in (W, W']. A writer keeps
them once in ``_recovery."expected__<dataset>"`` with what they were resolved from;
later callers read that table, and at a later watermark overlay the few changed keys
resolved afresh (their latest version among *all* their changes up to W', so a late
older version is still ordered by version): a caller pays for the changed keys and a
check, not for a resolution of the whole log.

The kept table is trusted only while the source rows up to its watermark are the
ones it was resolved from (their count and the sum of their rows' hashes, checked on
every use), and only for the spec's current source declaration and transform. A source
purged, rewritten or backfilled below the watermark, or a changed transform,
resolves afresh. DuckDB only, and only for a naive TIMESTAMP arrival column (the
control plane's own kind of time): another engine, or an arrival column of DATE or
TIMESTAMPTZ, resolves every time.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from recovery.lib.control.plane import SCHEMA, dataset_table, dataset_table_name, utcnow
from recovery.lib.control.tables import EXPECTED_KEPT as KEPT
from recovery.lib.control.tables import EXPECTED_KEPT_DDL
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.identifiers import quote, quote_all, ts_literal
from recovery.lib.snapshot import expected_rows_sql, latest_versions_sql

CHANGED = "__expected_changed"
REKEEP_SHARE = 0.1
"""A writer catching up more changed keys than this share of the kept rows keeps the caught-up rows."""


def resolution_key(spec: DatasetSpec) -> str:
    """What the expected rows depend on: the source's declaration, the transform and the name of the
    source-version column (not the target's table: a spec aimed at a namespace shares them)."""
    h = hashlib.sha256(spec.source.model_dump_json().encode())
    h.update(spec.target.metadata.source_version.encode())
    h.update(spec.transform_sql.encode())
    return h.hexdigest()[:16]


def keepable(s: Session, watermark: object) -> bool:
    """Whether expected rows at ``watermark`` can be kept and compared: a DuckDB session and a naive
    timestamp (a DATE or zoned arrival would compare with the kept TIMESTAMP as another type)."""
    return isinstance(s, DuckDBSession) and type(watermark) is datetime and watermark.tzinfo is None


def kept_select(spec: DatasetSpec) -> str:
    """The SELECT of the kept rows, exactly as they are."""
    return f"SELECT * FROM {dataset_table('expected', spec.dataset)}"


def source_state(s: Session, spec: DatasetSpec, upto: datetime) -> tuple[int, str]:
    """The source rows up to ``upto``: how many, and the sum of their hashes (one scan)."""
    [(n, h)] = s.fetchall(
        f"SELECT count(*), CAST(coalesce(sum(hash(x)), 0) AS VARCHAR) FROM {spec.source.table_name.sql()} x "
        f"WHERE {quote(spec.source.ingested_at)} <= {ts_literal(upto)}"
    )
    return int(n), str(h)


def kept_watermark(s: Session, spec: DatasetSpec) -> datetime | None:
    """The watermark of the kept expected rows, if they are still what the source says."""
    if s.object_kind(SCHEMA, "expected_rows_kept") is None:
        return None
    row = s.fetchone(
        f"SELECT resolution_key, watermark, source_rows, source_hash FROM {KEPT} WHERE dataset = ?", [spec.dataset]
    )
    if row is None or row[0] != resolution_key(spec):
        return None
    if s.object_kind(SCHEMA, dataset_table_name("expected", spec.dataset)) is None:
        return None
    return row[1] if source_state(s, spec, row[1]) == (row[2], row[3]) else None


def expected_rows(s: Session, spec: DatasetSpec, watermark: datetime | None, *, keep: bool) -> str:
    """A SELECT of the expected rows as of ``watermark`` (None: everything ingested).

    From the kept rows when they are valid and not newer than ``watermark``, with the
    keys changed since overlaid (this creates the temp table ``__expected_changed``, so
    the SELECT is read in this session). Otherwise resolved from the change log, and
    with ``keep`` (a writer) kept for the next caller."""
    plain = expected_rows_sql(spec, watermark)
    if not isinstance(s, DuckDBSession) or (watermark is not None and not keepable(s, watermark)):
        return plain
    src = spec.source
    at, source = quote(src.ingested_at), src.table_name.sql()
    upto = watermark
    if upto is None:  # "everything" is "up to the latest arrival" when every row has one
        [(upto, undated)] = s.fetchall(f"SELECT max({at}), count(*) FILTER (WHERE {at} IS NULL) FROM {source}")
        if upto is None or undated or not keepable(s, upto):
            return plain
    from_kept = _from_kept(s, spec, upto)
    if from_kept is not None and keep and from_kept != kept_select(spec) and _changed_share(s, spec) > REKEEP_SHARE:
        # a writer long after the kept watermark (a scheduled verification, weeks of ingestion later):
        # keep the caught-up rows, so the next caller does not re-resolve every key changed since
        s.temp_table("__expected_caught_up", f"{from_kept}")
        kept = keep_expected(s, spec, upto, "SELECT * FROM __expected_caught_up")
        s.drop_relation("__expected_caught_up")
        return kept
    if from_kept is not None:
        return from_kept
    if not keep:
        return plain
    return keep_expected(s, spec, upto, expected_rows_sql(spec, upto))


def _from_kept(s: DuckDBSession, spec: DatasetSpec, upto: datetime) -> str | None:
    """The expected rows as of ``upto`` from the kept rows, or None when they cannot serve."""
    kept = kept_watermark(s, spec)
    if kept is None or not keepable(s, upto) or kept > upto:
        return None
    table = dataset_table("expected", spec.dataset)
    if kept == upto:
        return kept_select(spec)
    src = spec.source
    key, at = quote_all(src.key), quote(src.ingested_at)
    s.temp_table(
        CHANGED,
        f"SELECT DISTINCT {key} FROM {src.table_name.sql()} "
        f"WHERE {at} > {ts_literal(kept)} AND {at} <= {ts_literal(upto)}",
    )
    fresh = expected_rows_sql(
        spec, upto, source_relation=latest_versions_sql(spec, upto, include_deleted=False, keys=CHANGED)
    )
    return f"SELECT * FROM {table} ANTI JOIN {CHANGED} USING ({key}) UNION ALL BY NAME SELECT * FROM ({fresh})"


def _changed_share(s: DuckDBSession, spec: DatasetSpec) -> float:
    """The keys changed since the kept watermark (``__expected_changed``) as a share of the kept rows."""
    kept_rows = s.scalar(f"SELECT count(*) FROM {dataset_table('expected', spec.dataset)}") or 0
    return (s.scalar(f"SELECT count(*) FROM {CHANGED}") or 0) / max(kept_rows, 1)


def stage_kept(s: Session, spec: DatasetSpec, upto: datetime, name: str) -> bool:
    """Stage temp relation ``name`` from the kept rows if they serve ``upto``; False (nothing staged)
    when they do not, so the caller resolves the change log its own way."""
    if not isinstance(s, DuckDBSession) or not keepable(s, upto):
        return False
    relation = _from_kept(s, spec, upto)
    if relation is None:
        return False
    _stage(s, spec, relation, name)
    return True


def keep_expected(s: DuckDBSession, spec: DatasetSpec, upto: datetime, sql: str) -> str:
    """Keep ``sql``, the expected rows as of ``upto`` however resolved, for later callers; returns
    a SELECT of them. Writing them to the warehouse costs a little more than a temp table; each
    later caller they serve saves a resolution."""
    table = dataset_table("expected", spec.dataset)
    s.materialize(table, f"{sql}")
    rows, hashed = source_state(s, spec, upto)
    s.execute(EXPECTED_KEPT_DDL)
    s.execute(f"DELETE FROM {KEPT} WHERE dataset = ?", [spec.dataset])
    s.execute(
        f"INSERT INTO {KEPT} VALUES (?, ?, ?, ?, ?, ?)",
        [spec.dataset, resolution_key(spec), upto, rows, hashed, utcnow()],
    )
    return kept_select(spec)


def stage_expected(s: Session, spec: DatasetSpec, watermark: datetime | None, name: str, *, keep: bool) -> None:
    """Temp relation ``name`` holding the expected rows: a view of the kept rows when they are
    exactly these, else a temp table (read as often as the caller likes)."""
    _stage(s, spec, expected_rows(s, spec, watermark, keep=keep), name)


def _stage(s: Session, spec: DatasetSpec, relation: str, name: str) -> None:
    if relation == kept_select(spec):
        drop_staged(s, name)
        s.temp_view(name, f"{relation}")
        return
    if isinstance(s, DuckDBSession) and _temp_kind(s, name) == "view":
        s.drop_relation(name, view=True)
    s.temp_table(name, f"{relation}")
    if isinstance(s, DuckDBSession):
        s.drop_relation(CHANGED)


def drop_staged(s: Session, name: str) -> None:
    """Drop what ``stage_expected`` made of ``name`` (a view or a table), if anything."""
    kind = _temp_kind(s, name) if isinstance(s, DuckDBSession) else "table"
    if kind:
        s.drop_relation(name, view=kind == "view")


def _temp_kind(s: Session, name: str) -> str | None:
    """'view' or 'table' for a temp relation of this name (DuckDB refuses to drop one kind as the other)."""
    row = s.fetchone(
        "SELECT 'view' FROM duckdb_views() WHERE temporary AND view_name = ? "
        "UNION ALL SELECT 'table' FROM duckdb_tables() WHERE temporary AND table_name = ?",
        [name, name],
    )
    return row[0] if row else None
