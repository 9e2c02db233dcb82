"""Partition-level findings beside the key labels.

- ``partially_updated``: the failed generation rewrote part of the partition while rows
  another generation wrote before the failed one started are still there;
- ``count_mismatch`` / ``total_mismatch``: rows or amount totals disagree with E;
- ``written_after_fence``: rows of a failed generation stamped after its fence.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.reconcile.footprint import Footprint
from recovery.lib.reconcile.inputs import ReconcileInputs, side
from recovery.lib.snapshot import str_list, ts_literal


def expected_partition_rows_sql(spec: DatasetSpec) -> str:
    """E's partition and amount columns, one row per expected row, without reading E again: the
    target's rows the diff left out (one copy of a key, equal to its expected row in every column)
    and the expected side of the diff, once per key. The same multiset as E's, so counts and totals
    (exact types' sums included) are E's own. A target row with a NULL key matches no expected
    row, so the diff holds it; it is not one of the equal rows."""
    meta = spec.target.metadata
    wanted = [c for c in (spec.target.partition, spec.target.amount) if c]
    cols = ", ".join(quote(c) for c in wanted)
    key = quote_all(spec.key)
    non_null = " AND ".join(f"{quote(k)} IS NOT NULL" for k in spec.key)
    sides = ", ".join(f"{side('e', c)} AS {quote(c)}" for c in wanted)
    firsts = ", ".join(f"min({side('e', c)}) AS {quote(c)}" for c in wanted)
    in_e = f"{side('e', meta.source_version)} IS NOT NULL"
    return (
        f"SELECT {cols} FROM {spec.target.table_name.sql()} ANTI JOIN __diff USING ({key}) WHERE {non_null} "
        f"UNION ALL SELECT {sides} FROM __diff WHERE {in_e} AND coalesce(__n, 1) = 1 "
        f"UNION ALL SELECT {cols} FROM (SELECT {key}, {firsts} FROM __diff WHERE {in_e} AND __n > 1 GROUP BY ALL)"
    )


def partition_findings_sql(
    inputs: ReconcileInputs, start: datetime | None, footprint: Footprint | None = None, expected: str = "__e"
) -> str:
    """One row per partition; with a ``footprint``, the partitions of its range only (their counts
    and totals are whole: every key expected or held there is in the footprint). ``expected``: a
    relation with E's partition and amount columns (E itself, or ``expected_partition_rows_sql`` in parentheses)."""
    spec = inputs.spec
    meta = spec.target.metadata
    p, gen, wat = quote(spec.target.partition), quote(meta.generation), quote(meta.written_at)
    gens = str_list(list(inputs.failed_generations))
    amount = f"sum({quote(spec.target.amount)})" if spec.target.amount else "CAST(NULL AS DECIMAL(38, 2))"
    before = f"{wat} < {ts_literal(start)}" if start else "false"
    fence = (
        f"(SELECT min(fenced_at) FROM {SCHEMA}.fences WHERE generation IN ({gens}))"
        if inputs.persist
        else "CAST(NULL AS TIMESTAMP)"
    )  # not fenced yet: nothing can have been written after a fence
    within = (lambda c: f" WHERE {footprint.between(c)}") if footprint else (lambda c: "")  # noqa: E731
    return f"""
    WITH tp AS (
        SELECT {p} AS p, count(*) AS actual_rows, {amount} AS actual_total,
               count(*) FILTER (WHERE {gen} IN ({gens})) AS failed_rows,
               count(*) FILTER (WHERE {gen} NOT IN ({gens}) AND {before}) AS older_rows,
               count(*) FILTER (WHERE {gen} IN ({gens}) AND {wat} > {fence}) AS written_after_fence
        FROM {spec.target.table_name.sql()}{within(p)} GROUP BY 1),
    ep AS (SELECT {p} AS p, count(*) AS expected_rows, {amount} AS expected_total FROM {expected}{within(p)}
        GROUP BY 1),
    lp AS (SELECT coalesce(actual_partition, expected_partition) AS p, count(*) AS damaged_keys FROM __recon
           {within("coalesce(actual_partition, expected_partition)")} GROUP BY 1)
    SELECT p AS partition,
           coalesce(actual_rows, 0) AS actual_rows, coalesce(expected_rows, 0) AS expected_rows,
           actual_total, expected_total,
           coalesce(failed_rows, 0) AS failed_rows,
           coalesce(failed_rows, 0) > 0 AND coalesce(older_rows, 0) > 0 AS partially_updated,
           coalesce(actual_rows, 0) <> coalesce(expected_rows, 0) AS count_mismatch,
           actual_total IS DISTINCT FROM expected_total AS total_mismatch,
           coalesce(written_after_fence, 0) AS written_after_fence,
           coalesce(damaged_keys, 0) AS damaged_keys
    FROM tp FULL OUTER JOIN ep USING (p) FULL OUTER JOIN lp USING (p)
    ORDER BY p
    """
