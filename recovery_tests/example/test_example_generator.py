"""The worked example's sample data: deterministic, shaped as the scenario promises, sized by ``events``.

Fast: no Dagster, only ``generate()`` into temporary DuckDB files.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from recovery.example.generator import generate
from recovery.example.scenario import SCENARIO
from recovery_tests.support.rows import present


def _ts(value) -> str:
    return f"TIMESTAMP '{value.isoformat(sep=' ')}'"


def table_hashes(path: Path) -> dict[str, str]:
    """An order-independent content hash of every table in schemas raw and example (all columns)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        tables = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema IN ('raw', 'example') AND table_type = 'BASE TABLE' ORDER BY 1, 2"
        ).fetchall()
        out = {}
        for schema, name in tables:
            out[f"{schema}.{name}"] = present(
                con.execute(
                    f"SELECT count(*) || ':' || coalesce(md5(string_agg(h, '' ORDER BY h)), '') "
                    f'FROM (SELECT md5(CAST(t AS VARCHAR)) AS h FROM "{schema}"."{name}" t)'
                ).fetchone()
            )[0]
        return out
    finally:
        con.close()


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """20k events, seed 7: inspected read-only by the shape tests."""
    path = tmp_path_factory.mktemp("gen") / "sample.duckdb"
    generate(path, events=20_000, seed=7)
    return path


@pytest.fixture
def con(sample: Path):
    c = duckdb.connect(str(sample), read_only=True)
    yield c
    c.close()


def one(con, sql: str):
    return con.execute(sql).fetchone()[0]


# ---- determinism ---------------------------------------------------------------------------


def test_same_seed_gives_the_same_contents_and_another_seed_does_not(sample: Path, tmp_path: Path):
    again = tmp_path / "again.duckdb"
    other = tmp_path / "other.duckdb"
    counts_a = generate(again, events=20_000, seed=7)
    generate(other, events=20_000, seed=8)

    h_sample, h_again, h_other = table_hashes(sample), table_hashes(again), table_hashes(other)
    assert set(h_sample) == {"raw.transaction_events", "example.live_events", "example.staging_feed"}
    assert h_sample == h_again
    for table in ("raw.transaction_events", "example.live_events", "example.staging_feed"):
        assert h_other[table] != h_sample[table], table
    assert counts_a["source_events"] > 0 and counts_a["live_events"] > 0


def test_regenerating_into_an_existing_file_replaces_its_contents(sample: Path, tmp_path: Path):
    path = tmp_path / "re.duckdb"
    generate(path, events=5_000, seed=1)
    generate(path, events=20_000, seed=7)
    assert table_hashes(path) == table_hashes(sample)


def test_too_few_events_is_refused(tmp_path: Path):
    path = tmp_path / "tiny.duckdb"
    with pytest.raises(ValueError, match="events"):
        generate(path, events=999)
    assert not path.exists()
    generate(path, events=1000)  # the boundary itself is accepted


def test_events_sizes_the_data(tmp_path: Path):
    counts = generate(tmp_path / "big.duckdb", events=300_000, seed=3)
    total = counts["source_events"] + counts["live_events"]
    assert abs(total - 300_000) <= 0.02 * 300_000, counts


# ---- the change log has what the scenario promises ------------------------------------------

ALL = "(SELECT * FROM raw.transaction_events UNION ALL SELECT * FROM example.live_events)"


def test_both_schema_versions_with_v1_only_before_the_cutover(con):
    cut = SCENARIO.schema_cutover.isoformat()
    by_version = dict(con.execute(f"SELECT schema_version, count(*) FROM {ALL} GROUP BY 1").fetchall())
    assert set(by_version) == {1, 2} and min(by_version.values()) > 1000
    assert (
        one(con, f"SELECT count(*) FROM {ALL} WHERE schema_version = 1 AND CAST(event_ts AS DATE) >= DATE '{cut}'") == 0
    )
    assert (
        one(con, f"SELECT count(*) FROM {ALL} WHERE schema_version = 2 AND CAST(event_ts AS DATE) < DATE '{cut}'") == 0
    )
    # v1 carries integer cents and no currency; v2 upserts carry a currency
    assert one(con, f"SELECT count(*) FROM {ALL} WHERE schema_version = 1 AND currency IS NOT NULL") == 0
    assert (
        one(con, f"SELECT count(*) FROM {ALL} WHERE schema_version = 1 AND op = 'upsert' AND amount <> round(amount)")
        == 0
    )
    assert one(con, f"SELECT count(*) FROM {ALL} WHERE schema_version = 2 AND op = 'upsert' AND currency IS NULL") == 0
    assert set(
        r[0] for r in con.execute(f"SELECT DISTINCT currency FROM {ALL} WHERE currency IS NOT NULL").fetchall()
    ) == {"USD", "EUR", "GBP"}


def test_corrections_tombstones_and_late_arrivals_occur(con):
    corrections = one(con, f"SELECT count(*) FROM {ALL} WHERE op = 'upsert' AND version = 2")
    tombstones = one(con, f"SELECT count(*) FROM {ALL} WHERE op = 'delete'")
    late = one(con, f"SELECT count(*) FROM {ALL} WHERE version = 1 AND ingested_at > event_ts + INTERVAL 1 DAY")
    keys = one(con, f"SELECT count(DISTINCT txn_id) FROM {ALL}")
    assert corrections > 0.05 * keys
    assert tombstones > 0.01 * keys
    assert late > 0.005 * keys
    # the ops are exactly upsert and delete; a tombstone carries no payload and is each key's last change
    assert {r[0] for r in con.execute(f"SELECT DISTINCT op FROM {ALL}").fetchall()} == {"upsert", "delete"}
    assert (
        one(con, f"SELECT count(*) FROM {ALL} WHERE op = 'delete' AND (amount IS NOT NULL OR status IS NOT NULL)") == 0
    )
    assert (
        one(
            con,
            f"""SELECT count(*) FROM {ALL} d JOIN {ALL} u USING (txn_id)
                        WHERE d.op = 'delete' AND u.version > d.version""",
        )
        == 0
    )
    # every key starts at version 1 as an upsert and versions have no gaps
    assert one(con, f"SELECT count(*) FROM {ALL} WHERE version = 1 AND op <> 'upsert'") == 0
    assert (
        one(
            con,
            f"SELECT count(*) FROM (SELECT txn_id FROM {ALL} GROUP BY txn_id HAVING max(version) <> count(*) "
            "OR min(version) <> 1)",
        )
        == 0
    )
    # corrections and tombstones also arrive while the incident runs
    assert one(con, "SELECT count(*) FROM example.live_events WHERE version > 1 AND op = 'upsert'") > 0
    assert one(con, "SELECT count(*) FROM example.live_events WHERE op = 'delete'") > 0


def test_history_and_live_events_split_at_t0(con):
    t0, end = _ts(SCENARIO.t0), _ts(SCENARIO.end)
    assert one(con, f"SELECT count(*) FROM raw.transaction_events WHERE ingested_at > {t0}") == 0
    assert one(con, "SELECT count(*) FROM example.live_events") > 0
    assert one(con, f"SELECT count(*) FROM example.live_events WHERE ingested_at <= {t0} OR ingested_at > {end}") == 0
    # live events span the window, not one instant
    lo, hi = con.execute("SELECT min(ingested_at), max(ingested_at) FROM example.live_events").fetchone()
    assert hi - lo > SCENARIO.live_window / 2
    # events happen within the scenario's days
    first, last = con.execute(f"SELECT min(CAST(event_ts AS DATE)), max(CAST(event_ts AS DATE)) FROM {ALL}").fetchone()
    assert first == SCENARIO.first_day and last == SCENARIO.last_day
    assert one(con, f"SELECT max(event_ts) FROM {ALL}") <= SCENARIO.end


def test_no_event_is_ingested_before_it_happened_and_versions_arrive_in_order(con):
    assert one(con, f"SELECT count(*) FROM {ALL} WHERE ingested_at <= event_ts") == 0
    assert (
        one(
            con,
            f"""SELECT count(*) FROM {ALL} a JOIN {ALL} b USING (txn_id)
                        WHERE b.version > a.version AND b.ingested_at < a.ingested_at""",
        )
        == 0
    )


def test_key_and_version_are_unique(con):
    assert one(con, f"SELECT count(*) FROM (SELECT txn_id, version FROM {ALL} GROUP BY ALL HAVING count(*) > 1)") == 0
    # a key's attributes other than the payload do not change between versions
    assert (
        one(
            con,
            f"""SELECT count(*) FROM (SELECT txn_id FROM {ALL} GROUP BY txn_id
                        HAVING count(DISTINCT (account_id, customer_id, merchant_id, event_ts)) > 1)""",
        )
        == 0
    )


def test_staging_feed_never_belongs_to_the_source(con):
    lo, hi = SCENARIO.staging_range
    n = one(con, "SELECT count(*) FROM example.staging_feed")
    assert n >= 5
    assert one(con, "SELECT count(DISTINCT txn_id) FROM example.staging_feed") == n
    assert one(con, f"SELECT count(*) FROM example.staging_feed WHERE txn_id IN (SELECT txn_id FROM {ALL})") == 0
    assert (
        one(
            con,
            f"""SELECT count(*) FROM example.staging_feed
                        WHERE CAST(event_ts AS DATE) NOT BETWEEN DATE '{lo}' AND DATE '{hi}'
                           OR ingested_at <= event_ts OR ingested_at > {_ts(SCENARIO.t0)}""",
        )
        == 0
    )


def test_staging_feed_size_follows_events(tmp_path: Path):
    counts = generate(tmp_path / "s.duckdb", events=10_000, seed=7)
    assert counts["staging_rows"] == 10_000 // 500
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    try:
        assert one(con, "SELECT count(*) FROM example.staging_feed") == counts["staging_rows"]
        assert one(con, "SELECT count(*) FROM raw.transaction_events") == counts["source_events"]
        assert one(con, "SELECT count(*) FROM example.live_events") == counts["live_events"]
        assert (
            one(
                con,
                "SELECT count(DISTINCT txn_id) FROM (SELECT txn_id FROM raw.transaction_events "
                "UNION ALL SELECT txn_id FROM example.live_events)",
            )
            == counts["transactions"]
        )
    finally:
        con.close()


def test_late_arrivals_land_on_a_later_day(con):
    # a late event's first ingestion date differs from its event date (what the landing-date bug needs)
    assert (
        one(
            con,
            f"""SELECT count(*) FROM (SELECT txn_id, min(event_ts) AS ts, min(ingested_at) AS first_in
                        FROM {ALL} GROUP BY txn_id) WHERE CAST(first_in AS DATE) > CAST(ts AS DATE) + 1""",
        )
        > 50
    )


def test_the_scenario_timeline_is_consistent():
    # the bugs the example relies on sit inside its days and its moments are in order
    days = set(SCENARIO.days())
    assert SCENARIO.dying_partition in days and all(p in days for p in SCENARIO.flaky_partitions)
    assert SCENARIO.first_day <= SCENARIO.buggy_cutover < SCENARIO.schema_cutover
    assert (
        SCENARIO.t0
        < SCENARIO.backfill_start
        < SCENARIO.ingest_during
        < SCENARIO.backfill_writes
        < SCENARIO.ingest_after
        <= SCENARIO.end
    )
    assert SCENARIO.requested_partitions()[-1] == SCENARIO.last_day.isoformat()
    assert SCENARIO.intended_range[1] < SCENARIO.requested_range[1]
    assert SCENARIO.end - SCENARIO.t0 == SCENARIO.live_window == timedelta(hours=6)
