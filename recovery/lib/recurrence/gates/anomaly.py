"""The anomaly gate: each backfilled partition's row count and amount total against the
published generation and against history.

One row per partition is computed in SQL: the new generation's rows and total, the
published generation's, and the median of the published partitions outside the range
(history). A partition whose rows or total moved past the spec's thresholds
(``recurrence.anomaly``) relative to published, or that lies beyond ``history_factor``
of the history median while the backfill changed it, is an anomaly. The frame is
small (one row per partition) and is validated by Great Expectations.
"""

from __future__ import annotations

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.recurrence.gates.values import Declared
from recovery.lib.repair.suites import Expectation, Suite, SuiteRunner


def _totals_checked(spec: DatasetSpec, declared: Declared | None) -> bool:
    """Totals are compared unless there is no amount column or the request declares changing it."""
    amount = spec.target.amount
    if not amount:
        return False
    return not (declared is not None and declared.covers(amount))


def anomaly_frame_sql(
    s: Session,
    spec: DatasetSpec,
    namespace: str,
    published: str,
    partitions: list[str],
    declared: Declared | None = None,
) -> str:
    part = quote(spec.target.partition)
    amount = spec.target.amount
    total = (
        f"CAST(sum({quote(amount)}) AS DOUBLE)"
        if amount and _totals_checked(spec, declared)
        else "CAST(NULL AS DOUBLE)"
    )
    inside = in_partitions(s, spec, partitions)
    agg = lambda ns, where: (
        f"SELECT CAST({part} AS VARCHAR) AS p, count(*) AS n, {total} AS t "  # noqa: E731
        f"FROM {namespace_sql(ns)} WHERE {where} GROUP BY 1"
    )
    return f"""
        WITH sc AS (SELECT unnest(CAST(? AS VARCHAR[])) AS p),
             a AS ({agg(namespace, inside)}), b AS ({agg(published, inside)}),
             h AS (SELECT median(n) AS mn, median(t) AS mt FROM ({agg(published, f"NOT ({inside})")})),
             f AS (SELECT sc.p AS partition, coalesce(a.n, 0) AS rows, a.t AS total, coalesce(b.n, 0) AS published_rows,
                          b.t AS published_total, h.mn AS history_rows, h.mt AS history_total
                   FROM sc LEFT JOIN a USING (p) LEFT JOIN b USING (p) CROSS JOIN h)
        SELECT *,
               CASE WHEN published_rows > 0 OR rows > 0 THEN abs(rows - published_rows) / greatest(published_rows, 1)
                   END AS row_change,
               CASE WHEN coalesce(published_total, 0) <> 0
                    THEN abs(coalesce(total, 0) - published_total) / abs(published_total)
                    WHEN coalesce(total, 0) <> 0 THEN 1e9 END AS total_change,
               CASE WHEN (rows <> published_rows OR total IS DISTINCT FROM published_total) AND history_rows > 0
                    THEN rows / history_rows END AS history_rows_ratio,
               CASE WHEN (rows <> published_rows OR total IS DISTINCT FROM published_total) AND history_total > 0
                    THEN coalesce(total, 0) / history_total END AS history_total_ratio
        FROM f ORDER BY partition
    """


def anomaly_suite(spec: DatasetSpec, declared: Declared | None = None) -> Suite:
    a = spec.recurrence_policy.anomaly
    E = Expectation
    exps = [
        E(
            "expect_column_values_to_be_between",
            {"column": "row_change", "min_value": 0, "max_value": a.max_row_change},
        ),
        E(
            "expect_column_values_to_be_between",
            {"column": "history_rows_ratio", "min_value": 1 / a.history_factor, "max_value": a.history_factor},
        ),
    ]
    if _totals_checked(spec, declared):
        exps += [
            E(
                "expect_column_values_to_be_between",
                {"column": "total_change", "min_value": 0, "max_value": a.max_total_change},
            ),
            E(
                "expect_column_values_to_be_between",
                {"column": "history_total_ratio", "min_value": 1 / a.history_factor, "max_value": a.history_factor},
            ),
        ]
    return Suite("anomaly", tuple(exps))


def evaluate_anomaly(
    s: Session,
    spec: DatasetSpec,
    namespace: str,
    published: str,
    partitions: list[str],
    declared: Declared | None = None,
) -> GateResult:
    a = spec.recurrence_policy.anomaly
    frame = s.arrow(anomaly_frame_sql(s, spec, namespace, published, partitions, declared), [partitions]).to_pandas()
    runner = SuiteRunner([anomaly_suite(spec, declared)])
    runner.validate(frame)
    result = runner.results["anomaly"]
    lo, hi = 1 / a.history_factor, a.history_factor

    def out(col, limit_lo, limit_hi):
        v = frame[col]
        return v.notna() & ((v < limit_lo) | (v > limit_hi))

    flagged = frame[
        out("row_change", 0, a.max_row_change)
        | out("total_change", 0, a.max_total_change)
        | out("history_rows_ratio", lo, hi)
        | out("history_total_ratio", lo, hi)
    ]
    if result.passed and flagged.empty:
        return GateResult(
            "anomaly",
            True,
            0,
            f"{len(frame)} partitions within {a.max_row_change:.0%} rows / "
            f"{a.max_total_change:.0%} totals of published and {hi}x of history",
        )

    def fmt(r) -> str:
        total = f"total {r.total or 0:,.2f} vs {r.published_total or 0:,.2f}" if _totals_checked(spec, declared) else ""
        return (
            f"{r.partition}: rows {r.rows:,} vs {r.published_rows:,} published, "
            f"{total} (history median {r.history_rows:,.0f} rows)"
        )

    details = (
        f"{len(flagged)} partition(s) past the thresholds (rows {a.max_row_change:.0%}, "
        f"totals {a.max_total_change:.0%} "
        f"of published; {hi}x history): " + "; ".join(fmt(r) for r in flagged.head(5).itertuples())
    )
    return GateResult("anomaly", False, len(flagged), details)
