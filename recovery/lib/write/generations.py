"""The generation registry and its fence: which generations exist, which may write, and every refused attempt.

A generation is registered once (with its own namespace when it must not touch the published one) and
fenced by a compare-and-set on its row: the token every write of it checks in its own transaction
(``Writer.write``), so a fence committed concurrently makes that write conflict and land nothing. The
fence takes the turnstile's urgent lane, so a busy writer in another process cannot hold it off.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, next_seq, utcnow
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine, Session, urgent
from recovery.lib.errors import FencedGenerationError, RecoveryError
from recovery.lib.retry import retrying

GenerationKind = Literal["ingest", "backfill", "repair", "adopted", "unknown"]


class GenerationRegistry:
    """One dataset's generations: register, set status, fence, count refused attempts."""

    def __init__(self, engine: Engine, spec: DatasetSpec, *, actor: str = "recovery"):
        self.engine = engine
        self.spec = spec
        self.actor = actor
        self.public = spec.target.table_name
        self.meta = spec.target.metadata

    # ---- generations --------------------------------------------------------------------
    def register_generation(
        self,
        generation: str,
        kind: GenerationKind,
        *,
        own_namespace: bool = False,
        started_at: datetime | None = None,
        source_watermark: datetime | None = None,
        code_version: str | None = None,
        run_id: str | None = None,
        backfill_id: str | None = None,
        parent: str | None = None,
        note: str | None = None,
    ) -> str | None:
        """Register a generation (idempotent for the same id). Returns its namespace, or None
        when it writes wherever the public pointer points (ingestion, in-place backfills)."""
        if not generation or len(generation) > 200:
            raise RecoveryError("generation id must be a non-empty string of at most 200 characters")

        def txn() -> str | None:
            with self.engine.transaction() as s:
                row = s.fetchone(
                    f"SELECT dataset, namespace, fenced_at FROM {SCHEMA}.generations WHERE generation = ?",
                    [generation],
                )
                if row is not None:
                    if row[0] != self.spec.dataset:
                        raise RecoveryError(f"generation {generation!r} belongs to dataset {row[0]!r}")
                    if row[2] is not None:
                        raise FencedGenerationError(generation, "it cannot be registered again")
                    return row[1]
                if backfill_id is not None:
                    fenced = s.fetchone(
                        f"SELECT generation FROM {SCHEMA}.generations WHERE dataset = ? AND backfill_id = ? "
                        f"AND fenced_at IS NOT NULL ORDER BY generation LIMIT 1",
                        [self.spec.dataset, backfill_id],
                    )
                    if fenced is not None:
                        raise FencedGenerationError(
                            generation,
                            f"Dagster backfill {backfill_id} is fenced (as {fenced[0]}): no run of it may write",
                        )
                seq = next_seq(s)
                ns = None
                if own_namespace:
                    ns = _new_namespace(s, self.spec, created_by=generation, seq=seq)
                s.execute(
                    f"INSERT INTO {SCHEMA}.generations VALUES (?, ?, ?, 'running', ?, ?, NULL, ?, ?, ?, ?, 1, NULL, 0, "
                    "NULL, ?, false, ?, ?, ?)",
                    [
                        generation,
                        self.spec.dataset,
                        kind,
                        ns,
                        started_at or utcnow(),
                        source_watermark,
                        code_version,
                        self.spec.fingerprint,
                        parent,
                        seq,
                        run_id,
                        backfill_id,
                        note,
                    ],
                )
                EventSource(dataset=self.spec.dataset, actor=self.actor, run_id=run_id).record(
                    s,
                    "generation_registered",
                    f"{kind} generation {generation} registered"
                    + (f" writing namespace {ns}" if ns else " writing the published namespace"),
                    at=started_at,
                )
                faults.checkpoint("register:recorded")  # the generation, its namespace and its event, not committed
                return ns

        try:
            ns = retrying(txn)
        except FencedGenerationError as err:
            self.record_fence_attempt(generation, "register", run_id=run_id, detail=str(err))
            raise
        faults.checkpoint("register:committed")
        return ns

    def set_status(self, generation: str, status: str, *, ended_at: datetime | None = None) -> None:
        def txn() -> None:
            with self.engine.transaction() as s:
                s.execute(
                    f"UPDATE {SCHEMA}.generations SET status = ?, ended_at = coalesce(?, ended_at) "
                    f"WHERE generation = ? AND fenced_at IS NULL",
                    [status, ended_at, generation],
                )

        retrying(txn)
        faults.checkpoint("status:committed")

    # ---- fencing ------------------------------------------------------------------------
    def fence(
        self,
        generation: str,
        *,
        incident_id: str,
        fenced_by: str,
        reason: str = "",
        at: datetime | None = None,
        backfill_id: str | None = None,
    ) -> int:
        """Fence ``generation``: from this commit on, its writes are refused. Returns the new
        token. A generation unknown to the registry (written by another tool) is registered
        as inferred and fenced in the same transaction, with the Dagster ``backfill_id`` it
        belongs to when known (so a later run of that backfill cannot register)."""
        fenced_at = at or utcnow()

        def txn() -> int:
            with self.engine.transaction() as s:
                seq = next_seq(s)
                faults.checkpoint("fence:locked")
                exists = s.fetchone(
                    f"SELECT token, fenced_at FROM {SCHEMA}.generations WHERE generation = ?", [generation]
                )
                if exists is None:
                    s.execute(
                        f"INSERT INTO {SCHEMA}.generations VALUES (?, ?, 'unknown', 'fenced', NULL, NULL, NULL, NULL, "
                        "NULL, NULL, NULL, 2, ?, 0, NULL, ?, true, NULL, ?, ?)",
                        [generation, self.spec.dataset, fenced_at, seq, backfill_id, "registered by the fence"],
                    )
                    token = 2
                elif exists[1] is not None:
                    return int(exists[0])
                else:
                    token = int(
                        s.scalar(
                            f"UPDATE {SCHEMA}.generations SET token = token + 1, fenced_at = ?, status = 'fenced', "
                            f"backfill_id = coalesce(backfill_id, ?) WHERE generation = ? RETURNING token",
                            [fenced_at, backfill_id, generation],
                        )
                    )
                faults.checkpoint("fence:generation_updated")  # the generation fenced, its fence row not yet
                s.execute(
                    f"INSERT INTO {SCHEMA}.fences VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [generation, self.spec.dataset, incident_id, token, fenced_at, fenced_by, reason, seq],
                )
                faults.checkpoint("fence:fence_recorded")
                EventSource(dataset=self.spec.dataset, incident_id=incident_id, actor=fenced_by).record(
                    s,
                    "fence",
                    f"generation {generation} fenced (token {token})",
                    {"generation": generation, "token": token, "seq": seq, "reason": reason},
                    at=fenced_at,
                )
                faults.checkpoint("fence:event_recorded")  # everything written, not committed
                return token

        with urgent():  # ahead of the writers' next transactions: a busy backfill must not hold it off
            token = retrying(txn)
        faults.checkpoint("fence:committed")  # committed, not yet acknowledged
        return token

    def is_fenced(self, generation: str) -> bool:
        with self.engine.session() as s:
            return (
                s.scalar(f"SELECT fenced_at IS NOT NULL FROM {SCHEMA}.generations WHERE generation = ?", [generation])
                is True
            )

    def record_fence_attempt(
        self, generation: str, action: str, *, run_id: str | None = None, detail: str = ""
    ) -> None:
        """Count a refused action and put it on the incident's timeline (the fencing sensor alerts on it)."""

        def txn() -> None:
            with self.engine.transaction() as s:
                s.execute(
                    f"INSERT INTO {SCHEMA}.fence_attempts VALUES (?, ?, ?, ?, ?, ?)",
                    [generation, self.spec.dataset, utcnow(), action, run_id, detail],
                )
                incident = s.scalar(
                    f"SELECT arg_min(incident_id, seq) FROM {SCHEMA}.fences WHERE generation = ?", [generation]
                )
                EventSource(dataset=self.spec.dataset, incident_id=incident, actor=self.actor, run_id=run_id).record(
                    s,
                    "fence_attempt",
                    f"{action} by fenced generation {generation} refused",
                    {"generation": generation, "action": action, "detail": detail},
                )
                faults.checkpoint("fence_attempt:recorded")  # the attempt and its event, not committed

        retrying(txn)
        faults.checkpoint("fence_attempt:committed")


def _new_namespace(s: Session, spec: DatasetSpec, *, created_by: str, seq: int) -> str:
    from recovery.lib.pointers.namespaces import new_namespace

    return new_namespace(s, spec, created_by=created_by, seq=seq)
