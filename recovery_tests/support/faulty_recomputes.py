"""Recomputes that each carry one realistic backfill bug, for the recurrence gates' matrix.

Each is the correct recompute (the spec's transform over the source as of the
backfill's watermark, restricted to the range) with one bug applied in SQL, written
through the writer as the backfill's generation, exactly as a real recompute would.
The bug is spelled per dataset (column names differ) in ``BUGS``; the functions are
importable by name (``recovery_tests.support.faulty_recomputes:unit_change``), so the CLI and
the Dagster job can run them too.

Datasets: ``transactions`` (the worked example: DATE partitions, a DECIMAL amount,
VARCHAR ids, a TIMESTAMP) and ``orders`` (``recurrence_orders``: a composite key,
VARCHAR shard partitions, INTEGER, DOUBLE, BOOLEAN, DATE and TIMESTAMP columns, no
amount column).
"""

from __future__ import annotations

from recovery.lib.identifiers import quote, quote_all
from recovery.lib.recurrence.recompute import RecomputeContext
from recovery.lib.snapshot import expected_rows_sql, latest_versions_sql, str_list
from recovery_tests.support.rows import present

# {rows}: the correct rows of the range. {source_upserts}: the latest upsert of every key, tombstones ignored.
# {stale}: a snapshot one version behind (every key's last correction missed).
BUGS: dict[str, dict[str, str]] = {
    "transactions": {
        "unit_change": "SELECT * REPLACE (CAST(amount_usd * 100 AS DECIMAL(18, 2)) AS amount_usd) FROM {rows}",
        "sign_flip": "SELECT * REPLACE (-amount_usd AS amount_usd) FROM {rows}",
        "swapped_columns": "SELECT * REPLACE (customer_id AS account_id, account_id AS customer_id) FROM {rows}",
        "column_nulled": "SELECT * REPLACE (CAST(NULL AS VARCHAR) AS status) FROM {rows}",
        "timezone_shift": "SELECT * REPLACE (event_ts + INTERVAL 5 HOUR AS event_ts) FROM {rows}",
        "rounding": "SELECT * REPLACE (CAST(round(amount_usd) AS DECIMAL(18, 2)) AS amount_usd) FROM {rows}",
        "lookup_fanout": "SELECT r.* FROM {rows} r JOIN (SELECT 1 AS copy UNION ALL SELECT 2) l "
        "ON l.copy = 1 OR hash(r.merchant_id) % 4 = 0",
        "duplicate_retries": "SELECT * FROM {rows} UNION ALL SELECT * FROM {rows} "
        "WHERE event_date = (SELECT min(event_date) FROM {rows})",
        "half_dropped": "SELECT * FROM {rows} WHERE hash(txn_id) % 2 = 0",
        "stale_snapshot": "SELECT * FROM {stale} WHERE {in_range}",
        "tombstones_ignored": "SELECT * FROM {source_upserts} WHERE {in_range}",
        "wrong_partition": "SELECT * REPLACE (event_date + INTERVAL 1 DAY AS event_date) FROM {rows}",
    },
    "orders": {
        "unit_change": "SELECT * REPLACE (price * 100 AS price) FROM {rows}",
        "sign_flip": "SELECT * REPLACE (-qty AS qty) FROM {rows}",
        "swapped_columns": "SELECT * REPLACE (CAST(qty AS DOUBLE) AS price, CAST(price AS INTEGER) AS qty) FROM {rows}",
        "column_nulled": "SELECT * REPLACE (CAST(NULL AS BOOLEAN) AS bulk) FROM {rows}",
        "timezone_shift": "SELECT * REPLACE (placed_at - INTERVAL 8 HOUR AS placed_at, "
        "CAST(placed_at - INTERVAL 8 HOUR AS DATE) AS placed_on) FROM {rows}",
        "rounding": "SELECT * REPLACE (round(price, -1) AS price) FROM {rows}",
        "lookup_fanout": "SELECT r.* FROM {rows} r JOIN (SELECT 1 AS copy UNION ALL SELECT 2) l "
        "ON l.copy = 1 OR r.sku IN ('SKU-001', 'SKU-002', 'SKU-003')",
        "duplicate_retries": "SELECT * FROM {rows} UNION ALL SELECT * FROM {rows} WHERE shard = (SELECT min(shard) "
        "FROM {rows})",
        "half_dropped": "SELECT * FROM {rows} WHERE hash(order_no) % 2 = 0",
        "stale_snapshot": "SELECT * FROM {stale} WHERE {in_range}",
        "tombstones_ignored": "SELECT * FROM {source_upserts} WHERE {in_range}",
        "wrong_partition": "SELECT * REPLACE (region || '-' || strftime(placed_at + INTERVAL 31 DAY, '%Y%m') AS shard) "
        "FROM {rows}",
    },
}


def _write(ctx: RecomputeContext, bug: str) -> None:
    spec = ctx.writer.spec
    in_range = (
        f"CAST({quote(spec.target.partition)} AS VARCHAR) IN ({str_list(ctx.partitions)})"
        if ctx.partitions
        else "false"
    )
    src = spec.source
    watermark = present(ctx.watermark)  # the guarded launcher gives every recompute its watermark
    upserts = (
        f"SELECT * FROM {src.table_name.sql()} WHERE {quote(src.op)} IN ({str_list(src.upsert_ops)}) "
        f"AND {quote(src.ingested_at)} <= TIMESTAMP '{watermark.isoformat(sep=' ')}' "
        f"QUALIFY row_number() OVER (PARTITION BY {quote_all(spec.key)} ORDER BY {quote(src.version)} DESC) = 1"
    )
    source_upserts = f"({expected_rows_sql(spec, ctx.watermark, source_relation=upserts)})"
    key, version = quote_all(spec.key), quote(src.version)
    latest = latest_versions_sql(spec, ctx.watermark, include_deleted=True)
    behind = (
        f"SELECT * EXCLUDE (__rn, __n) FROM (SELECT src.*, row_number() OVER (PARTITION BY {key} "
        f"ORDER BY {version} DESC) "
        f"AS __rn, count(*) OVER (PARTITION BY {key}) AS __n FROM {src.table_name.sql()} src "
        f"WHERE {quote(src.ingested_at)} <= TIMESTAMP '{watermark.isoformat(sep=' ')}' "
        f"AND {quote(src.op)} IN ({str_list(src.upsert_ops)})) WHERE __rn = least(2, __n) "
        f"AND ({key}) NOT IN (SELECT ({key}) FROM ({latest}) WHERE {quote(src.op)} IN ({str_list(src.delete_ops)}))"
    )
    stale = f"({expected_rows_sql(spec, ctx.watermark, source_relation=behind)})"
    correct = f"(SELECT * FROM ({expected_rows_sql(spec, ctx.watermark)}) WHERE {in_range})"
    sql = BUGS[spec.dataset][bug].format(rows=correct, stale=stale, in_range=in_range, source_upserts=source_upserts)
    ctx.writer.write(
        ctx.generation,
        sql,
        mode="replace_partitions",
        partitions=ctx.partitions,
        run_id=ctx.run_id,
        note=f"faulty recompute ({bug}) of guarded backfill {ctx.backfill_id}",
    )


def _faulty(bug: str):
    def recompute(ctx: RecomputeContext) -> None:
        _write(ctx, bug)

    recompute.__name__ = bug
    recompute.__doc__ = f"The correct recompute with one bug: {bug.replace('_', ' ')}."
    return recompute


unit_change = _faulty("unit_change")
sign_flip = _faulty("sign_flip")
swapped_columns = _faulty("swapped_columns")
column_nulled = _faulty("column_nulled")
timezone_shift = _faulty("timezone_shift")
rounding = _faulty("rounding")
lookup_fanout = _faulty("lookup_fanout")
duplicate_retries = _faulty("duplicate_retries")
half_dropped = _faulty("half_dropped")
stale_snapshot = _faulty("stale_snapshot")
tombstones_ignored = _faulty("tombstones_ignored")
wrong_partition = _faulty("wrong_partition")

MATRIX = tuple(BUGS["transactions"])
