"""The damage of the team's failed backfill, computed without the package.

The expected rows are the team's own correct transform (``EXPECTED_SQL``) over the change
log; the labels follow the damage vocabulary (ARCHITECTURE.md), first match wins, over what
the test itself recorded while the incident happened: the target just before the backfill
(``before``), the backfill's run ids, and the keys a concurrent ingestion run wrote a newer
version of while a backfill run that later clobbered them was in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pandas as pd

from recovery_tests.team_project.definitions import EXPECTED_SQL

PAYLOAD = ["sensor_id", "reading_ts", "value_c"]


@dataclass(frozen=True)
class History:
    before_keys: frozenset[int]  # reading ids clean.readings held when the backfill was launched
    backfill_runs: frozenset[str]
    concurrent_keys: frozenset[int]  # newer versions a normal run wrote while a backfill run was in flight


def expected_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return con.execute(EXPECTED_SQL).df()


def mart_rows(expected: pd.DataFrame) -> pd.DataFrame:
    return duckdb.query_df(
        expected,
        "e",
        "SELECT reading_day, sensor_id, count(*) AS readings, round(avg(value_c), 3) AS avg_c FROM e GROUP BY ALL",
    ).df()


def labels(events: pd.DataFrame, target: pd.DataFrame, expected: pd.DataFrame, history: History) -> dict[int, str]:
    """reading_id -> label for every key whose target rows differ from its expected row."""
    latest_op = events.sort_values("version").groupby("reading_id")["op"].last()
    exp = expected.set_index("reading_id")
    copies = target.groupby("reading_id").size()
    held = target.drop_duplicates("reading_id").set_index("reading_id")
    out: dict[int, str] = {}
    for key in set(exp.index) | set(copies.index):
        n = int(copies.get(key, 0))
        if n > 1:
            out[key] = "duplicate"
            continue
        if key not in exp.index:
            out[key] = "resurrected" if latest_op.get(key) == "D" else "unexpected"
            continue
        e = exp.loc[key]
        if n == 0:
            out[key] = "deleted" if key in history.before_keys else "missing"
            continue
        t = held.loc[key]
        same_payload = all(t[c] == e[c] for c in PAYLOAD)
        if same_payload and t["reading_day"] == e["reading_day"] and t["src_version"] == e["src_version"]:
            continue
        if same_payload and t["reading_day"] != e["reading_day"]:
            out[key] = "mispartitioned"
        elif t["src_version"] < e["src_version"] and t["_run_id"] in history.backfill_runs:
            out[key] = "overwritten" if key in history.concurrent_keys else "stale"
        elif t["src_version"] == e["src_version"]:
            out[key] = "incorrectly_transformed"
        else:
            out[key] = "unexplained"
    return out
