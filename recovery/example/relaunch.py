"""The worked example's faulty recompute (code 2.3.0), relaunched through the guarded launcher.

It runs exactly the code of ``faulty_backfill`` over the requested partitions, as one
Dagster run of the history asset would (one staged read of the source, then each
partition in order, a ``CatalogTimeout`` retried once as the asset's RetryPolicy
does), but its writes go through the writer as the guarded backfill's generation:
into the backfill's own namespace, never the published one. Name it in a request as
``recompute: recovery.example.relaunch:faulty_2_3_0``.
"""

from __future__ import annotations

from datetime import date

from recovery.example.faulty_backfill import CatalogTimeout, recompute_partition, stage_sql, stage_table
from recovery.lib.errors import RecoveryError
from recovery.lib.recurrence.recompute import RecomputeContext

RECOMPUTE = "recovery.example.relaunch:faulty_2_3_0"


def faulty_2_3_0(ctx: RecomputeContext) -> None:
    partitions = [date.fromisoformat(p) for p in ctx.partitions]
    stage = stage_table(ctx.run_id or ctx.backfill_id)
    if ctx.watermark is None:
        raise RecoveryError(f"backfill {ctx.backfill_id}: the source is empty, so the example has nothing to recompute")
    engine = ctx.writer.engine
    with engine.transaction() as s:
        s.execute("CREATE SCHEMA IF NOT EXISTS example")
        s.materialize(stage, f"{stage_sql(partitions, ctx.watermark)}")
    checkpoint: dict[str, str] = {}
    try:
        for p in partitions:
            for attempt in (0, 1):  # RetryPolicy(max_retries=1) of the history asset
                try:
                    recompute_partition(
                        ctx.writer,
                        ctx.generation,
                        p,
                        stage=stage,
                        checkpoint=checkpoint,
                        retry_number=attempt,
                        at=None,
                        run_id=ctx.run_id,
                    )
                    break
                except CatalogTimeout:
                    if attempt:
                        raise
    finally:
        with engine.transaction() as s:
            s.drop_relation(stage)
