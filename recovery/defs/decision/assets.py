"""The rollback-or-repair decision, with its reasons on the timeline."""

import dagster as dg

from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.lib import faults
from recovery.lib.decision import decide
from recovery.lib.incident.phases import ASSESS
from recovery.lib.retry import retrying


@incident_asset(
    key=["incident", "decision"],
    deps=[dg.AssetKey(["incident", "reconciliation"]), dg.AssetKey(["incident", "impact"])],
    description="Rollback only where a complete prior generation exists and no valid write would be lost; "
    "otherwise repair.",
)
def decision(context: dg.AssetExecutionContext, step: IncidentStep) -> dg.MaterializeResult:
    def txn():
        with step.engine.transaction() as s:
            d = decide(s, step.spec, step.incident.failed_generations)
            step.events("decision").record(s, "decision", f"{d.choice}: " + "; ".join(d.reasons))
            faults.checkpoint("decision:recorded")  # the decision's event, not committed
            return d

    d = retrying(txn)
    faults.checkpoint("decision:committed")
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
