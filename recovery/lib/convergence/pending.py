"""Pending changes: what arrived in the source after the watermark and the target does not show yet.

A change that arrived after the point up to which ingestion has applied the source is not
drift: ingestion has not reached it. It is pending while the target's row for its key
differs from the source's latest, and each pending change counts in the partitions its key
sits in on either side (where the target has it, where the source now puts it), against
that partition's own watermark. A key whose row already equals the source's latest is
not pending, however late its change: a writer that applied more than its recorded
watermark (the IO manager records a lower bound) is converged, not behind.

Only the late changes' keys are looked at (one scan of the source for arrivals after the
dataset's watermark, then joins on those keys); counts leave the engine, never rows.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib.convergence.watermark import PARTITION_WATERMARKS
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all, ts_literal

PENDING = "__cv_pending"
"""Temp table: one row per pending key and partition (key columns, ``p``, ``changes``,
``oldest``, ``overdue``)."""


def same_row_sql(spec: DatasetSpec, values: list[str], t: str = "t", e: str = "e") -> str:
    """``t``'s row equals ``e``'s on every compared column. A target row without a source version
    (an IO-manager output whose frame had none) is compared on its payload alone."""
    sv = spec.target.metadata.source_version

    def one(c: str) -> str:
        same = f"{t}.{quote(c)} IS NOT DISTINCT FROM {e}.{quote(c)}"
        return f"({t}.{quote(c)} IS NULL OR {same})" if c == sv else same

    return " AND ".join(one(c) for c in values) or "true"


def stage_pending(
    s: Session, spec: DatasetSpec, floor: datetime | None, overdue_before: datetime, values: list[str]
) -> None:
    """Temp table ``__cv_pending`` from the staged sides ``__cv_t`` / ``__cv_e`` (with ``__p``), the
    partition watermarks ``__cv_wm`` and the dataset's watermark ``floor``; a change that arrived
    before ``overdue_before`` is overdue."""
    key = quote_all(spec.key)
    src = spec.source
    empty = f"SELECT {key}, CAST(NULL AS VARCHAR) AS p, 0 AS changes, CAST(NULL AS TIMESTAMP) AS oldest, 0 AS overdue"
    if floor is None:  # an empty source: nothing can be pending
        s.temp_table(PENDING, f"{empty} FROM __cv_t WHERE false")
        return
    at = quote(src.ingested_at)
    s.temp_table(
        "__cv_late",
        f"SELECT {quote_all(src.key)}, CAST({at} AS TIMESTAMP) AS __at "
        f"FROM {src.table_name.sql()} WHERE {at} > {ts_literal(floor)}",
    )
    s.temp_table("__cv_late_keys", f"SELECT DISTINCT {key} FROM __cv_late")
    s.temp_table(
        PENDING,
        f"""
        WITH t AS (SELECT * FROM __cv_t SEMI JOIN __cv_late_keys USING ({key})),
             e AS (SELECT * FROM __cv_e SEMI JOIN __cv_late_keys USING ({key})),
             t_rows AS (SELECT {key}, count(*) AS n FROM t GROUP BY ALL),
             applied AS (  -- one target row, equal to the source's latest; or neither side holds the key
                 SELECT {key} FROM t JOIN e USING ({key}) JOIN t_rows USING ({key})
                 WHERE t_rows.n = 1 AND {same_row_sql(spec, values)}
                 UNION SELECT {key} FROM __cv_late_keys ANTI JOIN t USING ({key}) ANTI JOIN e USING ({key})),
             waiting AS (SELECT {key} FROM __cv_late_keys ANTI JOIN applied USING ({key})),
             kp AS (SELECT {key}, __p AS p FROM t SEMI JOIN waiting USING ({key})
                    UNION SELECT {key}, __p AS p FROM e SEMI JOIN waiting USING ({key}))
        SELECT kp.*, count(*) AS changes, min(l.__at) AS oldest,
               count(*) FILTER (WHERE l.__at < {ts_literal(overdue_before)}) AS overdue
        FROM kp JOIN __cv_late l USING ({key}) LEFT JOIN {PARTITION_WATERMARKS} w ON w.p = kp.p
        WHERE kp.p IS NOT NULL AND l.__at > coalesce(w.watermark, {ts_literal(floor)})
        GROUP BY ALL""",
    )
    for t in ("__cv_late", "__cv_late_keys"):
        s.drop_relation(t)


def pending_totals(s: Session, spec: DatasetSpec) -> tuple[int, datetime | None, int]:
    """(changes, oldest arrival, overdue changes) over the dataset: a key counted once, however many
    partitions it sits in."""
    key = quote_all(spec.key)
    row = s.fetchone(
        f"SELECT coalesce(sum(c), 0), min(o), coalesce(sum(d), 0) FROM "
        f"(SELECT {key}, max(changes) AS c, min(oldest) AS o, max(overdue) AS d FROM {PENDING} GROUP BY ALL)"
    )
    return (int(row[0]), row[1], int(row[2])) if row else (0, None, 0)
