"""What an incident's restatement did, per consumer, read back from the control plane."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.consumers.outputs import RESTATEMENTS
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session


class RestatementSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    consumer: str
    kind: str
    owner: str
    original_namespace: str | None
    corrected_namespace: str
    ledger_rows: int
    material_rows: int
    original_total: float | None
    corrected_total: float | None
    restated_at: datetime
    notified_at: datetime | None


def restatement_summary(s: Session, spec: DatasetSpec, incident_id: str) -> list[RestatementSummary]:
    """One row per consumer restated for ``incident_id``: the spec's SQL consumers in its order, then
    the Dagster assets by key ([] before any)."""
    if s.object_kind("_recovery", "restatements") is None:
        return []
    rows = s.fetchall(
        f"SELECT consumer, kind, owner, original_namespace, corrected_namespace, ledger_rows, material_rows, "
        f"original_total, corrected_total, restated_at, notified_at FROM {RESTATEMENTS} WHERE incident_id = ? "
        "AND dataset = ?",
        [incident_id, spec.dataset],
    )
    fields = list(RestatementSummary.model_fields)
    by_name = {r[0]: RestatementSummary(**dict(zip(fields, r))) for r in rows}
    listed = [c.name for c in spec.downstream]
    return [by_name[n] for n in listed if n in by_name] + [by_name[n] for n in sorted(set(by_name) - set(listed))]
