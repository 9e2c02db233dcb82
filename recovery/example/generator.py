"""Deterministic sample data for the worked example, generated inside DuckDB.

Randomness comes from ``hash(row, stream, seed)`` rather than a stateful RNG, so
the same ``--seed`` gives byte-for-byte the same tables at any size and thread
count, and 10M events are produced by set-based SQL without a Python loop.

Tables written:
- ``raw.transaction_events``: the change log as of T0 (history, corrections, tombstones,
  late arrivals);
- ``example.live_events``: changes that arrive during the incident (released into the
  source by the simulated producer as simulated time passes);
- ``example.staging_feed``: rows of a staging feed that never belonged to the source.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from recovery.example.scenario import SCENARIO, Scenario
from recovery.lib.engine.duckdb_engine import fetch_row

EVENT_COLUMNS = (
    "txn_id BIGINT, account_id BIGINT, customer_id BIGINT, merchant_id INTEGER, event_ts TIMESTAMP, "
    "amount DECIMAL(18,2), currency VARCHAR, status VARCHAR, op VARCHAR, version INTEGER, "
    "schema_version INTEGER, ingested_at TIMESTAMP"
)


def _ts(value) -> str:
    return f"TIMESTAMP '{value.isoformat(sep=' ')}'"


def generate(warehouse: Path, *, events: int = 200_000, seed: int = 42, scenario: Scenario = SCENARIO) -> dict:
    """(Re)create the example's source tables in ``warehouse``. Returns counts."""
    if events < 1000:
        raise ValueError("events: give at least 1000 events so every kind of damage occurs")
    warehouse.parent.mkdir(parents=True, exist_ok=True)
    n_txn = max(1, round(events / 1.13))
    n_accounts = max(50, n_txn // 25)
    n_customers = max(40, n_accounts * 3 // 4)
    n_days = (scenario.last_day - scenario.first_day).days + 1
    t0, first = scenario.t0, scenario.first_day
    window_s = scenario.live_window.total_seconds()
    con = duckdb.connect(str(warehouse))
    try:
        con.execute("SET python_enable_replacements = false")
        con.execute(
            f"CREATE OR REPLACE TEMP MACRO u(i, k) AS (hash(i * 1000003 + k * 7919 + {int(seed)} * 104729) % "
            "1000000) / 1000000.0"
        )
        con.execute("CREATE SCHEMA IF NOT EXISTS raw")
        con.execute("CREATE SCHEMA IF NOT EXISTS example")
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE txn AS
            SELECT i AS txn_id,
                   1 + hash(i, 'account', {int(seed)}) % {n_accounts} AS account_id,
                   1 + hash(i, 'merchant', {int(seed)}) % 500 AS merchant_id,
                   day,
                   TIMESTAMP '{first.isoformat()}' + to_days(CAST(day AS INTEGER))
                     + to_seconds(CAST(u(i, 2) * CASE WHEN day = {n_days - 1} THEN 18000 ELSE 75600
                         END AS BIGINT)) AS event_ts,
                   u(i, 3) < 0.012 AS late,
                   CASE WHEN u(i, 3) < 0.012 THEN CAST((2 + u(i, 4) * 18) * 86400 AS BIGINT)
                        ELSE CAST(60 + u(i, 4) * 7140 AS BIGINT) END AS lag_s,
                   u(i, 5) < 0.10 AS corrected,
                   CAST(3600 + u(i, 6) * 71 * 3600 AS BIGINT) AS corr_lag_s,
                   u(i, 7) < 0.03 AS deleted,
                   CAST(3600 + u(i, 8) * 119 * 3600 AS BIGINT) AS del_lag_s,
                   round(1 + pow(u(i, 9), 8) * 25000, 2) AS dollars,
                   CASE WHEN u(i, 10) < 0.7 THEN 'USD' WHEN u(i, 10) < 0.9 THEN 'EUR' ELSE 'GBP' END AS ccy,
                   CASE WHEN u(i, 11) < 0.90 THEN 'settled' WHEN u(i, 11) < 0.97 THEN 'pending' ELSE 'declined'
                       END AS status1,
                   round(0.5 + u(i, 12), 3) AS corr_factor,
                   CASE WHEN u(i, 13) < 0.3 THEN 'declined' ELSE 'settled' END AS status2
            FROM (SELECT i, CAST(floor(u(i, 1) * {n_days}) AS INTEGER) AS day FROM range(1, {n_txn + 1}) t(i))
            """
        )
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE changes AS
            WITH v AS (
              SELECT *, event_ts + to_seconds(lag_s) AS ing1,
                     event_ts + to_seconds(lag_s + corr_lag_s) AS ing2,
                     event_ts + to_seconds(lag_s + CASE WHEN corrected THEN corr_lag_s ELSE 0 END + del_lag_s) AS ing3,
                     CAST(event_ts AS DATE) < DATE '{scenario.schema_cutover.isoformat()}' AS v1
              FROM txn)
            SELECT txn_id, account_id, merchant_id, event_ts,
                   CASE WHEN v1 THEN round(dollars * 100) ELSE dollars END AS amount,
                   CASE WHEN v1 THEN NULL ELSE ccy END AS currency, status1 AS status, 'upsert' AS op, 1 AS version,
                   CASE WHEN v1 THEN 1 ELSE 2 END AS schema_version, ing1 AS natural_ingest FROM v
            UNION ALL
            SELECT txn_id, account_id, merchant_id, event_ts,
                   CASE WHEN v1 THEN round(dollars * corr_factor * 100) ELSE round(dollars * corr_factor, 2) END,
                   CASE WHEN v1 THEN NULL ELSE ccy END, status2, 'upsert', 2, CASE WHEN v1 THEN 1 ELSE 2 END, ing2
            FROM v WHERE corrected
            UNION ALL
            SELECT txn_id, account_id, merchant_id, event_ts, NULL, NULL, NULL, 'delete',
                   CASE WHEN corrected THEN 3 ELSE 2 END, CASE WHEN v1 THEN 1 ELSE 2 END, ing3
            FROM v WHERE deleted
            """
        )
        # Changes that would arrive after T0 are squeezed monotonically into the live window,
        # never before the event itself happened, so version order per key is kept.
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE events AS
            SELECT txn_id, account_id, 1 + (account_id * 7919) % {n_customers} AS customer_id, merchant_id, event_ts,
                   CAST(amount AS DECIMAL(18,2)) AS amount, currency, status, op, CAST(version AS INTEGER) AS version,
                   CAST(schema_version AS INTEGER) AS schema_version,
                   CASE WHEN natural_ingest <= {_ts(t0)} THEN natural_ingest
                        ELSE greatest(
                          {_ts(t0)} + to_microseconds(CAST({window_s * 1e6} * (1 - exp(-(epoch(natural_ingest) -
                              epoch({_ts(t0)})) / 172800.0)) AS BIGINT)),
                          event_ts + to_minutes(CAST(version AS BIGINT)))
                   END AS ingested_at
            FROM changes
            """
        )
        con.execute(f"CREATE OR REPLACE TABLE raw.transaction_events ({EVENT_COLUMNS})")
        con.execute(
            f"INSERT INTO raw.transaction_events SELECT * FROM events WHERE ingested_at <= {_ts(t0)} "
            "ORDER BY ingested_at, txn_id, version"
        )
        con.execute(f"CREATE OR REPLACE TABLE example.live_events ({EVENT_COLUMNS})")
        con.execute(
            f"INSERT INTO example.live_events SELECT * FROM events WHERE ingested_at > {_ts(t0)} ORDER BY ingested_at, "
            "txn_id, version"
        )
        lo, hi = scenario.staging_range
        n_staging = max(5, events // 500)
        staging_days = (hi - lo).days + 1
        con.execute(f"CREATE OR REPLACE TABLE example.staging_feed ({EVENT_COLUMNS})")
        con.execute(
            f"""
            INSERT INTO example.staging_feed
            SELECT 1000000000000 + i, 1 + i % {n_accounts}, 1 + ((1 + i % {n_accounts}) * 7919) % {n_customers},
                   1 + i % 500, ts, CAST(round(1 + u(i, 21) * 500, 2) AS DECIMAL(18,2)), 'USD', 'settled', 'upsert', 1,
                       2,
                   ts + INTERVAL 5 MINUTE
            FROM (SELECT i, TIMESTAMP '{lo.isoformat()}' + to_days(CAST(floor(u(i, 20) * {staging_days}) AS INTEGER))
                          + to_seconds(CAST(u(i, 22) * 75600 AS BIGINT)) AS ts
                  FROM range(1, {n_staging + 1}) t(i))
            """
        )
        counts = {
            "source_events": fetch_row(con, "SELECT count(*) FROM raw.transaction_events")[0],
            "live_events": fetch_row(con, "SELECT count(*) FROM example.live_events")[0],
            "staging_rows": n_staging,
            "transactions": n_txn,
        }
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return counts


def release_live_events(con, until) -> int:
    """The simulated producer: append live events with ingested_at <= ``until`` to the source."""
    before = con.execute("SELECT count(*) FROM raw.transaction_events").fetchone()[0]
    con.execute(
        "INSERT INTO raw.transaction_events SELECT * FROM example.live_events "
        "WHERE ingested_at <= ? AND ingested_at > (SELECT coalesce(max(ingested_at), TIMESTAMP '1970-01-01') "
        "FROM raw.transaction_events) "
        "ORDER BY ingested_at, txn_id, version",
        [until],
    )
    return con.execute("SELECT count(*) FROM raw.transaction_events").fetchone()[0] - before
