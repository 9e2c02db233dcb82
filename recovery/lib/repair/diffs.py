"""Before-and-after diffs: the damaged generation against the repaired one.

"Before" is the reconciliation of the incident (keys per damage label, per
partition). "After" classifies the repair generation the same way, by pointing
the same classifier at its physical table, and stores it under the incident id
with the suffix ``~after``; per partition the rows and totals before (the
published namespace at the low watermark) and after are kept beside it.
"""

from __future__ import annotations

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all, string_literal
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.reconcile.classify import ReconcileInputs, recon_table, reconcile
from recovery.lib.repair.build import partition_total_sql
from recovery.lib.repair.plan import RepairPlan
from recovery.lib.repair.replay import latest_delta_sql
from recovery.lib.repair.tables import DIFFS, PARTITIONS
from recovery.lib.write.writer import Writer


def after_id(incident_id: str) -> str:
    return f"{incident_id}~after"


def record_diffs(s: Session, spec: DatasetSpec, plan: RepairPlan, writer: Writer) -> dict[str, tuple[int, int]]:
    """Classify the repair generation and store per-partition, per-label counts. Returns label -> (before, after).

    "After" is judged against the fixed snapshot; keys that concurrent writes changed since
    the low watermark (replayed from the delta, counted there) are left out, so ingestion
    that lags the source is not mistaken for damage."""
    ns_spec = spec.model_copy(update={"target": spec.target.model_copy(update={"table": plan.namespace})})
    after = after_id(plan.incident_id)
    reconcile(
        s,
        ReconcileInputs(
            ns_spec, tuple(plan.failed_generations), watermark=plan.source_watermark, incident_id=after, reuse_kept=True
        ),
    )
    recon = recon_table(spec)
    key = quote_all(spec.key)
    s.replace_rows(
        recon,
        [],
        remove=f"incident_id = {string_literal(after)} AND ({key}) IN (SELECT {key} FROM "
        f"({latest_delta_sql(writer, plan, plan.low_seq, plan.high_seq or plan.low_seq)}))",
    )
    s.execute(f"DELETE FROM {DIFFS} WHERE incident_id = ?", [plan.incident_id])
    s.replace_rows(  # the control-plane rows read the (data-plane) reconciliation
        DIFFS,
        [n for n, _ in s.columns(DIFFS)],
        insert=f"""
        SELECT ?, partition, label, count(*) FILTER (WHERE side = 'before'), count(*) FILTER (WHERE side = 'after')
            FROM (
            SELECT CAST(coalesce(actual_partition, expected_partition) AS VARCHAR) AS partition, label,
                   CASE WHEN incident_id = ? THEN 'before' ELSE 'after' END AS side
            FROM {recon} WHERE incident_id IN (?, ?))
        GROUP BY ALL""",
        params=[plan.incident_id, plan.incident_id, plan.incident_id, after_id(plan.incident_id)],
    )
    part = quote(spec.target.partition)
    total = partition_total_sql(spec)
    s.collect_table(  # the namespace's partition totals, for the control-plane UPDATE
        "__diff_totals",
        f"SELECT CAST({part} AS VARCHAR) AS p, count(*) AS n, {total} AS t FROM {namespace_sql(plan.namespace)} "
        "GROUP BY 1",
    )
    s.execute(
        f"""UPDATE {PARTITIONS} SET rows_after = coalesce(a.n, 0), total_after = a.t
        FROM __diff_totals a WHERE incident_id = ? AND partition = a.p""",
        [plan.incident_id],
    )
    s.drop_relation("__diff_totals")
    rows = s.fetchall(
        f"SELECT label, sum(keys_before), sum(keys_after) FROM {DIFFS} WHERE incident_id = ? GROUP BY 1 ORDER BY 1",
        [plan.incident_id],
    )
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def label_diffs(s: Session, incident_id: str) -> dict[str, tuple[int, int]]:
    rows = s.fetchall(
        f"SELECT label, sum(keys_before), sum(keys_after) FROM {DIFFS} WHERE incident_id = ? GROUP BY 1 ORDER BY 1",
        [incident_id],
    )
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def partition_diffs(s: Session, incident_id: str) -> list[dict]:
    """Per partition: action, rows and totals before / expected / after."""
    cols = [
        "partition",
        "wave",
        "action",
        "qualified_reason",
        "labels",
        "rows_before",
        "total_before",
        "rows_expected",
        "total_expected",
        "rows_after",
        "total_after",
        "status",
    ]
    rows = s.fetchall(
        f"SELECT {', '.join(cols)} FROM {PARTITIONS} WHERE incident_id = ? ORDER BY partition", [incident_id]
    )
    return [dict(zip(cols, r)) for r in rows]
