"""The guarded backfill's last steps: gate the new generation, publish it, release the prior one.

- ``gate_backfill``: in one transaction, the invariants and anomaly gates on the
  backfilled partitions, and the fencing and rollback-readiness gates, recorded in
  ``_recovery.backfill_gates`` and on the timeline.
- ``publish_backfill``: one transaction that confirms every gate passed (a Dagster
  blocking check only blocks within its run), re-checks fencing under the commit
  lock (the pointer has not moved; no write landed in the range since the seed;
  partitions outside the range that ingestion wrote since are refreshed from the
  published generation), and moves the pointer. Idempotent. Otherwise the backfill
  is stopped, both generations kept, the reason on the timeline.
- ``verify_backfill_convergence``: the prior generation stays retained until a
  convergence check after publish finds the backfilled partitions equal to the source.
"""

from __future__ import annotations

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, delta_table, next_seq, utcnow
from recovery.lib.convergence.verify import verify_convergence
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.errors import RecoveryError
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.pointers.namespaces import current_namespace, move_pointer, namespace_sql
from recovery.lib.pointers.published_export import refresh_published_export
from recovery.lib.recurrence.gates.anomaly import evaluate_anomaly
from recovery.lib.recurrence.gates.invariants import InvariantResult, evaluate_invariants
from recovery.lib.recurrence.gates.profile import evaluate_profile
from recovery.lib.recurrence.gates.values import Declared, evaluate_values
from recovery.lib.recurrence.policy import GATES
from recovery.lib.recurrence.record import BackfillRecord, latest_gates, load_backfill, record_gates, set_status
from recovery.lib.recurrence.tables import BACKFILLS
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer


def _since_seed(s: Session, spec: DatasetSpec, rec: BackfillRecord) -> tuple[list[str], list[str]]:
    """Partitions of the published generation written since the seed: (in the range, outside it)."""
    part = quote(spec.target.partition)
    rows = s.fetchall(
        f"SELECT DISTINCT CAST({part} AS VARCHAR) AS p FROM {delta_table(spec.dataset)} "
        f"WHERE _delta_namespace = ? AND _delta_seq > ? AND {part} IS NOT NULL ORDER BY p",
        [rec.from_namespace, rec.seed_seq],
    )
    inside = set(rec.partitions)
    touched = [r[0] for r in rows]
    return [p for p in touched if p in inside], [p for p in touched if p not in inside]


def declared_of(rec: BackfillRecord) -> Declared:
    """The intent the request declared, as its manifest (the approval record) stores it."""
    return Declared.from_mapping(rec.manifest.get("declared_intent"))


def profile_gate(
    s: Session, writer: Writer, rec: BackfillRecord, declared: Declared, outcomes: dict | None = None
) -> GateResult:
    """The published profile as a GE suite on the candidate, computed by DuckDB (GE's SQL datasource)."""
    spec = writer.spec
    if spec.warehouse.engine != "duckdb":
        return GateResult(
            "profile",
            True,
            0,
            "not evaluated: the profile suite runs through GE's SQL datasource on "
            "DuckDB; on Spark the values gate holds the same profile checks",
        )
    out = evaluate_profile(s, spec, rec.built_namespace, rec.from_namespace, rec.partitions, declared)
    if outcomes is not None:
        outcomes["profile"] = out
    return out.gate


def fencing_gate(s: Session, spec: DatasetSpec, rec: BackfillRecord) -> GateResult:
    problems = []
    gen = s.fetchone(
        f"SELECT namespace, token, fenced_at FROM {SCHEMA}.generations WHERE generation = ?", [rec.generation]
    )
    if gen is None or gen[0] != rec.namespace or rec.namespace == rec.from_namespace:
        problems.append(f"generation {rec.generation} does not own namespace {rec.namespace}")
    elif gen[2] is not None:
        problems.append(f"generation {rec.generation} was fenced at {gen[2]}")
    stray = s.scalar(
        f"SELECT count(*) FROM {SCHEMA}.writes WHERE generation = ? AND namespace <> ?", [rec.generation, rec.namespace]
    )
    if stray:
        problems.append(f"{stray} write(s) of {rec.generation} landed outside its namespace")
    now = current_namespace(s, spec)
    if now != rec.from_namespace:
        problems.append(
            f"{spec.target.table} was republished since the backfill started (now {now}, was {rec.from_namespace})"
        )
    conflicts, _ = _since_seed(s, spec, rec)
    if conflicts:
        problems.append(
            f"normal ingestion wrote {len(conflicts)} partition(s) of the range since the backfill started "
            f"({', '.join(conflicts[:5])}); publishing would overwrite those writes"
        )
    if problems:
        return GateResult(
            "fencing",
            False,
            len(problems),
            "; ".join(problems)
            + ". Fix: relaunch the backfill with a range that ends before the partitions ingestion writes",
        )
    assert gen is not None  # no problem above: the generation's row was found
    token = gen[1]
    return GateResult(
        "fencing",
        True,
        0,
        f"generation {rec.generation} (token {token}) wrote only its own namespace "
        f"{rec.namespace}; {spec.target.table} still points at {rec.from_namespace} and "
        f"no write landed in the range since seq {rec.seed_seq}",
    )


def readiness_gate(s: Session, spec: DatasetSpec, rec: BackfillRecord) -> GateResult:
    prior = rec.from_namespace
    status = s.scalar(f"SELECT status FROM {SCHEMA}.namespaces WHERE namespace = ?", [prior])
    cols = s.columns(namespace_sql(prior))
    if not cols or status not in ("published", "retained"):
        return GateResult(
            "rollback_readiness",
            False,
            1,
            f"the prior generation {prior} is {status or 'missing'}: no complete state to roll back to",
        )
    rows = s.scalar(f"SELECT count(*) FROM {namespace_sql(prior)}")
    expected = rec.manifest.get("inputs", {}).get("published", {})
    had = (expected.get("rows_in_range") or 0) + (expected.get("rows_outside_range") or 0)
    if had and not rows:
        return GateResult(
            "rollback_readiness", False, 1, f"the prior generation {prior} is empty (it held {had:,} rows)"
        )
    return GateResult(
        "rollback_readiness",
        True,
        0,
        f"prior generation {prior} complete ({rows:,} rows), retained after "
        f"publish until convergence verification passes",
    )


def gate_backfill(
    writer: Writer, backfill_id: str, *, run_id: str | None = None, outcomes: dict | None = None
) -> tuple[list[GateResult], list[InvariantResult]]:
    """Every post-build gate in one transaction; ``outcomes`` (if given) receives the profile suite's result."""
    spec = writer.spec

    def txn():
        with writer.engine.transaction() as s:
            rec = load_backfill(s, backfill_id)
            if rec is None or rec.status not in ("built", "stopped"):
                raise RecoveryError(
                    f"backfill {backfill_id} is {rec.status if rec else 'unknown'}; only a built backfill is gated"
                )
            if rec.namespace is None:
                raise RecoveryError(f"backfill {backfill_id} has no namespace recorded; rerun the backfill")
            inv, details = evaluate_invariants(s, spec, rec.namespace, rec.partitions, rec.source_watermark)
            declared = declared_of(rec)
            values, _ = evaluate_values(s, spec, rec.namespace, rec.from_namespace, rec.partitions, declared)
            results = [
                fencing_gate(s, spec, rec),
                inv,
                evaluate_anomaly(s, spec, rec.namespace, rec.from_namespace, rec.partitions, declared),
                values,
                profile_gate(s, writer, rec, declared, outcomes),
                readiness_gate(s, spec, rec),
            ]
            record_gates(s, backfill_id, rec.generation, spec.dataset, "candidate", results, run_id=run_id)
            faults.checkpoint("backfill_gate:recorded")  # the gates' rows and events written, not committed
            return results, details

    out = retrying(txn)
    faults.checkpoint("backfill_gate:committed")
    return out


def publish_backfill(
    writer: Writer, backfill_id: str, *, actor: str = "guarded_backfill", run_id: str | None = None
) -> dict:
    """Publish if every gate passed; otherwise stop the backfill and keep the published table unchanged."""
    spec = writer.spec

    def txn() -> dict:
        with writer.engine.transaction() as s:
            rec = load_backfill(s, backfill_id)
            if rec is None:
                raise RecoveryError(f"backfill {backfill_id} is unknown; launch it first")
            if rec.status in ("published", "converged"):  # converged since: still what it published
                return {"published": True, "already": True, "namespace": rec.namespace, "seq": rec.published_seq}
            if rec.status != "built":
                return {
                    "published": False,
                    "reason": f"backfill is {rec.status}" + (f": {rec.reason}" if rec.reason else ""),
                }
            gates = latest_gates(s, backfill_id)
            missing = [g for g in GATES if g not in gates]
            failed = [g for g in GATES if g in gates and not gates[g].passed]
            if missing or failed:
                return {
                    "published": False,
                    "reason": "; ".join(
                        [f"gate {g} failed: {gates[g].details}" for g in failed]
                        + [f"gate {g} not evaluated" for g in missing]
                    ),
                }
            seq = next_seq(s)  # from here to commit no other writer commits: the re-checks hold at publish
            for gate in (fencing_gate(s, spec, rec), readiness_gate(s, spec, rec)):
                if not gate.passed:
                    return {
                        "published": False,
                        "reason": f"gate {gate.gate} failed at publish: {gate.details}",
                        "recheck": gate,
                    }
            _, outside = _since_seed(s, spec, rec)
            if outside:  # ingestion wrote partitions outside the range since the seed: carry them over as they are now
                where, built = in_partitions(s, spec, outside), namespace_sql(rec.built_namespace)
                s.replace_rows(
                    built,
                    [c for c, _ in s.columns(built)],
                    remove=where,
                    insert=f"SELECT * FROM {namespace_sql(rec.from_namespace)} WHERE {where}",
                )
            move_pointer(s, spec, rec.built_namespace, actor=actor, reason=f"publish guarded backfill {backfill_id}")
            s.execute(
                f"UPDATE {BACKFILLS} SET status = 'published', published_seq = ? WHERE backfill_id = ?",
                [seq, backfill_id],
            )
            s.execute(
                f"UPDATE {SCHEMA}.generations SET status = 'published', ended_at = ? WHERE generation = ?",
                [utcnow(), rec.generation],
            )
            EventSource(dataset=spec.dataset, actor=actor, run_id=run_id).record(
                s,
                "backfill_published",
                f"{spec.target.table} now points at {rec.namespace} (guarded backfill {backfill_id}); prior "
                f"{rec.from_namespace} retained until convergence verification passes"
                + (f"; {len(outside)} partition(s) ingestion wrote meanwhile carried over" if outside else ""),
                {"seq": seq, "from": rec.from_namespace, "to": rec.namespace, "refreshed": outside},
            )
            faults.checkpoint("backfill_publish:recorded")  # pointer, backfill, generation and event, not committed
            return {
                "published": True,
                "already": False,
                "namespace": rec.namespace,
                "seq": seq,
                "from_namespace": rec.from_namespace,
            }

    result = retrying(txn)
    if result["published"]:
        faults.checkpoint("backfill_publish:committed")  # the read copy not yet refreshed
        # outside readers' copy (BI tools), after the commit as a repair's publish does; a rerun
        # (already published) refreshes it too, if a kill after the commit left it behind
        refresh_published_export(writer.engine, spec)
        faults.checkpoint("backfill_publish:exported")
    elif "already" not in result:
        _stop(writer, backfill_id, result["reason"], result.get("recheck"), run_id)
    return result


def stop_backfill(writer: Writer, backfill_id: str, reason: str, *, run_id: str | None = None) -> None:
    """Stop a built backfill whose gates failed: both generations kept, the reason on the timeline."""
    _stop(writer, backfill_id, reason, None, run_id)


def _stop(writer: Writer, backfill_id: str, reason: str, recheck: GateResult | None, run_id: str | None) -> None:
    def txn() -> None:
        with writer.engine.transaction() as s:
            rec = load_backfill(s, backfill_id)
            if rec is None or rec.status not in ("built",):
                return
            if recheck is not None:
                record_gates(s, backfill_id, rec.generation, writer.spec.dataset, "publish", [recheck], run_id=run_id)
            set_status(s, backfill_id, "stopped", reason[:2000])
            EventSource(dataset=writer.spec.dataset, actor="guarded_backfill", run_id=run_id).record(
                s,
                "backfill_stopped",
                f"backfill {backfill_id} stopped before publish; {writer.spec.target.table} still points at "
                f"{rec.from_namespace}, {rec.namespace} kept for investigation: {reason[:500]}",
            )

    retrying(txn)


def verify_backfill_convergence(writer: Writer, backfill_id: str, *, run_id: str | None = None) -> dict:
    """Check ongoing ingestion converges on the published backfill; only then may its prior generation be released."""
    spec = writer.spec
    with writer.engine.session(read_only=True) as s:
        rec = load_backfill(s, backfill_id)
    if rec is None or rec.status not in ("published", "converged"):
        raise RecoveryError(
            f"backfill {backfill_id} is {rec.status if rec else 'unknown'}; only a published backfill converges"
        )
    # the backfilled partitions checked with the rest: changes ingestion has not reached yet are
    # pending there, not drift, as everywhere else
    overall = verify_convergence(
        writer.engine, spec, run_id=run_id, actor="guarded_backfill", partitions=list(rec.partitions)
    )
    backfilled = set(rec.partitions)
    drift = [p.partition for p in overall.partitions if p.partition in backfilled and p.drifts]

    def txn() -> dict:
        with writer.engine.transaction() as s:
            converged = overall.converged and not drift
            seq = next_seq(s)
            if converged:
                s.execute(
                    f"UPDATE {BACKFILLS} SET status = 'converged', converged_seq = ? WHERE backfill_id = ?",
                    [seq, backfill_id],
                )
                s.execute(
                    f"UPDATE {SCHEMA}.namespaces SET status = 'releasable' WHERE namespace = ? AND status = 'retained'",
                    [rec.from_namespace],
                )
            EventSource(dataset=spec.dataset, actor="guarded_backfill", run_id=run_id).record(
                s,
                "backfill_convergence",
                f"backfill {backfill_id}: "
                + (
                    f"converged; prior {rec.from_namespace} may be released"
                    if converged
                    else f"not converged ({overall.summary()}; backfilled partitions drifting: "
                    f"{drift[:5]}); prior {rec.from_namespace} stays retained"
                ),
            )
            faults.checkpoint("backfill_converge:recorded")  # converged and the prior releasable, not committed
            return {"converged": converged, "drifting": drift, "check": overall.summary()}

    out = retrying(txn)
    faults.checkpoint("backfill_converge:committed")
    return out
