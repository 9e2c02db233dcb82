"""The worked example's normal ingestion while the repair runs.

The runbook's repair happens "while normal ingestion keeps running": the simulated
producer keeps appending changes after the incident's last ingestion, and the
example's own ``ingest_transactions`` job applies them to the *published* table
between the repair's canary and its waves. The repair must then carry them into
its generation by replaying the delta (what the recovery report's "concurrent
writes preserved" counts).

The changes are chosen deterministically from the source as it stands (by a hash
of the key): corrections of existing transactions (late ones for old partitions
included, some of them keys the backfill damaged), tombstones, and new
transactions of the current day, each one version above the key's latest, with
``ingested_at`` spread over ``(scenario.end, scenario.repair_ingest]``.
"""

from __future__ import annotations

from recovery.example.scenario import SCENARIO, Scenario
from recovery.lib.snapshot import ts_literal as _ts


def release_repair_window_events(con, *, scenario: Scenario = SCENARIO, per_million: int = 400) -> int:
    """Append the changes that arrive during the repair to ``raw.transaction_events``; idempotent
    (a second call finds them there and adds nothing). Returns how many were appended."""
    lo, hi = scenario.end, scenario.repair_ingest
    if con.execute(f"SELECT count(*) FROM raw.transaction_events WHERE ingested_at > {_ts(lo)}").fetchone()[0]:
        return 0
    n_keys = con.execute("SELECT count(DISTINCT txn_id) FROM raw.transaction_events").fetchone()[0]
    n = max(40, n_keys * per_million // 1_000_000)
    span_us = int((hi - lo).total_seconds() * 1e6)
    con.execute(f"""
        INSERT INTO raw.transaction_events
        WITH latest AS (
            SELECT * FROM raw.transaction_events
            QUALIFY row_number() OVER (PARTITION BY txn_id ORDER BY version DESC) = 1),
        picked AS (
            SELECT *, row_number() OVER (ORDER BY hash(txn_id, 'repair-window')) AS n
            FROM latest WHERE op = 'upsert'),
        changes AS (
            SELECT * REPLACE (CAST(amount * 1.10 + 1 AS DECIMAL(18, 2)) AS amount, 'settled' AS status,
                              version + 1 AS version)
            FROM picked WHERE n <= {n // 2}
            UNION ALL
            SELECT * REPLACE ('delete' AS op, version + 1 AS version)
            FROM picked WHERE n > {n // 2} AND n <= {n * 3 // 4}
            UNION ALL
            SELECT * REPLACE (txn_id + (SELECT max(txn_id) FROM latest) AS txn_id, 1 AS version, 2 AS schema_version,
                              CASE WHEN schema_version = 1 THEN CAST(amount / 100 AS DECIMAL(18, 2)) ELSE amount
                                  END AS amount,
                              'USD' AS currency, TIMESTAMP '{scenario.last_day.isoformat()} 05:30:00' AS event_ts)
            FROM picked WHERE n > {n * 3 // 4} AND n <= {n})
        SELECT * EXCLUDE (n, ingested_at), {_ts(lo)} + to_microseconds(CAST({span_us} * n / {n + 1} AS
            BIGINT)) AS ingested_at
        FROM changes ORDER BY ingested_at, txn_id
    """)
    return con.execute(f"SELECT count(*) FROM raw.transaction_events WHERE ingested_at > {_ts(lo)}").fetchone()[0]
