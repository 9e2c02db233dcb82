"""The incident timeline report: :class:`recovery.lib.timeline.Timeline` as one HTML page.

The timeline itself is assembled by :mod:`recovery.lib.timeline` (control plane +
orchestrator run history); this only arranges it for reading: events in story
order with their own clocks and real run ids, counts per kind, the runbook kinds
not recorded yet, and the runs the story involves.
"""

from __future__ import annotations

from collections import Counter

from recovery.lib.timeline import Timeline
from recovery.lib.timeline.events import CLOCKS


def timeline_context(timeline: Timeline) -> dict:
    runs = Counter(e.run_id for e in timeline.events if e.run_id)
    first_kind = {}
    for e in timeline.events:
        if e.run_id and e.run_id not in first_kind:
            first_kind[e.run_id] = e.kind
    return {
        "incident_id": timeline.incident_id,
        "dataset": timeline.dataset,
        "failed_generations": list(timeline.failed_generations),
        "built_at": timeline.built_at,
        "orchestrator": timeline.orchestrator,
        "clocks": CLOCKS,
        "notes": list(timeline.notes),
        "kinds": timeline.kind_counts,
        "missing_kinds": timeline.missing_kinds,
        "events": [e.as_dict() | {"at": e.at, "order_at": e.order_at} for e in timeline.events],
        "runs": [{"run_id": r, "events": n, "first_kind": first_kind[r]} for r, n in runs.most_common()],
    }
