"""Impact on downstream consumers: each consumer's output on the damaged data vs on E.

Computed in SQL: the consumer's SQL over the expected rows (the reconciliation's
snapshot) is compared by the consumer's key with what the consumer published. A
difference is material when it reaches the spec's materiality threshold. The
decisions a difference touches depend on the consumer's kind (a statement must be
re-issued, an extract row resubmitted, a served feature corrected...).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.consumers.sql import consumer_sql, consumer_table
from recovery.lib.control.plane import dataset_table
from recovery.lib.control.tables import CONSUMER_IMPACT_COLUMNS
from recovery.lib.dataset_spec.models import Consumer, DatasetSpec, DownstreamSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, sql_literal
from recovery.lib.reconcile.expected_cache import drop_staged, stage_expected
from recovery.lib.snapshot import expected_rows_sql

DECISIONS = {
    "dashboard": "dashboard figures shown to decision makers changed",
    "report": "report figures must be re-issued",
    "statement": "customer statements must be re-issued",
    "export": "extract rows must be resubmitted",
    "feature": "features served to models changed",
    "model": "model outputs trained or scored on damaged rows",
    "experiment": "experiment readouts must be re-evaluated",
}


class ConsumerImpact(BaseModel):
    model_config = ConfigDict(frozen=True)
    consumer: str
    kind: str
    owner: str
    rows_changed: int
    rows_missing: int
    rows_extra: int
    material_rows: int
    magnitude: float | None
    decision: str

    @property
    def affected(self) -> bool:
        return self.rows_changed + self.rows_missing + self.rows_extra > 0


def impact_table(spec: DatasetSpec) -> str:
    return dataset_table("impact", spec.dataset)


def consumer_impact_sql(
    spec: DatasetSpec,
    c: Consumer,
    watermark: datetime | None,
    value_columns: list[str],
    *,
    original_relation: str | None = None,
    corrected_sql: str | None = None,
) -> str:
    """Per consumer key: original (published) vs corrected (on E) value, difference, material.

    A damaged consumer can hold a key more than once (a duplicated source row reaches an
    extract twice): the published side is taken per key, its materiality column summed
    over the copies, and a key published more than once always counts as changed.
    ``original_relation`` (a table) and ``corrected_sql`` (a SELECT) replace the two sides,
    e.g. a consumer's preserved and restated namespaces (a Dagster asset consumer gives both).
    """
    if original_relation is not None and corrected_sql is not None:
        published, corrected = original_relation, corrected_sql
    else:
        assert isinstance(c, DownstreamSpec), "a Dagster asset consumer's sides are its kept rows"
        published = original_relation or consumer_table(spec, c).sql()
        corrected = corrected_sql or consumer_sql(spec, c, expected_rows_sql(spec, watermark))
    key = ", ".join(quote(k) for k in c.key)
    key_text = " || '|' || ".join(f"coalesce(CAST({quote(k)} AS VARCHAR), '∅')" for k in c.key)
    m = c.materiality
    col = quote(m.column) if m else None
    per_key = ", ".join(
        ["count(*) AS __copies"]
        + [f"any_value({quote(v)}) AS {quote(v)}" for v in value_columns]
        + ([f"sum({col}) AS __original"] if m else [])
    )
    orig = "CAST(o.__original AS DOUBLE)" if m else "NULL"
    corr = f"CAST(n.{col} AS DOUBLE)" if m else "NULL"
    diff = f"coalesce({corr}, 0) - coalesce({orig}, 0)"
    rules = []
    if m and m.abs is not None:
        rules.append(f"abs({diff}) >= {float(m.abs)}")
    if m and m.rel is not None:
        rules.append(f"abs({diff}) >= {float(m.rel)} * abs(coalesce({orig}, 0)) AND {diff} <> 0")
    material = " OR ".join(rules) or "false"
    differs = " OR ".join(f"o.{quote(x)} IS DISTINCT FROM n.{quote(x)}" for x in value_columns) or "false"
    return f"""
        SELECT '{c.name}' AS consumer, {key_text} AS consumer_key,
               CASE WHEN o.__present IS NULL THEN 'missing' WHEN n.__present IS NULL THEN 'extra' ELSE 'changed'
                   END AS change,
               {orig} AS original_value, {corr} AS corrected_value, {diff} AS difference,
               (o.__present IS NULL OR n.__present IS NULL OR o.__copies > 1 OR ({material})) AS material
        FROM (SELECT {key}, {per_key}, true AS __present FROM {published} GROUP BY ALL) o
        FULL OUTER JOIN (SELECT *, true AS __present FROM ({corrected})) n USING ({key})
        WHERE o.__present IS NULL OR n.__present IS NULL OR o.__copies > 1 OR ({differs})
    """


def assess_impact(
    s: Session, spec: DatasetSpec, *, incident_id: str, watermark: datetime | None
) -> list[ConsumerImpact]:
    """Write per-key differences of every consumer to the control plane; return per-consumer impact."""
    table = impact_table(spec)
    s.create_table(table, CONSUMER_IMPACT_COLUMNS)
    columns = [n for n, _ in s.columns(table)]
    s.replace_rows(table, columns, remove=f"incident_id = {sql_literal(incident_id)}")
    # the expected rows, once for every consumer: each consumer's corrected side reads them, and
    # computing them per consumer resolved the whole change log again each time
    if spec.downstream:
        stage_expected(s, spec, watermark, "__impact_expected", keep=True)
    for c in spec.downstream:
        original = None
        if s.object_kind("consumers", c.name) is None:
            # never materialized here (a BI tool or another pipeline computes it): its original outcome is
            # its SQL over the damaged target, which is what it showed while the damage was published
            original = f"({consumer_sql(spec, c)})"
            values = [n for n, _ in s.relation_columns(consumer_sql(spec, c)) if n not in c.key]
        else:
            values = [n for n, _ in s.columns(consumer_table(spec, c).sql()) if n not in c.key]
        corrected = consumer_sql(spec, c, "SELECT * FROM __impact_expected")
        impact = consumer_impact_sql(spec, c, watermark, values, original_relation=original, corrected_sql=corrected)
        s.replace_rows(table, columns, insert=f"SELECT ?, * FROM ({impact})", params=[incident_id])
    drop_staged(s, "__impact_expected")
    return impact_summary(s, spec, incident_id=incident_id)


def impact_summary(s: Session, spec: DatasetSpec, *, incident_id: str) -> list[ConsumerImpact]:
    """Per-consumer impact of an incident, from the control plane."""
    rows = {
        r[0]: r
        for r in s.fetchall(
            f"SELECT consumer, count(*) FILTER (WHERE change = 'changed'), count(*) FILTER (WHERE change = 'missing'), "
            f"count(*) FILTER (WHERE change = 'extra'), count(*) FILTER (WHERE material), sum(abs(difference)) "
            f"FROM {impact_table(spec)} WHERE incident_id = ? GROUP BY 1",
            [incident_id],
        )
    }
    out = []
    for c in spec.downstream:
        r = rows.get(c.name, (c.name, 0, 0, 0, 0, None))
        out.append(
            ConsumerImpact(
                consumer=c.name,
                kind=c.kind,
                owner=c.owner,
                rows_changed=r[1],
                rows_missing=r[2],
                rows_extra=r[3],
                material_rows=r[4],
                magnitude=r[5],
                decision=DECISIONS[c.kind],
            )
        )
    return out
