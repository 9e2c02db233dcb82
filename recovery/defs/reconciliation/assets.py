"""The reconciliation asset: every damaged key classified, every damaged partition found.

It works from the spec and the incident alone (no column names of any dataset in
code) and runs as set-based SQL inside the warehouse.
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from recovery.defs.containment.config import IncidentConfig
from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.defs.target_partitions import TARGET_PARTITIONS, register_found
from recovery.lib.incident.phases import RECONCILE
from recovery.lib.reconcile.run import run_reconciliation

# a partition's own figures on its materialization, beside the run's (which every partition carries)
PARTITION_DAMAGED_KEYS, PARTITION_LABELS, PARTITION_FINDINGS = (
    "partition/damaged_keys",
    "partition/labels",
    "partition/findings",
)


class ReconcileConfig(IncidentConfig):
    out_dir: str | None = Field(
        None,
        description="Where to write reconciliation.parquet and summary.json (default: reports/<incident> beside "
        "the warehouse).",
    )
    full: bool = Field(
        False,
        description="Reconcile the whole target, with the damage outside the failed generations' footprint "
        "counted as drift. Default: their footprint (the keys they wrote and the keys held or expected in their "
        "partition range, the incident's widened to what they wrote), or the whole target when there is none.",
    )
    footprint: bool = Field(
        False,
        description="Reconcile the footprint only, and refuse when there is none (the failed generations wrote "
        "nothing and the incident gives no partition range) rather than reconcile the whole target.",
    )


@incident_asset(
    key=["incident", "reconciliation"],
    config=ReconcileConfig,
    partitions_def=TARGET_PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    description="Source-to-output reconciliation: one damage label per key, findings per partition.",
)
def reconciliation(context: dg.AssetExecutionContext, step: IncidentStep[ReconcileConfig]) -> dg.MaterializeResult:
    incident, config = step.incident, step.config
    out = Path(config.out_dir) if config.out_dir else incident.reports_dir(step.spec)
    rng = (incident.partitions.start, incident.partitions.end) if incident.partitions else None
    summary, files = run_reconciliation(
        step.spec,
        incident.failed_generations,
        incident_id=step.incident_id,
        out_dir=out,
        actor="reconciliation",
        run_id=step.run_id,
        full=True if config.full else (False if config.footprint else None),
        partitions=rng,
    )
    table = "\n".join(["| label | keys |", "| --- | ---: |"] + [f"| {k} | {v:,} |" for k, v in summary.labels.items()])
    findings = ", ".join(f"{k}: {v}" for k, v in summary.partition_findings.items())
    metadata: dict[str, Any] = {  # Dagster's raw metadata values: numbers, text, MetadataValue
        "dagster/row_count": summary.damaged_keys,
        "damaged_keys": summary.damaged_keys,
        "unexplained": summary.unexplained,
        "damaged_partitions": len(summary.damaged_partitions),
        "labels": dg.MetadataValue.md(table),
        "partition_findings": findings,
        "watermark": str(summary.watermark),
        "scope": summary.scope,
        "footprint_range": " .. ".join(summary.footprint_range or []) or "none",
        "drift_outside_footprint": sum((summary.drift_outside_footprint or {}).values()),
        "summary": dg.MetadataValue.path(str(files["summary"])),
    }
    # partitions Dagster did not know when the run started (a fresh instance learns only the target's
    # first): registered from the classification's own findings and materialized here, with the run's
    # figures beside their own like every other partition's
    found = register_found(context.instance, [p.partition for p in summary.partitions])
    per_partition = _partition_metadata(files["summary"], list(context.partition_keys) + found)
    for key in found:
        context.log_event(
            dg.AssetMaterialization(
                asset_key=context.asset_key, partition=key, metadata={**metadata, **per_partition[key]}
            )
        )
    for key in context.partition_keys:
        context.add_asset_metadata(per_partition[key], partition_key=key)
    return dg.MaterializeResult(metadata=metadata)


reconcile_incident = dg.define_asset_job(
    RECONCILE.job,
    selection=dg.AssetSelection.keys(["incident", "reconciliation"]),
    executor_def=dg.in_process_executor,
    description="Classify every damaged key of an incident and write reconciliation.parquet + summary.json.",
)


def _partition_metadata(summary_path: Path, keys: list[str]) -> dict[str, dict]:
    """Per partition: its own damaged keys, labels and findings, shown on the partition in the UI.

    They ride on the partition's materialization rather than on an observation of their own:
    Dagster stores every event in its own transaction (one SQLite commit each), and a
    whole-target run already writes a planned and a materialized event per partition."""
    doc = json.loads(summary_path.read_text())
    by_partition = doc["labels_by_partition"]
    findings = {p["partition"]: p["findings"] for p in doc["partitions"]}
    out = {}
    for key in keys:
        labels = by_partition.get(key, {})
        out[key] = {
            PARTITION_DAMAGED_KEYS: sum(labels.values()),
            PARTITION_LABELS: dg.MetadataValue.json(labels),
            PARTITION_FINDINGS: ", ".join(findings.get(key, [])) or "none",
        }
    return out
