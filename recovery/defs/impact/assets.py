"""Consumer impact: each consumer's published output vs the same SQL over the expected rows.

Consumers come from the spec and, through lineage, from the Dagster asset graph. A Dagster
asset downstream of the target (in this code location, or named in the spec with its own)
cannot be computed here: its impact is the partitions that read damaged target partitions
and its rows in them, which are kept now, while the damage is published, as the original
the restatement compares its corrected rows with (``recovery/lib/consumers/assets.py``).
"""

from dataclasses import asdict

import dagster as dg

from recovery.defs.asset_consumers import affected_partitions, resolve
from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.defs.location import asset_graph
from recovery.lib import faults
from recovery.lib.consumers.assets import AssetImpact, damaged_target_partitions, trace_asset
from recovery.lib.consumers.impact import assess_impact
from recovery.lib.retry import retrying


def downstream_of_target(context: dg.AssetExecutionContext, target_table: str, spec_path: str) -> list[str]:
    """Asset keys downstream of the target's asset (key = the table's schema/name) in this code location."""
    graph = asset_graph(context, spec_path)
    target = dg.AssetKey(target_table.split("."))
    if graph is None or not graph.has(target):
        return []
    return sorted(k.to_user_string() for k in graph.get(target).child_keys)


@incident_asset(
    key=["incident", "impact"],
    deps=[dg.AssetKey(["incident", "reconciliation"])],
    description="Downstream impact: rows changed, magnitude and materiality per consumer (SQL consumers), "
    "partitions and rows reached per downstream Dagster asset, and the decisions affected.",
)
def impact(context: dg.AssetExecutionContext, step: IncidentStep) -> dg.MaterializeResult:
    spec, spec_path = step.spec, step.warehouse.spec_path
    lineage = downstream_of_target(context, str(spec.target.table_name), spec_path)
    assets, undeclared = resolve(context, spec, spec_path)

    def txn():
        with step.engine.transaction() as s:
            impacts = assess_impact(s, spec, incident_id=step.incident_id, watermark=None)
            damaged = damaged_target_partitions(s, spec, step.incident_id) if assets else []
            traced: list[AssetImpact] = []
            for a in assets:
                partitions, scope = affected_partitions(a, spec, damaged)
                traced.append(
                    trace_asset(
                        s,
                        spec,
                        a.consumer,
                        incident_id=step.incident_id,
                        partitions=partitions,
                        scope=scope,
                        run_id=step.run_id,
                    )
                )
            affected = [i for i in impacts if i.affected]
            reached = [t for t in traced if t.affected]
            step.events("impact").record(
                s,
                "impact",
                f"{len(affected)} of {len(impacts)} consumers affected: "
                + "; ".join(f"{i.consumer} {i.material_rows:,} material" for i in affected)
                + (
                    f"; {len(reached)} of {len(traced)} downstream assets reached: "
                    + "; ".join(f"{t.asset} {len(t.partitions)} partitions, {t.rows_reached:,} rows" for t in reached)
                    if traced
                    else ""
                )
                + "".join(f"; asset {u.asset} not traced: it {u.problem} (fix: {u.fix})" for u in undeclared),
            )
            faults.checkpoint("impact:recorded")  # the impact's rows, the assets' originals and its event
            return impacts, traced

    impacts, traced = retrying(txn)
    faults.checkpoint("impact:committed")
    rows = [
        "| consumer | kind | owner | changed | missing | extra | material | decision |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    rows += [
        f"| {i.consumer} | {i.kind} | {i.owner} | {i.rows_changed:,} | {i.rows_missing:,} | {i.rows_extra:,} | "
        f"{i.material_rows:,} | {i.decision} |"
        for i in impacts
    ]
    asset_rows = [
        "| asset | table | owner | partitions reached | rows reached | original kept in |",
        "| --- | --- | --- | --- | ---: | --- |",
    ] + [
        f"| {t.asset} | {t.table} | {t.owner} | {', '.join(t.partitions[:8])}{' ...' if len(t.partitions) > 8 else ''} "
        f"| {t.rows_reached:,} | {t.original_namespace or '-'} |"
        for t in traced
    ]
    return dg.MaterializeResult(
        metadata={
            "consumers_affected": sum(i.affected for i in impacts),
            "material_rows": sum(i.material_rows for i in impacts),
            "impact": dg.MetadataValue.md("\n".join(rows)),
            "downstream_assets": dg.MetadataValue.md("\n".join(asset_rows)),
            "downstream_assets_reached": sum(t.affected for t in traced),
            "downstream_assets_not_traced": dg.MetadataValue.json([asdict(u) for u in undeclared]),
            "lineage_downstream_of_target": dg.MetadataValue.json(lineage),
        }
    )
