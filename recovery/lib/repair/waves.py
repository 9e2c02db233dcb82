"""Gating a wave: an unexplained difference stops the expansion and keeps both generations.

After each wave, the key-by-key reconciliation runs over all partitions built so
far (a difference that appeared in an earlier wave's partitions is caught too) and
the suites over the wave's own partitions, against the fixed snapshot, before any
delta is replayed.
"""

from __future__ import annotations

import json

from recovery.lib.control_plane import record_event
from recovery.lib.repair.build import stop_expansion
from recovery.lib.repair.gates import GateResult, evaluate_gates
from recovery.lib.repair.plan import RepairPlan, load_plan, wave_name
from recovery.lib.writer import Writer, retrying


def gate_wave(writer: Writer, incident_id: str, wave: int, *, run_id: str | None = None) -> list[GateResult]:
    def txn() -> tuple[RepairPlan, list[GateResult]]:
        with writer.engine.transaction() as s:
            plan = load_plan(s, incident_id)
            scope = [p for p in plan.rebuild if p in plan.built]
            results = evaluate_gates(s, writer, plan, stage=wave_name(wave), scope=scope, suite_scope=plan.waves[wave],
                                     through_seq=plan.low_seq, run_id=run_id)
            failed = [r for r in results if not r.passed]
            record_event(
                s, kind="repair_wave", dataset=writer.spec.dataset, incident_id=incident_id, actor="repair", run_id=run_id,
                summary=f"{wave_name(wave)} of {plan.generation}: {len(plan.waves[wave])} partitions rebuilt; gates over "
                f"{len(scope)} built partitions " + ("passed" if not failed else "FAILED " + ", ".join(r.gate for r in failed)),
                details=json.dumps([r.__dict__ for r in results]),
            )
            return plan, results

    plan, results = retrying(txn)
    failed = [r for r in results if not r.passed]
    if failed:
        stop_expansion(writer, plan, f"{wave_name(wave)}: " + "; ".join(r.details for r in failed), run_id=run_id)
    return results
