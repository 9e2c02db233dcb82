"""Fences as containment and the fencing sensor see them. Dagster-free.

The fence itself is ``Writer.fence``: a compare-and-set in the same transaction
as every write, so it holds whatever Dagster does. This module reads the fence
registry (which generation, which incident, since which commit, which backfill
produced it), counts attempts by runs of a fenced generation once per run, finds
refused attempts nobody has been alerted about yet, and records containment's
timeline events in one transaction each, so a re-run can tell what it already did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from recovery.lib import faults
from recovery.lib.catalog_checks import record_source_checks
from recovery.lib.control.plane import SCHEMA, EventSource, control_plane_exists, utcnow
from recovery.lib.engine.base import Engine, Session
from recovery.lib.incident.model import Incident
from recovery.lib.notify import NOTIFICATIONS, delivered_keys
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer

GENERATION_TAG = "recovery/generation"
"""The Dagster run/backfill tag naming the generation a run writes as."""


@dataclass(frozen=True)
class FenceRecord:
    generation: str
    dataset: str
    incident_id: str
    token: int
    fenced_at: datetime
    fenced_by: str
    seq: int  # commit sequence of the fence: every write of the generation after it is refused
    backfill_id: str | None  # the Dagster backfill that produced the generation, when known


@dataclass(frozen=True)
class FenceOutcome:
    record: FenceRecord
    newly_fenced: bool  # False when an earlier run (or another incident) had fenced it already


@dataclass(frozen=True)
class TimelineEvent:
    kind: str
    summary: str
    incident_id: str | None = None
    dataset: str | None = None
    actor: str | None = None
    run_id: str | None = None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Attempt:
    """One refused action of a fenced generation, with the key its alert is deduplicated by."""

    dedupe_key: str
    generation: str
    dataset: str
    incident_id: str | None
    attempted_at: datetime
    action: str
    run_id: str | None
    detail: str


def fences(session: Session, generations: list[str] | None = None) -> list[FenceRecord]:
    """The fence of each fenced generation (the first one: ``Writer.fence`` never fences twice)."""
    if not control_plane_exists(session):
        return []
    where = "WHERE list_contains(?, f.generation)" if generations is not None else ""
    rows = session.fetchall(
        f"SELECT f.generation, f.dataset, f.incident_id, f.token, f.fenced_at, f.fenced_by, f.seq, g.backfill_id "
        f"FROM {SCHEMA}.fences f LEFT JOIN {SCHEMA}.generations g USING (generation) {where} "
        f"QUALIFY row_number() OVER (PARTITION BY f.generation ORDER BY f.seq) = 1 ORDER BY f.seq",
        [generations] if generations is not None else [],
    )
    return [FenceRecord(*r) for r in rows]


def read_fences(engine: Engine, generations: list[str] | None = None) -> list[FenceRecord]:
    with engine.session(read_only=True) as s:
        return fences(s, generations)


def fence_incident(writer: Writer, incident: Incident) -> list[FenceOutcome]:
    """Fence every failed generation of the incident and its backfill's aliases (the stamp later
    runs of it would write as). Idempotent: an existing fence is kept, and a generation already
    fenced is not even opened for writing (a re-run changes nothing)."""
    generations = incident.fence_generations
    before = {f.generation for f in read_fences(writer.engine, generations)}
    approved = ", ".join(incident.approved_by) or "nobody yet"
    for generation in generations:
        if generation in before:
            continue
        writer.fence(
            generation,
            incident_id=incident.incident_id,
            fenced_by=incident.requested_by,
            reason=f"incident {incident.incident_id}, approved by {approved}",
            backfill_id=incident.dagster_backfill if generation in incident.subject_generations else None,
        )
    after = {f.generation: f for f in read_fences(writer.engine, generations)}
    record_source_checks(writer.engine, writer.spec)  # so the phases after containment do not scan the log again
    return [FenceOutcome(after[g], g not in before) for g in generations]


def record_events(engine: Engine, events: list[TimelineEvent]) -> None:
    """Append events to the timeline in one transaction."""
    if not events:
        return

    def txn() -> None:
        with engine.transaction() as s:
            for e in events:
                EventSource(dataset=e.dataset, incident_id=e.incident_id, actor=e.actor, run_id=e.run_id).record(
                    s, e.kind, e.summary, json.dumps(e.details, sort_keys=True, default=str)
                )
            faults.checkpoint("events:recorded")  # the events, not committed

    retrying(txn)
    faults.checkpoint("events:committed")


def event_recorded(engine: Engine, kind: str, incident_id: str, generation: str) -> bool:
    """Whether an event of ``kind`` about ``generation`` was recorded for the incident."""
    with engine.session(read_only=True) as s:
        return bool(
            s.scalar(
                f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = ? AND incident_id = ? "
                f"AND json_extract_string(details, '$.generation') = ?",
                [kind, incident_id, generation],
            )
        )


def backfill_cancels_recorded(engine: Engine, incident_id: str, backfill_ids: list[str]) -> set[str]:
    """The backfills among ``backfill_ids`` whose cancel by the fencing sensor is already on the timeline.

    A cancelled Dagster backfill is never live again, so one found live with its cancel recorded is one a
    pass recorded and was killed before cancelling: the next pass cancels it without a second event."""
    if not backfill_ids:
        return set()
    with engine.session(read_only=True) as s:
        marks = ", ".join("?" for _ in backfill_ids)
        return {
            r[0]
            for r in s.fetchall(
                f"SELECT DISTINCT json_extract_string(details, '$.backfill_id') FROM {SCHEMA}.timeline "
                f"WHERE kind = 'fence_cancel_backfill' AND incident_id = ? "
                f"AND json_extract_string(details, '$.backfill_id') IN ({marks})",
                [incident_id, *backfill_ids],
            )
        }


def count_run_attempt(engine: Engine, fence: FenceRecord, run_id: str, status: str, detail: str) -> bool:
    """Count a run of a fenced generation found active after the fence, once per run.
    Returns True when counted now (the run was not counted before)."""

    def txn() -> bool:
        with engine.transaction() as s:
            seen = s.scalar(
                f"SELECT count(*) FROM {SCHEMA}.fence_attempts WHERE generation = ? AND run_id = ? "
                f"AND action LIKE 'run:%'",
                [fence.generation, run_id],
            )
            if seen:
                return False
            action = f"run:{status}"
            s.execute(
                f"INSERT INTO {SCHEMA}.fence_attempts VALUES (?, ?, ?, ?, ?, ?)",
                [fence.generation, fence.dataset, utcnow(), action, run_id, detail],
            )
            EventSource(
                dataset=fence.dataset, incident_id=fence.incident_id, actor="fencing_sensor", run_id=run_id
            ).record(
                s,
                "fence_attempt",
                f"run {run_id} of fenced generation {fence.generation} was {status} after the fence; stopped",
                {"generation": fence.generation, "action": action, "detail": detail},
            )
            faults.checkpoint("run_attempt:recorded")  # the attempt and its event, not committed
            return True

    counted = retrying(txn)
    faults.checkpoint("run_attempt:committed")
    return counted


ATTEMPT_KEY_SQL = (
    "'fence-attempt:' || a.generation || ':' || a.action || ':' || coalesce(a.run_id, '-') || ':' "
    "|| strftime(a.attempted_at, '%Y-%m-%dT%H:%M:%S.%f')"
)


def unalerted_attempts(session: Session) -> list[Attempt]:
    """Refused attempts whose alert has not been delivered yet, oldest first."""
    if not control_plane_exists(session):
        return []
    rows = session.fetchall(
        f"SELECT {ATTEMPT_KEY_SQL} AS k, a.generation, a.dataset, f.incident_id, a.attempted_at, a.action, a.run_id, "
        f"coalesce(a.detail, '') FROM {SCHEMA}.fence_attempts a "
        f"LEFT JOIN (SELECT generation, arg_min(incident_id, seq) AS incident_id FROM {SCHEMA}.fences GROUP BY 1) f "
        f"USING (generation) ORDER BY a.attempted_at"
    )
    done = delivered_keys(session)
    return [Attempt(*r) for r in rows if r[0] not in done]


__all__ = [
    "GENERATION_TAG",
    "FenceRecord",
    "FenceOutcome",
    "TimelineEvent",
    "Attempt",
    "fences",
    "read_fences",
    "fence_incident",
    "record_events",
    "event_recorded",
    "count_run_attempt",
    "unalerted_attempts",
    "NOTIFICATIONS",
]
