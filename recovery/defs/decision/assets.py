"""The rollback-or-repair decision, with its reasons on the timeline."""

import dagster as dg

from recovery.defs.containment.config import IncidentConfig, incident_for_step
from recovery.defs.resources import WarehouseResource
from recovery.lib.control.plane import EventSource
from recovery.lib.decision import decide
from recovery.lib.engine import open_engine
from recovery.lib.incident.phases import ASSESS
from recovery.lib.retry import retrying


@dg.asset(
    key=["incident", "decision"],
    deps=[dg.AssetKey(["incident", "reconciliation"]), dg.AssetKey(["incident", "impact"])],
    group_name="recovery",
    description="Rollback only where a complete prior generation exists and no valid write would be lost; "
    "otherwise repair.",
)
def decision(
    context: dg.AssetExecutionContext, config: IncidentConfig, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    incident, spec = incident_for_step(context, config, warehouse.spec_path)
    engine = open_engine(spec.warehouse)
    events = EventSource(
        dataset=spec.dataset, incident_id=incident.incident_id, actor="decision", run_id=context.run.run_id
    )

    def txn():
        with engine.transaction() as s:
            d = decide(s, spec, incident.failed_generations)
            events.record(s, "decision", f"{d.choice}: " + "; ".join(d.reasons))
            return d

    d = retrying(txn)
    return dg.MaterializeResult(
        metadata={
            "choice": d.choice,
            "rollback_to": d.rollback_to or "",
            "reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in d.reasons)),
        }
    )


assess_incident = dg.define_asset_job(
    ASSESS.job,
    selection=dg.AssetSelection.keys(["incident", "reconciliation"], ["incident", "impact"], ["incident", "decision"]),
    executor_def=dg.in_process_executor,
    description="Reconcile, trace the impact downstream and decide rollback vs repair for an incident.",
)
