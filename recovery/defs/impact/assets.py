"""Consumer impact: each consumer's published output vs the same SQL over the expected rows.

Consumers come from the spec and, through lineage, from the Dagster asset graph:
an asset downstream of the target that the spec does not describe is still
reported as reached (its magnitude needs its SQL in the spec).
"""

import dagster as dg

from recovery.defs.containment.config import IncidentConfig, resolve_incident
from recovery.defs.location import asset_graph
from recovery.defs.resources import WarehouseResource
from recovery.lib.control_plane import record_event
from recovery.lib.engine import open_engine
from recovery.lib.impact import assess_impact
from recovery.lib.writer import retrying


def downstream_of_target(context: dg.AssetExecutionContext, target_table: str, spec_path: str) -> list[str]:
    """Asset keys downstream of the target's asset (key = the table's schema/name) in this code location."""
    graph = asset_graph(context, spec_path)
    target = dg.AssetKey(target_table.split("."))
    if graph is None or not graph.has(target):
        return []
    return sorted(k.to_user_string() for k in graph.get(target).child_keys)


@dg.asset(
    key=["incident", "impact"],
    deps=[dg.AssetKey(["incident", "reconciliation"])],
    kinds={"duckdb"},
    group_name="recovery",
    description="Downstream impact: rows changed, magnitude and materiality per consumer, and the decisions affected.",
)
def impact(
    context: dg.AssetExecutionContext, config: IncidentConfig, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    incident, spec = resolve_incident(config, warehouse.spec_path, context.instance)
    engine = open_engine(spec.warehouse)
    lineage = downstream_of_target(context, str(spec.target.table_name), warehouse.spec_path)

    def txn():
        with engine.transaction() as s:
            impacts = assess_impact(s, spec, incident_id=incident.incident_id, watermark=None)
            affected = [i for i in impacts if i.affected]
            record_event(
                s,
                kind="impact",
                dataset=spec.dataset,
                incident_id=incident.incident_id,
                run_id=context.run.run_id,
                actor="impact",
                summary=f"{len(affected)} of {len(impacts)} consumers affected: "
                + "; ".join(f"{i.consumer} {i.material_rows:,} material" for i in affected),
            )
            return impacts

    impacts = retrying(txn)
    rows = [
        "| consumer | kind | owner | changed | missing | extra | material | decision |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    rows += [
        f"| {i.consumer} | {i.kind} | {i.owner} | {i.rows_changed:,} | {i.rows_missing:,} | {i.rows_extra:,} | {i.material_rows:,} | {i.decision} |"
        for i in impacts
    ]
    return dg.MaterializeResult(
        metadata={
            "consumers_affected": sum(i.affected for i in impacts),
            "material_rows": sum(i.material_rows for i in impacts),
            "impact": dg.MetadataValue.md("\n".join(rows)),
            "lineage_downstream_of_target": dg.MetadataValue.json(lineage),
        }
    )
