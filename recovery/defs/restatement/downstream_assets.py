"""Restating the Dagster assets downstream of the target, inside the restatement's run.

Per asset, upstream first: the original rows it is compared with (kept by the impact, else
copied now), one Dagster run per affected partition of the asset alone (the team's code
computes the correction from the published repair; each run is tagged with the incident
and shows in the UI), then the corrected rows kept, the ledger and the check. The runs are
launched with no warehouse connection open, since the team's IO manager opens the file.
"""

from __future__ import annotations

import dagster as dg

from recovery.defs.asset_consumers import ResolvedAsset, affected_partitions, materialize
from recovery.lib.consumers.assets import damaged_target_partitions
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.incident.model import Incident
from recovery.lib.restatement.assets import original_for, record_restated
from recovery.lib.restatement.checks import RestatementCheck
from recovery.lib.restatement.record import ConsumerRestatement

ASSETS_KEY = dg.AssetKey(["restatement", "downstream_assets"])
RESTATES_TAG = "recovery/restates"


def restate_assets(
    context: dg.AssetExecutionContext,
    engine: Engine,
    spec: DatasetSpec,
    incident: Incident,
    assets: list[ResolvedAsset],
) -> tuple[list[ConsumerRestatement], list[RestatementCheck]]:
    """Restate every asset consumer of the incident: the restatements, and one check per asset (an
    asset none of whose partitions read a damaged one passes, with nothing restated)."""
    if not assets:
        return [], []
    with engine.session(read_only=True) as s:
        damaged = damaged_target_partitions(s, spec, incident.incident_id)
    results, checks = [], []
    for a in assets:
        partitions, scope = affected_partitions(a, spec, damaged)
        original = original_for(
            engine,
            spec,
            a.consumer,
            incident_id=incident.incident_id,
            partitions=partitions,
            scope=scope,
            field=a.field,
        )
        if original.scope.column is not None and not original.partitions:
            checks.append(
                RestatementCheck(
                    consumer=a.consumer.asset,
                    check="rematerialized",
                    passed=True,
                    observed=0,
                    details=f"{a.consumer.asset}: none of its partitions read a damaged partition of "
                    f"{spec.target.table}; nothing to restate",
                )
            )
            continue
        tags = {
            "recovery/phase": "restatement",
            "recovery/incident": incident.incident_id,
            RESTATES_TAG: a.consumer.asset,
            "recovery/launched_by": context.run.run_id,
        }
        runs = materialize(a, original.partitions, context.instance, tags)
        context.log.info(
            f"{a.consumer.asset}: {sum(r.success for r in runs)} of {len(runs)} runs re-materialized its partitions"
        )
        result = record_restated(
            engine,
            spec,
            a.consumer,
            incident_id=incident.incident_id,
            original=original,
            runs=runs,
            actor="restatement",
            run_id=context.run.run_id,
        )
        results.append(result)
        if result.check is not None:
            checks.append(result.check)
    return results, checks
