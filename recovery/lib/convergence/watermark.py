"""How far ingestion has applied the source, and who says so: per dataset, and per partition
where a later write says more.

A convergence check needs the point up to which the target must already equal the source
(changes after it are *pending*, not drift). Every write path records what it applied
(``_recovery.source_watermarks``, in the write's own transaction); a target another tool
wrote has its run registry. So the dataset's watermark is the latest of:

- the write log: a write of a non-fenced ingest generation that applied every change up to
  its watermark (incremental ingestion through the writer, an unpartitioned IO-manager output);
- the generations: a non-fenced ingest generation's ``source_watermark`` (the control plane's,
  or the team's registry row, copied at adoption or read live).

When no ingestion recorded one, any non-fenced generation's (a repair's, a guarded
backfill's) serves, and the basis says so; when nothing recorded one at all, the source's
latest change (nothing can be pending then, and the basis says that too).

A partition rebuilt from the source by a later write (a partitioned IO-manager output, a
guarded backfill) is as of that write's watermark when it is later than the dataset's. Only
writes that landed in a namespace the public name has pointed at count: a repair or a
backfill that was never published says nothing about what readers see.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.control.plane import SCHEMA, SOURCE_WATERMARKS
from recovery.lib.control.write_registry import generations_sql
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, string_literal, ts_literal

PARTITION_WATERMARKS = "__cv_wm"
"""Temp table: (p, watermark, basis) for the partitions a later write rebuilt past the dataset's watermark."""


class Watermark(BaseModel):
    """A point in the source's arrival order and where it comes from, as a reader needs it."""

    model_config = ConfigDict(frozen=True)
    at: datetime | None
    basis: str

    def text(self) -> str:
        if self.at is None:
            return f"none ({self.basis})"
        return f"{self.at:%Y-%m-%d %H:%M:%S} ({self.basis})"


def _recorded(s: Session) -> bool:
    return s.object_kind(SCHEMA, "source_watermarks") is not None


def _candidates(s: Session, spec: DatasetSpec) -> str:
    """Every recorded dataset-wide watermark: (watermark, tier, rank, basis); tier 1 is ingestion's."""
    fenced = f"SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL"
    dataset = string_literal(spec.dataset)
    parts = [
        # a generation's own watermark: the control plane's, or the team's registry
        f"SELECT source_watermark AS watermark, CASE WHEN kind = 'ingest' THEN 1 ELSE 2 END AS tier, 2 AS rank, "
        f"CASE WHEN basis LIKE 'registry %' THEN basis || ', run ' || generation "
        f"ELSE 'control plane: ' || kind || ' generation ' || generation END AS basis "
        f"FROM ({generations_sql(s, spec)}) WHERE source_watermark IS NOT NULL AND kind <> 'unknown' "
        f"AND generation NOT IN ({fenced})"
    ]
    if _recorded(s):
        parts.append(
            f"SELECT w.source_watermark, CASE WHEN g.kind = 'ingest' THEN 1 ELSE 2 END, 1, "
            f"'write log: write ' || CAST(w.seq AS VARCHAR) || ' of ' || w.generation || ', ' || w.basis "
            f"FROM {SOURCE_WATERMARKS} w JOIN {SCHEMA}.generations g USING (generation) "
            f"WHERE w.dataset = {dataset} AND w.partitions IS NULL AND g.fenced_at IS NULL"
        )
    return " UNION ALL ".join(parts)


def dataset_watermark(s: Session, spec: DatasetSpec) -> Watermark:
    """How far ingestion has applied the source, and where that comes from (never left unresolved)."""
    row = s.fetchone(
        f"SELECT watermark, tier, basis FROM ({_candidates(s, spec)}) ORDER BY tier, watermark DESC, rank LIMIT 1"
    )
    if row is not None:
        at, tier, basis = row
        return Watermark(at=at, basis=basis if tier == 1 else f"no ingestion recorded one; {basis}")
    src = spec.source
    latest = s.scalar(f"SELECT max({quote(src.ingested_at)}) FROM {src.table_name.sql()}")
    if latest is None:
        return Watermark(at=None, basis="the source is empty")
    return Watermark(
        at=latest, basis="the source's latest change: no write or registry recorded how far ingestion applied it"
    )


def stage_partition_watermarks(s: Session, spec: DatasetSpec, floor: datetime | None) -> None:
    """Temp table ``__cv_wm``: each partition a published write rebuilt from the source as of a
    watermark later than ``floor`` (the dataset's), with the latest such watermark and its basis."""
    s.execute(f"CREATE OR REPLACE TEMP TABLE {PARTITION_WATERMARKS} (p VARCHAR, watermark TIMESTAMP, basis VARCHAR)")
    if floor is None or not _recorded(s):
        return
    dataset = string_literal(spec.dataset)
    s.execute(
        f"""INSERT INTO {PARTITION_WATERMARKS}
        SELECT p, max(source_watermark), arg_max(basis, source_watermark) FROM (
            SELECT unnest(w.partitions) AS p, w.source_watermark,
                   'write log: write ' || CAST(w.seq AS VARCHAR) || ' of ' || w.generation || ', ' || w.basis AS basis
            FROM {SOURCE_WATERMARKS} w
            JOIN {SCHEMA}.generations g USING (generation)
            JOIN {SCHEMA}.writes x ON x.seq = w.seq
            WHERE w.dataset = {dataset} AND w.partitions IS NOT NULL AND g.fenced_at IS NULL
              AND w.source_watermark > {ts_literal(floor)}
              AND x.namespace IN (SELECT to_namespace FROM {SCHEMA}.pointer_history WHERE dataset = {dataset}))
        GROUP BY p"""
    )
