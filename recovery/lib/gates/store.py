"""Reading gate results back: one query for the repair's ``gate_results`` and the guarded backfill's
``backfill_gates``, which keep the same columns under a different owner (an incident, a backfill)."""

from __future__ import annotations

from recovery.lib.engine.base import Session
from recovery.lib.gates.result import StoredGate


def latest_results(
    s: Session, table: str, *, owner_column: str, owner: str, stage: str | None = None
) -> dict[str, StoredGate]:
    """The most recent result of each gate of one owner (of one stage, if given), by gate name; empty before the
    table exists (nothing was ever gated)."""
    schema, name = table.split(".", 1)
    if s.object_kind(schema, name) is None:
        return {}
    where, params = f"{owner_column} = ?", [owner]
    if stage:
        where += " AND stage = ?"
        params.append(stage)
    rows = s.fetchall(
        f"SELECT gate, passed, observed, details, stage, evaluated_seq, run_id FROM {table} WHERE {where} "
        "QUALIFY row_number() OVER (PARTITION BY gate ORDER BY evaluated_at DESC, evaluated_seq DESC) = 1 "
        "ORDER BY gate",
        params,
    )
    return {r[0]: StoredGate(r[0], r[1], r[2], r[3], stage=r[4], seq=r[5], run_id=r[6]) for r in rows}
