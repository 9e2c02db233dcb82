"""Restatement as assets: ``restatement/<consumer>`` for every SQL consumer of the spec, and
``restatement/downstream_assets`` for the Dagster assets downstream of the target.

One multi-asset (subsettable, so one consumer can be restated alone from the UI) takes the
incident as launchpad config. Every asset consumer is resolved first (one declared nowhere,
or named in a code location that does not hold it, stops the run before anything is
written). Per SQL consumer it publishes the corrected output through the consumer's pointer,
keeps the original, writes the ledger; per Dagster asset it launches the asset's
materialization for the affected partitions (``downstream_assets.py``); then it tells each
owner once. Its checks (ERROR) are the restatement's own (``recovery/lib/restatement/checks.py``):
``equals_consumer_on_source`` per SQL consumer, ``downstream_assets_restated`` for the assets.
A failed check fails the run with one sentence after everything is recorded (the command's
exit 1); so does a notice that could not be delivered (re-running delivers it, and only it).
"""

import dagster as dg

from recovery.config import spec_path
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.asset_consumers import ResolvedAsset, resolve
from recovery.defs.containment.config import IncidentConfig
from recovery.defs.incident_step import IncidentStep
from recovery.defs.resources import WarehouseResource
from recovery.defs.restatement.downstream_assets import ASSETS_KEY, restate_assets
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.incident.phases import RESTATE
from recovery.lib.restatement.checks import record_checks, refusal
from recovery.lib.restatement.notices import notify_owners
from recovery.lib.restatement.restate import ConsumerRestatement, check_request, refreshed, restate_consumers
from recovery.lib.retry import retrying

RESTATE_JOB = RESTATE.job
RESTATEMENT_OP = "restatement"
CHECK = "equals_consumer_on_source"
ASSETS_CHECK = "downstream_assets_restated"


def restatement_key(consumer: str) -> dg.AssetKey:
    return dg.AssetKey(["restatement", consumer])


def _metadata(r: ConsumerRestatement) -> dict:
    return {
        "dagster/row_count": r.ledger_rows,
        "ledger_rows": r.ledger_rows,
        "material_rows": r.material_rows,
        "original_namespace": r.original_namespace or "",
        "corrected_namespace": r.corrected_namespace,
        "original_total": dg.MetadataValue.float(r.original_total) if r.original_total is not None else "",
        "corrected_total": dg.MetadataValue.float(r.corrected_total) if r.corrected_total is not None else "",
        "decision": r.decision,
        "owner": r.owner,
        "reused": r.reused,
        "notified_at": str(r.notified_at or ""),
    }


def restatement_asset(spec: DatasetSpec) -> dg.AssetsDefinition:
    target = dg.AssetKey(spec.target.table.split("."))
    specs = [
        dg.AssetSpec(
            restatement_key(c.name),
            deps=[target, dg.AssetKey(["consumers", c.name])],
            group_name="restatement",
            kinds={"duckdb"},
            owners=[f"team:{c.owner}"],
            tags={"recovery/consumer_kind": c.kind},
            description=f"{c.name} restated from the repaired {spec.target.table}: corrected output published, "
            f"original kept, ledger rows, {c.owner} notified once.",
        )
        for c in spec.downstream
    ] + [
        dg.AssetSpec(
            ASSETS_KEY,
            deps=[target],
            group_name="restatement",
            kinds={"duckdb"},
            description=f"The Dagster assets downstream of {spec.target.table} (this code location's, and those the "
            f"spec names), re-materialized through Dagster for the partitions the damage reached; original and "
            f"corrected rows in the ledger, each owner notified once.",
        )
    ]
    checks = [
        dg.AssetCheckSpec(
            CHECK,
            asset=restatement_key(c.name),
            description="The corrected output equals the consumer's SQL over the source's expected rows "
            "(as of the ingestion watermark), and the ledger is not empty where the impact found material rows.",
        )
        for c in spec.downstream
    ] + [
        dg.AssetCheckSpec(
            ASSETS_CHECK,
            asset=ASSETS_KEY,
            description="Every affected partition of every downstream asset was re-materialized by a successful run, "
            "and each corrected table holds each key once.",
        )
    ]

    @dg.multi_asset(name=RESTATEMENT_OP, specs=specs, check_specs=checks, can_subset=True)
    def restatement(
        context: dg.AssetExecutionContext,
        config: IncidentConfig,
        warehouse: WarehouseResource,
        notifier: NotifierResource,
    ):
        step = IncidentStep.of(context, config, warehouse)
        incident, served, engine = step.incident, step.spec, step.engine
        names = [k.path[-1] for k in context.selected_asset_keys if k != ASSETS_KEY]
        assets: list[ResolvedAsset] = []
        if ASSETS_KEY in context.selected_asset_keys:
            assets, undeclared = resolve(context, served, warehouse.spec_path)
            if undeclared:
                raise undeclared[0].error(served.target.table)
            check_request(engine, served, incident.incident_id, [])  # before any write: the repair is published
        results = (
            restate_consumers(
                engine,
                served,
                incident.incident_id,
                failed_generations=incident.failed_generations,
                consumers=names,
                actor="restatement",
                run_id=step.run_id,
            )
            if names
            else []
        )
        asset_results, asset_checks = restate_assets(context, engine, served, incident, assets)

        def record() -> None:
            with engine.transaction() as s:
                record_checks(s, served.dataset, incident.incident_id, asset_checks, run_id=step.run_id)

        retrying(record)
        checks = [r.check for r in results if r.check is not None] + asset_checks
        held = {c.consumer for c in checks if c.passed}  # no owner is told of a correction its check refuted
        failures = notify_owners(
            engine,
            served,
            incident.incident_id,
            notifier.notifier(engine),
            consumers=[n for n in names + [r.consumer for r in asset_results] if n in held],
            extra=[a.consumer for a in assets],
        )
        for r in refreshed(engine, served, results):
            key = restatement_key(r.consumer)
            yield dg.MaterializeResult(asset_key=key, metadata=_metadata(r))
            if dg.AssetCheckKey(key, CHECK) in context.selected_asset_check_keys and r.check is not None:
                yield dg.AssetCheckResult(
                    asset_key=key,
                    check_name=CHECK,
                    passed=r.check.passed,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description=r.check.details,
                    metadata={"mismatched_rows": r.mismatches_vs_source, "watermark": str(r.watermark)},
                )
        if ASSETS_KEY in context.selected_asset_keys:
            restated = refreshed(engine, served, asset_results)
            yield dg.MaterializeResult(
                asset_key=ASSETS_KEY,
                metadata={
                    "dagster/row_count": sum(r.ledger_rows for r in restated),
                    "assets": dg.MetadataValue.json([c.details for c in asset_checks]),
                    "ledger_rows": sum(r.ledger_rows for r in restated),
                    "material_rows": sum(r.material_rows for r in restated),
                },
            )
            if dg.AssetCheckKey(ASSETS_KEY, ASSETS_CHECK) in context.selected_asset_check_keys:
                said = refusal(asset_checks)
                yield dg.AssetCheckResult(
                    asset_key=ASSETS_KEY,
                    check_name=ASSETS_CHECK,
                    passed=said is None,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description=said
                    or (
                        "; ".join(c.details for c in asset_checks)
                        or "no Dagster asset is downstream of the target: nothing to restate"
                    ),
                    metadata={"assets": len(asset_checks), "failed": sum(not c.passed for c in asset_checks)},
                )
        if failures:
            raise dg.Failure(description="notices not delivered (re-run to deliver them): " + "; ".join(failures))
        said = refusal(checks)
        if said:
            raise dg.Failure(description=said, allow_retries=False)

    return restatement


@dg.definitions
def restatement_definitions() -> dg.Definitions:
    spec = parse_spec(spec_path())
    asset = restatement_asset(spec)
    job = dg.define_asset_job(
        RESTATE_JOB,
        selection=dg.AssetSelection.groups("restatement"),
        executor_def=dg.in_process_executor,
        description="Restate every downstream consumer against the published repair: corrected outputs through "
        "their pointers (SQL consumers) or re-materialized through Dagster (downstream assets), originals kept, "
        "restatement ledger, each owner notified once.",
        tags={"recovery/phase": "restatement"},
    )
    return dg.Definitions(assets=[asset], jobs=[job])
