"""Definitions for every dataset beyond the served one (``RECOVERY_SPECS``).

The served dataset (``RECOVERY_SPEC``) keeps the unprefixed names every phase uses.
Each further dataset ``<d>`` gets, under the key prefix ``<d>`` and the group ``<d>``:
its managed target as an external asset, one asset per downstream consumer, the
``ingest__<d>`` job (change-data-capture through the writer, up to now) with an hourly
schedule, and its own ``fencing_sensor__<d>`` and ``backfill_incident_sensor__<d>``,
bound to the resource ``warehouse__<d>``, and ``contain_backfill__<d>``, the containment job
bound to its warehouse (the draft incident's alert links its launchpad). The later recovery
phases' jobs still serve the one dataset of ``RECOVERY_SPEC`` (see README, Limits).
"""

from pathlib import Path

import dagster as dg

from recovery.config import spec_path, spec_paths
from recovery.defs.containment.jobs import contain_backfill
from recovery.defs.containment.patrol import patrol
from recovery.defs.intake.sensors import open_drafts
from recovery.defs.resources import WarehouseResource, warehouse_resource
from recovery.lib.consumers.sql import materialize_consumer
from recovery.lib.control.plane import utcnow
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.errors import WarehouseBusyError
from recovery.lib.incident.phases import CONTAIN
from recovery.lib.write.ingest import apply_changes

BUSY_TIMEOUT_S = 20.0


def target_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey([spec.dataset, spec.target.table_name.schema, spec.target.table_name.name])


def dataset_definitions(path: Path) -> dg.Definitions:
    """Everything one further dataset needs to ingest, be watched, and draft its incidents."""
    spec = parse_spec(path)
    d = spec.dataset
    res = f"warehouse__{d}"
    target = dg.AssetSpec(
        key=target_key(spec),
        group_name=d,
        kinds={"duckdb"},
        description=f"{spec.target.table} of dataset {d}: the managed public view (written through the writer).",
    )

    def consumer_asset(consumer):
        @dg.asset(
            key=dg.AssetKey([d, "consumers", consumer.name]),
            deps=[target.key],
            group_name=d,
            kinds={"duckdb"},
            owners=[f"team:{consumer.owner}"],
            required_resource_keys={res},
            description=f"{consumer.kind.capitalize()} owned by {consumer.owner} over {spec.target.table} ({d}).",
        )
        def _consumer(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            warehouse: WarehouseResource = getattr(context.resources, res)
            return dg.MaterializeResult(
                metadata={"dagster/row_count": materialize_consumer(warehouse.engine(), spec, consumer)}
            )

        return _consumer

    @dg.op(
        name=f"ingest_changes__{d}",
        required_resource_keys={res},
        description=f"Apply {spec.source.table}'s changes up to now to {spec.target.table} through the writer.",
    )
    def ingest_op(context: dg.OpExecutionContext) -> dg.Output:
        writer = getattr(context.resources, res).writer(actor=f"ingest__{d}")
        writer.ensure()
        generation = f"ingest-{d}-{utcnow():%Y-%m-%d}"
        writer.register_generation(generation, "ingest", run_id=context.run.run_id)
        result = apply_changes(writer, generation, until=utcnow(), run_id=context.run.run_id)
        return dg.Output(
            None, metadata={"generation": generation, "upserted": result.upserted, "deleted": result.deleted}
        )

    @dg.job(
        executor_def=dg.in_process_executor,
        name=f"ingest__{d}",
        tags={"recovery/dataset": d},
        description=f"Normal ingestion of dataset {d}: the source change log applied to {spec.target.table}.",
    )
    def ingest_job():
        ingest_op()

    schedule = dg.ScheduleDefinition(
        name=f"ingest__{d}_hourly",
        job=ingest_job,
        cron_schedule="0 * * * *",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )

    # the containment job, bound to this dataset's warehouse (a job's own resource wins over the
    # location's ``warehouse``): its launchpad takes incidents whose spec is this dataset's
    contain = contain_backfill.graph.to_job(
        name=f"{CONTAIN.job}__{d}",
        resource_defs={"warehouse": warehouse_resource(str(path))},
        executor_def=dg.in_process_executor,
        tags={**contain_backfill.tags, "recovery/dataset": d},
        description=f"Contain a failed backfill of dataset {d}: validate the incident (its spec must be {d}'s), "
        f"fence its generations, cancel its Dagster backfill and stop its runs.",
    )

    @dg.sensor(
        name=f"fencing_sensor__{d}",
        minimum_interval_seconds=15,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={res, "notifier"},
        description=f"Stops any run or retry of a fenced generation of dataset {d} and alerts on refused attempts.",
    )
    def fencing(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        warehouse: WarehouseResource = getattr(context.resources, res)
        if not Path(spec.warehouse.path).exists():
            return dg.SkipReason(f"warehouse {spec.warehouse.path} does not exist yet")
        engine = warehouse.engine()
        engine.busy_timeout_s = BUSY_TIMEOUT_S
        try:
            report = patrol(context.instance, engine, context.resources.notifier.notifier(engine))
        except WarehouseBusyError as err:
            return dg.SkipReason(f"warehouse busy, trying again next tick: {err}")
        if report.alert_failures:
            raise dg.Failure(
                description="alerts not delivered (retried next tick): " + "; ".join(report.alert_failures)
            )
        return dg.SkipReason(report.summary())

    @dg.sensor(
        name=f"backfill_incident_sensor__{d}",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={res, "notifier"},
        description=f"Opens a draft incident for every failed backfill of dataset {d}.",
    )
    def intake(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        try:
            drafts, errors = open_drafts(
                context.instance,
                getattr(context.resources, res),
                context.resources.notifier,
                context.log,
                asset_key=target.key,
                contain_job=contain.name,
            )
        except WarehouseBusyError as err:
            return dg.SkipReason(f"warehouse busy, trying again next tick: {err}")
        if errors:
            raise dg.Failure(description="alerts not delivered (retried next tick): " + "; ".join(errors))
        opened = sum(x.newly_opened for x in drafts)
        return dg.SkipReason(f"{opened} draft incident(s) opened, {len(drafts) - opened} already open")

    return dg.Definitions(
        assets=[target, *(consumer_asset(c) for c in spec.downstream)],
        jobs=[ingest_job, contain],
        schedules=[schedule],
        sensors=[fencing, intake],
        resources={res: warehouse_resource(str(path))},
    )


@dg.definitions
def further_datasets() -> dg.Definitions:
    further = spec_paths()[1:]
    if not further:  # the one dataset asked (``RECOVERY_SPECS`` unset): its spec is not read again here
        return dg.Definitions()
    seen = {parse_spec(spec_path()).dataset}
    parts = []
    for path in further:
        name = parse_spec(path).dataset
        if name in seen:
            raise dg.DagsterInvalidDefinitionError(
                f"RECOVERY_SPECS: dataset {name!r} ({path}) is served twice; give each spec its own dataset name"
            )
        seen.add(name)
        parts.append(dataset_definitions(path))
    return dg.Definitions.merge(*parts) if parts else dg.Definitions()
