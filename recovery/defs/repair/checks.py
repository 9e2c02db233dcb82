"""The gates as blocking asset checks: Great Expectations suites plus the key-by-key reconciliation.

They need no configuration: a check finds the incident and the wave its run built in
the control plane (partitions record the run that built them; replays record theirs).
Each gate also lands in ``_recovery.gate_results``, which publish reads back, because
a blocking check only blocks within its own run.
"""

import dagster as dg

from recovery.defs.resources import WarehouseResource
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.gates import GateResult
from recovery.lib.repair.gates import BUILTIN, DESCRIPTIONS
from recovery.lib.repair.tables import PARTITIONS, REPLAYS

GENERATION_KEY = dg.AssetKey(["repair", "generation"])
CANDIDATE_KEY = dg.AssetKey(["repair", "candidate"])


def gate_names(spec: DatasetSpec) -> list[str]:
    return list(BUILTIN) + [s.name for s in spec.suites]


def check_specs(spec: DatasetSpec, asset: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    described = {
        **DESCRIPTIONS,
        **{s.name: f"Great Expectations suite {s.name!r} declared in the spec." for s in spec.suites},
    }
    return [dg.AssetCheckSpec(name=g, asset=asset, blocking=True, description=described[g]) for g in gate_names(spec)]


def check_results(results: list[GateResult], asset: dg.AssetKey, spec: DatasetSpec, context_note: str):
    by_gate = {r.gate: r for r in results}
    for g in gate_names(spec):
        r = by_gate.get(g)
        if r is None:
            yield dg.AssetCheckResult(
                asset_key=asset,
                check_name=g,
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={"details": "not evaluated"},
            )
            continue
        yield dg.AssetCheckResult(
            asset_key=asset,
            check_name=g,
            passed=r.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"unexpected": r.observed, "details": r.details[:2000], "scope": context_note},
        )


def wave_built_by(warehouse: WarehouseResource, run_id: str) -> tuple[str, int] | None:
    with warehouse.engine().session(read_only=True) as s:
        return s.fetchone(
            f"SELECT incident_id, max(wave) FROM {PARTITIONS} WHERE built_run_id = ? GROUP BY 1", [run_id]
        )


def candidate_of(warehouse: WarehouseResource, run_id: str) -> str | None:
    with warehouse.engine().session(read_only=True) as s:
        return s.scalar(f"SELECT max(incident_id) FROM {REPLAYS} WHERE run_id = ?", [run_id])
