"""The containment steps, in the runbook's order: validate, fence, then stop Dagster's work.

The fence comes before any cancellation because cancellation is advisory: from the
fence's commit on, a run that escapes cancellation (or a retry) writes nothing.
Every action that changed something is a timeline event with the real run ids; a
re-run for the same incident finds everything done and records nothing. Dagster's
storage and the warehouse commit apart: an attempt killed after it stopped Dagster's
work and before its events committed leaves the backfill cancelled and the runs stopped
(tagged never to be retried) without a word on the timeline, so the re-run records
those it finds so, once, as stopped by an interrupted attempt.
"""

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus

from recovery.defs.containment import dagster_runs
from recovery.defs.containment.config import IncidentConfig, incident_for_step
from recovery.defs.containment.report import ContainmentReport, GenerationContainment
from recovery.defs.containment.writers import refused_writers
from recovery.defs.resources import WarehouseResource
from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA
from recovery.lib.engine.base import Engine
from recovery.lib.incident.model import Incident
from recovery.lib.incident.phases import CONTAIN
from recovery.lib.lakehouse.adoption import adopted_lakehouse
from recovery.lib.lakehouse.fence import fence_table
from recovery.lib.pointers.adoption import Adoption, adopt
from recovery.lib.write.fencing import FenceOutcome, TimelineEvent, event_recorded, fence_incident, record_events

ACTOR = CONTAIN.job


@dg.op(description="Validate the incident (shape, then meaning against the warehouse, read-only) before any write.")
def validate_incident(context: dg.OpExecutionContext, config: IncidentConfig, warehouse: WarehouseResource) -> Incident:
    incident, spec = incident_for_step(context, config, warehouse.spec_path)
    context.log.info(
        f"incident {incident.incident_id}: contain {', '.join(incident.failed_generations)} of {spec.dataset}, "
        f"requested by {incident.requested_by}"
    )
    return incident


@dg.op(
    description="Take a target another tool wrote under management in one transaction (the control plane, the "
    "table into its first versioned namespace, the public name a managed view, the team's registry "
    "copied); from that commit on foreign writes to the public name fail. Nothing to do when managed."
)
def adopt_target(
    context: dg.OpExecutionContext, incident: Incident, warehouse: WarehouseResource
) -> dg.Output[Adoption]:
    spec, engine = warehouse.spec(), warehouse.engine()
    table_fence = None
    if spec.target.lakehouse is not None:  # the fence on the table itself first: it pins the damaged version
        table_fence = fence_table(
            engine, spec, incident.incident_id, list(incident.failed_generations), actor=incident.requested_by
        )
        context.log.info(table_fence.line())
    adoption = adopt(engine, spec, actor=incident.requested_by, incident_id=incident.incident_id)
    if table_fence is not None:
        adoption = adopted_lakehouse(engine, spec, adoption, table_fence)
    context.log.info(adoption.line(warehouse.spec()))
    return dg.Output(
        adoption,
        metadata={
            "adopted_now": adoption.adopted_now,
            "namespace": adoption.namespace,
            "rows": adoption.rows,
            "checksum": adoption.checksum or "",
            "summary": adoption.line(warehouse.spec()),
        },
    )


@dg.op(description="Fence each failed generation: from this commit on, the writer refuses its writes.")
def fence_generations(
    context: dg.OpExecutionContext, incident: Incident, adoption: Adoption, warehouse: WarehouseResource
) -> list[FenceOutcome]:
    outcomes = fence_incident(warehouse.writer(actor=incident.requested_by), incident)
    for o in outcomes:
        f = o.record
        context.log.info(
            f"{f.generation}: {'fenced' if o.newly_fenced else 'already fenced'} "
            f"(token {f.token}, commit seq {f.seq}, by {f.fenced_by})"
        )
    return outcomes


@dg.op(
    description="Cancel the backfills that produced the fenced generations, stop their queued and "
    "in-flight runs and disable their retries, through Dagster's instance APIs."
)
def stop_dagster_work(
    context: dg.OpExecutionContext, incident: Incident, fences: list[FenceOutcome], warehouse: WarehouseResource
) -> dg.Output[ContainmentReport]:
    engine = warehouse.engine()
    results = []
    covered: dict[str, str] = {}  # backfill or run id -> the generation whose containment stopped it
    for outcome in fences:
        events: list[TimelineEvent] = []
        result = _contain_generation(context, incident, outcome, events, covered, engine)
        if (
            not result.backfills
            and not result.runs_seen
            and result.covered_by is None
            and not event_recorded(engine, "containment_no_runs", incident.incident_id, outcome.record.generation)
        ):
            events.append(
                _event(
                    context,
                    incident,
                    outcome,
                    "containment_no_runs",
                    None,
                    f"no Dagster backfill or run of {outcome.record.generation} in this instance: nothing to cancel",
                )
            )
        faults.checkpoint("contain:dagster_stopped")  # Dagster's work stopped, its events not yet committed
        record_events(engine, events)
        faults.checkpoint("contain:stop_recorded")
        results.append(result)
    spec = warehouse.spec()
    table = spec.target.table_name
    # only a target another tool wrote (taken over by adoption) has writers the managed view now refuses
    with engine.session(read_only=True) as s:
        adopted = s.scalar(
            f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = 'target_adopted' AND dataset = ?", [spec.dataset]
        )
    writers = refused_writers(context.instance, dg.AssetKey([table.schema, table.name])) if adopted else []
    sentences = tuple(w.sentence(spec, str(warehouse.spec_path)) for w in writers)
    if sentences and not event_recorded(engine, "containment_refused_writers", incident.incident_id, ""):
        record_events(
            engine,
            [
                TimelineEvent(
                    "containment_refused_writers",
                    f"{len(sentences)} Dagster writer(s) of {spec.target.table} are refused from now on: "
                    + "; ".join(sentences),
                    incident.incident_id,
                    spec.dataset,
                    ACTOR,
                    details={"generation": "", "writers": [w.__dict__ for w in writers]},
                )
            ],
        )
    report = ContainmentReport(incident.incident_id, context.run.run_id, tuple(results), sentences)
    for line in report.lines():
        context.log.info(line)
    return dg.Output(
        report,
        metadata={
            "report": dg.MetadataValue.md(report.markdown()),
            "runs_stopped": sum(len(g.stopped_runs) for g in report.generations),
            "backfills_cancelled": sum(len(g.cancelled_backfills) for g in report.generations),
            "changed_anything": report.changed_anything,
        },
    )


def _cancelled_already(instance: dg.DagsterInstance, backfill_id: str) -> bool:
    found = instance.get_backfill(backfill_id)
    return found is not None and found.status in (BulkActionStatus.CANCELING, BulkActionStatus.CANCELED)


def _recorded_stops(engine: Engine, incident_id: str) -> tuple[set[str], set[str]]:
    """(backfill ids, run ids) whose cancellation or stop this incident's containment recorded."""
    with engine.session(read_only=True) as s:
        rows = s.fetchall(
            f"SELECT kind, json_extract_string(details, '$.backfill_id'), run_id FROM {SCHEMA}.timeline "
            "WHERE incident_id = ? AND kind IN ('containment_cancel_backfill', 'containment_terminate_run', "
            "'containment_strip_retries')",
            [incident_id],
        )
    return (
        {b for kind, b, _ in rows if kind == "containment_cancel_backfill" and b},
        {r for kind, _, r in rows if kind != "containment_cancel_backfill" and r},
    )


def _contain_generation(
    context,
    incident: Incident,
    outcome: FenceOutcome,
    events: list[TimelineEvent],
    covered: dict[str, str],
    engine: Engine,
) -> GenerationContainment:
    """Cancel the generation's backfills and stop its runs; those an earlier generation of the same
    subject (another run id of one backfill) already covered are left to it (``covered``). What an
    interrupted attempt stopped without recording it is recorded now (module docstring)."""
    instance, gen = context.instance, outcome.record.generation
    recorded_backfills, recorded_runs = _recorded_stops(engine, incident.incident_id)
    all_backfills = dagster_runs.backfills_of(instance, gen, outcome.record.backfill_id)
    all_runs = dagster_runs.runs_of(instance, gen, all_backfills)
    backfills = [b for b in all_backfills if b not in covered]
    seen = [b for b in all_backfills if b in covered] + [
        r.dagster_run.run_id for r in all_runs if r.dagster_run.run_id in covered
    ]
    covered_by = covered[seen[0]] if seen else None
    covered.update({b: gen for b in backfills})
    cancelled = []
    for b in backfills:  # first, so the daemon submits no more runs
        before = dagster_runs.cancel_backfill(instance, b)
        if before is not None:
            cancelled.append(b)
            said, status_before = f"cancelled (was {before})", before
        elif b not in recorded_backfills and _cancelled_already(instance, b):
            said = (
                "found cancelled: cancelled by an interrupted attempt of this containment (or from the UI), "
                "recorded now"
            )
            status_before = "unknown (an interrupted containment)"
        else:
            continue
        events.append(
            _event(
                context,
                incident,
                outcome,
                "containment_cancel_backfill",
                None,
                f"backfill {b} of {gen} {said}",
                backfill_id=b,
                status_before=status_before,
            )
        )
    runs = [r.dagster_run for r in all_runs if r.dagster_run.run_id not in covered]
    covered.update({r.run_id: gen for r in runs})
    stripped = dagster_runs.strip_retries(instance, runs)
    stopped = [dagster_runs.stop_run(instance, r) for r in runs if r.status in dagster_runs.STOPPABLE]
    for s in stopped:
        events.append(
            _event(
                context,
                incident,
                outcome,
                "containment_terminate_run",
                s.run_id,
                f"run {s.run_id} of {gen} ({s.status_before}): {s.action}",
                backfill_id=s.backfill_id,
                status_before=s.status_before,
                action=s.action,
            )
        )
    stopped_ids = {s.run_id for s in stopped}
    for r in runs:  # tagged by an attempt of containment killed before it recorded them
        if (
            r.run_id in stopped_ids
            or r.run_id in stripped
            or r.run_id in recorded_runs
            or any(r.tags.get(k) != v for k, v in dagster_runs.NO_RETRY_TAGS.items())
        ):
            continue
        halted = r.status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.CANCELING)
        events.append(
            _event(
                context,
                incident,
                outcome,
                "containment_terminate_run" if halted else "containment_strip_retries",
                r.run_id,
                f"run {r.run_id} of {gen} ({r.status.value}): "
                + ("stopped" if halted else "set never to be retried")
                + " by an interrupted attempt of this containment, recorded now",
                backfill_id=r.tags.get(dagster_runs.BACKFILL_ID_TAG),
                status_before="unknown (an interrupted containment)",
                action="stopped by an interrupted containment" if halted else "retries stripped",
            )
        )
    for run_id in stripped:
        if run_id not in stopped_ids:
            events.append(
                _event(
                    context,
                    incident,
                    outcome,
                    "containment_strip_retries",
                    run_id,
                    f"run {run_id} of {gen} will not be retried",
                )
            )
    return GenerationContainment(
        outcome, tuple(backfills), tuple(cancelled), tuple(stopped), tuple(stripped), len(runs), covered_by
    )


def _event(
    context, incident: Incident, outcome: FenceOutcome, kind: str, run_id: str | None, summary: str, **details
) -> TimelineEvent:
    return TimelineEvent(
        kind=kind,
        summary=summary,
        incident_id=incident.incident_id,
        dataset=outcome.record.dataset,
        actor=ACTOR,
        run_id=run_id,
        details={"generation": outcome.record.generation, "containment_run_id": context.run.run_id, **details},
    )
