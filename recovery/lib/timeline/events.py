"""Timeline events and the order they are told in.

Two clocks meet in an incident timeline. Dagster's event log is wall-clock. The
control plane orders commits exactly (its commit sequence ``seq``) and stamps
each write's ``committed_at`` on the wall clock, but the times a writer
*declares* (``written_at``, a generation's ``started_at``, its source watermark)
may be business or simulated time: the worked example declares 2024-07-05 while
its runs execute today. So every event keeps its own timestamp and names its
clock, and the story is ordered by a wall-clock position:

- Dagster events, file times and commit times are wall-clock already;
- an event with a commit sequence but only a declared time is placed between the
  wall-clock commit times of the writes just before and just after it in the
  sequence (its own time is kept when it falls in that window, so a fence
  stamped with ``now`` lands where it happened);
- ties keep the commit sequence, then the order events were gathered in.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from datetime import datetime

KINDS = (
    "request",
    "approval",
    "input_snapshot",
    "code",
    "configuration",
    "ranges",
    "runs",
    "retries",
    "writes",
    "alerts",
    "decisions",
    "containment",
    "evidence",
    "reconciliation",
    "other",
)
"""The runbook's event kinds (request ... containment), then what later phases add."""

CLOCKS = {
    "wall": "recorded by the system as it happened (Dagster event log, commit time)",
    "declared": "a time the writer declared (business or simulated time; the worked example simulates 2024-07-05)",
    "file": "modification time of the incident file (when it was last written; the file states no time of its own)",
}


@dataclass(frozen=True)
class TimelineEvent:
    at: datetime | None  # the event's own timestamp, naive UTC
    clock: str  # a key of CLOCKS
    kind: str  # one of KINDS
    actor: str | None
    summary: str
    run_id: str | None = None
    seq: int | None = None  # control-plane commit sequence, where the event has one
    source: str = ""  # where it was read: "_recovery.writes", "dagster:RUN_START", ...
    order_at: datetime | None = None  # wall-clock position (set by order_events)

    def as_dict(self) -> dict:
        return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in self.__dict__.items()}


def kind_of(recorded_kind: str) -> str:
    """Map a kind recorded in ``_recovery.timeline`` by any phase onto the timeline's vocabulary."""
    k = recorded_kind.lower()
    for words, kind in (
        (("attempt", "alert", "notif", "refus"), "alerts"),
        (("contain", "fence", "cancel", "terminat", "strip", "pause"), "containment"),
        (("decision", "decide", "rollback", "repair_plan"), "decisions"),
        (("approv",), "approval"),
        (("evidence",), "evidence"),
        (("reconcil",), "reconciliation"),
    ):
        if any(w in k for w in words):
            return kind
    return k if k in KINDS else "other"


class CommitClock:
    """Wall-clock commit times of the control plane's writes, looked up by commit sequence."""

    def __init__(self, commits: list[tuple[int, datetime]]):
        commits = sorted(commits)
        self.seqs = [s for s, _ in commits]
        self.times = [t for _, t in commits]

    def window(self, seq: int) -> tuple[datetime | None, datetime | None]:
        """Commit times of the nearest writes before and after ``seq``."""
        i = bisect.bisect_left(self.seqs, seq)
        lo = self.times[i - 1] if i > 0 else None
        j = i + 1 if i < len(self.seqs) and self.seqs[i] == seq else i
        hi = self.times[j] if j < len(self.seqs) else None
        return lo, hi


def _position(e: TimelineEvent, clock: CommitClock) -> datetime:
    if e.order_at is not None:
        return e.order_at
    if e.seq is None or e.clock == "wall":
        return e.at or datetime.min
    lo, hi = clock.window(e.seq)
    at = e.at
    if at is None or (lo is not None and at < lo):
        at = lo or hi or at
    if hi is not None and at is not None and at > hi:
        at = hi
    return at or datetime.min


def order_events(events: list[TimelineEvent], clock: CommitClock) -> list[TimelineEvent]:
    """Events in story order, each with its wall-clock position set."""
    placed = [replace(e, order_at=_position(e, clock)) for e in events]
    big = 1 << 62
    index = {id(e): i for i, e in enumerate(placed)}
    return sorted(placed, key=lambda e: (e.order_at, e.seq if e.seq is not None else big, index[id(e)]))
