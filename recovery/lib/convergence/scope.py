"""What a convergence check looks at, and as of when.

- The watermark: how far normal ingestion has applied the source (the latest
  ``source_watermark`` of a non-fenced ingest generation). Changes that arrived in
  the source after it are *pending*, not drift: ingestion has not reached them yet.
  A change at or before it that the target does not reflect is drift.
- Recent partitions: those normal ingestion wrote most recently, by commit order,
  read from the delta log (so tombstones count too). A late event for an old
  partition makes that partition recent again.
- Repaired partitions: every partition a repair generation wrote; they must keep
  equalling the source as late arrivals land on them.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib.control_plane import SCHEMA, delta_table, has_dataset_table
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote
from recovery.lib.spec import DatasetSpec


def applied_watermark(s: Session, spec: DatasetSpec) -> datetime | None:
    """The source as far as normal ingestion has applied it; else as far as any generation
    read it; else None (everything in the source now)."""
    return s.scalar(
        f"SELECT coalesce(max(source_watermark) FILTER (WHERE kind = 'ingest'), max(source_watermark)) "
        f"FROM {SCHEMA}.generations WHERE dataset = ? AND fenced_at IS NULL",
        [spec.dataset],
    )


def _written_partitions(s: Session, spec: DatasetSpec, kind: str, limit: int | None) -> list[str]:
    if not has_dataset_table(s, "delta", spec.dataset):
        return []
    part = quote(spec.target.partition)
    lim = f" LIMIT {int(limit)}" if limit else ""
    rows = s.fetchall(
        f"SELECT p FROM (SELECT CAST({part} AS VARCHAR) AS p, max(_delta_seq) AS last_seq FROM {delta_table(spec.dataset)} "
        f"WHERE _delta_seq IN (SELECT w.seq FROM {SCHEMA}.writes w JOIN {SCHEMA}.generations g USING (generation) "
        f"WHERE w.dataset = ? AND g.kind = ? AND g.fenced_at IS NULL) AND {part} IS NOT NULL GROUP BY 1) "
        f"ORDER BY last_seq DESC, p DESC{lim}",
        [spec.dataset, kind],
    )
    return [r[0] for r in rows]


def recent_partitions(s: Session, spec: DatasetSpec, n: int) -> list[str]:
    """The ``n`` partitions normal ingestion wrote most recently (latest first)."""
    return _written_partitions(s, spec, "ingest", n)


def repaired_partitions(s: Session, spec: DatasetSpec) -> list[str]:
    """Every partition a (non-fenced) repair generation wrote, sorted."""
    return sorted(_written_partitions(s, spec, "repair", None))


def pending_changes(s: Session, spec: DatasetSpec, watermark: datetime | None) -> int:
    """Source changes that arrived after the watermark (ingestion has not applied them yet)."""
    if watermark is None:
        return 0
    src = spec.source
    return int(
        s.scalar(f"SELECT count(*) FROM {src.table_name.sql()} WHERE {quote(src.ingested_at)} > ?", [watermark]) or 0
    )
