"""Convergence as an asset with checks: ``convergence/drift``, the drift record per partition over time.

Each materialization reconciles the partitions normal ingestion wrote most
recently and every repaired partition against the source as of the ingestion
watermark, and appends the result to the control plane. Two checks, ERROR when
they fail, say whether each scope converged; the alert sensor turns a failure into
a notification with a link to the run. ``verify_convergence`` is the on-demand job
(and ``recovery verify``); ``verify_convergence_hourly`` runs it on a schedule.
"""

from datetime import datetime

import dagster as dg
from pydantic import Field

from recovery.defs.containment.config import IncidentConfig, resolve_incident
from recovery.defs.resources import WarehouseResource
from recovery.lib.convergence import ConvergenceResult, verify_convergence
from recovery.lib.errors import SpecError

CONVERGENCE_KEY = dg.AssetKey(["convergence", "drift"])
VERIFY_JOB = "verify_convergence"
RECENT_CHECK = "recent_partitions_converge"
REPAIRED_CHECK = "repaired_history_converges"


class ConvergenceConfig(IncidentConfig):
    """Optional incident (recorded with the check); how many recent partitions; the watermark."""

    recent_partitions: int = Field(
        3, description="How many of the partitions normal ingestion wrote last to reconcile."
    )
    watermark: str | None = Field(
        None,
        description="Compare with the source as of this ISO timestamp (default: how far ingestion has applied it).",
    )


def _watermark(config: ConvergenceConfig) -> datetime | None:
    if not config.watermark:
        return None
    try:
        return datetime.fromisoformat(config.watermark)
    except ValueError:
        raise SpecError(
            "watermark",
            f"{config.watermark!r} is not an ISO timestamp",
            "give e.g. 2024-07-06T00:00:00, or leave it empty",
        ) from None


def _table(result: ConvergenceResult, scope: str) -> str:
    rows = [p for p in result.partitions if getattr(p, scope)]
    bad = [p for p in rows if not p.converged]
    lines = [
        "| partition | expected | actual | missing | extra | changed | duplicate | drifting since | sample keys |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    lines += [
        f"| {p.partition} | {p.expected_rows:,} | {p.actual_rows:,} | {p.missing:,} | {p.extra:,} | {p.changed:,} | "
        f"{p.duplicate:,} | {p.drifting_since or ''} | {', '.join(p.sample_keys)} |"
        for p in bad[:50]
    ]
    return "\n".join(lines) if bad else f"all {len(rows)} partitions equal the source"


def _check(result: ConvergenceResult, scope: str, name: str) -> dg.AssetCheckResult:
    partitions = result.recent_partitions if scope == "recent" else result.repaired_partitions
    bad = result.drifted(scope)
    return dg.AssetCheckResult(
        asset_key=CONVERGENCE_KEY,
        check_name=name,
        passed=not bad,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{len(bad)} of {len(partitions)} {scope} partitions drift from the source: "
            + ", ".join(p.partition for p in bad[:10])
        )
        if bad
        else f"{len(partitions)} {scope} partitions equal the source as of {result.as_of()}",
        metadata={
            "partitions_checked": len(partitions),
            "partitions_drifting": len(bad),
            "drift_keys": sum(p.drift_keys for p in bad),
            "check_id": result.check_id,
            "drift": dg.MetadataValue.md(_table(result, scope)),
        },
    )


@dg.asset(
    key=CONVERGENCE_KEY,
    group_name="convergence",
    kinds={"duckdb"},
    check_specs=[
        dg.AssetCheckSpec(
            RECENT_CHECK,
            asset=CONVERGENCE_KEY,
            description="The partitions normal ingestion wrote most recently equal the source.",
        ),
        dg.AssetCheckSpec(
            REPAIRED_CHECK,
            asset=CONVERGENCE_KEY,
            description="Every repaired partition still equals the source as late arrivals land.",
        ),
    ],
    description="Drift per partition over time: recent and repaired partitions vs the source as of the ingestion watermark.",
)
def convergence(context: dg.AssetExecutionContext, config: ConvergenceConfig, warehouse: WarehouseResource):
    incident_id = None
    spec = warehouse.spec()
    if config.incident_file or config.has_fields():
        incident, spec = resolve_incident(config, warehouse.spec_path, context.instance)
        incident_id = incident.incident_id
    result = verify_convergence(
        warehouse.engine(),
        spec,
        recent=config.recent_partitions,
        watermark=_watermark(config),
        incident_id=incident_id,
        run_id=context.run.run_id,
    )
    context.log.info(result.summary())
    return dg.MaterializeResult(
        metadata={
            "converged": result.converged,
            "check_id": result.check_id,
            "watermark": str(result.watermark),
            "pending_changes": result.pending_changes,
            "partitions_checked": len(result.partitions),
            "partitions_drifting": len(result.drifted()),
            "summary": result.summary(),
        },
        check_results=[_check(result, "recent", RECENT_CHECK), _check(result, "repaired", REPAIRED_CHECK)],
    )


verify_convergence_job = dg.define_asset_job(
    VERIFY_JOB,
    selection=dg.AssetSelection.assets(CONVERGENCE_KEY),
    description="Reconcile the most recent and the repaired partitions against the source; record drift per partition.",
    tags={"recovery/phase": "convergence"},
)


@dg.definitions
def convergence_assets() -> dg.Definitions:
    return dg.Definitions(assets=[convergence], jobs=[verify_convergence_job])
