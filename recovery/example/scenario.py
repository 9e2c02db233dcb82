"""The incident's timeline in simulated time, fixed so every run of the example is the same.

History is ingested up to T0. The backfill generation starts at ``backfill_start``
and reads the source as of that moment; live events keep arriving until ``end``;
normal ingestion runs before and after the backfill writes. Which partitions
trigger which bug is part of the scenario, as a bug in real code is triggered by
real data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta


@dataclass(frozen=True)
class Scenario:
    first_day: date = date(2024, 1, 1)
    last_day: date = date(2024, 7, 5)  # the current partition
    schema_cutover: date = date(2024, 4, 1)  # schema v2 from this event date
    t0: datetime = datetime(2024, 7, 5, 0, 0)  # history ingested up to here
    live_window: timedelta = timedelta(hours=6)  # live events arrive in (t0, t0 + window]
    backfill_start: datetime = datetime(2024, 7, 5, 1, 0)
    ingest_during: datetime = datetime(2024, 7, 5, 3, 0)
    backfill_writes: datetime = datetime(2024, 7, 5, 4, 0)
    ingest_after: datetime = datetime(2024, 7, 5, 6, 0)
    repair_ingest: datetime = datetime(2024, 7, 5, 7, 0)  # changes in (end, here] arrive during the repair
    backfill_generation: str = "backfill-0042"
    intended_range: tuple[date, date] = (date(2024, 1, 1), date(2024, 6, 30))
    # the range bug: the launcher computed the end as "today", reaching current partitions
    requested_range: tuple[date, date] = (date(2024, 1, 1), date(2024, 7, 5))
    # bugs of the backfill code (code version 2.3.0)
    buggy_cutover: date = date(2024, 3, 1)  # reads v1 cents as dollars from here
    flaky_partitions: tuple[date, ...] = (date(2024, 2, 14),)
    # a partition after the flaky one in the same run: written by the retried step, which
    # applies a redelivered batch of earlier versions after the latest ones (out of order)
    reordered_partitions: tuple[date, ...] = (date(2024, 2, 21),)
    dying_partition: date = date(2024, 3, 20)
    staging_range: tuple[date, date] = (date(2024, 4, 10), date(2024, 4, 20))
    stale_range: tuple[date, date] = (date(2024, 5, 4), date(2024, 6, 3))
    stale_watermark: datetime = datetime(2024, 5, 30, 0, 0)
    max_partitions_per_run: int = 31
    notes: dict = field(default_factory=dict)

    @property
    def end(self) -> datetime:
        return self.t0 + self.live_window

    def days(self) -> list[date]:
        n = (self.last_day - self.first_day).days + 1
        return [self.first_day + timedelta(days=i) for i in range(n)]

    def requested_partitions(self) -> list[str]:
        lo, hi = self.requested_range
        return [d.isoformat() for d in self.days() if lo <= d <= hi]


SCENARIO = Scenario()
