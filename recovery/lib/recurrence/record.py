"""Reading and writing a guarded backfill's row and its gate results (the caller owns the transaction)."""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.control.plane import EventSource, next_seq, utcnow
from recovery.lib.engine.base import Session
from recovery.lib.errors import RecoveryError
from recovery.lib.gates import GateResult, StoredGate
from recovery.lib.gates.store import latest_results
from recovery.lib.recurrence.policy import GATES as EVALUATION_ORDER
from recovery.lib.recurrence.tables import BACKFILLS, GATES, tables_exist


class BackfillRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    backfill_id: str
    dataset: str
    generation: str
    namespace: str | None
    from_namespace: str
    partitions: list[str]
    status: str
    manifest: dict
    source_watermark: datetime | None
    seed_seq: int | None
    published_seq: int | None
    converged_seq: int | None
    reason: str | None

    @property
    def built_namespace(self) -> str:
        """The backfill's own namespace, set when its seed is written: a step after that needs it."""
        if self.namespace is None:
            raise RecoveryError(f"backfill {self.backfill_id} is {self.status} and has no namespace yet")
        return self.namespace


_COLS = (
    "backfill_id, dataset, generation, namespace, from_namespace, partitions, status, manifest, source_watermark, "
    "seed_seq, published_seq, converged_seq, reason"
)


def require_backfill(s: Session, backfill_id: str) -> BackfillRecord:
    """The recorded backfill the caller just wrote: none is a ``RecoveryError``."""
    rec = load_backfill(s, backfill_id)
    if rec is None:
        raise RecoveryError(f"backfill {backfill_id} is not recorded")
    return rec


def load_backfill(s: Session, backfill_id: str) -> BackfillRecord | None:
    if not tables_exist(s):
        return None
    row = s.fetchone(f"SELECT {_COLS} FROM {BACKFILLS} WHERE backfill_id = ?", [backfill_id])
    if row is None:
        return None
    fields = dict(zip([c.strip() for c in _COLS.split(",")], row))
    fields["manifest"] = json.loads(fields["manifest"]) if fields["manifest"] else {}
    fields["partitions"] = list(fields["partitions"] or [])
    return BackfillRecord(**fields)


def set_status(s: Session, backfill_id: str, status: str, reason: str | None = None) -> None:
    s.execute(
        f"UPDATE {BACKFILLS} SET status = ?, reason = coalesce(?, reason) WHERE backfill_id = ?",
        [status, reason, backfill_id],
    )


def record_gates(
    s: Session,
    backfill_id: str,
    generation: str,
    dataset: str,
    stage: str,
    results: list[GateResult],
    *,
    run_id: str | None = None,
    actor: str = "guarded_backfill",
) -> int:
    """Append each gate's result and put it on the timeline; returns the evaluation's sequence number."""
    seq = next_seq(s)
    events = EventSource(dataset=dataset, actor=actor, run_id=run_id)
    for r in results:
        s.execute(
            f"INSERT INTO {GATES} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [backfill_id, generation, stage, r.gate, r.passed, r.observed, r.details, seq, utcnow(), run_id],
        )
        events.record(
            s,
            "backfill_gate",
            f"backfill {backfill_id} gate {r.gate} {'passed' if r.passed else 'FAILED'} ({stage}): {r.details[:300]}",
            {"backfill_id": backfill_id, "gate": r.gate, "stage": stage, "passed": r.passed, "observed": r.observed},
        )
    return seq


def latest_gates(s: Session, backfill_id: str) -> dict[str, StoredGate]:
    """The most recent result of each gate of a backfill, in the order the guarded launcher evaluates them."""
    latest = latest_results(s, GATES, owner_column="backfill_id", owner=backfill_id)
    order = {g: i for i, g in enumerate(EVALUATION_ORDER)}
    return dict(sorted(latest.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
