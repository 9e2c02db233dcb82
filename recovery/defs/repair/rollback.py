"""Rollback: the publish move, backwards, when the decision chose it."""

import dagster as dg

from recovery.defs.containment.config import IncidentConfig
from recovery.defs.incident_step import IncidentStep
from recovery.defs.resources import WarehouseResource
from recovery.lib.decision import decide
from recovery.lib.incident.phases import ROLLBACK
from recovery.lib.repair.publish import rollback


@dg.op(description="Move the public view back to the complete prior namespace, if the decision allows it.")
def roll_back(context: dg.OpExecutionContext, config: IncidentConfig, warehouse: WarehouseResource) -> dg.Output:
    step = IncidentStep.of(context, config, warehouse)
    with step.engine.session(read_only=True) as s:
        decision = decide(s, step.spec, step.incident.failed_generations)
    result = rollback(step.writer("rollback"), step.incident_id, decision, run_id=step.run_id)
    return dg.Output(
        result["namespace"],
        metadata={
            "namespace": result["namespace"],
            "already": result["already"],
            "reasons": "; ".join(decision.reasons),
        },
    )


@dg.job(
    executor_def=dg.in_process_executor,
    name=ROLLBACK.job,
    description="Roll the public view back to the prior generation (only when the decision chose rollback).",
)
def rollback_incident():
    roll_back()
