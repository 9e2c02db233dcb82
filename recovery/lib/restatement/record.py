"""One consumer's restatement, recorded: the ledger, its decisions, the restatement row, the timeline.

Shared by both kinds of consumer: a SQL consumer restated by ``restate.py`` and a Dagster
asset restated by ``assets.py`` end the same way, with an original and a corrected
namespace compared key by key.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib import faults
from recovery.lib.consumers.impact import DECISIONS
from recovery.lib.consumers.outputs import RESTATEMENTS, original_basis
from recovery.lib.control.plane import EventSource, next_seq, utcnow
from recovery.lib.convergence.scope import applied_watermark
from recovery.lib.dataset_spec.models import Consumer, DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote_all
from recovery.lib.restatement.checks import RestatementCheck
from recovery.lib.restatement.ledger import ledger_counts, ledger_table, output_total, write_decisions, write_ledger


class ConsumerRestatement(BaseModel):
    """One consumer restated for one incident."""

    model_config = ConfigDict(frozen=True)
    incident_id: str
    consumer: str
    kind: str
    owner: str
    decision: str
    original_namespace: str | None
    corrected_namespace: str
    reused: bool  # the corrected namespace of an earlier run, still current and exact
    rows_changed: int
    rows_missing: int
    rows_extra: int
    material_rows: int
    original_total: float | None
    corrected_total: float | None
    watermark: datetime | None
    notified_at: datetime | None = None
    # rows where the corrected output differs from the consumer on the source's expected rows;
    # None until source_mismatches has compared them (restate_consumers always does)
    mismatches_vs_source: int | None = None
    original_basis: str = ""  # kept as materialized, or computed from the preserved damaged generation
    check: RestatementCheck | None = None  # the restatement's own check (``checks.py``), once made

    @property
    def ledger_rows(self) -> int:
        return self.rows_changed + self.rows_missing + self.rows_extra

    @property
    def affected(self) -> bool:
        return self.ledger_rows > 0


def mismatched_rows(s: Session, a_sql: str, b_sql: str) -> int:
    """Rows in one relation and not the other (multiset difference, both ways); -1 when their columns differ.

    One pass over each side: every row tallied +1 from ``a`` and -1 from ``b``, grouped by all its
    columns (NULLs group together, as in ``EXCEPT ALL``); what does not cancel is the difference.
    ``EXCEPT ALL`` both ways computes each side twice, and a side is a consumer's SQL over the
    whole expected table."""
    columns = [c for c, _ in s.relation_columns(a_sql)]
    if columns != [c for c, _ in s.relation_columns(b_sql)]:
        return -1
    tallied = f"SELECT *, 1 AS __side FROM ({a_sql}\n) UNION ALL SELECT *, -1 AS __side FROM ({b_sql}\n)"
    return int(
        s.scalar(
            f"SELECT coalesce(sum(abs(__n)), 0) FROM "
            f"(SELECT sum(__side) AS __n FROM ({tallied}) GROUP BY {quote_all(columns)})"
        )
        or 0
    )


def record_restatement(
    s: Session,
    spec: DatasetSpec,
    c: Consumer,
    *,
    incident_id: str,
    original: str | None,
    corrected: str,
    reused: bool,
    actor: str,
    run_id: str | None,
    basis: str | None = None,
) -> ConsumerRestatement:
    """Write the ledger (original vs corrected namespace), the decisions and the restatement record of
    consumer ``c``, and put it on the timeline; ``basis`` says where the original came from (default:
    read from the consumer builds). The caller owns the transaction."""
    write_ledger(s, spec, c, incident_id=incident_id, original_namespace=original, corrected_namespace=corrected)
    faults.checkpoint("restate:ledger_written")
    counts = ledger_counts(s, spec, incident_id=incident_id, consumer=c.name)
    watermark = applied_watermark(s, spec)
    totals = output_total(s, original, c), output_total(s, corrected, c)
    write_decisions(
        s,
        spec,
        c,
        incident_id=incident_id,
        material_rows=counts["material"],
        original_total=totals[0],
        corrected_total=totals[1],
    )
    faults.checkpoint("restate:decisions_written")
    seq = next_seq(s)
    s.execute(
        f"DELETE FROM {RESTATEMENTS} WHERE incident_id = ? AND dataset = ? AND consumer = ?",
        [incident_id, spec.dataset, c.name],
    )
    s.replace_rows(  # the control-plane row reads the (data-plane) ledger
        RESTATEMENTS,
        [n for n, _ in s.columns(RESTATEMENTS)],
        insert="SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
        f"(SELECT max(notified_at) FROM {ledger_table(spec)} WHERE incident_id = ? AND consumer = ?)",
        params=[
            incident_id,
            spec.dataset,
            c.name,
            c.kind,
            c.owner,
            original,
            corrected,
            counts["changed"] + counts["missing"] + counts["extra"],
            counts["material"],
            totals[0],
            totals[1],
            watermark,
            utcnow(),
            run_id,
            seq,
            incident_id,
            c.name,
        ],
    )
    faults.checkpoint("restate:row_recorded")
    notified = s.scalar(
        f"SELECT notified_at FROM {RESTATEMENTS} WHERE incident_id = ? AND dataset = ? AND consumer = ?",
        [incident_id, spec.dataset, c.name],
    )
    result = ConsumerRestatement(
        incident_id=incident_id,
        consumer=c.name,
        kind=c.kind,
        owner=c.owner,
        decision=DECISIONS[c.kind],
        original_namespace=original,
        corrected_namespace=corrected,
        reused=reused,
        rows_changed=counts["changed"],
        rows_missing=counts["missing"],
        rows_extra=counts["extra"],
        material_rows=counts["material"],
        original_total=totals[0],
        corrected_total=totals[1],
        watermark=watermark,
        notified_at=notified,
        original_basis=basis if basis is not None else original_basis(s, original),
    )
    EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor, run_id=run_id).record(
        s,
        "restatement",
        f"{c.name} restated into {corrected}"
        + (f" (original kept in {original})" if original and original != corrected else "")
        + f": {result.ledger_rows:,} keys changed, {result.material_rows:,} material",
        {
            "consumer": c.name,
            "original_namespace": original,
            "corrected_namespace": corrected,
            "reused": reused,
            "material_rows": result.material_rows,
        },
    )
    faults.checkpoint("restate:recorded")  # everything written, not committed
    return result
