"""Restatement as assets: ``restatement/<consumer>`` for every downstream consumer of the spec.

One multi-asset (subsettable, so one consumer can be restated alone from the UI)
takes the incident as launchpad config. Per consumer it publishes the corrected
output through the consumer's pointer, keeps the original, writes the ledger, and
tells the owner once. Its check ``equals_consumer_on_source`` (ERROR) says whether
the corrected output equals the consumer's SQL over the source's expected rows,
which is the promise a restatement makes; the alert sensor notifies on a failure.
A notice that could not be delivered fails the run after everything else is
recorded; re-running delivers it, and only it.
"""

import dagster as dg

from recovery.config import spec_path
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.containment.config import IncidentConfig, resolve_incident
from recovery.defs.resources import WarehouseResource
from recovery.lib.engine import open_engine
from recovery.lib.restatement.notices import notify_owners
from recovery.lib.restatement.restate import ConsumerRestatement, refreshed, restate_consumers
from recovery.lib.spec import DatasetSpec, parse_spec

RESTATE_JOB = "restate_consumers"
RESTATEMENT_OP = "restatement"
CHECK = "equals_consumer_on_source"


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
    ]
    checks = [
        dg.AssetCheckSpec(
            CHECK,
            asset=restatement_key(c.name),
            description="The corrected output equals the consumer's SQL over the source's expected rows "
            "(as of the ingestion watermark).",
        )
        for c in spec.downstream
    ]

    @dg.multi_asset(name=RESTATEMENT_OP, specs=specs, check_specs=checks, can_subset=True)
    def restatement(
        context: dg.AssetExecutionContext,
        config: IncidentConfig,
        warehouse: WarehouseResource,
        notifier: NotifierResource,
    ):
        incident, served = resolve_incident(config, warehouse.spec_path, context.instance)
        engine = open_engine(served.warehouse)
        names = [k.path[-1] for k in context.selected_asset_keys]
        results = restate_consumers(
            engine,
            served,
            incident.incident_id,
            failed_generations=incident.failed_generations,
            consumers=names,
            actor="restatement",
            run_id=context.run.run_id,
        )
        failures = notify_owners(engine, served, incident.incident_id, notifier.notifier(engine), consumers=names)
        for r in refreshed(engine, served, results):
            key = restatement_key(r.consumer)
            yield dg.MaterializeResult(asset_key=key, metadata=_metadata(r))
            if dg.AssetCheckKey(key, CHECK) in context.selected_asset_check_keys:
                yield dg.AssetCheckResult(
                    asset_key=key,
                    check_name=CHECK,
                    passed=r.mismatches_vs_source == 0,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description=None
                    if r.mismatches_vs_source == 0
                    else f"{r.consumer}: {r.mismatches_vs_source} rows differ from the consumer on the source's expected rows",
                    metadata={"mismatched_rows": r.mismatches_vs_source, "watermark": str(r.watermark)},
                )
        if failures:
            raise dg.Failure(description="notices not delivered (re-run to deliver them): " + "; ".join(failures))

    return restatement


@dg.definitions
def restatement_definitions() -> dg.Definitions:
    spec = parse_spec(spec_path())
    if not spec.downstream:
        return dg.Definitions()
    asset = restatement_asset(spec)
    job = dg.define_asset_job(
        RESTATE_JOB,
        selection=dg.AssetSelection.groups("restatement"),
        description="Restate every downstream consumer against the published repair: corrected outputs through "
        "their pointers, originals kept, restatement ledger, each owner notified once.",
        tags={"recovery/phase": "restatement"},
    )
    return dg.Definitions(assets=[asset], jobs=[job])
