"""Timeline events from the orchestrator's record of the failed generations' runs.

The backfill's request (who asked, who approved, which partitions), each run's
creation, start and end, step failures and step retries, and runs that retry
other runs, all on Dagster's wall clock and with real run ids. A backfill that
carries no approval tag is itself a finding, so it is told as one.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from recovery.lib.control.run_history import BackfillInfo, RunHistory, RunInfo
from recovery.lib.incident.model import Incident
from recovery.lib.timeline.events import TimelineEvent

RUN_EVENT_KINDS = {
    "RUN_START": ("runs", "started"),
    "RUN_SUCCESS": ("runs", "succeeded"),
    "RUN_FAILURE": ("runs", "failed"),
    "RUN_CANCELING": ("runs", "cancelling"),
    "RUN_CANCELED": ("runs", "cancelled"),
    "STEP_FAILURE": ("runs", "step failed"),
    "STEP_UP_FOR_RETRY": ("retries", "step up for retry"),
    "STEP_RESTARTED": ("retries", "step restarted"),
}
EXPLAINED = {"RUN_FAILURE", "RUN_CANCELED", "STEP_FAILURE", "STEP_UP_FOR_RETRY"}  # their messages say why
REQUESTER_TAGS = ("requested_by", "dagster/user", "user")
APPROVER_TAGS = ("approved_by", "approval")


def _first_tag(tags: dict[str, str], names: tuple[str, ...]) -> str | None:
    return next((tags[n] for n in names if tags.get(n)), None)


def _backfill_events(b: BackfillInfo, incident: Incident) -> list[TimelineEvent]:
    ev: dict[str, Any] = dict(at=b.requested_at, clock="wall", source=f"dagster:backfill {b.backfill_id}")
    span = (
        f"{len(b.partitions)} partitions {b.partitions[0]}..{b.partitions[-1]}" if b.partitions else "no partition list"
    )
    requester = _first_tag(b.tags, REQUESTER_TAGS)
    approver = _first_tag(b.tags, APPROVER_TAGS)
    out = [
        TimelineEvent(
            kind="request",
            actor=requester,
            summary=f"Dagster backfill {b.backfill_id} requested"
            + (f": {b.title}" if b.title else "")
            + (f" ({b.description})" if b.description else ""),
            **ev,
        ),
        TimelineEvent(
            kind="approval",
            actor=approver,
            summary=f"backfill {b.backfill_id} approved by {approver} (tag)"
            if approver
            else f"backfill {b.backfill_id} carries no approval: nobody is recorded as approving it",
            **ev,
        ),
    ]
    ranges = f"backfill {b.backfill_id} requests {span}"
    if incident.partitions and b.partitions:
        lo, hi = str(incident.partitions.start), str(incident.partitions.end)
        outside = [p for p in b.partitions if p < lo or p > hi]
        if outside:
            ranges += f"; {len(outside)} beyond the intended {lo}..{hi} ({outside[0]}..{outside[-1]})"
    out.append(TimelineEvent(kind="ranges", actor=requester, summary=ranges, **ev))
    if b.ended_at:
        out.append(
            TimelineEvent(
                b.ended_at,
                "wall",
                "containment" if b.status.startswith("CANCEL") else "runs",
                None,
                f"backfill {b.backfill_id} ended {b.status}",
                source=f"dagster:backfill {b.backfill_id}",
            )
        )
    return out


def _configuration_event(generation: str, runs: list[RunInfo]) -> TimelineEvent:
    configs = {json.dumps(r.run_config, sort_keys=True) for r in runs}
    tags = sorted(
        {
            f"{k}={v}"
            for r in runs
            for k, v in r.tags.items()
            if not k.startswith(("dagster/", ".dagster")) and k not in ("dagster/backfill",)
        }
    )
    config = configs.pop() if len(configs) == 1 else f"{len(configs)} different run configs"
    first = min(runs, key=lambda r: r.created_at or r.started_at or datetime.max)  # a run without a time sorts last
    return TimelineEvent(
        first.created_at,
        "wall",
        "configuration",
        None,
        f"{len(runs)} runs of {generation} ({first.job_name}): run config {config}; tags {', '.join(tags) or 'none'}",
        source="dagster:runs",
    )


def _run_events(r: RunInfo) -> list[TimelineEvent]:
    scope = f" for partitions {r.partition_range}" if r.partition_range else ""
    out = [
        TimelineEvent(
            r.created_at,
            "wall",
            "runs",
            None,
            f"run created ({r.job_name}){scope}",
            r.run_id,
            source="dagster:run record",
        )
    ]
    if r.parent_run_id:
        out.append(
            TimelineEvent(
                r.created_at,
                "wall",
                "retries",
                None,
                f"run is a retry of run {r.parent_run_id}",
                r.run_id,
                source="dagster:run record",
            )
        )
    for e in r.events:
        if e.event_type not in RUN_EVENT_KINDS:
            continue
        kind, verb = RUN_EVENT_KINDS[e.event_type]
        step = f" {e.step_key}" if e.step_key else ""
        detail = f": {e.message}" if e.message and e.event_type in EXPLAINED else ""
        out.append(
            TimelineEvent(
                e.at, "wall", kind, None, f"{verb}{step}{scope}{detail}", r.run_id, source=f"dagster:{e.event_type}"
            )
        )
    return out


def run_events(history: RunHistory, incident: Incident) -> list[TimelineEvent]:
    out: list[TimelineEvent] = []
    for b in history.backfills:
        out += _backfill_events(b, incident)
    for g in incident.failed_generations:
        runs = history.runs_of(g)
        if runs:
            out.append(_configuration_event(g, runs))
    for r in history.runs:
        out += _run_events(r)
    return out
