"""From the built generation to the public name: candidate, publish, rollback.

- ``replay_to_now`` / ``gate_candidate``: the delta replayed up to the high watermark
  (every commit before it) and, in the same transaction, every gate evaluated over
  the whole generation, so the checks see exactly what will be published.
- ``publish``: one transaction that confirms every gate of the candidate passed,
  replays the writes that landed after the high watermark, and moves the public
  view and its pointer row to the repair generation, with the pointer history. It
  is idempotent: a publish whose acknowledgement was lost finds that it already
  happened.
- ``rollback``: the same pointer move, backwards, when the decision chose it.
"""

from __future__ import annotations

import json

from recovery.lib import faults
from recovery.lib.control_plane import SCHEMA, next_seq, record_event, utcnow
from recovery.lib.decision import Decision
from recovery.lib.errors import RecoveryError
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.namespaces import current_namespace, move_pointer, namespace_sql
from recovery.lib.phases import PUBLISH
from recovery.lib.published_export import refresh_published_export
from recovery.lib.repair.diffs import record_diffs
from recovery.lib.repair.gates import BUILTIN, evaluate_gates, latest_gates
from recovery.lib.repair.plan import RepairPlan, load_plan, require_plan
from recovery.lib.repair.replay import ReplayResult, committed_seq, replay_in
from recovery.lib.repair.tables import PARTITIONS, PLANS
from recovery.lib.spec import DatasetSpec
from recovery.lib.writer import Writer, retrying

CANDIDATE = "candidate"


def _require_building(plan: RepairPlan) -> None:
    if plan.status == "stopped":
        raise RecoveryError(
            f"the repair of {plan.incident_id} was stopped: {plan.stopped_reason}. Both generations are "
            f"kept; investigate, then resume it (recovery repair --resume) or abandon it"
        )
    missing = [p for p in plan.rebuild if p not in plan.built]
    if missing:
        raise RecoveryError(
            f"{len(missing)} partitions of the repair of {plan.incident_id} are not rebuilt yet "
            f"(first: {missing[0]}); run the remaining waves before publishing"
        )


def replay_to_now(writer: Writer, plan: RepairPlan, *, stage: str, run_id: str | None = None) -> ReplayResult:
    """Replay every valid write committed since the low watermark; records the high watermark."""
    if plan.status == "published":
        raise RecoveryError(f"the repair of {plan.incident_id} is already published")
    _require_building(plan)

    def txn() -> ReplayResult:
        with writer.engine.transaction() as s:
            return _replay_now(s, writer, plan.incident_id, stage, run_id)[0]

    return retrying(txn)


def _replay_now(s, writer: Writer, incident_id: str, stage: str, run_id: str | None) -> tuple[ReplayResult, RepairPlan]:
    fresh = require_plan(s, incident_id)
    if current_namespace(s, writer.spec) != fresh.from_namespace:
        raise RecoveryError(f"{writer.spec.target.table} no longer points at {fresh.from_namespace}; the plan is stale")
    through = committed_seq(s)
    replayed = replay_in(s, writer, fresh, after_seq=fresh.low_seq, through_seq=through, stage=stage, run_id=run_id)
    s.execute(f"UPDATE {PLANS} SET high_seq = ? WHERE incident_id = ?", [through, incident_id])
    return replayed, fresh.model_copy(update={"high_seq": through})


def gate_candidate(
    writer: Writer, plan: RepairPlan, *, run_id: str | None = None, with_diffs: bool = True
) -> tuple[ReplayResult, list[GateResult], dict]:
    """In one transaction: catch the replay up to now (the high watermark), gate the whole
    generation against the reference, and record the before/after diffs. The checks thus
    see exactly the rows that publish will expose, less the writes publish replays itself."""
    _require_building(plan)

    def txn():
        with writer.engine.transaction() as s:
            replayed, fresh = _replay_now(s, writer, plan.incident_id, "high watermark", run_id)
            scope = fresh.rebuild + _carried(s, writer.spec, fresh)
            if fresh.high_seq is None:  # _replay_now sets it; a plan read back without it is not a candidate
                raise RecoveryError(f"repair {fresh.generation} has no high watermark after the replay; rerun repair")
            results = evaluate_gates(
                s, writer, fresh, stage=CANDIDATE, scope=scope, through_seq=fresh.high_seq, run_id=run_id
            )
            diffs = record_diffs(s, writer.spec, fresh, writer) if with_diffs else {}
            failed = [r for r in results if not r.passed]
            record_event(
                s,
                kind="repair_gates",
                dataset=writer.spec.dataset,
                incident_id=plan.incident_id,
                actor="repair",
                run_id=run_id,
                summary=f"candidate {fresh.namespace} at high watermark seq {fresh.high_seq} ({replayed.upserted:,} upserts, "
                f"{replayed.deleted:,} deletes replayed now): "
                + ("every gate passed" if not failed else "FAILED " + ", ".join(r.gate for r in failed)),
                details=json.dumps([r.__dict__ for r in results]),
            )
            return replayed, results, diffs

    return retrying(txn)


def _carried(s, spec: DatasetSpec, plan: RepairPlan) -> list[str]:
    part = quote(spec.target.partition)
    skip = set(plan.rebuild) | set(plan.qualified)
    rows = s.fetchall(
        f"SELECT DISTINCT CAST({part} AS VARCHAR) FROM {namespace_sql(plan.namespace)} WHERE {part} IS NOT NULL"
    )
    return sorted(r[0] for r in rows if r[0] not in skip)


def publish(writer: Writer, incident_id: str, *, actor: str = "publish", run_id: str | None = None) -> dict:
    """Publish the repair generation of ``incident_id`` in one transaction. Idempotent."""
    spec = writer.spec

    def txn() -> dict:
        with writer.engine.transaction() as s:
            plan = load_plan(s, incident_id)
            if plan is None:
                raise RecoveryError(f"incident {incident_id} has no repair plan; run the repair first")
            if plan.status == "published":
                return {"already": True, "namespace": plan.namespace, "seq": plan.published_seq, "replayed": None}
            _require_building(plan)
            if plan.high_seq is None:
                raise RecoveryError(
                    f"the repair candidate has not been gated yet; run the candidate checks ({PUBLISH.job}) first"
                )
            gates = latest_gates(s, incident_id, CANDIDATE)
            missing = [g for g in BUILTIN if g not in gates] + [x.name for x in spec.suites if x.name not in gates]
            failed = [g for g, r in gates.items() if not r["passed"]]
            if missing or failed:
                raise RecoveryError(
                    f"publish refused: gates {'failed: ' + ', '.join(failed) if failed else ''}"
                    f"{' not evaluated: ' + ', '.join(missing) if missing else ''}; the public view still "
                    f"points at {plan.from_namespace}"
                )
            seq = next_seq(s)  # from here until commit, no other writer can commit
            faults.checkpoint("publish:locked")
            if current_namespace(s, spec) != plan.from_namespace:
                raise RecoveryError(f"{spec.target.table} no longer points at {plan.from_namespace}; the plan is stale")
            replayed = replay_in(
                s, writer, plan, after_seq=plan.high_seq, through_seq=seq - 1, stage="publish", run_id=run_id
            )
            faults.checkpoint("publish:replayed")
            move_pointer(s, spec, plan.namespace, actor=actor, reason=f"publish repair of {incident_id}")
            faults.checkpoint("publish:view_moved")
            s.execute(
                f"UPDATE {PLANS} SET status = 'published', published_seq = ? WHERE incident_id = ?", [seq, incident_id]
            )
            s.execute(
                f"UPDATE {SCHEMA}.generations SET status = 'published', ended_at = ? WHERE generation = ?",
                [utcnow(), plan.generation],
            )
            s.execute(
                f"UPDATE {PARTITIONS} SET status = 'published' WHERE incident_id = ? AND status = 'built'",
                [incident_id],
            )
            record_event(
                s,
                kind="publish",
                dataset=spec.dataset,
                incident_id=incident_id,
                actor=actor,
                run_id=run_id,
                summary=f"{spec.target.table} now points at {plan.namespace} (was {plan.from_namespace}, kept); "
                f"{replayed.upserted:,} upserts and {replayed.deleted:,} deletes that landed after the high watermark replayed "
                f"in the same transaction",
                details=json.dumps({"seq": seq, "from": plan.from_namespace, "to": plan.namespace}),
            )
            faults.checkpoint("publish:recorded")
            return {
                "already": False,
                "namespace": plan.namespace,
                "seq": seq,
                "replayed": replayed.__dict__,
                "from_namespace": plan.from_namespace,
            }

    result = retrying(txn)
    faults.checkpoint("publish:committed")  # committed, not yet acknowledged
    refresh_published_export(writer.engine, spec)  # outside readers' copy (BI tools): after the commit, atomically
    return result


def rollback(
    writer: Writer, incident_id: str, decision: Decision, *, actor: str = "publish", run_id: str | None = None
) -> dict:
    """Move the public view back to the decision's complete prior namespace."""
    spec = writer.spec
    rollback_to = decision.rollback_to
    if not decision.is_rollback or not rollback_to:
        raise RecoveryError(
            f"the decision for {incident_id} is {decision.choice}, not rollback: " + "; ".join(decision.reasons)
        )

    def txn() -> dict:
        with writer.engine.transaction() as s:
            current = current_namespace(s, spec)
            if current == decision.rollback_to:
                return {"already": True, "namespace": current}
            if current != decision.current_namespace:
                raise RecoveryError(f"{spec.target.table} moved since the decision was taken; decide again")
            seq = move_pointer(s, spec, rollback_to, actor=actor, reason=f"rollback for {incident_id}")
            record_event(
                s,
                kind="rollback",
                dataset=spec.dataset,
                incident_id=incident_id,
                actor=actor,
                run_id=run_id,
                summary=f"{spec.target.table} rolled back to {decision.rollback_to} (from {current}, kept)",
            )
            return {"already": False, "namespace": decision.rollback_to, "seq": seq, "from_namespace": current}

    result = retrying(txn)
    refresh_published_export(writer.engine, spec)
    return result
