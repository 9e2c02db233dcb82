"""The team's ``clean/readings`` ported to a guarded backfill's recompute (``recovery backfill --recompute``).

The asset computes each reading's latest version in Celsius for the days of its run and
returns a frame; as a recompute, the same SQL runs over the change log as of
``ctx.watermark`` (the fixed snapshot the backfill's manifest records before the first
write: no cached copy) for ``ctx.partitions`` only, and is written through ``ctx.writer``
as ``ctx.generation`` (the backfill's own namespace, fenced if the backfill is contained).
The writer stamps ``_run_id`` and ``_loaded_at`` itself; the recompute returns the key,
the partition, the payload and the source version.
"""

from __future__ import annotations

from recovery.lib.recurrence.recompute import RecomputeContext

READINGS_SQL = """
SELECT reading_id, reading_day, sensor_id, reading_ts, value_c, src_version FROM (
    SELECT reading_id, CAST(reading_ts AS DATE) AS reading_day, sensor_id, reading_ts,
           round(CASE WHEN unit = 'F' THEN (value - 32) * 5 / 9 ELSE value END, 3) AS value_c,
           version AS src_version, op
    FROM raw.readings
    WHERE ingested_at <= CAST(? AS TIMESTAMP)
    QUALIFY row_number() OVER (PARTITION BY reading_id ORDER BY version DESC) = 1)
WHERE op <> 'D' AND CAST(reading_day AS VARCHAR) IN (SELECT unnest(CAST(? AS VARCHAR[])))
"""


def readings(ctx: RecomputeContext) -> None:
    ctx.writer.write(
        ctx.generation,
        READINGS_SQL,
        params=[ctx.watermark or "1970-01-01", list(ctx.partitions)],
        mode="replace_partitions",
        partitions=list(ctx.partitions),
        run_id=ctx.run_id,
        note=f"clean/readings recomputed by guarded backfill {ctx.backfill_id}",
    )
