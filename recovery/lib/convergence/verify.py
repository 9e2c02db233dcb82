"""One convergence check: recent, repaired and late partitions vs the source, recorded over time.

A check runs in one transaction, so it compares one consistent state of the target
with one state of the source. It resolves the watermark (per dataset, and per
partition where a later write rebuilt it), stages the pending changes, compares every
partition in scope with the source as it is now, leaving out the keys whose changes
are pending there, and takes a commit-order sequence number as its id (checks and
writes are ordered together). It appends one row per partition to
``_recovery."convergence__<dataset>"`` (drift, pending and watermark per partition
over time) and puts a ``convergence`` event on the timeline. It never changes data:
late events are applied by normal ingestion through the writer; this only says
whether they were, and since when they wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from recovery.lib import faults
from recovery.lib.control.plane import (
    EventSource,
    dataset_table,
    ensure_control_plane,
    has_dataset_table,
    next_seq,
    utcnow,
)
from recovery.lib.control.tables import CONVERGENCE_HISTORY_COLUMNS as HISTORY_COLUMNS
from recovery.lib.convergence.drift import compare_partitions, stage_sides
from recovery.lib.convergence.pending import PENDING, pending_totals, stage_pending
from recovery.lib.convergence.result import ConvergenceResult, PartitionDrift
from recovery.lib.convergence.scope import recent_partitions, repaired_partitions
from recovery.lib.convergence.watermark import (
    PARTITION_WATERMARKS,
    Watermark,
    dataset_watermark,
    stage_partition_watermarks,
)
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine, Session
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.identifiers import naive_utc
from recovery.lib.reconcile.expected_cache import drop_staged
from recovery.lib.retry import retrying


def history_table(spec: DatasetSpec) -> str:
    return dataset_table("convergence", spec.dataset)


DRIFTS = "(h.drift_keys > 0 OR (h.expected_rows <> h.actual_rows AND coalesce(h.pending_changes, 0) = 0))"
"""A history row that drifts (the rule of ``PartitionDrift.drifts``, for rows of older checks too)."""


def verify_convergence(
    engine: Engine,
    spec: DatasetSpec,
    *,
    recent: int = 3,
    watermark: datetime | None = None,
    max_lag: timedelta | None = None,
    partitions: Sequence[str] = (),
    incident_id: str | None = None,
    actor: str = "convergence",
    run_id: str | None = None,
) -> ConvergenceResult:
    """Reconcile the ``recent`` partitions ingestion wrote last, every repaired partition and every
    partition holding a pending change against the source. ``watermark`` (default: how far
    ingestion has applied it) splits pending changes from drift; ``max_lag`` (default: the spec's
    ``convergence.max_lag``) is how long a pending change may wait; ``partitions`` (as text) are
    checked too (e.g. a guarded backfill's)."""
    if not isinstance(recent, int) or isinstance(recent, bool) or recent < 1:
        raise SpecError(
            "recent_partitions",
            f"{recent!r} is not a positive whole number",
            "give how many of the partitions ingestion wrote last to check, e.g. 3",
        )
    lag = max_lag if max_lag is not None else spec.convergence_policy.max_lag

    with engine.session(read_only=True) as s:
        if not s.columns(spec.target.table_name.sql()):
            raise RecoveryError(
                f"{spec.target.table} does not exist yet, so there is nothing to verify. "
                f"Fix: ingest the dataset through the writer first"
            )

    def txn() -> ConvergenceResult:
        with engine.transaction() as s:
            ensure_control_plane(s)
            given = Watermark(at=naive_utc(watermark), basis="given") if watermark is not None else None
            checked = _check(s, spec, recent, given, lag, list(partitions), incident_id, actor, run_id)
            faults.checkpoint("verify:recorded")  # the check's rows and its event written, not committed
            return checked

    result = retrying(txn)
    faults.checkpoint("verify:committed")
    return result


def _check(
    s: Session,
    spec: DatasetSpec,
    recent: int,
    given: Watermark | None,
    lag: timedelta,
    also: list[str],
    incident_id: str | None,
    actor: str,
    run_id: str | None,
) -> ConvergenceResult:
    at = utcnow()
    wm = given or dataset_watermark(s, spec)
    stage_partition_watermarks(s, spec, None if given else wm.at)
    values = stage_sides(s, spec, None)
    stage_pending(s, spec, wm.at, at - lag, values)
    rec = recent_partitions(s, spec, recent)
    rep = repaired_partitions(s, spec)
    late = [r[0] for r in s.fetchall(f"SELECT DISTINCT p FROM {PENDING}")]
    compare_partitions(s, spec, sorted(set(rec) | set(rep) | set(late) | set(also)), values, leave_out=PENDING)
    check_id = next_seq(s)
    table = _history(s, spec)
    s.replace_rows(
        table,
        [
            *(
                "check_id, checked_at, run_id, incident_id, watermark, partition, recent, repaired, expected_rows, "
                "actual_rows, missing, extra, changed, duplicate, drift_keys, sample_keys, watermark_basis, "
                "pending_changes, pending_oldest, pending_overdue"
            ).split(", ")
        ],
        insert=f"""SELECT ?, ?, ?, ?, coalesce(w.watermark, CAST(? AS TIMESTAMP)), d.partition,
               list_contains(CAST(? AS VARCHAR[]), d.partition), list_contains(CAST(? AS VARCHAR[]), d.partition),
               d.expected_rows, d.actual_rows, d.missing, d.extra, d.changed, d.duplicate, d.drift_keys, d.sample_keys,
               coalesce(w.basis, ?), coalesce(pp.changes, 0), pp.oldest, coalesce(pp.overdue, 0)
        FROM __cv_drift d LEFT JOIN {PARTITION_WATERMARKS} w ON w.p = d.partition
        LEFT JOIN (SELECT p, sum(changes) AS changes, min(oldest) AS oldest, sum(overdue) AS overdue
                   FROM {PENDING} GROUP BY p) pp ON pp.p = d.partition""",
        params=[check_id, at, run_id, incident_id, wm.at, rec, rep, wm.basis],
    )
    changes, oldest, overdue = pending_totals(s, spec)
    result = ConvergenceResult(
        check_id=check_id,
        dataset=spec.dataset,
        checked_at=at,
        watermark=wm.at,
        watermark_basis=wm.basis,
        max_lag=lag,
        pending_changes=changes,
        pending_oldest=oldest,
        pending_overdue=overdue,
        recent_partitions=rec,
        repaired_partitions=rep,
        partitions=load_partitions(s, spec, check_id),
    )
    for t in ("__cv_drift", PENDING, PARTITION_WATERMARKS):
        s.drop_relation(t)
    drop_staged(s, "__cv_e")
    EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor, run_id=run_id).record(
        s,
        "convergence",
        result.summary(),
        {
            "check_id": check_id,
            "converged": result.converged,
            "drifted": [p.partition for p in result.drifted()],
            "behind": [p.partition for p in result.behind()],
            "pending_changes": result.pending_changes,
            "pending_overdue": result.pending_overdue,
            "watermark": str(result.watermark),
            "watermark_basis": result.watermark_basis,
        },
    )
    return result


def _history(s: Session, spec: DatasetSpec) -> str:
    """The history table, with the columns a check writes (a table of an older version gains them)."""
    table = history_table(spec)
    s.create_table(table, HISTORY_COLUMNS)
    if isinstance(s, DuckDBSession):
        have = {c for c, _ in s.columns(table)}
        for col in HISTORY_COLUMNS.split(", "):
            name, typ = col.split(" ", 1)
            if name not in have:
                s.execute(f"ALTER TABLE {table} ADD COLUMN {name} {typ}")
    return table


def load_partitions(s: Session, spec: DatasetSpec, check_id: int) -> list[PartitionDrift]:
    """The partitions one check recorded, with since when each has been drifting."""
    table = history_table(spec)
    rows = s.fetchall(
        f"""SELECT h.partition, h.recent, h.repaired, h.expected_rows, h.actual_rows, h.missing, h.extra, h.changed,
                   h.duplicate, h.drift_keys, h.sample_keys, CASE WHEN {DRIFTS} THEN d.since END,
                   h.watermark, h.watermark_basis, h.pending_changes, h.pending_oldest, h.pending_overdue
            FROM {table} h
            LEFT JOIN (SELECT o.partition, min(o.checked_at) AS since   -- first check after the last clean one
                       FROM {table} o
                       LEFT JOIN (SELECT partition, max(check_id) AS clean_id FROM {table} h
                                  WHERE NOT {DRIFTS} GROUP BY partition) c
                              ON c.partition = o.partition
                       WHERE o.check_id > coalesce(c.clean_id, -1) GROUP BY o.partition) d ON d.partition = h.partition
            WHERE h.check_id = ? ORDER BY h.partition""",
        [check_id],
    )
    return [
        PartitionDrift(
            partition=r[0],
            recent=r[1],
            repaired=r[2],
            expected_rows=r[3],
            actual_rows=r[4],
            missing=r[5],
            extra=r[6],
            changed=r[7],
            duplicate=r[8],
            drift_keys=r[9],
            sample_keys=list(r[10] or []),
            drifting_since=r[11],
            watermark=r[12],
            watermark_basis=r[13] or "",
            pending_changes=r[14] or 0,
            pending_oldest=r[15],
            pending_overdue=r[16] or 0,
        )
        for r in rows
    ]


def drift_history(s: Session, spec: DatasetSpec, *, partition: str | None = None, limit: int = 1000) -> list[tuple]:
    """(check_id, checked_at, partition, drift_keys, expected_rows, actual_rows), latest first."""
    table = history_table(spec)
    if not has_dataset_table(s, "convergence", spec.dataset):
        return []
    where, params = ("WHERE partition = ?", [partition]) if partition is not None else ("", [])
    return s.fetchall(
        f"SELECT check_id, checked_at, partition, drift_keys, expected_rows, actual_rows FROM {table} {where} "
        f"ORDER BY check_id DESC, partition LIMIT {int(limit)}",
        params,
    )
