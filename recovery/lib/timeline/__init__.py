"""The incident timeline (runbook step 1): request, approval, input snapshot, code,
configuration, ranges, runs, retries, writes, alerts, decisions and containment.

Assembled from the warehouse's control plane (:mod:`.from_warehouse`) and the
orchestrator's run history (:mod:`.from_runs`), ordered across their two clocks
(:mod:`.events`), rendered for people and later reports (:mod:`.render`). It only
reads: rebuilding it at any time tells the story so far.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timezone
from pathlib import Path
from typing import Any

from recovery.lib.control.plane import utcnow
from recovery.lib.control.run_history import RunHistory
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.incident.failed_generations import generation_facts
from recovery.lib.incident.model import Incident
from recovery.lib.timeline.events import KINDS, TimelineEvent, order_events
from recovery.lib.timeline.from_runs import run_events
from recovery.lib.timeline.from_warehouse import (
    commit_clock,
    fence_events,
    recorded_events,
    registration_events,
    write_events,
)
from recovery.lib.timeline.render import render_markdown, write_timeline

RUNBOOK_KINDS = KINDS[:12]  # request ... containment: what the runbook asks the timeline to show


@dataclass(frozen=True)
class Timeline:
    incident_id: str
    dataset: str
    failed_generations: tuple[str, ...]
    built_at: datetime
    orchestrator: str
    events: tuple[TimelineEvent, ...]
    notes: tuple[str, ...]

    @property
    def kind_counts(self) -> dict[str, int]:
        counts = Counter(e.kind for e in self.events)
        return {k: counts[k] for k in KINDS if counts[k]}

    @property
    def missing_kinds(self) -> list[str]:
        return [k for k in RUNBOOK_KINDS if k not in self.kind_counts]

    @property
    def run_ids(self) -> set[str]:
        return {e.run_id for e in self.events if e.run_id}

    def as_dict(self) -> dict:
        return {
            "incident_id": self.incident_id,
            "dataset": self.dataset,
            "failed_generations": list(self.failed_generations),
            "built_at": self.built_at.isoformat(),
            "orchestrator": self.orchestrator,
            "notes": list(self.notes),
            "kinds": self.kind_counts,
            "missing_kinds": self.missing_kinds,
            "events": [e.as_dict() for e in self.events],
        }


def _incident_events(incident: Incident) -> list[TimelineEvent]:
    """The recovery's own request and approval, timed by the incident file (the only time it carries)."""
    path = incident.incident_path
    at = (
        datetime.fromtimestamp(Path(path).stat().st_mtime, UTC).replace(tzinfo=None)
        if path and Path(path).exists()
        else None
    )
    ev: dict[str, Any] = dict(at=at, clock="file", source="incident file")
    out = [
        TimelineEvent(
            kind="request",
            actor=incident.requested_by,
            summary=f"recovery of {', '.join(incident.failed_generations)} "
            f"requested as incident {incident.incident_id}" + (f": {incident.notes.strip()}" if incident.notes else ""),
            **ev,
        )
    ]
    out += [
        TimelineEvent(kind="approval", actor=a, summary=f"incident {incident.incident_id} approved by {a}", **ev)
        for a in incident.approved_by
    ]
    if not incident.approved_by:
        out.append(
            TimelineEvent(
                kind="approval", actor=None, summary=f"incident {incident.incident_id} names no approver", **ev
            )
        )
    return out


def build_timeline(incident: Incident, spec: DatasetSpec, engine: Engine, history: RunHistory) -> Timeline:
    """Gather, order and return the incident's timeline (reads only, one read-only session)."""
    with engine.session(read_only=True) as s:
        facts = generation_facts(s, spec, incident.failed_generations)
        events = [e for f in facts for e in registration_events(f, incident)]
        events += write_events(s, spec, incident, facts)
        events += fence_events(s, spec, incident.failed_generations)
        events += recorded_events(s, spec, incident)
        clock = commit_clock(s, spec)
    events += run_events(history, incident)
    events += _incident_events(incident)
    return Timeline(
        incident.incident_id,
        spec.dataset,
        tuple(incident.failed_generations),
        utcnow(),
        history.orchestrator,
        tuple(order_events(events, clock)),
        tuple(history.notes),
    )


__all__ = ["Timeline", "TimelineEvent", "KINDS", "RUNBOOK_KINDS", "build_timeline", "render_markdown", "write_timeline"]
