"""The evidence bundle asset: the incident's evidence frozen before anyone cleans up.

It takes the incident as the containment job does (``IncidentConfig``: a file or
its fields, validated before anything is read) and the Dagster instance the
backfill ran in (``context.instance``), so the bundle holds the backfill's real
run records and event logs. Materializing it again for the same incident leaves
the first bundle untouched and reports it (see ``recovery.lib.evidence.bundle``).
"""

import dagster as dg

from recovery.dagster_history import run_history_for
from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.lib.evidence import build_evidence
from recovery.lib.incident.phases import EVIDENCE

EVIDENCE_KEY = dg.AssetKey(["incident", "evidence_bundle"])


def _files_table(manifest: dict) -> str:
    rows = [
        f"| {f['path']} | {f['rows'] if f['rows'] is not None else ''} | {f['bytes']:,} | {f['sha256'][:12]} |"
        for f in manifest["files"]
    ]
    return "\n".join(["| file | rows | bytes | sha256 |", "| --- | ---: | ---: | --- |", *rows])


@incident_asset(
    key=EVIDENCE_KEY,
    kinds={"duckdb", "parquet"},
    description="Immutable, owner-only evidence bundle of the incident: source, target generations, control plane, "
    "spec, runs and event logs, with a checksummed manifest; sensitive columns as keyed hashes.",
)
def evidence_bundle(context: dg.AssetExecutionContext, step: IncidentStep) -> dg.MaterializeResult:
    history = run_history_for(context.instance, step.engine, step.incident.failed_generations, with_logs=True)
    result = build_evidence(step.incident, step.spec, step.engine, history, actor="evidence_bundle", run_id=step.run_id)
    if not result.created:
        context.log.info(f"{result.bundle} already holds this incident's bundle; left untouched")
    notes = result.manifest["notes"] + result.manifest["orchestrator"]["notes"]
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": result.table_rows,
            "bundle": dg.MetadataValue.path(str(result.bundle)),
            "created": result.created,
            "files": len(result.manifest["files"]),
            "bytes": result.total_bytes,
            "seconds": round(result.seconds, 2),
            "manifest_sha256": result.manifest_sha256,
            "dagster_runs": result.manifest["orchestrator"]["runs"],
            "sensitive_columns": ", ".join(result.manifest["sensitive_columns"]["columns"]) or "none",
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in notes) or "none"),
            "manifest": dg.MetadataValue.md(_files_table(result.manifest)),
        }
    )


preserve_evidence = dg.define_asset_job(
    EVIDENCE.job,
    selection=dg.AssetSelection.assets(EVIDENCE_KEY),
    executor_def=dg.in_process_executor,
    description="Freeze an incident's evidence bundle (refuses to overwrite an existing one).",
)
