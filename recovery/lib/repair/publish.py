"""From the built generation to the public name: candidate, publish, rollback.

- ``replay_to_now`` / ``gate_candidate``: the delta replayed up to the high watermark
  (every commit before it) and, in the same transaction, every gate evaluated over
  the whole generation, so the checks see exactly what will be published.
- ``publish``: one transaction that confirms every gate of the candidate passed,
  replays the writes that landed after the high watermark, compares every key a
  concurrent write touched with the snapshot plus those writes (``preservation_gate``:
  a lost or doubled row refuses the move), and moves the public
  view and its pointer row to the repair generation, with the pointer history. It
  is idempotent: a publish whose acknowledgement was lost finds that it already
  happened.
- ``finish_publish``: what follows the commit, each step once: the read copy outside
  readers open (``published/<table>/current.duckdb``), its timeline entry, and the
  notice to whoever asked for the recovery. A publish killed after its commit leaves
  some undone; ``publish_steps_left`` names them, and a rerun finishes them: the
  repair is "already published" only when none is left.
- ``rollback``: the same pointer move, backwards, when the decision chose it.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, next_seq, utcnow
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.decision import Decision
from recovery.lib.errors import GateRefusedError, RecoveryError
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.incident.phases import PUBLISH
from recovery.lib.notify import Notifier, delivered_keys
from recovery.lib.pointers.namespaces import current_namespace, move_pointer, namespace_sql
from recovery.lib.pointers.published_export import export_dir, export_is_current, read_marker, refresh_published_export
from recovery.lib.repair.diffs import record_diffs
from recovery.lib.repair.gates import BUILTIN, evaluate_gates, latest_gates
from recovery.lib.repair.plan import RepairPlan, load_plan, require_plan
from recovery.lib.repair.preservation import preservation_gate
from recovery.lib.repair.replay import ReplayResult, committed_seq, replay_in
from recovery.lib.repair.tables import GATES, PARTITIONS, PLANS
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer

CANDIDATE = "candidate"
READ_COPY_EVENT = "read_copy_refreshed"
"""Timeline kind: the read copy outside readers open now serves the published repair."""
READ_COPY, TIMELINE_ENTRY, NOTIFICATION = "the read copy", "the timeline entry", "the notification"
"""The steps after publish's commit, as ``publish_steps_left`` names them."""


@dataclass(frozen=True)
class PublishNotice:
    """Who is told that the repair is published, and through what."""

    notifier: Notifier
    owner: str  # the incident's requested_by: who asked for the recovery


def notice_key(incident_id: str) -> str:
    return f"published:{incident_id}"


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
            replayed = _replay_now(s, writer, plan.incident_id, stage, run_id)[0]
            faults.checkpoint("replay:recorded")  # replayed and the high watermark moved, not committed
            return replayed

    replayed = retrying(txn)
    faults.checkpoint("replay:committed")
    return replayed


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
            # key by key over every partition (a carried row must be the published one, with the writes
            # replayed); the row-level suites over the rebuilt rows, the repair's own: a carried partition
            # holds what the public name held, and a footprint reconciliation leaves its drift to verify
            results = evaluate_gates(
                s,
                writer,
                fresh,
                stage=CANDIDATE,
                scope=scope,
                suite_scope=fresh.rebuild,
                through_seq=fresh.high_seq,
                run_id=run_id,
                whole_generation=True,
            )
            diffs = record_diffs(s, writer.spec, fresh, writer) if with_diffs else {}
            failed = [r for r in results if not r.passed]
            EventSource(
                dataset=writer.spec.dataset, incident_id=plan.incident_id, actor="repair", run_id=run_id
            ).record(
                s,
                "repair_gates",
                f"candidate {fresh.namespace} at high watermark seq {fresh.high_seq} "
                f"({replayed.upserted:,} upserts, "
                f"{replayed.deleted:,} deletes replayed now): "
                + ("every gate passed" if not failed else "FAILED " + ", ".join(r.gate for r in failed)),
                [r.__dict__ for r in results],
            )
            faults.checkpoint("candidate:recorded")  # replayed, gated and recorded, not committed
            return replayed, results, diffs

    gated = retrying(txn)
    faults.checkpoint("candidate:committed")
    return gated


def _carried(s, spec: DatasetSpec, plan: RepairPlan) -> list[str]:
    part = quote(spec.target.partition)
    skip = set(plan.rebuild) | set(plan.qualified)
    rows = s.fetchall(
        f"SELECT DISTINCT CAST({part} AS VARCHAR) FROM {namespace_sql(plan.namespace)} WHERE {part} IS NOT NULL"
    )
    return sorted(r[0] for r in rows if r[0] not in skip)


def publish(
    writer: Writer,
    incident_id: str,
    *,
    actor: str = "publish",
    run_id: str | None = None,
    notice: PublishNotice | None = None,
) -> dict:
    """Publish the repair generation of ``incident_id`` in one transaction, then finish what follows
    the commit (``finish_publish``). Idempotent: a rerun finishes what a killed one left."""
    spec = writer.spec

    def txn() -> dict:
        with writer.engine.transaction() as s:
            plan = require_plan(s, incident_id)
            if plan.status == "published":
                return {"already": True, "namespace": plan.namespace, "seq": plan.published_seq, "replayed": None}
            _require_building(plan)
            if plan.high_seq is None:
                raise RecoveryError(
                    f"the repair candidate has not been gated yet; run the candidate checks ({PUBLISH.job}) first"
                )
            gates = latest_gates(s, incident_id, CANDIDATE)
            missing = [g for g in BUILTIN if g not in gates] + [x.name for x in spec.suites if x.name not in gates]
            failed = [g for g, r in gates.items() if not r.passed]
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
            kept = preservation_gate(s, writer, plan, through_seq=seq - 1, scope=plan.rebuild + _carried(s, spec, plan))
            if not kept.passed:
                raise _PreservationRefused(plan, kept)
            _record_gate(s, plan, kept, seq, run_id)
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
            EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor, run_id=run_id).record(
                s,
                "publish",
                f"{spec.target.table} now points at {plan.namespace} (was {plan.from_namespace}, kept); "
                f"{replayed.upserted:,} upserts and {replayed.deleted:,} deletes that landed after the high "
                "watermark replayed "
                f"in the same transaction",
                {"seq": seq, "from": plan.from_namespace, "to": plan.namespace},
            )
            faults.checkpoint("publish:recorded")
            return {
                "already": False,
                "namespace": plan.namespace,
                "seq": seq,
                "replayed": replayed.__dict__,
                "from_namespace": plan.from_namespace,
            }

    try:
        result = retrying(txn)
    except _PreservationRefused as refused:
        _record_refusal(writer, refused, actor=actor, run_id=run_id)  # kept; the replay and the move are not
        raise GateRefusedError(
            f"publish refused: {refused.gate.gate} found the repair generation would lose or double rows a "
            f"concurrent write put there ({refused.gate.details}); the public view still points at "
            f"{refused.plan.from_namespace}. Keep both generations and investigate the delta replay "
            f"(recovery timeline --incident FILE)"
        ) from None
    faults.checkpoint("publish:committed")  # committed, not yet acknowledged
    finish_publish(writer.engine, spec, incident_id, notice=notice, actor=actor, run_id=run_id)
    return result


class _PreservationRefused(Exception):
    """Raised inside the publish transaction so that it rolls back; carries the failed gate."""

    def __init__(self, plan: RepairPlan, gate: GateResult):
        super().__init__(gate.details)
        self.plan, self.gate = plan, gate


def _record_refusal(writer: Writer, refused: _PreservationRefused, *, actor: str, run_id: str | None) -> None:
    """The refused publish's failed gate and its timeline event, in one transaction; once per
    commit clock: a rerun refused at the same state finds it recorded and adds nothing."""
    plan, gate = refused.plan, refused.gate

    def txn() -> None:
        with writer.engine.transaction() as s:
            seq = committed_seq(s)
            if s.scalar(
                f"SELECT count(*) FROM {GATES} WHERE incident_id = ? AND stage = 'publish' AND gate = ? "
                "AND NOT passed AND evaluated_seq = ?",
                [plan.incident_id, gate.gate, seq],
            ):
                return
            _record_gate(s, plan, gate, seq, run_id)
            faults.checkpoint("publish:refusal_gated")  # the failed gate written, its event not yet
            EventSource(dataset=writer.spec.dataset, incident_id=plan.incident_id, actor=actor, run_id=run_id).record(
                s,
                "publish_refused",
                f"publish of {plan.namespace} refused by {gate.gate} ({gate.details}); "
                f"{writer.spec.target.table} still points at {plan.from_namespace}",
                {"gate": gate.gate, "seq": seq, "generation": plan.generation},
            )
            faults.checkpoint("publish:refusal_recorded")  # everything written, not committed

    retrying(txn)
    faults.checkpoint("publish:refusal_committed")


def _record_gate(s, plan: RepairPlan, gate: GateResult, seq: int, run_id: str | None) -> None:
    s.execute(
        f"INSERT INTO {GATES} VALUES (?, ?, ?, ?, ?, true, ?, ?, ?, ?, ?)",
        [
            plan.incident_id,
            plan.generation,
            "publish",
            gate.gate,
            gate.passed,
            gate.observed,
            gate.details,
            seq,
            utcnow(),
            run_id,
        ],
    )


def publish_steps_left(engine, spec: DatasetSpec, incident_id: str, *, notify: bool = True) -> list[str]:
    """What a published repair still lacks after its commit (``READ_COPY``, ``TIMELINE_ENTRY``,
    ``NOTIFICATION``); [] when the repair is not published or nothing is left."""
    with engine.session(read_only=True) as s:
        plan = load_plan(s, incident_id)
        if plan is None or plan.status != "published":
            return []
        left = [] if export_is_current(s, spec) else [READ_COPY]
        recorded = s.scalar(
            f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = ? AND incident_id = ?", [READ_COPY_EVENT, incident_id]
        )
        if not recorded:
            left.append(TIMELINE_ENTRY)
        if notify and notice_key(incident_id) not in delivered_keys(s):
            left.append(NOTIFICATION)
    return left


def finish_publish(
    engine,
    spec: DatasetSpec,
    incident_id: str,
    *,
    notice: PublishNotice | None = None,
    actor: str = "publish",
    run_id: str | None = None,
) -> list[str]:
    """Do what follows a publish's commit and is not done yet (a rerun after a kill finishes it):
    export the read copy, record it in the timeline, tell the requester. Returns the steps done now."""
    left = publish_steps_left(engine, spec, incident_id, notify=notice is not None)
    if READ_COPY in left:
        refresh_published_export(engine, spec)  # outside readers' copy (BI tools): after the commit, atomically
    faults.checkpoint("publish:exported")
    marker = read_marker(spec) or {}
    where = export_dir(spec) / str(marker.get("catalog", "current.duckdb"))
    if TIMELINE_ENTRY in left:

        def txn() -> None:
            with engine.transaction() as s:
                if s.scalar(  # a concurrent finisher recorded it first
                    f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = ? AND incident_id = ?",
                    [READ_COPY_EVENT, incident_id],
                ):
                    return
                EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor, run_id=run_id).record(
                    s,
                    READ_COPY_EVENT,
                    f"read copy {where} now serves {marker.get('namespace')} "
                    f"(pointer move {marker.get('pointer_seq')}, {marker.get('rows', 0):,} rows)",
                    marker,
                )

        retrying(txn)
    faults.checkpoint("publish:read_copy_recorded")
    if notice is not None and NOTIFICATION in left:
        notice.notifier.notify(
            notice.owner,
            f"{incident_id}: the repair of {spec.target.table} is published",
            f"{spec.target.table} now serves the repaired generation {marker.get('namespace')}; outside readers "
            f"(BI tools) read it from {where}. Restate the consumers next: recovery restate --incident <file>.",
            "info",
            notice_key(incident_id),
            incident_id=incident_id,
            dataset=spec.dataset,
        )
    return left


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
            # a rerun (its step retried, the job run again after a kill) decides again: the last move is
            # then this rollback, which the decision would undo; the pointer stays where the rollback put it
            last = s.fetchone(
                f"SELECT to_namespace, reason FROM {SCHEMA}.pointer_history WHERE public_name = ? "
                "ORDER BY seq DESC LIMIT 1",
                [str(spec.target.table_name)],
            )
            if last is not None and last[0] == current and last[1] == f"rollback for {incident_id}":
                return {"already": True, "namespace": current}
            if current != decision.current_namespace:
                raise RecoveryError(f"{spec.target.table} moved since the decision was taken; decide again")
            seq = move_pointer(s, spec, rollback_to, actor=actor, reason=f"rollback for {incident_id}")
            faults.checkpoint("rollback:view_moved")  # the pointer and view moved, the event not yet
            EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor, run_id=run_id).record(
                s, "rollback", f"{spec.target.table} rolled back to {decision.rollback_to} (from {current}, kept)"
            )
            faults.checkpoint("rollback:recorded")  # everything written, not committed
            return {"already": False, "namespace": decision.rollback_to, "seq": seq, "from_namespace": current}

    result = retrying(txn)
    faults.checkpoint("rollback:committed")  # the read copy not yet refreshed
    refresh_published_export(writer.engine, spec)
    faults.checkpoint("rollback:exported")
    return result
