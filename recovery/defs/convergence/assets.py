"""Convergence as an asset with checks: ``convergence/drift``, the record per partition over time.

Each materialization reconciles the partitions normal ingestion wrote most recently,
every repaired partition and every partition holding a late change against the
source, and appends per partition the three figures (drift, pending changes after the
watermark, the watermark with where it comes from) to the control plane. Three ERROR
checks: the recent and the repaired partitions do not drift, and no pending change
has waited past ``convergence.max_lag`` (ingestion is not behind); a scope with no
partition says "not verified" (WARN) rather than passing. Every check's description
carries the three figures, so the alert the sensor sends on a failure does too.
``verify_convergence`` is the on-demand job (and ``recovery verify``);
``verify_convergence_hourly`` runs it on a schedule.
"""

from datetime import datetime

import dagster as dg
from pydantic import Field

from recovery.defs.containment.config import IncidentConfig, incident_for_step, names_incident
from recovery.defs.resources import WarehouseResource
from recovery.lib.convergence import ConvergenceResult, verify_convergence
from recovery.lib.dataset_spec.durations import format_duration
from recovery.lib.errors import SpecError
from recovery.lib.incident.phases import VERIFY

CONVERGENCE_KEY = dg.AssetKey(["convergence", "drift"])
VERIFY_JOB = VERIFY.job
RECENT_CHECK = "recent_partitions_converge"
REPAIRED_CHECK = "repaired_history_converges"
LAG_CHECK = "ingestion_keeps_up"


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


def _age(result: ConvergenceResult, at: datetime | None) -> str:
    return format_duration(result.checked_at - at) if at else ""


def _table(result: ConvergenceResult, scope: str | None) -> str:
    """The partitions that drift, are behind or hold pending changes (worst first), with the three figures."""
    rows = result.scoped(scope)
    shown = sorted(
        (p for p in rows if p.drifts or p.pending_changes),
        key=lambda p: (not p.drifts, not p.behind, p.partition),
    )
    if not shown:
        return f"all {len(rows)} partitions equal the source; nothing pending"
    lines = [
        "| partition | drift keys | missing | extra | changed | duplicate | pending changes | oldest pending | "
        "watermark | watermark from | drifting since | sample keys |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {p.partition} | {p.drift_keys:,} | {p.missing:,} | {p.extra:,} | {p.changed:,} | {p.duplicate:,} | "
        f"{p.pending_changes:,}{' (overdue)' if p.behind else ''} | {_age(result, p.pending_oldest)} | "
        f"{p.watermark or ''} | {p.watermark_basis} | {p.drifting_since or ''} | {', '.join(p.sample_keys)} |"
        for p in shown[:50]
    ]
    return "\n".join(lines)


NOT_VERIFIED = {
    "recent": "no ingestion has written a partition through the writer or the IO manager yet",
    "repaired": "no repair generation wrote a partition (nothing was repaired, or the repair was rolled back)",
}


def _metadata(result: ConvergenceResult, scope: str | None) -> dict:
    rows = result.scoped(scope)
    pending = [p for p in rows if p.pending_changes]
    oldest = min((p.pending_oldest for p in pending if p.pending_oldest), default=None)
    return {
        "partitions_checked": len(rows),
        "partitions_drifting": len([p for p in rows if p.drifts]),
        "drift_keys": sum(p.drift_keys for p in rows if p.drifts),
        "pending_changes": sum(p.pending_changes for p in pending) if scope else result.pending_changes,
        "pending_overdue": sum(p.pending_overdue for p in pending) if scope else result.pending_overdue,
        "oldest_pending_age": _age(result, oldest),
        "max_lag": format_duration(result.max_lag),
        "watermark": str(result.watermark),
        "watermark_basis": result.watermark_basis,
        "check_id": result.check_id,
        "checked_at": result.checked_at.isoformat(),
        "drift": dg.MetadataValue.md(_table(result, scope)),
    }


def _check(result: ConvergenceResult, scope: str, name: str) -> dg.AssetCheckResult:
    """Drift in one scope fails (ERROR); pending changes are reported; an empty scope is not verified (WARN)."""
    rows = result.scoped(scope)
    bad = result.drifted(scope)
    figures = result.figures(scope)
    if not rows:
        passed, severity = False, dg.AssetCheckSeverity.WARN
        text = f"not verified: {NOT_VERIFIED[scope]}; {figures}"
    elif bad:
        passed, severity = False, dg.AssetCheckSeverity.ERROR
        text = (
            f"{len(bad)} of {len(rows)} {scope} partitions drift from the source where ingestion has applied it: "
            + ", ".join(f"{p.partition} ({p.drift_keys} keys)" for p in bad[:10])
            + f"; {figures}"
        )
    else:
        passed, severity = True, dg.AssetCheckSeverity.ERROR
        behind = result.behind(scope)
        text = f"{len(rows)} {scope} partitions equal the source where ingestion has applied it; {figures}" + (
            f"; {len(behind)} of them {'waits' if len(behind) == 1 else 'wait'} on changes past convergence.max_lag "
            f"(see {LAG_CHECK})"
            if behind
            else ""
        )
    return dg.AssetCheckResult(
        asset_key=CONVERGENCE_KEY,
        check_name=name,
        passed=passed,
        severity=severity,
        description=text,
        metadata=_metadata(result, scope),
    )


def _lag_check(result: ConvergenceResult) -> dg.AssetCheckResult:
    """Pending changes older than ``convergence.max_lag`` fail (ERROR): ingestion is behind."""
    if result.watermark is None:
        passed, severity = False, dg.AssetCheckSeverity.WARN
        text = f"not verified: the source is empty; {result.figures()}"
    elif result.pending_overdue:
        passed, severity = False, dg.AssetCheckSeverity.ERROR
        text = f"{result.behind_sentence()} ({result.figures()})"
    else:
        passed, severity = True, dg.AssetCheckSeverity.ERROR
        text = (
            f"ingestion keeps up: no change that arrived after the watermark has waited longer than "
            f"convergence.max_lag ({format_duration(result.max_lag)}); {result.figures()}"
        )
    return dg.AssetCheckResult(
        asset_key=CONVERGENCE_KEY,
        check_name=LAG_CHECK,
        passed=passed,
        severity=severity,
        description=text,
        metadata=_metadata(result, None),
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
        dg.AssetCheckSpec(
            LAG_CHECK,
            asset=CONVERGENCE_KEY,
            description="No source change that arrived after the watermark waits longer than convergence.max_lag.",
        ),
    ],
    description="Per partition over time: drift from the source, changes pending after the ingestion watermark, "
    "and the watermark with where it comes from.",
)
def convergence(context: dg.AssetExecutionContext, config: ConvergenceConfig, warehouse: WarehouseResource):
    incident_id = None
    spec = warehouse.spec()
    if names_incident(context, config):
        incident, spec = incident_for_step(context, config, warehouse.spec_path)
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
            **_metadata(result, None),
            "converged": result.converged,
            "verified": result.verified,
            "partitions_behind": len(result.behind()),
            "summary": result.summary(),
        },
        check_results=[
            _check(result, "recent", RECENT_CHECK),
            _check(result, "repaired", REPAIRED_CHECK),
            _lag_check(result),
        ],
    )


verify_convergence_job = dg.define_asset_job(
    VERIFY_JOB,
    selection=dg.AssetSelection.assets(CONVERGENCE_KEY),
    executor_def=dg.in_process_executor,
    description="Reconcile the most recent and the repaired partitions against the source; record drift per partition.",
    tags={"recovery/phase": "convergence"},
)


@dg.definitions
def convergence_assets() -> dg.Definitions:
    return dg.Definitions(assets=[convergence], jobs=[verify_convergence_job])
