"""One convergence check: recent and repaired partitions vs the source, recorded over time.

A check runs in one transaction, so it compares one consistent state of the target
with the source as of the watermark, takes a commit-order sequence number as its
id (checks and writes are ordered together), appends one row per partition to
``_recovery."convergence__<dataset>"`` (drift per partition over time) and puts a
``convergence`` event on the timeline. It never changes data: late events are
applied by normal ingestion through the writer; this only says whether they were.
"""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.control_plane import (
    dataset_table,
    ensure_control_plane,
    has_dataset_table,
    next_seq,
    record_event,
    utcnow,
)
from recovery.lib.convergence.drift import stage_drift
from recovery.lib.convergence.scope import applied_watermark, pending_changes, recent_partitions, repaired_partitions
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.expected_cache import drop_staged
from recovery.lib.identifiers import quote
from recovery.lib.spec import DatasetSpec
from recovery.lib.writer import retrying


class PartitionDrift(BaseModel):
    model_config = ConfigDict(frozen=True)
    partition: str
    recent: bool
    repaired: bool
    expected_rows: int
    actual_rows: int
    missing: int
    extra: int
    changed: int
    duplicate: int
    drift_keys: int
    sample_keys: list[str]
    drifting_since: datetime | None = None  # first check of the current run of drifting checks

    @property
    def converged(self) -> bool:
        return self.drift_keys == 0 and self.expected_rows == self.actual_rows


class ConvergenceResult(BaseModel):
    """What one check found; ``converged`` is what ``recovery verify`` exits on."""

    model_config = ConfigDict(frozen=True)
    check_id: int
    dataset: str
    checked_at: datetime
    watermark: datetime | None
    pending_changes: int
    recent_partitions: list[str]
    repaired_partitions: list[str]
    partitions: list[PartitionDrift]
    watermark_basis: str = ""  # where the watermark came from (never left unresolved)

    def drifted(self, scope: str | None = None) -> list[PartitionDrift]:
        """Partitions that drift (``scope``: 'recent', 'repaired' or None for both)."""
        return [p for p in self.partitions if not p.converged and (scope is None or getattr(p, scope))]

    @property
    def recent_converged(self) -> bool:
        return not self.drifted("recent")

    @property
    def repaired_converged(self) -> bool:
        return not self.drifted("repaired")

    @property
    def converged(self) -> bool:
        return not self.drifted()

    def summary(self) -> str:
        bad = self.drifted()
        if not bad:
            return (
                f"converged: {len(self.recent_partitions)} recent and {len(self.repaired_partitions)} repaired "
                f"partitions equal the source as of {self.as_of()} ({self.pending_changes} changes pending)"
            )
        return (
            f"drift in {len(bad)} partition(s): "
            + ", ".join(f"{p.partition} ({p.drift_keys} keys)" for p in bad[:10])
            + (" ..." if len(bad) > 10 else "")
            + f"; source as of {self.as_of()}"
        )

    def as_of(self) -> str:
        """The watermark as a reader needs it: the timestamp and where it came from."""
        if self.watermark is None:
            return "its latest change (the source is empty)"
        return f"{self.watermark:%Y-%m-%d %H:%M:%S}" + (f" ({self.watermark_basis})" if self.watermark_basis else "")


def history_table(spec: DatasetSpec) -> str:
    return dataset_table("convergence", spec.dataset)


HISTORY_COLUMNS = (
    "check_id BIGINT, checked_at TIMESTAMP, run_id VARCHAR, incident_id VARCHAR, watermark TIMESTAMP, "
    "partition VARCHAR, recent BOOLEAN, repaired BOOLEAN, expected_rows BIGINT, actual_rows BIGINT, missing BIGINT, "
    "extra BIGINT, changed BIGINT, duplicate BIGINT, drift_keys BIGINT, sample_keys VARCHAR[]"
)


def verify_convergence(
    engine: Engine,
    spec: DatasetSpec,
    *,
    recent: int = 3,
    watermark: datetime | None = None,
    incident_id: str | None = None,
    actor: str = "convergence",
    run_id: str | None = None,
) -> ConvergenceResult:
    """Reconcile the ``recent`` partitions ingestion wrote last and every repaired partition
    against the source as of ``watermark`` (default: how far ingestion has applied it)."""
    if not isinstance(recent, int) or isinstance(recent, bool) or recent < 1:
        raise SpecError(
            "recent_partitions",
            f"{recent!r} is not a positive whole number",
            "give how many of the partitions ingestion wrote last to check, e.g. 3",
        )

    with engine.session(read_only=True) as s:
        if not s.columns(spec.target.table_name.sql()):
            raise RecoveryError(
                f"{spec.target.table} does not exist yet, so there is nothing to verify. "
                f"Fix: ingest the dataset through the writer first"
            )

    def txn() -> ConvergenceResult:
        with engine.transaction() as s:
            ensure_control_plane(s)
            return _check(s, spec, recent, watermark, incident_id, actor, run_id)

    return retrying(txn)


def _check(
    s: Session,
    spec: DatasetSpec,
    recent: int,
    watermark: datetime | None,
    incident_id: str | None,
    actor: str,
    run_id: str | None,
) -> ConvergenceResult:
    wm, basis = watermark, "given"
    if wm is None:
        wm, basis = applied_watermark(s, spec), "how far ingestion has applied the source"
    if wm is None:  # no generation recorded what it read: the whole source, as of its latest change now
        src = spec.source
        wm = s.scalar(f"SELECT max({quote(src.ingested_at)}) FROM {src.table_name.sql()}")
        basis = "the source's latest change: no generation recorded a watermark"
    rec = recent_partitions(s, spec, recent)
    rep = repaired_partitions(s, spec)
    stage_drift(s, spec, wm, sorted(set(rec) | set(rep)))
    check_id, at = next_seq(s), utcnow()
    table = history_table(spec)
    s.execute(f"CREATE TABLE IF NOT EXISTS {table} ({HISTORY_COLUMNS})")
    s.execute(
        f"INSERT INTO {table} SELECT ?, ?, ?, ?, ?, partition, list_contains(CAST(? AS VARCHAR[]), partition), "
        f"list_contains(CAST(? AS VARCHAR[]), partition), expected_rows, actual_rows, missing, extra, changed, duplicate, "
        f"drift_keys, sample_keys FROM __cv_drift",
        [check_id, at, run_id, incident_id, wm, rec, rep],
    )
    rows = s.fetchall(
        f"""SELECT h.partition, h.recent, h.repaired, h.expected_rows, h.actual_rows, h.missing, h.extra, h.changed,
                   h.duplicate, h.drift_keys, h.sample_keys,
                   CASE WHEN h.drift_keys > 0 OR h.expected_rows <> h.actual_rows THEN d.since END
            FROM {table} h
            LEFT JOIN (SELECT o.partition, min(o.checked_at) AS since   -- first check after the last clean one
                       FROM {table} o
                       LEFT JOIN (SELECT partition, max(check_id) AS clean_id FROM {table}
                                  WHERE drift_keys = 0 AND expected_rows = actual_rows GROUP BY partition) c
                              ON c.partition = o.partition
                       WHERE o.check_id > coalesce(c.clean_id, -1) GROUP BY o.partition) d ON d.partition = h.partition
            WHERE h.check_id = ? ORDER BY h.partition""",
        [check_id],
    )
    parts = [
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
            sample_keys=list(r[10]),
            drifting_since=r[11],
        )
        for r in rows
    ]
    result = ConvergenceResult(
        check_id=check_id,
        dataset=spec.dataset,
        checked_at=at,
        watermark=wm,
        pending_changes=pending_changes(s, spec, wm),
        recent_partitions=rec,
        repaired_partitions=rep,
        partitions=parts,
        watermark_basis=basis,
    )
    s.execute("DROP TABLE IF EXISTS __cv_drift")
    drop_staged(s, "__cv_e")
    record_event(
        s,
        kind="convergence",
        dataset=spec.dataset,
        incident_id=incident_id,
        actor=actor,
        run_id=run_id,
        summary=result.summary(),
        details=json.dumps(
            {
                "check_id": check_id,
                "converged": result.converged,
                "drifted": [p.partition for p in result.drifted()],
                "pending_changes": result.pending_changes,
            }
        ),
    )
    return result


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
