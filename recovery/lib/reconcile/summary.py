"""What a reconciliation found, as a frozen model: counts per label, per partition, totals."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.engine.base import Session
from recovery.lib.reconcile.classify import ReconcileInputs, partition_table, recon_table
from recovery.lib.reconcile.labels import LABELS


class PartitionSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    partition: str
    actual_rows: int
    expected_rows: int
    actual_total: float | None
    expected_total: float | None
    damaged_keys: int
    findings: list[str]


class ReconciliationSummary(BaseModel):
    """Counts that later phases and reports rely on; ``has_damage`` gates the repair."""

    model_config = ConfigDict(frozen=True)
    incident_id: str
    dataset: str
    failed_generations: list[str]
    watermark: datetime | None
    failed_start: datetime | None
    labels: dict[str, int]
    partition_findings: dict[str, int]
    partitions: list[PartitionSummary]
    rows_expected: int
    rows_actual: int
    total_expected: float | None
    total_actual: float | None
    basis: dict = {}  # what deleted/missing and overwritten/stale rest on: write_log, registry <table>, none
    contained: bool = True  # False: a read-only look at a target not yet fenced (nothing was recorded)
    # where out_of_order was read from: the failed generations' write log, or (a target
    # without one) the metadata columns of the rows each write left
    out_of_order_basis: str | None = None
    # what was reconciled: the whole target ("full") or the failed generations' footprint ("footprint",
    # ``footprint.py``), and the footprint's partition range (the incident's, widened to what they wrote)
    scope: str = "full"
    footprint_range: list[str] | None = None
    # a whole-table run: damaged keys outside the footprint, per label (drift, not the backfill's damage;
    # they are in ``labels`` too)
    drift_outside_footprint: dict[str, int] | None = None
    # a lakehouse target: the table whose commit log is the write log (format, table, versions, fence) and
    # the commits after the fence kept out of the repair (``recovery.lib.lakehouse.history``)
    history: dict | None = None

    @property
    def damaged_keys(self) -> int:
        return sum(self.labels.values())

    @property
    def has_damage(self) -> bool:
        return self.damaged_keys > 0 or any(self.partition_findings.values())

    @property
    def unexplained(self) -> int:
        return self.labels.get("unexplained", 0)

    @property
    def damaged_partitions(self) -> list[str]:
        return [p.partition for p in self.partitions if p.damaged_keys or p.findings]


def summarize(s: Session, inputs: ReconcileInputs, facts: dict) -> ReconciliationSummary:
    spec = inputs.spec
    table, ptable = recon_table(spec, inputs.persist), partition_table(spec, inputs.persist)
    labels = dict(
        s.fetchall(f"SELECT label, count(*) FROM {table} WHERE incident_id = ? GROUP BY 1", [inputs.incident_id])
    )
    rows = s.fetchall(
        f"SELECT CAST(partition AS VARCHAR), actual_rows, expected_rows, CAST(actual_total AS DOUBLE), "
        "CAST(expected_total AS DOUBLE), damaged_keys, partially_updated, count_mismatch, total_mismatch, "
        "written_after_fence "
        f"FROM {ptable} WHERE incident_id = ? ORDER BY 1",
        [inputs.incident_id],
    )
    parts, findings = [], {"partially_updated": 0, "count_mismatch": 0, "total_mismatch": 0, "written_after_fence": 0}
    for r in rows:
        f = [name for name, flag in zip(("partially_updated", "count_mismatch", "total_mismatch"), r[6:9]) if flag]
        if r[9]:
            f.append("written_after_fence")
        for name in f:
            findings[name] += 1
        parts.append(
            PartitionSummary(
                partition=r[0],
                actual_rows=r[1],
                expected_rows=r[2],
                actual_total=r[3],
                expected_total=r[4],
                damaged_keys=r[5],
                findings=f,
            )
        )
    return ReconciliationSummary(
        incident_id=inputs.incident_id,
        dataset=spec.dataset,
        failed_generations=list(inputs.failed_generations),
        watermark=facts["watermark"],
        failed_start=facts["failed_start"],
        labels={label: int(labels[label]) for label in LABELS if label in labels},
        partition_findings=findings,
        partitions=parts,
        rows_expected=sum(p.expected_rows for p in parts),
        rows_actual=sum(p.actual_rows for p in parts),
        total_expected=sum(p.expected_total or 0 for p in parts) if spec.target.amount else None,
        total_actual=sum(p.actual_total or 0 for p in parts) if spec.target.amount else None,
        basis=facts.get("basis", {}),
        contained=inputs.persist,
        out_of_order_basis=facts.get("out_of_order_basis"),
        scope=facts.get("scope", "full"),
        footprint_range=[fp.lo_text, fp.hi_text] if (fp := facts.get("footprint")) else None,
        drift_outside_footprint=facts.get("drift_outside_footprint"),
        history=facts.get("history"),
    )
