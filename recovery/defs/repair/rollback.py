"""Rollback: the publish move, backwards, when the decision chose it."""

import dagster as dg

from recovery.defs.containment.config import IncidentConfig, incident_for_step
from recovery.defs.resources import WarehouseResource
from recovery.lib.decision import decide
from recovery.lib.engine import open_engine
from recovery.lib.incident.phases import ROLLBACK
from recovery.lib.repair.publish import rollback
from recovery.lib.write.writer import Writer


@dg.op(description="Move the public view back to the complete prior namespace, if the decision allows it.")
def roll_back(context: dg.OpExecutionContext, config: IncidentConfig, warehouse: WarehouseResource) -> dg.Output:
    incident, spec = incident_for_step(context, config, warehouse.spec_path)
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        decision = decide(s, spec, incident.failed_generations)
    result = rollback(Writer(engine, spec, actor="rollback"), incident.incident_id, decision, run_id=context.run.run_id)
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
