"""The restatement ledger: history restated, never erased.

One row per incident, consumer and consumer key whose published value changed:
the original value (from the preserved output the damage reached), the corrected
value (from the restated output), the difference, whether it is material (the
spec's materiality threshold; for an experiment, also a change of sign), the
owner, the decision it affects, both namespaces, and when the owner was notified.
Rows are computed in SQL by the same per-key comparison as the impact assessment
(``recovery.lib.consumers.impact.consumer_impact_sql``) and replaced per incident and
consumer, so a re-run gives the same rows; ``notified_at`` comes from the
notification's delivery record, so it survives a re-run too.
"""

from __future__ import annotations

from recovery.lib.consumers.impact import consumer_impact_sql
from recovery.lib.control.plane import dataset_table
from recovery.lib.control.tables import (
    DECISIONS_LEDGER,
    DECISIONS_LEDGER_DDL,
    NOTIFICATIONS,
    NOTIFICATIONS_DDL,
    RESTATEMENT_LEDGER_COLUMNS,
)
from recovery.lib.dataset_spec.models import Consumer, DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import TableName, quote, sql_literal

# what a material change of one key obliges its owner to do, by consumer kind
ROW_DECISIONS = {
    "dashboard": "dashboard figure corrected",
    "report": "report re-issue",
    "statement": "statement re-issue",
    "export": "extract row resubmit",
    "feature": "served feature correction",
    "model": "model output review",
    "experiment": "experiment readout changes significance",
}
SIGN_CHANGE = "experiment readout changes sign"
BELOW_MATERIALITY = "none: below materiality"


def ledger_table(spec: DatasetSpec) -> str:
    return dataset_table("restatement_ledger", spec.dataset)


def notice_key(spec: DatasetSpec, incident_id: str, consumer: str) -> str:
    """Dedupe key of the owner's notice: one per incident and consumer, whatever the re-runs."""
    return f"restatement:{spec.dataset}:{incident_id}:{consumer}"


def ensure_ledger(s: Session, spec: DatasetSpec) -> None:
    s.execute(NOTIFICATIONS_DDL)
    s.create_table(ledger_table(spec), RESTATEMENT_LEDGER_COLUMNS)


def _sign_change(kind: str) -> str:
    if kind != "experiment":
        return "false"
    return (
        "(i.original_value IS NOT NULL AND i.corrected_value IS NOT NULL "
        "AND sign(i.original_value) <> sign(i.corrected_value))"
    )


def write_ledger(
    s: Session,
    spec: DatasetSpec,
    c: Consumer,
    *,
    incident_id: str,
    original_namespace: str | None,
    corrected_namespace: str,
) -> None:
    """Replace the incident's ledger rows for consumer ``c``; the caller owns the transaction."""
    ensure_ledger(s, spec)
    table = ledger_table(spec)
    remove = f"incident_id = {sql_literal(incident_id)} AND consumer = {sql_literal(c.name)}"
    if original_namespace is None:  # never published before: nobody saw a wrong value
        s.replace_rows(table, [], remove=remove)
        return
    original = TableName.parse(original_namespace).sql()
    corrected = TableName.parse(corrected_namespace).sql()
    corrected_cols = {n for n, _ in s.columns(corrected)}
    values = [n for n, _ in s.columns(original) if n not in c.key and n in corrected_cols]
    impact = consumer_impact_sql(
        spec, c, None, values, original_relation=original, corrected_sql=f"SELECT * FROM {corrected}"
    )
    flip = _sign_change(c.kind)
    s.replace_rows(
        table,
        [n for n, _ in s.columns(table)],
        remove=remove,
        insert=f"""
            SELECT ?, i.consumer, ?, ?, i.consumer_key, i.change, i.original_value, i.corrected_value, i.difference,
                   i.material OR {flip} AS material,
                   CASE WHEN {flip} THEN ? WHEN i.material THEN ? ELSE ? END AS decision,
                   ?, ?, n.delivered_at
            FROM ({impact}) i LEFT JOIN {NOTIFICATIONS} n ON n.dedupe_key = ?""",
        params=[
            incident_id,
            c.kind,
            c.owner,
            SIGN_CHANGE,
            ROW_DECISIONS[c.kind],
            BELOW_MATERIALITY,
            original_namespace,
            corrected_namespace,
            notice_key(spec, incident_id, c.name),
        ],
    )


def write_decisions(
    s: Session,
    spec: DatasetSpec,
    c: Consumer,
    *,
    incident_id: str,
    material_rows: int,
    original_total: float | None,
    corrected_total: float | None,
) -> None:
    """One row per decision the spec says consumer ``c``'s output fed: whether it crossed
    materiality (the restated output has material rows), the remediation owed, and the output's
    original vs corrected total. Replaced per incident and consumer, so a re-run gives the same rows."""
    s.execute(DECISIONS_LEDGER_DDL)
    s.execute(
        f"DELETE FROM {DECISIONS_LEDGER} WHERE incident_id = ? AND dataset = ? AND consumer = ?",
        [incident_id, spec.dataset, c.name],
    )
    for d in c.decisions:
        s.execute(
            f"INSERT INTO {DECISIONS_LEDGER} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                incident_id,
                spec.dataset,
                c.name,
                d.name,
                material_rows > 0,
                material_rows,
                d.remediation if material_rows > 0 else BELOW_MATERIALITY,
                original_total,
                corrected_total,
            ],
        )


def ledger_counts(s: Session, spec: DatasetSpec, *, incident_id: str, consumer: str) -> dict[str, int]:
    row = s.fetchrow(
        f"SELECT count(*) FILTER (WHERE change = 'changed'), count(*) FILTER (WHERE change = 'missing'), "
        f"count(*) FILTER (WHERE change = 'extra'), count(*) FILTER (WHERE material) "
        f"FROM {ledger_table(spec)} WHERE incident_id = ? AND consumer = ?",
        [incident_id, consumer],
    )
    return dict(zip(("changed", "missing", "extra", "material"), (int(x or 0) for x in row)))


def output_total(s: Session, namespace: str | None, c: Consumer) -> float | None:
    """Sum of the consumer's materiality column over one of its namespaces."""
    if namespace is None or c.materiality is None:
        return None
    v = s.scalar(f"SELECT CAST(sum({quote(c.materiality.column)}) AS DOUBLE) FROM {TableName.parse(namespace).sql()}")
    return None if v is None else float(v)


def ledger_items(
    s: Session, spec: DatasetSpec, *, incident_id: str, consumer: str, limit: int | None = None
) -> list[tuple]:
    """(consumer_key, change, original, corrected, difference, material, decision): material first, largest first."""
    lim = f" LIMIT {int(limit)}" if limit else ""
    return s.fetchall(
        f"SELECT consumer_key, change, original_value, corrected_value, difference, material, decision "
        f"FROM {ledger_table(spec)} WHERE incident_id = ? AND consumer = ? "
        f"ORDER BY material DESC, abs(difference) DESC NULLS FIRST, consumer_key{lim}",
        [incident_id, consumer],
    )
