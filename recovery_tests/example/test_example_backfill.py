"""The worked example's failed backfill: a real Dagster backfill whose damage matches the scenario.

The ground truth (schema ``truth``) is cross-checked here against the scenario's causes
directly from the source, the target and the write log, independently of truth.py's rules.
Every test only reads the shared build (``failed_example``).
"""

from __future__ import annotations

from datetime import date, timedelta

import dagster as dg
import duckdb
import pytest
from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES

from recovery.example.defs import GENERATION_TAG
from recovery.example.scenario import SCENARIO
from recovery.lib.consumers.sql import consumer_sql, consumer_table
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.reconcile.labels import DAMAGE_LABELS

GEN = SCENARIO.backfill_generation
SOURCE = "raw.transaction_events"
TARGET = "analytics.transactions"
CURRENT = date(2024, 7, 1)  # first of the partitions ingestion was writing when the backfill ran


def _ts(value) -> str:
    return f"TIMESTAMP '{value.isoformat(sep=' ')}'"


def _d(value: date) -> str:
    return f"DATE '{value.isoformat()}'"


@pytest.fixture(scope="module")
def con(failed_example):
    c = duckdb.connect(str(failed_example.warehouse), read_only=True)
    yield c
    c.close()


@pytest.fixture
def instance(failed_example, monkeypatch):
    """The Dagster instance the example's runs were recorded in (function-scoped: DAGSTER_HOME
    must not leak into other tests, which could then record runs in the shared instance)."""
    monkeypatch.setenv("DAGSTER_HOME", str(failed_example.dagster_home))
    with dg.DagsterInstance.get() as inst:
        yield inst


def keys(con, sql: str) -> set:
    return {r[0] for r in con.execute(sql).fetchall()}


def labelled(con, label: str) -> set:
    return keys(con, f"SELECT txn_id FROM truth.damage WHERE label = '{label}'")


def one(con, sql: str):
    return con.execute(sql).fetchone()[0]


# ---- a real Dagster backfill ----------------------------------------------------------------


def test_backfill_is_a_real_dagster_backfill_with_one_dead_run_and_one_retry(failed_example, instance):
    info = failed_example.info
    backfill = instance.get_backfill(info["backfill_id"])
    assert backfill is not None
    assert backfill.status in BULK_ACTION_TERMINAL_STATUSES
    assert backfill.status.value == info["backfill_status"]
    assert backfill.tags.get(GENERATION_TAG) == GEN

    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": info["backfill_id"]}))
    assert sorted(r.run_id for r in runs) == sorted(info["run_ids"]["backfill"])
    assert len(runs) >= 2
    for r in runs:
        assert r.tags.get("dagster/backfill") == info["backfill_id"]
        assert r.tags.get(GENERATION_TAG) == GEN
        assert r.status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE), (r.run_id, r.status)

    # runs cover the requested range (the range bug reaches the current partitions) in bounded chunks
    covered: set[str] = set()
    for r in runs:
        lo, hi = r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"]
        part = [p for p in SCENARIO.requested_partitions() if lo <= p <= hi]
        assert 0 < len(part) <= SCENARIO.max_partitions_per_run
        assert not covered & set(part)
        covered |= set(part)
    assert covered == set(SCENARIO.requested_partitions())

    # exactly one run died: the one holding the dying partition; it was not retried
    failed = [r for r in runs if r.status == dg.DagsterRunStatus.FAILURE]
    assert len(failed) == 1
    dead = failed[0]
    assert (
        dead.tags["dagster/asset_partition_range_start"]
        <= SCENARIO.dying_partition.isoformat()
        <= dead.tags["dagster/asset_partition_range_end"]
    )

    # the flaky partition's step failed once and was retried by the RetryPolicy, in the same run
    def types(run_id):
        return [e.dagster_event.event_type for e in instance.all_logs(run_id) if e.dagster_event is not None]

    retried = [
        r
        for r in runs
        if {dg.DagsterEventType.STEP_UP_FOR_RETRY, dg.DagsterEventType.STEP_RESTARTED} & set(types(r.run_id))
    ]
    assert len(retried) == 1
    flaky = SCENARIO.flaky_partitions[0].isoformat()
    assert (
        retried[0].tags["dagster/asset_partition_range_start"]
        <= flaky
        <= retried[0].tags["dagster/asset_partition_range_end"]
    )
    assert retried[0].status == dg.DagsterRunStatus.SUCCESS
    # the reordered partition sits after the flaky one in the same run: its retry wrote it
    for p in SCENARIO.reordered_partitions:
        assert flaky < p.isoformat() <= retried[0].tags["dagster/asset_partition_range_end"]
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in set(types(dead.run_id))

    # ingestion and the consumers' refresh ran as ordinary successful runs
    assert len(info["run_ids"]["ingest"]) == 3 and len(info["run_ids"]["consumers"]) == 1
    for run_id in info["run_ids"]["ingest"] + info["run_ids"]["consumers"]:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS, run_id
        assert "dagster/backfill" not in run.tags
    assert {instance.get_run_by_id(r).job_name for r in info["run_ids"]["ingest"]} == {"ingest_transactions"}


# ---- the ground truth covers the vocabulary --------------------------------------------------


def test_every_label_occurs_and_counts_match_the_build(failed_example, con):
    counts = dict(con.execute("SELECT label, count(*) FROM truth.damage GROUP BY 1").fetchall())
    assert set(counts) == set(DAMAGE_LABELS)
    assert all(n > 0 for n in counts.values()), counts
    assert counts == failed_example.info["truth_labels"]
    assert one(con, "SELECT count(*) - count(DISTINCT txn_id) FROM truth.damage") == 0


# ---- causal cross-checks of the ground truth against the scenario -----------------------------


def replaced_partitions(con) -> set[date]:
    """Partitions the failed generation rewrote whole (from its write log)."""
    return {
        date.fromisoformat(p)
        for p in keys(
            con,
            f"""SELECT DISTINCT unnest(partitions) FROM _recovery.writes
                                                          WHERE generation = '{GEN}' AND mode = 'replace_partitions'""",
        )
    }


def test_duplicates_come_from_the_retried_append_or_a_partition_the_dead_run_never_rewrote(con):
    dup = labelled(con, "duplicate")
    assert dup == keys(con, f"SELECT txn_id FROM {TARGET} GROUP BY txn_id HAVING count(*) > 1")
    flaky = ", ".join(_d(p) for p in SCENARIO.flaky_partitions)
    # the non-idempotent retry: every key the backfill wrote into the flaky partition is there exactly twice
    per_key = dict(
        con.execute(
            f"SELECT txn_id, count(*) FROM {TARGET} WHERE event_date IN ({flaky}) AND _generation = '{GEN}' GROUP BY 1"
        ).fetchall()
    )
    assert per_key and set(per_key.values()) == {2}
    assert set(per_key) <= dup
    assert len(per_key) > len(dup) / 2
    # the rest are late keys: the backfill wrote them into their landing-date partition while their
    # row in the event-date partition survived, because the run that died never rewrote that partition
    rows = con.execute(f"""
        SELECT t.txn_id, count(*), count(*) FILTER (WHERE t._generation = '{GEN}'),
               any_value(t.event_date) FILTER (WHERE t._generation = '{GEN}'),
               any_value(t.event_date) FILTER (WHERE t._generation <> '{GEN}'),
               CAST(any_value(t.event_ts) AS DATE),
               (SELECT CAST(min(ingested_at) AS DATE) FROM {SOURCE} s WHERE s.txn_id = t.txn_id)
        FROM {TARGET} t
        WHERE t.txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'duplicate')
          AND t.txn_id NOT IN (SELECT txn_id FROM {TARGET} WHERE event_date IN ({flaky}) AND _generation = '{GEN}')
        GROUP BY t.txn_id""").fetchall()
    assert {r[0] for r in rows} == dup - set(per_key)
    replaced = replaced_partitions(con)
    for txn, n, n_gen, gen_part, old_part, event_day, landing in rows:
        assert (n, n_gen) == (2, 1), txn
        assert gen_part == landing != event_day, txn
        assert old_part == event_day, txn
        assert event_day not in replaced and event_day >= SCENARIO.dying_partition, txn


def test_unexpected_keys_are_exactly_the_staging_rows_the_backfill_read(con):
    lo, hi = SCENARIO.staging_range
    staging = keys(
        con,
        f"""SELECT txn_id FROM example.staging_feed
                            WHERE CAST(event_ts AS DATE) BETWEEN {_d(lo)} AND {_d(hi)}
                              AND ingested_at <= {_ts(SCENARIO.backfill_start)}""",
    )
    assert staging
    assert labelled(con, "unexpected") == staging
    assert keys(con, f"SELECT txn_id FROM {TARGET} WHERE txn_id NOT IN (SELECT txn_id FROM {SOURCE})") == staging


def test_partially_updated_is_exactly_the_dying_partition(con):
    partial = keys(con, "SELECT event_date FROM truth.partition_findings WHERE finding = 'partially_updated'")
    assert partial == {SCENARIO.dying_partition}
    # independently: the dying partition holds rows of both the backfill and the generation before it
    gens = keys(con, f"SELECT DISTINCT _generation FROM {TARGET} WHERE event_date = {_d(SCENARIO.dying_partition)}")
    assert GEN in gens and len(gens) >= 2
    assert SCENARIO.dying_partition not in replaced_partitions(con)
    # the partitions after it in the dead run's range were never written at all
    after = keys(
        con,
        f"""SELECT DISTINCT event_date FROM {TARGET} WHERE _generation = '{GEN}'
                          AND event_date > {_d(SCENARIO.dying_partition)}
                              AND event_date < {_d(SCENARIO.staging_range[0])}""",
    )
    assert SCENARIO.dying_partition + timedelta(days=1) not in after


def test_incorrectly_transformed_keys_are_schema_v1_cents_read_as_dollars(con):
    bad = labelled(con, "incorrectly_transformed")
    assert bad
    rows = con.execute(f"""
        SELECT t.txn_id, t.amount_usd, e.amount_usd, s.schema_version, t._generation,
               (SELECT CAST(min(ingested_at) AS DATE) FROM {SOURCE} f WHERE f.txn_id = t.txn_id) AS landing
        FROM {TARGET} t JOIN truth.expected e USING (txn_id)
        JOIN {SOURCE} s ON s.txn_id = t.txn_id AND s.version = e._source_version
        WHERE t.txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'incorrectly_transformed')""").fetchall()
    assert {r[0] for r in rows} == bad
    for txn, actual, expected, schema_version, gen, landing in rows:
        assert schema_version == 1, txn
        assert abs(actual - 100 * expected) <= 0.01, (txn, actual, expected)
        assert gen == GEN, txn
        assert landing >= SCENARIO.buggy_cutover, txn


def test_resurrected_keys_are_tombstoned_in_the_source(con):
    res = labelled(con, "resurrected")
    assert res
    latest = dict(
        con.execute(f"""SELECT txn_id, arg_max(op, version) FROM {SOURCE}
                                  WHERE txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'resurrected')
                                      GROUP BY 1""").fetchall()
    )
    assert set(latest) == res and set(latest.values()) == {"delete"}
    # the target holds each of them once, as the latest upsert in the snapshot the backfill read
    # (the outdated extract in the stale range), which the tombstone came after
    lo, hi = SCENARIO.stale_range
    rows = con.execute(f"""
        SELECT t.txn_id, t._generation, t._source_version,
               (SELECT max(version) FROM {SOURCE} s WHERE s.txn_id = t.txn_id AND op = 'upsert'
                  AND s.ingested_at <= CASE WHEN t.event_date BETWEEN {_d(lo)} AND {_d(hi)}
                                            THEN {_ts(SCENARIO.stale_watermark)} ELSE {_ts(SCENARIO.backfill_start)}
                                                END),
               (SELECT max(version) FROM {SOURCE} s WHERE s.txn_id = t.txn_id AND op = 'delete')
        FROM {TARGET} t WHERE txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'resurrected')""").fetchall()
    assert {r[0] for r in rows} == res and len(rows) == len(res)
    for txn, gen, version, read_version, tombstone in rows:
        assert gen == GEN and version == read_version < tombstone, (txn, gen, version, read_version, tombstone)


def test_overwritten_keys_lost_a_concurrent_ingestion_write(con):
    over = labelled(con, "overwritten")
    assert over
    rows = con.execute(f"""
        SELECT t.txn_id, t.event_date, t._source_version, e._source_version,
               (SELECT ingested_at FROM {SOURCE} s WHERE s.txn_id = t.txn_id
                   AND s.version = e._source_version) AS newer_at
        FROM {TARGET} t JOIN truth.expected e USING (txn_id)
        WHERE t.txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'overwritten')""").fetchall()
    assert {r[0] for r in rows} == over
    for txn, part, t_sv, e_sv, newer_at in rows:
        assert part >= CURRENT, (txn, part)
        assert t_sv < e_sv, txn
        # arrived after the backfill fixed its snapshot, and was applied by the ingestion run during it
        assert SCENARIO.backfill_start < newer_at <= SCENARIO.ingest_during, (txn, newer_at)
    # an ingestion generation had written the newer version before the backfill's write clobbered it
    lost = keys(
        con,
        f"""
        SELECT d.txn_id FROM _recovery."delta__transactions" d JOIN truth.expected e USING (txn_id)
        WHERE d._generation LIKE 'ingest-%' AND d._delta_op = 'upsert' AND d._source_version = e._source_version
          AND d._delta_seq < (SELECT max(b._delta_seq) FROM _recovery."delta__transactions" b
                              WHERE b.txn_id = d.txn_id AND b._generation = '{GEN}' AND b._delta_op = 'upsert')""",
    )
    assert over <= lost


def test_stale_keys_sit_where_an_outdated_input_was_read(con):
    stale = labelled(con, "stale")
    assert stale
    lo, hi = SCENARIO.stale_range
    outside = keys(
        con,
        f"""SELECT txn_id FROM {TARGET} WHERE txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'stale')
                            AND NOT (event_date BETWEEN {_d(lo)} AND {_d(hi)} OR event_date >= {_d(CURRENT)})""",
    )
    assert not outside
    # in the stale range the newer version was in the source before the backfill started,
    # but after the outdated extract the worker read
    rows = con.execute(f"""
        SELECT t.txn_id, t._source_version, e._source_version,
               (SELECT ingested_at FROM {SOURCE} s WHERE s.txn_id = t.txn_id AND s.version = e._source_version)
        FROM {TARGET} t JOIN truth.expected e USING (txn_id)
        WHERE t.txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'stale')
          AND t.event_date BETWEEN {_d(lo)} AND {_d(hi)}""").fetchall()
    assert rows
    for txn, t_sv, e_sv, newer_at in rows:
        assert t_sv < e_sv, txn
        assert SCENARIO.stale_watermark < newer_at <= SCENARIO.backfill_start, (txn, newer_at)


def test_out_of_order_keys_got_an_earlier_version_after_the_latest_one_in_the_retried_step(con):
    ooo = labelled(con, "out_of_order")
    assert ooo
    parts = ", ".join(_d(p) for p in SCENARIO.reordered_partitions)
    # independently of truth.py: keys of the reordered partitions whose target row holds the upsert
    # before their latest upsert as of the backfill's read, written by the failed generation
    expected = keys(
        con,
        f"""
        SELECT t.txn_id FROM {TARGET} t
        WHERE t._generation = '{GEN}' AND t.event_date IN ({parts})
          AND t._source_version < (SELECT max(version) FROM {SOURCE} s WHERE s.txn_id = t.txn_id AND op = 'upsert'
                                   AND s.ingested_at <= {_ts(SCENARIO.backfill_start)})""",
    )
    assert ooo == expected
    # the write log shows the newer version written first, the older one last, by the same generation
    rows = con.execute(f"""
        SELECT txn_id, arg_max(_source_version, _delta_seq), max(_source_version)
        FROM _recovery."delta__transactions"
        WHERE _generation = '{GEN}' AND _delta_op = 'upsert'
          AND txn_id IN (SELECT txn_id FROM truth.damage WHERE label = 'out_of_order') GROUP BY 1""").fetchall()
    assert {r[0] for r in rows} == ooo
    for txn, last, newest in rows:
        assert last < newest, txn
    notes = keys(con, f"SELECT note FROM _recovery.writes WHERE generation = '{GEN}' AND mode = 'upsert_keys'")
    assert any("earlier versions" in (n or "") for n in notes)


def test_mispartitioned_rows_sit_in_their_landing_date_partition(con):
    mis = labelled(con, "mispartitioned")
    assert mis
    rows = con.execute(f"""
        SELECT t.txn_id, t.event_date, CAST(t.event_ts AS DATE),
               (SELECT CAST(min(ingested_at) AS DATE) FROM {SOURCE} s WHERE s.txn_id = t.txn_id)
        FROM {TARGET} t WHERE t.txn_id IN (SELECT txn_id FROM truth.damage
            WHERE label = 'mispartitioned')""").fetchall()
    assert {r[0] for r in rows} == mis
    for txn, part, event_day, landing in rows:
        assert part == landing != event_day, (txn, part, event_day, landing)


def test_damaged_rows_were_written_by_the_failed_generation(con):
    assert (
        one(
            con,
            f"""SELECT count(*) FROM {TARGET} t JOIN truth.damage d USING (txn_id)
                        WHERE d.label NOT IN ('missing', 'deleted', 'duplicate') AND t._generation <> '{GEN}'""",
        )
        == 0
    )
    # a duplicate key has at least one row of the failed generation
    assert (
        one(
            con,
            f"""SELECT count(*) FROM (SELECT txn_id FROM {TARGET} t JOIN truth.damage d USING (txn_id)
                        WHERE d.label = 'duplicate' GROUP BY txn_id
                            HAVING count(*) FILTER (WHERE t._generation = '{GEN}') = 0)""",
        )
        == 0
    )
    # missing and deleted keys have no row at all
    assert (
        one(
            con,
            f"""SELECT count(*) FROM {TARGET} t JOIN truth.damage d USING (txn_id)
                        WHERE d.label IN ('missing', 'deleted')""",
        )
        == 0
    )
    # and every undamaged key matches its expected row
    assert (
        one(
            con,
            f"""SELECT count(*) FROM (
                          SELECT txn_id, event_date, amount_usd, status, _source_version FROM {TARGET}
                          WHERE txn_id NOT IN (SELECT txn_id FROM truth.damage)
                          EXCEPT SELECT txn_id, event_date, amount_usd, status, _source_version FROM truth.expected)""",
        )
        == 0
    )


def test_deleted_keys_were_held_before_the_backfill_and_missing_keys_were_not(con):
    # 'deleted': the target held the key when the backfill started; 'missing': it never did
    held_before = f"""SELECT txn_id FROM _recovery."delta__transactions"
                      WHERE _delta_op = 'upsert' AND _written_at < {_ts(SCENARIO.backfill_start)}"""
    deleted, missing = labelled(con, "deleted"), labelled(con, "missing")
    assert deleted and missing
    assert deleted <= keys(con, held_before)
    assert not missing & keys(con, held_before)
    assert (deleted | missing) <= keys(con, "SELECT txn_id FROM truth.expected")


# ---- the managed target and its write log -------------------------------------------------


def test_public_name_is_a_view_over_a_namespace_table(con):
    kind = one(
        con,
        "SELECT table_type FROM information_schema.tables WHERE table_schema = 'analytics' "
        "AND table_name = 'transactions'",
    )
    assert kind == "VIEW"
    ns = one(con, f"SELECT namespace FROM _recovery.pointers WHERE public_name = '{TARGET}'")
    schema, name = ns.split(".")
    assert schema == "analytics" and name.startswith("transactions__g")
    assert (
        one(
            con,
            f"SELECT table_type FROM information_schema.tables WHERE table_schema = '{schema}' "
            f"AND table_name = '{name}'",
        )
        == "BASE TABLE"
    )
    view_sql = one(con, "SELECT sql FROM duckdb_views() WHERE schema_name = 'analytics' AND view_name = 'transactions'")
    assert name in view_sql
    assert one(con, f"SELECT count(*) FROM {TARGET}") == one(con, f'SELECT count(*) FROM "{schema}"."{name}"') > 0


def test_write_log_holds_every_write_of_the_failed_generation(failed_example, con):
    requested = set(SCENARIO.requested_partitions())
    writes = con.execute(
        f"SELECT seq, mode, partitions, run_id, note FROM _recovery.writes WHERE generation = '{GEN}' ORDER BY seq"
    ).fetchall()
    assert writes
    touched = {p for w in writes for p in w[2]}
    assert touched <= requested
    # the range bug: writes reached past the intended range into the current partitions
    assert any(p > SCENARIO.intended_range[1].isoformat() for p in touched)
    assert {w[3] for w in writes} <= set(failed_example.info["run_ids"]["backfill"])
    # every delta-log entry of the generation belongs to a logged write of it
    seqs = {w[0] for w in writes}
    assert (
        keys(con, f"SELECT DISTINCT _delta_seq FROM _recovery.\"delta__transactions\" WHERE _generation = '{GEN}'")
        <= seqs
    )
    # every partition holding the generation's rows was logged as written by it
    held = {str(p) for p in keys(con, f"SELECT DISTINCT event_date FROM {TARGET} WHERE _generation = '{GEN}'")}
    assert held <= touched
    # the bugs left their traces: the doubled append and the dying partition's partial chunks
    notes = [w[4] for w in writes]
    assert sum((n or "").startswith("append after checkpointed clear") for n in notes) == 2
    assert "chunk 1/4" in notes and "chunk 2/4 cleared" in notes
    assert "chunk 3/4" not in " ".join(n or "" for n in notes)
    assert (
        one(con, f"SELECT backfill_id FROM _recovery.generations WHERE generation = '{GEN}'")
        == failed_example.info["backfill_id"]
    )


# ---- consumers propagated the damage -------------------------------------------------------


def test_consumers_exist_and_differ_from_the_truth(failed_example, con):
    spec = parse_spec(failed_example.spec_path)
    assert len(spec.downstream) == 5
    for c in spec.downstream:
        table = consumer_table(spec, c)
        assert table.schema == "consumers"
        n = one(con, f"SELECT count(*) FROM {table.sql()}")
        assert n > 0, c.name
        damaged = f"SELECT * FROM {table.sql()}"
        # the consumer reflects the published (damaged) target ...
        current = consumer_sql(spec, c)
        assert one(con, f"SELECT count(*) FROM (({damaged}) EXCEPT ALL ({current}))") == 0, c.name
        assert one(con, f"SELECT count(*) FROM (({current}) EXCEPT ALL ({damaged}))") == 0, c.name
        # ... so it differs from the same SQL over the ground truth
        truth = consumer_sql(spec, c, "SELECT * FROM truth.expected")
        wrong = one(con, f"SELECT count(*) FROM (({damaged}) EXCEPT ALL ({truth}))")
        absent = one(con, f"SELECT count(*) FROM (({truth}) EXCEPT ALL ({damaged}))")
        assert wrong + absent > 0, c.name
