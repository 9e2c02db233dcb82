"""The source as of a watermark is each key's highest version among the changes that had
arrived by then, tombstones dropping the key: the same rows as ranking every key's changes,
on a composite key with NULL parts, at any watermark, for all keys or a few."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.identifiers import quote, quote_all, str_list, ts_literal
from recovery.lib.snapshot import latest_versions_sql
from recovery_tests.support.small_dataset import SOURCE_TABLE, build_small_dataset


def _ranked(spec: DatasetSpec, watermark: datetime | None, include_deleted: bool, keys: str | None) -> str:
    """The definition, written the obvious way: rank each key's changes, keep the first."""
    s = spec.source
    key = quote_all(s.key)
    where = f"WHERE {quote(s.ingested_at)} <= {ts_literal(watermark)}" if watermark else ""
    only = f" SEMI JOIN {keys} USING ({key})" if keys else ""
    deleted = "" if include_deleted else f" AND {quote(s.op)} NOT IN ({str_list(s.delete_ops)})"
    return (
        f"SELECT * EXCLUDE (__rn) FROM (SELECT src.*, row_number() OVER (PARTITION BY {key} "
        f"ORDER BY {quote(s.version)} DESC) AS __rn FROM {s.table_name.sql()} AS src{only} {where}) "
        f"WHERE __rn = 1{deleted}"
    )


@pytest.fixture
def orders(tmp_path: Path):
    """The small orders dataset (key region + order_no, version rev, ops put/drop) with keys that
    have several changes, a late older version, and NULL key parts with several changes each."""
    spec = parse_spec(build_small_dataset(tmp_path))
    con = duckdb.connect(str(spec.warehouse.path))
    s = DuckDBSession(con)
    t0 = s.scalar(f"SELECT max(loaded_at) FROM {SOURCE_TABLE}")
    at = [t0 + timedelta(minutes=m) for m in range(1, 12)]
    placed = datetime(2026, 2, 10, 9)
    rows = [
        ("north", None, 1, "put", at[0], placed, 1, "A"),
        ("north", None, 2, "put", at[1], placed, 2, "B"),  # a NULL key part, latest by version
        (None, None, 3, "put", at[2], placed, 3, "C"),
        (None, None, 1, "put", at[3], placed, 4, "D"),  # an older version arriving later
        (None, 7, 1, "put", at[4], placed, 5, "E"),
        (None, 7, 2, "drop", at[5], placed, 5, "E"),  # a NULL key part whose latest change is a tombstone
        ("south", 424242, 2, "put", at[6], placed, 6, "F"),
        ("south", 424242, 1, "put", at[7], placed, 7, "G"),  # late older version of a new key
    ]
    con.executemany(f"INSERT INTO {SOURCE_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute(
        f"CREATE TEMP TABLE few AS SELECT DISTINCT region, order_no FROM {SOURCE_TABLE} "
        "WHERE order_no % 3 = 0 OR order_no = 424242"
    )
    yield spec, s, [None, t0, at[1], at[3], at[6]]
    con.close()


def _differences(s: DuckDBSession, a: str, b: str) -> int:
    return s.scalar(f"SELECT count(*) FROM ((({a}) EXCEPT ALL ({b})) UNION ALL (({b}) EXCEPT ALL ({a})))")


@pytest.mark.parametrize("include_deleted", [True, False])
@pytest.mark.parametrize("keys", [None, "few"])
def test_latest_versions_are_the_ranked_first_change_of_every_key(orders, include_deleted, keys):
    spec, s, watermarks = orders
    several = 0
    for wm in watermarks:
        ours = latest_versions_sql(spec, wm, include_deleted=include_deleted, keys=keys)
        assert _differences(s, ours, _ranked(spec, wm, include_deleted, keys)) == 0, wm
        several += s.scalar(f"SELECT count(*) FROM ({ours})")
    assert several > 0


def test_a_null_key_part_resolves_to_one_row_per_key(orders):
    spec, s, _ = orders
    rows = s.fetchall(
        f"SELECT region, order_no, rev, change FROM ({latest_versions_sql(spec, None, include_deleted=True)}) "
        "WHERE region IS NULL OR order_no IS NULL ORDER BY ALL"
    )
    assert rows == [("north", None, 2, "put"), (None, 7, 2, "drop"), (None, None, 3, "put")]
    live = s.fetchall(
        f"SELECT region, order_no FROM ({latest_versions_sql(spec, None, include_deleted=False)}) "
        "WHERE region IS NULL OR order_no IS NULL ORDER BY ALL"
    )
    assert live == [("north", None), (None, None)]
