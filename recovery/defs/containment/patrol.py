"""One pass of the fencing sensor: keep fenced generations stopped, and tell someone.

Containment stops what exists when it runs; this pass catches what comes later: a
backfill someone resumed, a run someone re-executed, a retry, a straggler the
backfill daemon submitted while it was being cancelled. Each such run is stopped,
counted once in ``_recovery.fence_attempts`` (with whether it was created before
or after the fence) and put on the timeline. Then every attempt not yet alerted
on, whether a run found here or a write the writer refused, is delivered through
the notifier, once per attempt (keys kept in the control plane).

State lives in the control plane rather than in a sensor cursor: it survives a
daemon restart and is the same table the alerts are deduplicated by.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from recovery.defs.containment import dagster_runs
from recovery.defs.containment.writers import REFUSED_TAG, refusal_sentence, refused_runs
from recovery.lib.control.plane import SCHEMA, control_plane_exists
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.identifiers import naive_utc
from recovery.lib.notify import NotificationError, Notifier
from recovery.lib.write.fencing import (
    FenceRecord,
    TimelineEvent,
    backfill_cancels_recorded,
    count_run_attempt,
    read_fences,
    record_events,
    unalerted_attempts,
)

DEFAULT_OWNER = "data-platform-oncall"


@dataclass(frozen=True)
class PatrolReport:
    fences: int
    runs_stopped: tuple[str, ...] = ()
    attempts_counted: int = 0
    alerts_delivered: int = 0
    alert_failures: tuple[str, ...] = ()

    def summary(self) -> str:
        if not self.fences and not self.alerts_delivered:
            return "no fenced generation"
        return (
            f"{self.fences} fenced generation(s); stopped {len(self.runs_stopped)} run(s), "
            f"counted {self.attempts_counted} new attempt(s), delivered {self.alerts_delivered} alert(s)"
            + (f", {len(self.alert_failures)} alert(s) undelivered" if self.alert_failures else "")
        )


def patrol(
    instance: dg.DagsterInstance,
    engine: Engine,
    notifier: Notifier,
    spec: DatasetSpec | None = None,
    spec_path: str = "",
) -> PatrolReport:
    fences = read_fences(engine)
    stopped: list[str] = []
    counted = 0
    for fence in fences:
        ids, n = _stop_fenced_runs(instance, engine, fence)
        stopped += ids
        counted += n
    explained = _explain_refused_writes(instance, engine, notifier, spec, spec_path) if spec is not None else 0
    owners = {f.generation: f.fenced_by for f in fences}
    with engine.session(read_only=True) as s:
        pending = unalerted_attempts(s)
    delivered, failures = 0, []
    for a in pending:
        subject = (
            f"run {a.run_id} of fenced generation {a.generation} stopped"
            if a.action.startswith("run:")
            else f"{a.action} by fenced generation {a.generation} refused"
        )
        body = (
            f"{subject} at {a.attempted_at:%Y-%m-%d %H:%M:%S} UTC (incident {a.incident_id or 'none'}). "
            f"{a.detail}\nThe fence held: nothing of {a.generation} landed. Find out who or what is still "
            f"launching it, and stop it at the source."
        )
        try:
            delivered += notifier.notify(
                owners.get(a.generation, DEFAULT_OWNER),
                subject,
                body,
                "critical",
                a.dedupe_key,
                incident_id=a.incident_id,
                dataset=a.dataset,
            )
        except NotificationError as err:
            failures.append(str(err))
    return PatrolReport(len(fences), tuple(stopped), counted, delivered + explained, tuple(failures))


def _explain_refused_writes(
    instance: dg.DagsterInstance, engine: Engine, notifier: Notifier, spec: DatasetSpec, spec_path: str
) -> int:
    """A team's run that failed writing the contained table (DuckDB: "Can only delete from base table")
    gets the sentence saying so as a run tag, a timeline event and one alert. Returns alerts delivered."""
    with engine.session(read_only=True) as s:
        adopted = (
            s.fetchone(
                f"SELECT min(event_at), arg_min(incident_id, event_at) FROM {SCHEMA}.timeline "
                "WHERE kind = 'target_adopted' "
                f"AND dataset = ?",
                [spec.dataset],
            )
            if control_plane_exists(s)
            else None
        )
    if not adopted or adopted[0] is None:
        return 0
    table = spec.target.table_name
    delivered = 0
    for run, said in refused_runs(instance, dg.AssetKey([table.schema, table.name]), adopted[0]):
        sentence = refusal_sentence(str(table), adopted[1], spec, spec_path)
        instance.add_run_tags(run.run_id, {REFUSED_TAG: sentence})
        record_events(
            engine,
            [
                TimelineEvent(
                    "refused_write_explained",
                    f"run {run.run_id} ({run.job_name}) failed writing {table} ('{said}'): {sentence}",
                    adopted[1],
                    spec.dataset,
                    "fencing_sensor",
                    run.run_id,
                    {"generation": "", "error": said},
                )
            ],
        )
        try:
            delivered += notifier.notify(
                DEFAULT_OWNER,
                f"run {run.run_id} could not write the contained {table}",
                sentence,
                "warning",
                f"refused-write:{run.run_id}",
                incident_id=adopted[1],
                dataset=spec.dataset,
            )
        except NotificationError:
            pass  # the tag and the timeline hold the sentence; the next alert goes through the usual retry
    return delivered


def _stop_fenced_runs(instance: dg.DagsterInstance, engine: Engine, fence: FenceRecord) -> tuple[list[str], int]:
    backfills = dagster_runs.backfills_of(instance, fence.generation, fence.backfill_id)
    events = []
    live = {b: s for b in backfills if (s := dagster_runs.live_backfill_status(instance, b)) is not None}
    recorded = backfill_cancels_recorded(engine, fence.incident_id, list(live))
    for b, before in live.items():  # someone resumed or relaunched it after containment
        if b in recorded:  # a killed pass recorded its cancel and never made it: made below, told once
            continue
        events.append(
            TimelineEvent(
                "fence_cancel_backfill",
                f"backfill {b} of fenced {fence.generation} was {before}; cancelled",
                fence.incident_id,
                fence.dataset,
                "fencing_sensor",
                details={"generation": fence.generation, "backfill_id": b, "status_before": before},
            )
        )
    # recorded before the cancel: a pass killed between the two finds the backfill still live and cancels it (the
    # other way round, the cancelled backfill was no longer live for the next pass, and its event never recorded)
    record_events(engine, events)
    for b in live:
        dagster_runs.cancel_backfill(instance, b)
    records = dagster_runs.runs_of(instance, fence.generation, backfills)
    dagster_runs.strip_retries(instance, [r.dagster_run for r in records])
    stopped, counted = [], 0
    for record in records:
        run = record.dagster_run
        if run.status not in dagster_runs.STOPPABLE:
            continue
        when = "after" if naive_utc(record.create_timestamp) > fence.fenced_at else "before"
        # counted before it is stopped: a pass killed between the two finds it still active and stops it (counted
        # after, the stopped run was no longer active for the next pass, and never counted nor alerted)
        counted += count_run_attempt(
            engine,
            fence,
            run.run_id,
            run.status.value,
            f"run created {when} the fence (parent {run.parent_run_id or 'none'}): "
            + ("canceled from the queue" if run.status == dg.DagsterRunStatus.QUEUED else "termination requested"),
        )
        dagster_runs.stop_run(instance, run)
        stopped.append(run.run_id)
    return stopped, counted
