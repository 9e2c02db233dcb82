"""Gating a wave: an unexplained difference stops the expansion and keeps both generations.

After each wave, the suites and the key-by-key reconciliation run over the wave's own
partitions, against the fixed snapshot, before any delta is replayed. An earlier
wave's partitions are not reconciled again key by key (that would make the waves
quadratic in the generation's size): each partition's content fingerprint (row count
and the sum of its rows' hashes) is recorded when its gate passes and compared now;
a partition whose rows changed since is reconciled key by key with the wave, so the
difference is named. The publish candidate is still reconciled key by key in full.
"""

from __future__ import annotations

from recovery.lib import faults
from recovery.lib.control.plane import EventSource
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.repair.build import stop_in
from recovery.lib.repair.gates import evaluate_gates
from recovery.lib.repair.plan import RepairPlan, require_plan, wave_name
from recovery.lib.repair.replay import committed_seq
from recovery.lib.repair.tables import FINGERPRINTS, ensure_repair_tables
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer


def gate_wave(writer: Writer, incident_id: str, wave: int, *, run_id: str | None = None) -> list[GateResult]:
    def txn() -> tuple[RepairPlan, list[GateResult]]:
        with writer.engine.transaction() as s:
            ensure_repair_tables(
                s
            )  # a repair started by an earlier version has no fingerprints yet: all count as changed
            plan = require_plan(s, incident_id)
            own = plan.waves[wave]
            earlier = [p for p in plan.rebuild if p in plan.built and p not in own]
            changed = changed_since_gated(s, writer.spec, plan, earlier)
            results = evaluate_gates(
                s,
                writer,
                plan,
                stage=wave_name(wave),
                scope=own + changed,
                suite_scope=own,
                through_seq=plan.low_seq,
                run_id=run_id,
            )
            if changed:
                results = [_name_changed(r, changed) for r in results]
            failed = [r for r in results if not r.passed]
            if not failed:
                record_fingerprints(s, writer.spec, plan, own, stage=wave_name(wave))
            EventSource(dataset=writer.spec.dataset, incident_id=incident_id, actor="repair", run_id=run_id).record(
                s,
                "repair_wave",
                f"{wave_name(wave)} of {plan.generation}: {len(own)} partitions rebuilt and gated; "
                f"{len(earlier) - len(changed)} earlier partitions unchanged since their gate, {len(changed)} changed: "
                + ("passed" if not failed else "FAILED " + ", ".join(r.gate for r in failed)),
                [r.__dict__ for r in results],
            )
            if failed:  # the expansion stops with the failed results: no kill can leave them without the stop
                stop_in(s, writer, plan, f"{wave_name(wave)}: " + "; ".join(r.details for r in failed), run_id=run_id)
            faults.checkpoint("gate:recorded")  # everything written, not committed
            return plan, results

    _, results = retrying(txn)
    faults.checkpoint("gate:committed")
    return results


def _fingerprints_sql(s: Session, spec: DatasetSpec, plan: RepairPlan, partitions: list[str]) -> str:
    return (
        f"SELECT CAST({quote(spec.target.partition)} AS VARCHAR) AS partition, count(*) AS rows, "
        f"sum(hash(t)) AS fingerprint FROM {namespace_sql(plan.namespace)} t "
        f"WHERE {in_partitions(s, spec, partitions)} GROUP BY 1"
    )


def record_fingerprints(s: Session, spec: DatasetSpec, plan: RepairPlan, partitions: list[str], *, stage: str) -> None:
    """Remember what the gated partitions hold, to tell later whether anything changed them."""
    s.execute(
        f"DELETE FROM {FINGERPRINTS} WHERE incident_id = ? AND partition IN (SELECT unnest(CAST(? AS VARCHAR[])))",
        [plan.incident_id, partitions],
    )
    s.replace_rows(  # the control-plane rows read the (data-plane) namespace
        FINGERPRINTS,
        [n for n, _ in s.columns(FINGERPRINTS)],
        insert="SELECT ?, partition, coalesce(rows, 0), coalesce(fingerprint, 0), ?, ? "
        "FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS partition) p "  # an emptied partition is recorded too
        f"LEFT JOIN ({_fingerprints_sql(s, spec, plan, partitions)}) USING (partition)",
        params=[plan.incident_id, committed_seq(s), stage, partitions],
    )


def changed_since_gated(s: Session, spec: DatasetSpec, plan: RepairPlan, partitions: list[str]) -> list[str]:
    """Partitions whose rows differ from what they held when their gate passed (or never passed)."""
    if not partitions:
        return []
    rows = s.fetchall(
        f"SELECT partition FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS partition) p "
        f"LEFT JOIN ({_fingerprints_sql(s, spec, plan, partitions)}) now USING (partition) "
        f"LEFT JOIN (SELECT partition, rows, fingerprint FROM {FINGERPRINTS} WHERE incident_id = ?) gated "
        "USING (partition) "
        f"WHERE gated.rows IS NULL OR coalesce(now.rows, 0) <> gated.rows "
        f"OR coalesce(now.fingerprint, 0) <> gated.fingerprint ORDER BY partition",
        [partitions, plan.incident_id],
    )
    return [r[0] for r in rows]


def _name_changed(result: GateResult, changed: list[str]) -> GateResult:
    if result.gate != "repair_reconciliation":
        return result
    return GateResult(
        result.gate,
        result.passed,
        result.observed,
        f"{result.details}; {len(changed)} earlier partition(s) changed since their gate: {changed[:5]}",
    )
