"""The expected rows kept once per dataset are the change log's own answer at every later
watermark: caught up by the keys that changed (a newer version, a tombstone, a new key,
an older version arriving late), and resolved afresh when the source below the kept
watermark or the transform is no longer what they were resolved from."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.reconcile.expected_cache import CHANGED, KEPT, expected_rows, kept_watermark, stage_expected
from recovery.lib.snapshot import expected_rows_sql
from recovery_tests.support.small_dataset import SOURCE_TABLE, build_small_dataset

KEPT_TABLE = '_recovery."expected__orders"'


@pytest.fixture
def orders(tmp_path: Path):
    """The small orders dataset (composite key, text partition, ops put/drop), a session on it."""
    spec = parse_spec(build_small_dataset(tmp_path))
    con = duckdb.connect(str(spec.warehouse.path))
    con.execute("CREATE SCHEMA IF NOT EXISTS _recovery")
    yield spec, DuckDBSession(con)
    con.close()


def _same(s: DuckDBSession, a: str, b: str) -> bool:
    """The two SELECTs hold the same multiset of rows (compared by column name)."""
    cols = ", ".join(c for c, _ in s.columns(f"({b})"))
    return (
        s.scalar(
            f"SELECT count(*) FROM ((SELECT {cols} FROM ({a}) EXCEPT ALL SELECT {cols} FROM ({b})) "
            f"UNION ALL (SELECT {cols} FROM ({b}) EXCEPT ALL SELECT {cols} FROM ({a})))"
        )
        == 0
    )


def _latest(s: DuckDBSession) -> datetime:
    return s.scalar(f"SELECT max(loaded_at) FROM {SOURCE_TABLE}")


def _append_changes(s: DuckDBSession, after: datetime) -> datetime:
    """Four kinds of change ingested after ``after``; returns the last arrival."""
    live = s.fetchall(
        f"SELECT region, order_no, max(rev) FROM {SOURCE_TABLE} GROUP BY ALL "
        f"HAVING arg_max(change, rev) = 'put' ORDER BY ALL LIMIT 3"
    )
    (r1, o1, v1), (r2, o2, v2), (r3, o3, v3) = live
    at = [after + timedelta(minutes=m) for m in (1, 2, 3, 4)]
    rows = [
        (r1, o1, v1 + 1, "put", at[0], datetime(2026, 2, 10, 9), 99, "SKU-NEW"),  # a newer version elsewhere
        (r2, o2, v2 + 1, "drop", at[1], datetime(2026, 2, 10, 9), 1, "SKU-001"),  # a tombstone
        ("north", 99999, 1, "put", at[2], datetime(2026, 3, 3, 3), 5, "SKU-002"),  # a new key
        (r3, o3, v3 - 1, "put", at[3], datetime(2026, 1, 2, 3), 7, "SKU-OLD"),  # an older version, late
    ]
    s.conn.executemany(f"INSERT INTO {SOURCE_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return at[-1]


def test_kept_rows_caught_up_by_the_changed_keys_equal_the_change_log_resolved_afresh(orders):
    spec, s = orders
    w0 = _latest(s)
    assert expected_rows(s, spec, w0, keep=True) == f"SELECT * FROM {KEPT_TABLE}"
    assert _same(s, f"SELECT * FROM {KEPT_TABLE}", expected_rows_sql(spec, w0))
    assert kept_watermark(s, spec) == w0

    w1 = _append_changes(s, w0)
    caught_up = expected_rows(s, spec, w1, keep=True)
    assert CHANGED in caught_up  # overlaid, not resolved again
    assert s.scalar(f"SELECT count(*) FROM {CHANGED}") == 4
    assert _same(s, caught_up, expected_rows_sql(spec, w1))
    # "everything ingested" is the same as the latest arrival
    assert _same(s, expected_rows(s, spec, None, keep=False), expected_rows_sql(spec, None))
    # an earlier watermark than the kept one cannot be caught up: resolved from the change log
    earlier = w0 - timedelta(hours=5)
    assert expected_rows(s, spec, earlier, keep=False) == expected_rows_sql(spec, earlier)


def test_a_source_changed_below_the_kept_watermark_is_resolved_afresh(orders):
    spec, s = orders
    w0 = _latest(s)
    expected_rows(s, spec, w0, keep=True)
    # a purge below the watermark: the kept rows no longer speak for the source
    s.execute(f"DELETE FROM {SOURCE_TABLE} WHERE order_no = (SELECT min(order_no) FROM {SOURCE_TABLE})")
    assert kept_watermark(s, spec) is None
    assert expected_rows(s, spec, w0, keep=False) == expected_rows_sql(spec, w0)
    # a writer keeps the rows again, from the source as it now is
    expected_rows(s, spec, w0, keep=True)
    assert kept_watermark(s, spec) == w0
    assert _same(s, f"SELECT * FROM {KEPT_TABLE}", expected_rows_sql(spec, w0))
    # a payload rewritten in place (same key, version and arrival) is a change too
    s.execute(f"UPDATE {SOURCE_TABLE} SET qty = qty + 1 WHERE order_no = (SELECT max(order_no) FROM {SOURCE_TABLE})")
    assert kept_watermark(s, spec) is None


def test_a_changed_transform_or_a_reader_never_uses_or_writes_kept_rows(orders):
    spec, s = orders
    w0 = _latest(s)
    assert expected_rows(s, spec, w0, keep=False) == expected_rows_sql(spec, w0)
    assert s.object_kind("_recovery", "expected__orders") is None  # a reader keeps nothing
    expected_rows(s, spec, w0, keep=True)
    doubled = spec.model_copy(update={"transform_sql": spec.transform_sql.replace("qty,", "qty * 2 AS qty,")})
    assert kept_watermark(s, doubled) is None
    assert expected_rows(s, doubled, w0, keep=False) == expected_rows_sql(doubled, w0)
    assert s.scalar(f"SELECT count(*) FROM {KEPT} WHERE dataset = 'orders'") == 1


def test_staged_rows_are_a_view_of_the_kept_rows_or_a_table_and_either_can_replace_the_other(orders):
    spec, s = orders
    w0 = _latest(s)
    stage_expected(s, spec, w0, "__e", keep=False)  # nothing kept yet: a table
    assert s.scalar("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = '__e'") == 1
    stage_expected(s, spec, w0, "__e", keep=True)  # kept now: a view of them
    assert s.scalar("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = '__e'") == 1
    w1 = _append_changes(s, w0)
    stage_expected(s, spec, w1, "__e", keep=False)  # caught up: a table again
    assert s.scalar("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = '__e'") == 1
    assert _same(s, "SELECT * FROM __e", expected_rows_sql(spec, w1))
    assert s.scalar(f"SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = '{CHANGED}'") == 0


def test_the_evidence_bundle_does_not_copy_the_kept_rows(orders):
    """They are derived from the change log the bundle copies whole, and as large as the target."""
    from recovery.lib.evidence.tables import planned_copies

    spec, s = orders
    expected_rows(s, spec, _latest(s), keep=True)
    copies, _ = planned_copies(s, spec, [])
    paths = [c.path for c in copies]
    assert "control_plane/expected_rows_kept.parquet" in paths
    assert not [p for p in paths if "expected__" in p]


def test_a_writer_far_behind_the_kept_rows_keeps_the_caught_up_rows_and_a_reader_does_not(orders):
    """Weeks of ingestion after a recovery: a scheduled verification (a writer) catching up more than
    a tenth of the keys keeps what it caught up; a reader, or a writer catching up a few keys, leaves
    the kept rows as they are."""
    spec, s = orders
    w0 = _latest(s)
    expected_rows(s, spec, w0, keep=True)
    w1 = _append_changes(s, w0)  # four keys of ~150
    expected_rows(s, spec, w1, keep=True)
    assert kept_watermark(s, spec) == w0
    # a correction of every order, ingested a day later
    w2 = w1 + timedelta(days=1)
    s.execute(
        f"INSERT INTO {SOURCE_TABLE} SELECT region, order_no, max(rev) + 1, 'put', ?, arg_max(placed_at, rev), "
        f"arg_max(qty, rev) + 1, arg_max(sku, rev) FROM {SOURCE_TABLE} GROUP BY region, order_no",
        [w2],
    )
    assert _same(s, expected_rows(s, spec, w2, keep=False), expected_rows_sql(spec, w2))
    assert kept_watermark(s, spec) == w0  # a reader keeps nothing
    assert expected_rows(s, spec, w2, keep=True) == f"SELECT * FROM {KEPT_TABLE}"
    assert kept_watermark(s, spec) == w2
    assert _same(s, f"SELECT * FROM {KEPT_TABLE}", expected_rows_sql(spec, w2))


@pytest.mark.parametrize("arrival_type", ["TIMESTAMPTZ", "DATE"])
def test_an_arrival_column_that_is_not_a_naive_timestamp_is_resolved_every_time_never_kept(orders, arrival_type):
    """A warehouse another tool wrote may record arrivals as a zoned timestamp or a date: the kept
    rows' TIMESTAMP would compare with them as another type, so such a source is never kept."""
    spec, s = orders
    s.execute(f"ALTER TABLE {SOURCE_TABLE} ALTER loaded_at TYPE {arrival_type}")
    latest = s.scalar(f"SELECT max(loaded_at) FROM {SOURCE_TABLE}")
    # a DATE watermark itself is refused by the snapshot's literal (a watermark is a time); "everything" is not
    for watermark in (latest, None) if arrival_type == "TIMESTAMPTZ" else (None,):
        assert expected_rows(s, spec, watermark, keep=True) == expected_rows_sql(spec, watermark)
        stage_expected(s, spec, watermark, "__e", keep=True)
        assert _same(s, "SELECT * FROM __e", expected_rows_sql(spec, watermark))
    assert s.object_kind("_recovery", "expected__orders") is None
