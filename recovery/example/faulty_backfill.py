"""The history recompute of code version 2.3.0, with the worked example's bugs.

This is deliberately wrong code, kept readable so each bug is visible:

1. tombstones dropped: it takes each key's latest *upsert*, ignoring deletes;
2. late events put in the partition of their landing (first ingestion) date;
3. schema-v1 cents read as dollars: it decides the schema by partition date with a
   wrong cut-over instead of reading ``schema_version``;
4. a worker read an outdated snapshot (an extract cached days earlier);
5. a non-idempotent append: a partition whose catalog update times out is retried,
   and the retry appends again because the partition is checkpointed as cleared;
6. a run dies mid-partition (rows deleted chunk by chunk, not re-inserted) and is
   never retried;
7. rows from a staging feed that never belonged to the source are unioned in;
8. (in the launcher) the range reaches the current partitions ingestion is writing;
9. a retried step re-applies changes out of order: in a reordered partition, the
   retry writes the partition's latest versions, then applies the queue's
   redelivered batch of each corrected key's earlier version on top of them.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

from recovery.example.scenario import SCENARIO, Scenario
from recovery.lib.snapshot import ts_literal
from recovery.lib.write.writer import Writer


class CatalogTimeout(Exception):
    """A transient failure after the data was committed (retried by the op's RetryPolicy)."""


class WorkerLost(Exception):
    """The run's worker died mid-partition."""


def _buggy_source_sql(partitions: list[date], watermark: datetime, scenario: Scenario, *, rank: int = 1) -> str:
    """The 2.3.0 read of the source for some partitions, as of one watermark (``rank`` 2: each
    key's upsert before its latest one, the redelivered batch of bug 9)."""
    days = ", ".join(f"DATE '{p.isoformat()}'" for p in partitions)
    staging = ""
    lo, hi = scenario.staging_range
    if any(lo <= p <= hi for p in partitions):
        staging = (
            "UNION ALL SELECT s.*, CAST(s.ingested_at AS DATE) AS landing_date FROM example.staging_feed s "
            f"WHERE s.ingested_at <= {ts_literal(watermark)} AND CAST(s.ingested_at AS DATE) BETWEEN DATE '{lo}' "
            f"AND DATE '{hi}'"
        )
    return f"""
        WITH latest AS (
            SELECT * EXCLUDE (rn) FROM (
                SELECT e.*, row_number() OVER (PARTITION BY txn_id ORDER BY version DESC) AS rn
                FROM raw.transaction_events e
                WHERE ingested_at <= {ts_literal(watermark)} AND op = 'upsert') WHERE rn = {int(rank)}),
        landing AS (
            SELECT txn_id, CAST(min(ingested_at) AS DATE) AS landing_date
            FROM raw.transaction_events WHERE ingested_at <= {ts_literal(watermark)} GROUP BY txn_id),
        src AS (SELECT l.*, la.landing_date FROM latest l JOIN landing la USING (txn_id) {staging})
        SELECT txn_id, account_id, customer_id, merchant_id, event_ts,
               landing_date AS event_date,
               CAST(CASE WHEN landing_date < DATE '{scenario.buggy_cutover.isoformat()}' THEN amount / 100
                         ELSE amount * CASE currency WHEN 'EUR' THEN 1.08 WHEN 'GBP' THEN 1.27 ELSE 1.00 END
                    END AS DECIMAL(18, 2)) AS amount_usd,
               status, version AS _source_version, landing_date, {"true" if rank > 1 else "false"} AS _queued
        FROM src WHERE landing_date IN ({days})
    """


def stage_table(run_id: str) -> str:
    return 'example."stage_' + "".join(ch if ch.isalnum() else "_" for ch in run_id) + '"'


def stage_sql(partitions: list[date], snapshot: datetime, scenario: Scenario = SCENARIO) -> str:
    """All rows a run will write, read once per run (a worker in the stale range read an old extract)."""
    lo, hi = scenario.stale_range
    stale = [p for p in partitions if lo <= p <= hi]
    fresh = [p for p in partitions if not lo <= p <= hi]
    parts = [
        _buggy_source_sql(group, wm, scenario)
        for group, wm in ((fresh, snapshot), (stale, scenario.stale_watermark))
        if group
    ]
    reordered = [p for p in partitions if p in scenario.reordered_partitions]
    if reordered:
        parts.append(_buggy_source_sql(reordered, snapshot, scenario, rank=2))
    return " UNION ALL ".join(f"({q})" for q in parts)


def buggy_rows_sql(partition: date, stage: str, *, queued: bool = False) -> str:
    """A partition's staged rows (``queued``: the redelivered earlier versions of bug 9)."""
    return (
        f"SELECT * EXCLUDE (landing_date, _queued) FROM {stage} "
        f"WHERE landing_date = DATE '{partition.isoformat()}' AND {'' if queued else 'NOT '}_queued"
    )


def write_time(partition: date, scenario: Scenario = SCENARIO) -> datetime:
    """Simulated commit time of a partition's write: within the backfill's write window."""
    return scenario.backfill_writes + timedelta(seconds=10 * (partition - scenario.first_day).days)


def recompute_partition(
    writer: Writer,
    generation: str,
    partition: date,
    *,
    stage: str,
    checkpoint: dict[str, str],
    retry_number: int,
    at: datetime | None,
    run_id: str | None,
    scenario: Scenario = SCENARIO,
) -> str:
    """Recompute one partition the 2.3.0 way. Returns the checkpoint state it leaves."""
    rows = buggy_rows_sql(partition, stage)
    key = partition.isoformat()
    kw: dict[str, Any] = dict(
        at=at, run_id=run_id, allow_duplicate_keys=True
    )  # the 2.3.0 pipeline wrote duplicates; reproduce it
    if partition in scenario.flaky_partitions:
        if checkpoint.get(key) != "cleared":
            writer.write(
                generation, f"SELECT * FROM ({rows}) WHERE false", mode="replace_partitions", partitions=[key], **kw
            )
            checkpoint[key] = "cleared"
        writer.write(generation, rows, mode="append", note="append after checkpointed clear", **kw)
        if retry_number == 0:
            raise CatalogTimeout(f"catalog update for partition {key} timed out after the data was written")
        return "done"
    if partition in scenario.reordered_partitions and retry_number > 0:
        writer.write(generation, rows, mode="replace_partitions", partitions=[key], **kw)
        writer.write(
            generation,
            buggy_rows_sql(partition, stage, queued=True),
            mode="upsert_keys",
            note="retry applied the redelivered batch of earlier versions",
            **kw,
        )
        return "done"
    if partition == scenario.dying_partition:
        chunk = lambda k: f"SELECT * FROM ({rows}) WHERE hash(txn_id) % 4 = {k}"  # noqa: E731
        writer.write(generation, chunk(0), mode="upsert_keys", note="chunk 1/4", **kw)
        writer.write(
            generation,
            f"SELECT txn_id, _source_version FROM ({chunk(1)})",
            mode="delete_keys",
            note="chunk 2/4 cleared",
            **kw,
        )
        raise WorkerLost(f"worker lost while rewriting partition {key} (chunk 2/4)")
    writer.write(generation, rows, mode="replace_partitions", partitions=[key], **kw)
    return "done"
