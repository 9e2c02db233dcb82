"""What a convergence check looks at.

- The watermark: how far normal ingestion has applied the source, per dataset and per
  partition (``recovery.lib.convergence.watermark``). Changes that arrived in the source
  after it are *pending*, not drift: ingestion has not reached them yet. A change at or
  before it that the target does not reflect is drift.
- Recent partitions: those normal ingestion wrote most recently, by commit order,
  read from the delta log (so tombstones count too). A late event for an old
  partition makes that partition recent again.
- Repaired partitions: every partition a repair generation wrote; they must keep
  equalling the source as late arrivals land on them.
- Late partitions: every partition holding a pending change, wherever it is, so late
  arrivals that no ingestion applies are seen however old the partition.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib.control.plane import SCHEMA, delta_table, has_dataset_table
from recovery.lib.convergence.watermark import dataset_watermark
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote


def applied_watermark(s: Session, spec: DatasetSpec) -> datetime | None:
    """How far normal ingestion has applied the source (see ``dataset_watermark`` for where it
    comes from); None only for an empty source."""
    return dataset_watermark(s, spec).at


def _written_partitions(s: Session, spec: DatasetSpec, kind: str, limit: int | None) -> list[str]:
    if not has_dataset_table(s, "delta", spec.dataset):
        return []
    part = quote(spec.target.partition)
    lim = f" LIMIT {int(limit)}" if limit else ""
    rows = s.fetchall(
        f"SELECT p FROM (SELECT CAST({part} AS VARCHAR) AS p, max(_delta_seq) AS last_seq "
        f"FROM {delta_table(spec.dataset)} "
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
