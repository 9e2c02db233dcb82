"""The repair's last step on a lakehouse target: the published generation committed onto the table."""

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.errors import RecoveryError
from recovery.lib.lakehouse.publish import TablePublish, check_publishable, publish_to_table
from recovery.lib.repair.plan import load_plan


def publish_onto_table(spec: DatasetSpec, incident_id: str) -> TablePublish:
    """One commit of the incident's published repair onto the table (idempotent: a rerun finds its commit)."""
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        plan = load_plan(s, incident_id)
    if plan is None or plan.status != "published":
        raise RecoveryError(f"the repair of {incident_id} is not published in the warehouse yet: run publish first")
    return publish_to_table(
        engine,
        spec,
        incident_id,
        namespace=plan.namespace,
        from_namespace=plan.from_namespace,
        generation=plan.generation,
        scope=sorted(set(plan.rebuild) | set(plan.qualified)),
    )


def refuse_foreign_changes(spec: DatasetSpec, incident_id: str) -> None:
    """Before the pointer moves: a change by a writer outside the package in the repair's partitions refuses."""
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        plan = load_plan(s, incident_id)
    if plan is not None and plan.status != "published":
        check_publishable(engine, spec, plan.from_namespace, sorted(set(plan.rebuild) | set(plan.qualified)))
