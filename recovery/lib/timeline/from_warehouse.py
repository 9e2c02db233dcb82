"""Timeline events the warehouse's control plane holds, gathered in SQL.

Writes are summarised per generation and run (count, modes, partition range, rows
in and out, commit sequence range), never listed row by row: a six-month backfill
is a few hundred writes, and the story needs their shape. The failed generations'
writes are joined by every other generation's writes committed since the first
failed generation registered (the concurrent ingestion whose rows may have been
overwritten). Fences and refused attempts come from their registries; the events
other phases recorded in ``_recovery.timeline`` are taken as they are, except the
kinds already told here from a registry (registration, fence, fence attempt).
"""

from __future__ import annotations

from typing import Any

from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.incident.failed_generations import GenerationFacts
from recovery.lib.incident.model import Incident
from recovery.lib.timeline.events import CommitClock, TimelineEvent, kind_of

TOLD_FROM_REGISTRIES = ("generation_registered", "fence", "fence_attempt")
DECLARED_SKEW_S = 60  # a written_at this far from its commit time was declared by the writer, not the wall clock


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def commit_clock(s: Session, spec: DatasetSpec) -> CommitClock:
    return CommitClock(
        s.fetchall(f"SELECT seq, committed_at FROM {SCHEMA}.writes WHERE dataset = ? ORDER BY seq", [spec.dataset])
    )


def registration_events(f: GenerationFacts, incident: Incident) -> list[TimelineEvent]:
    """Request, input snapshot, code, configuration and intended range, as the registry recorded them."""
    if not f.registered:
        return [
            TimelineEvent(
                f.first_write_at,
                "declared",
                "request",
                None,
                f"generation {f.generation} is not registered: known only from its rows in the target "
                f"(first write {f.first_write_at}); no request, snapshot or code was recorded",
                source="target rows",
            )
        ]
    wm, basis = f.snapshot_watermark
    ev: dict[str, Any] = dict(
        at=f.started_at, clock="declared", actor=f.registered_by, seq=f.registered_seq, source="_recovery.generations"
    )
    out = [
        TimelineEvent(
            kind="request",
            summary=f"{f.kind} generation {f.generation} registered"
            + (f" for Dagster backfill {f.backfill_id}" if f.backfill_id else "")
            + (f" ({f.note})" if f.note else ""),
            **ev,
        ),
        TimelineEvent(
            kind="input_snapshot",
            summary=f"{f.generation} reads the source as of {wm} ({basis})"
            if wm
            else f"{f.generation} recorded no source watermark: its input snapshot is unknown",
            **ev,
        ),
        TimelineEvent(
            kind="code",
            summary=f"{f.generation} runs code version {f.code_version}"
            if f.code_version
            else f"{f.generation} recorded no code version",
            **ev,
        ),
        TimelineEvent(kind="configuration", summary=f"{f.generation} runs with spec fingerprint {f.config_hash}", **ev),
    ]
    if incident.partitions:
        out.append(
            TimelineEvent(
                kind="ranges",
                summary=f"incident {incident.incident_id} names the intended range "
                f"{incident.partitions.start}..{incident.partitions.end}",
                **ev,
            )
        )
    return out


def write_events(
    s: Session, spec: DatasetSpec, incident: Incident, facts: list[GenerationFacts]
) -> list[TimelineEvent]:
    failed = [f.generation for f in facts]
    start = min((f.registered_seq for f in facts if f.registered_seq is not None), default=None)
    lo, hi = (str(incident.partitions.start), str(incident.partitions.end)) if incident.partitions else (None, None)
    rows = s.fetchall(
        f"""
        WITH w AS (SELECT * FROM {SCHEMA}.writes WHERE dataset = ?
                   AND (generation IN (SELECT unnest(CAST(? AS VARCHAR[]))) OR seq >= ?)),
        fence AS (SELECT generation, min(seq) AS seq FROM {SCHEMA}.fences GROUP BY 1),
        parts AS (SELECT generation, run_id, min(p) AS lo, max(p) AS hi, count(DISTINCT p) AS n,
                         count(DISTINCT p) FILTER (WHERE p < ? OR p > ?) AS outside
                  FROM (SELECT generation, run_id, unnest(partitions) AS p FROM w) GROUP BY ALL),
        agg AS (SELECT w.generation, w.run_id, count(*) AS writes, string_agg(DISTINCT w.mode, ', '
            ORDER BY w.mode) AS modes,
                       sum(rows_inserted) AS ins, sum(rows_deleted) AS del, min(w.seq) AS first_seq,
                           max(w.seq) AS last_seq,
                       min(written_at) AS first_at, max(written_at) AS last_at, min(committed_at) AS first_commit,
                       max(committed_at) AS last_commit, count(*) FILTER (WHERE w.seq > fence.seq) AS after_fence,
                       arg_min(written_at, w.seq) AS first_written
                FROM w LEFT JOIN fence USING (generation) GROUP BY ALL)
        SELECT agg.*, parts.lo, parts.hi, coalesce(parts.n, 0), coalesce(parts.outside, 0)
        FROM agg LEFT JOIN parts ON agg.generation = parts.generation AND agg.run_id IS NOT DISTINCT FROM parts.run_id
        ORDER BY agg.first_seq""",
        [spec.dataset, failed, start if start is not None else 1 << 62, lo, hi],
    )
    events = []
    for gen, run_id, n, modes, ins, dele, s0, s1, at0, at1, c0, c1, after_fence, _, plo, phi, pn, outside in rows:
        declared = abs((at0 - c0).total_seconds()) > DECLARED_SKEW_S
        scope = f"partitions {plo}..{phi} ({_n(pn, 'partition')})" if pn else "no partition list (key writes)"
        text = f"{gen}: {_n(n, 'write')} ({modes}) over {scope}, +{ins:,} / -{dele:,} rows, commits seq {s0}..{s1}" + (
            (f", declared {at0}" + (f"..{at1}" if at1 != at0 else "")) if declared else ""
        )
        if gen in failed and outside and lo:
            text += f"; {_n(outside, 'partition')} outside the incident's range {lo}..{hi}"
        if after_fence:
            text += f"; {after_fence} WRITES COMMITTED AFTER THE FENCE"
        events.append(
            TimelineEvent(
                at0,
                "declared" if declared else "wall",
                "writes",
                gen,
                text,
                run_id,
                s0,
                "_recovery.writes",
                order_at=c0,
            )
        )
    return events


def fence_events(s: Session, spec: DatasetSpec, failed: list[str]) -> list[TimelineEvent]:
    events = [
        TimelineEvent(
            at,
            "declared",
            "containment",
            by,
            f"generation {g} fenced for incident {inc} (token {token}): writes refused from commit {seq} on"
            + (f"; {reason}" if reason else ""),
            None,
            seq,
            "_recovery.fences",
        )
        for g, inc, token, at, by, reason, seq in s.fetchall(
            f"SELECT generation, incident_id, token, fenced_at, fenced_by, reason, seq FROM {SCHEMA}.fences "
            f"WHERE dataset = ? AND generation IN (SELECT unnest(CAST(? AS VARCHAR[]))) ORDER BY seq",
            [spec.dataset, failed],
        )
    ]
    for g, action, run_id, n, first, last in s.fetchall(
        "SELECT generation, action, run_id, count(*), min(attempted_at), max(attempted_at) "
        f"FROM {SCHEMA}.fence_attempts "
        f"WHERE dataset = ? AND generation IN (SELECT unnest(CAST(? AS VARCHAR[]))) GROUP BY ALL ORDER BY 5",
        [spec.dataset, failed],
    ):
        span = f" ({first} .. {last})" if n > 1 else ""
        events.append(
            TimelineEvent(
                first,
                "wall",
                "alerts",
                None,
                f"{n} {action} attempt{'s' if n > 1 else ''} by fenced generation {g} refused{span}",
                run_id,
                None,
                "_recovery.fence_attempts",
            )
        )
    return events


def recorded_events(s: Session, spec: DatasetSpec, incident: Incident) -> list[TimelineEvent]:
    """What every phase recorded for this incident (or for the dataset without an incident)."""
    return [
        TimelineEvent(at, "wall", kind_of(kind), actor, summary, run_id, None, f"_recovery.timeline:{kind}")
        for at, kind, actor, summary, run_id in s.fetchall(
            f"SELECT event_at, kind, actor, summary, run_id FROM {SCHEMA}.timeline "
            f"WHERE (incident_id = ? OR (incident_id IS NULL AND dataset = ?)) "
            f"AND kind NOT IN (SELECT unnest(CAST(? AS VARCHAR[]))) ORDER BY event_id",
            [incident.incident_id, spec.dataset, list(TOLD_FROM_REGISTRIES)],
        )
    ]
