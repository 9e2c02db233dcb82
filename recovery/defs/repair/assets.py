"""The repair in Dagster: plan → generation (partitioned, in waves) → candidate → publication.

- ``repair/plan``: the affected range, qualified partitions, canary and waves; starts
  the repair generation at the low watermark (carry-over and fixed snapshot).
- ``repair/generation``: partitioned by the repair's partitions in wave order; a run
  over one wave's range rebuilds it; its blocking checks gate the wave and stop the
  expansion on an unexplained difference.
- ``repair/candidate``: the delta replayed up to the high watermark; its blocking
  checks run every gate over the whole generation in the same transaction.
- ``repair/publication``: the atomic pointer move, after confirming every gate.
"""

import dagster as dg

from recovery.config import spec_path
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.containment.config import log_next_phases
from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.defs.repair.checks import (
    CANDIDATE_KEY,
    GENERATION_KEY,
    candidate_of,
    check_results,
    check_specs,
    wave_built_by,
)
from recovery.defs.repair.config import RepairPlanConfig
from recovery.defs.repair.lakehouse import publish_onto_table, refuse_foreign_changes
from recovery.defs.repair.partitions import REPAIR_PARTITIONS, register_repair_partitions, wave_ranges_md
from recovery.defs.repair.rollback import rollback_incident
from recovery.defs.resources import WarehouseResource
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.errors import GateRefusedError
from recovery.lib.incident.phases import CANARY, PLAN, PUBLISH, WAVE
from recovery.lib.repair.build import build_wave, start_repair
from recovery.lib.repair.diffs import label_diffs
from recovery.lib.repair.plan import RepairPlan, load_plan, require_plan, wave_name
from recovery.lib.repair.publish import PublishNotice, finish_publish, gate_candidate, publish, replay_to_now
from recovery.lib.repair.waves import gate_wave
from recovery.refusal import refuse

PLAN_KEY = dg.AssetKey(["repair", "plan"])
PUBLICATION_KEY = dg.AssetKey(["repair", "publication"])


def _plan_or_fail(step: IncidentStep) -> RepairPlan:
    with step.engine.session(read_only=True) as s:
        plan = load_plan(s, step.incident_id)
    if plan is None:
        raise dg.Failure(
            description=f"incident {step.incident_id} has no repair plan; materialize repair/plan (job {PLAN.job}) "
            "first",
            allow_retries=False,
        )
    return plan


@incident_asset(
    key=PLAN_KEY,
    deps=[dg.AssetKey(["incident", "decision"])],
    config=RepairPlanConfig,
    group_name="repair",
    description="Repair plan: affected partitions (beyond the nominal range if the damage is), qualified partitions, "
    "canary and waves; starts the repair generation at the low watermark.",
)
def repair_plan(context: dg.AssetExecutionContext, step: IncidentStep[RepairPlanConfig]) -> dg.MaterializeResult:
    config = step.config
    plan = start_repair(
        step.writer("repair_plan"),
        step.incident,
        canary=config.canary_partitions or None,
        canary_max=config.canary_max,
        wave_size=config.wave_size,
        run_id=step.run_id,
    )
    register_repair_partitions(context.instance, plan)
    log_next_phases(context, step.incident, step.spec)  # the canary's launchpad link, its range chosen
    qualified = "\n".join(f"- {p}: {why}" for p, why in plan.qualified.items()) or "none"
    return dg.MaterializeResult(
        metadata={
            "generation": plan.generation,
            "namespace": plan.namespace,
            "from_namespace": plan.from_namespace,
            "low_watermark_seq": plan.low_seq,
            "source_watermark": str(plan.source_watermark),
            "partitions_to_rebuild": len(plan.rebuild),
            "qualified_partitions": len(plan.qualified),
            "waves": dg.MetadataValue.md(wave_ranges_md(plan)),
            "qualified": dg.MetadataValue.md(qualified),
        }
    )


@incident_asset(
    key=GENERATION_KEY,
    deps=[PLAN_KEY],
    partitions_def=REPAIR_PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="repair",
    description="The repair generation, rebuilt from the fixed source snapshot one wave (a partition range) per run; "
    "re-running a wave replaces exactly its partitions.",
)
def repair_generation(context: dg.AssetExecutionContext, step: IncidentStep) -> dg.MaterializeResult:
    plan = _plan_or_fail(step)
    wave = plan.wave_of(list(context.partition_keys))
    if context.job_def.name == CANARY.job and wave != 0:
        raise dg.Failure(
            description=f"{CANARY.job} builds the canary only; these partitions are {wave_name(wave)} "
            f"(launch {WAVE.job})",
            allow_retries=False,
        )
    rows = build_wave(step.writer("repair_generation"), plan, wave, run_id=step.run_id)
    context.log.info(f"{wave_name(wave)}: {len(context.partition_keys)} partitions, {rows:,} rows from the snapshot")
    log_next_phases(context, step.incident, step.spec)  # the next wave's launchpad link (or publish's)
    return dg.MaterializeResult(
        metadata={
            "wave": wave_name(wave),
            "partitions": len(context.partition_keys),
            "dagster/row_count": rows,
            "generation": plan.generation,
        }
    )


@incident_asset(
    key=CANDIDATE_KEY,
    deps=[GENERATION_KEY],
    group_name="repair",
    resources={"notifier": NotifierResource},
    output_required=False,
    description="Publish candidate: the delta of normal ingestion since the low watermark replayed by key and version "
    "(newer wins, tombstones delete) up to the high watermark. Once the repair is published, a launch is a no-op: "
    "nothing is replayed, gated or published again, and the published candidate's gates stay as they were.",
)
def repair_candidate(context: dg.AssetExecutionContext, step: IncidentStep):
    incident, spec = step.incident, step.spec
    notifier: NotifierResource = context.resources.notifier
    plan = _plan_or_fail(step)
    if plan.status == "published":  # a second publish: no materialization, so its gates and the publication skip
        finished = finish_publish(  # a publish killed after its commit left these undone
            step.engine,
            spec,
            incident.incident_id,
            notice=PublishNotice(notifier.notifier(step.engine), incident.requested_by),
            run_id=step.run_id,
        )
        context.log.info(
            f"{incident.incident_id}: already published ({spec.target.table} -> {plan.namespace}); "
            + (f"finished what that publish left undone: {', '.join(finished)}" if finished else "nothing to do")
        )
        if spec.target.lakehouse is not None:  # a publish stopped between the pointer and the table's commit
            context.log.info(publish_onto_table(spec, incident.incident_id).line())
        return
    replayed = replay_to_now(step.writer("repair_candidate"), plan, stage="candidate", run_id=step.run_id)
    yield dg.MaterializeResult(
        metadata={
            "upserts_replayed": replayed.upserted,
            "deletes_replayed": replayed.deleted,
            "older_than_repair": replayed.skipped_older,
            "window": f"({replayed.after_seq}, {replayed.through_seq}]",
        }
    )


@incident_asset(
    key=PUBLICATION_KEY,
    deps=[CANDIDATE_KEY],
    group_name="repair",
    resources={"notifier": NotifierResource},
    description="Atomic publish: every gate confirmed, late writes replayed and the public view moved, "
    "in one transaction.",
)
def repair_publication(context: dg.AssetExecutionContext, step: IncidentStep) -> dg.MaterializeResult:
    incident, spec = step.incident, step.spec
    notifier: NotifierResource = context.resources.notifier
    if spec.target.lakehouse is not None:
        refuse_foreign_changes(spec, incident.incident_id)
    writer = step.writer("repair_publication")
    notice = PublishNotice(notifier.notifier(writer.engine), incident.requested_by)
    try:
        result = publish(writer, incident.incident_id, run_id=step.run_id, notice=notice)
    except GateRefusedError as err:  # a gate said no at the pointer move: its sentence on the run page, no trace
        refuse(str(err))
    onto_table = (  # the consumers' table itself: one commit, after the pointer move every gate allowed
        publish_onto_table(spec, incident.incident_id) if spec.target.lakehouse is not None else None
    )
    with step.engine.session(read_only=True) as s:
        diffs = label_diffs(s, incident.incident_id)
    table = "\n".join(
        ["| label | keys before | keys after |", "| --- | ---: | ---: |"]
        + [f"| {k} | {b:,} | {a:,} |" for k, (b, a) in diffs.items()]
    )
    return dg.MaterializeResult(
        metadata={
            "published_namespace": result["namespace"],
            "already_published": result["already"],
            "previous_namespace": result.get("from_namespace") or "",
            "pointer_seq": result["seq"] or 0,
            "before_after": dg.MetadataValue.md(table),
            **({"lakehouse": onto_table.line(), "lakehouse_version": onto_table.version or 0} if onto_table else {}),
        }
    )


def gate_checks(spec) -> list[dg.AssetChecksDefinition]:
    @dg.multi_asset_check(
        specs=check_specs(spec, GENERATION_KEY),
        name="wave_gates",
        description="Gates of the wave this run built (GE suites on its partitions; reconciliation of all built).",
    )
    def wave_gates(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource):
        found = wave_built_by(warehouse, context.run.run_id)
        if found is None:
            raise dg.Failure(description="this run built no wave of a repair; nothing to gate")
        incident_id, wave = found
        results = gate_wave(warehouse.writer("wave_gates"), incident_id, wave, run_id=context.run.run_id)
        yield from check_results(results, GENERATION_KEY, warehouse.spec(), f"{incident_id} {wave_name(wave)}")

    @dg.multi_asset_check(
        specs=check_specs(spec, CANDIDATE_KEY),
        name="candidate_gates",
        description="Every gate over the whole candidate, in the transaction that fixes the high watermark.",
    )
    def candidate_gates(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource):
        incident_id = candidate_of(warehouse, context.run.run_id)
        if incident_id is None:
            raise dg.Failure(description="this run replayed no repair candidate; nothing to gate")
        writer = warehouse.writer("candidate_gates")
        with writer.engine.session(read_only=True) as s:
            plan = require_plan(s, incident_id)
        _, results, diffs = gate_candidate(writer, plan, run_id=context.run.run_id)
        yield from check_results(results, CANDIDATE_KEY, warehouse.spec(), f"{incident_id} candidate")

    return [wave_gates, candidate_gates]


plan_repair = dg.define_asset_job(
    PLAN.job,
    selection=dg.AssetSelection.assets(PLAN_KEY),
    executor_def=dg.in_process_executor,
    description="Plan the repair of an incident and start its generation (low watermark).",
)
repair_canary = dg.define_asset_job(
    CANARY.job,
    selection=dg.AssetSelection.assets(GENERATION_KEY),
    executor_def=dg.in_process_executor,
    description="Rebuild the canary partitions (select the canary range shown on repair/plan) and gate them.",
)
repair_waves = dg.define_asset_job(
    WAVE.job,
    selection=dg.AssetSelection.assets(GENERATION_KEY),
    executor_def=dg.in_process_executor,
    description="Rebuild one wave (select its range shown on repair/plan) and gate it; a failed gate stops "
    "the expansion.",
)
publish_repair = dg.define_asset_job(
    PUBLISH.job,
    selection=dg.AssetSelection.assets(CANDIDATE_KEY, PUBLICATION_KEY),
    executor_def=dg.in_process_executor,
    description="Replay the delta, run every gate over the candidate, and publish by one pointer move if all pass.",
)


@dg.definitions
def repair_definitions() -> dg.Definitions:
    spec = parse_spec(spec_path())
    return dg.Definitions(
        assets=[repair_plan, repair_generation, repair_candidate, repair_publication],
        asset_checks=gate_checks(spec),
        jobs=[plan_repair, repair_canary, repair_waves, publish_repair, rollback_incident],
    )
