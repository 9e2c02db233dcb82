"""Every write path keeps the key unique: a batch with two rows for one key is refused in
the same transaction, whatever the write mode, and nothing of it lands (namespace, delta
log, write log and commit clock unchanged). Tested on the writer's four modes, normal
ingestion (a transform that fans rows out), a repair wave (a snapshot holding a key
twice), the delta replay and a guarded backfill's recompute."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.control.plane import SCHEMA
from recovery.lib.engine import open_engine
from recovery.lib.errors import DuplicateKeyError, SchemaMismatchError
from recovery.lib.incident.model import parse_incident
from recovery.lib.repair.build import build_wave
from recovery.lib.repair.replay import committed_seq, replay_in
from recovery.lib.repair.tables import snapshot_table
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.writer import Writer
from recovery_tests.support.repair_support import current_plan, repair_through_library
from recovery_tests.support.repaired_small import INCIDENT, build_damaged
from recovery_tests.support.small_dataset import TRANSFORM_SQL, build_small_dataset, fetch, rows_digest

NS = "mart.orders__g0001"
DELTA = f'{SCHEMA}."delta__orders"'


def _state(db: Path, ns: str = NS) -> tuple:
    return (
        rows_digest(db, ns),
        fetch(db, f"SELECT count(*) FROM {DELTA}"),
        fetch(db, f"SELECT count(*) FROM {SCHEMA}.writes"),
        fetch(db, f"SELECT seq FROM {SCHEMA}.clock"),
    )


def _dups(db: Path, relation: str) -> int:
    return fetch(
        db, f"SELECT count(*) FROM (SELECT region, order_no FROM {relation} GROUP BY ALL HAVING count(*) > 1)"
    )[0][0]


@pytest.fixture
def loaded(tmp_path):
    spec = load_spec(build_small_dataset(tmp_path / "ds"))
    w = Writer(open_engine(spec.warehouse), spec)
    w.ensure()
    w.register_generation("ingest-1", "ingest")
    w.write("ingest-1", expected_rows_sql(spec, None), mode="replace_partitions")
    return spec, w, spec.warehouse.path


@pytest.mark.parametrize("mode", ["upsert_keys", "replace_partitions", "append", "delete_keys"])
def test_every_write_mode_refuses_a_batch_with_one_key_twice_and_lands_nothing(mode, loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    one = f"SELECT * FROM ({e}) WHERE region = 'north' ORDER BY order_no LIMIT 1"
    if mode == "append":  # a new key, offered twice (an existing one would also clash with the table)
        one = f"SELECT * REPLACE (order_no + 100000 AS order_no) FROM ({one})"
    batch = f"SELECT * FROM ({e}) WHERE region = 'south' UNION ALL ({one}) UNION ALL ({one})"
    if mode == "delete_keys":
        batch = f"SELECT region, order_no, src_rev FROM ({batch})"
    before = _state(db)
    with pytest.raises(DuplicateKeyError, match=r"key \['region', 'order_no'\] = \('north', \d+\) occurs 2 times"):
        w.write("ingest-1", batch, mode=mode)
    assert _state(db) == before
    assert _dups(db, NS) == 0


def test_a_batch_of_distinct_keys_still_writes_in_every_mode(loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    assert w.write("ingest-1", f"SELECT * FROM ({e}) WHERE region = 'north'", mode="upsert_keys").rows_inserted > 0
    assert (
        w.write(
            "ingest-1", f"SELECT region, order_no, src_rev FROM ({e}) WHERE region = 'east'", mode="delete_keys"
        ).rows_deleted
        > 0
    )
    assert w.write("ingest-1", f"SELECT * FROM ({e}) WHERE region = 'east'", mode="append").rows_inserted > 0
    assert _dups(db, NS) == 0


def test_a_key_the_table_holds_in_another_partition_is_refused_by_replace_partitions(loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    shard = fetch(db, f"SELECT min(shard) FROM ({e}) WHERE region = 'south'")[0][0]
    # one north order re-partitioned into the replaced south shard: its north row would stay
    moved = f"SELECT * REPLACE ('{shard}' AS shard) FROM ({e}) WHERE region = 'north' ORDER BY order_no LIMIT 1"
    before = _state(db)
    with pytest.raises(DuplicateKeyError, match=r"is outside the replaced partitions in the table \(1 such keys\)"):
        w.write(
            "ingest-1",
            f"SELECT * FROM ({e}) WHERE shard = '{shard}' UNION ALL ({moved})",
            mode="replace_partitions",
            partitions=[shard],
        )
    assert _state(db) == before
    assert _dups(db, NS) == 0
    w.write("ingest-1", moved, mode="upsert_keys")  # as an upsert the key moves: one row, in its new shard
    assert _dups(db, NS) == 0


def test_a_stray_copy_written_by_a_fenced_generation_does_not_stop_normal_ingestion(loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    shard = fetch(db, f"SELECT min(shard) FROM ({e}) WHERE region = 'south'")[0][0]
    w.register_generation("bf-stray", "backfill")  # the backfill's damage: a north order copied into a south shard
    w.write(
        "bf-stray",
        f"SELECT * REPLACE ('{shard}' AS shard) FROM ({e}) WHERE region = 'north' ORDER BY order_no LIMIT 1",
        mode="append",
        allow_duplicate_keys=True,
    )
    w.fence("bf-stray", incident_id="INC-1", fenced_by="test")
    # ingestion rewrites the north shard holding that order's right copy: the stray is known damage, not a refusal
    north = fetch(db, f"SELECT min(shard) FROM ({e}) WHERE region = 'north'")[0][0]
    assert (
        w.write(
            "ingest-1", f"SELECT * FROM ({e}) WHERE shard = '{north}'", mode="replace_partitions", partitions=[north]
        ).rows_inserted
        > 0
    )
    w.register_generation("bf-live", "backfill")  # the same stray by a generation nobody fenced is refused
    with pytest.raises(DuplicateKeyError, match="is already in the table"):
        w.write(
            "bf-live",
            f"SELECT * REPLACE ('{shard}' AS shard) FROM ({e}) WHERE region = 'north' "
            f"ORDER BY order_no LIMIT 1 OFFSET 1",
            mode="append",
        )


def test_append_of_a_key_the_table_already_holds_is_refused(loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    before = _state(db)
    with pytest.raises(DuplicateKeyError, match=r"is already in the table"):
        w.write("ingest-1", f"SELECT * FROM ({e}) WHERE region = 'west' ORDER BY order_no LIMIT 2", mode="append")
    assert _state(db) == before


def test_a_faulty_pipeline_can_still_be_reproduced_and_the_write_log_says_so(loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    w.write(
        "ingest-1",
        f"SELECT * FROM ({e}) WHERE region = 'west' ORDER BY order_no LIMIT 2",
        mode="append",
        note="retried append",
        allow_duplicate_keys=True,
    )
    assert _dups(db, NS) == 2
    assert fetch(db, f"SELECT note FROM {SCHEMA}.writes ORDER BY seq DESC LIMIT 1") == [
        ("retried append; duplicate keys allowed",)
    ]


def test_ingestion_through_a_transform_that_fans_rows_out_is_refused(tmp_path):
    spec_path = build_small_dataset(tmp_path / "ds")
    # a join gone wrong: every order with qty > 15 comes out twice
    (tmp_path / "ds" / "orders.sql").write_text(
        TRANSFORM_SQL + "UNION ALL " + TRANSFORM_SQL.split("\n", 1)[1].rstrip() + " WHERE qty > 15\n"
    )
    spec = load_spec(spec_path)
    w = Writer(open_engine(spec.warehouse), spec)
    w.ensure()
    w.register_generation("ingest-1", "ingest")
    db = spec.warehouse.path
    before = _state(db)
    with pytest.raises(DuplicateKeyError, match="ingest-1"):
        apply_changes(w, "ingest-1", until=fetch(db, "SELECT max(loaded_at) FROM src.order_events")[0][0])
    assert _state(db) == before and fetch(db, f"SELECT count(*) FROM {NS}") == [(0,)]


@pytest.fixture
def planned(tmp_path):
    r = build_damaged(tmp_path / "orders")
    plan = repair_through_library(r.spec, parse_incident(r.incident_path), wave_size=5, waves=0)
    return r, plan


def test_a_repair_wave_whose_snapshot_holds_a_key_twice_is_refused(planned):
    r, plan = planned
    db = r.spec.warehouse.path
    snap = snapshot_table(r.spec)
    wave0 = plan.waves[0]
    with r.engine.transaction() as s:  # what a transform that fans out would have put in the snapshot
        s.execute(f"INSERT INTO {snap} SELECT * FROM {snap} WHERE shard = ? ORDER BY order_no LIMIT 1", [wave0[0]])
    ns = plan.namespace
    before = _state(db, ns)
    with pytest.raises(DuplicateKeyError, match="replace_partitions"):
        build_wave(r.writer, current_plan(r.spec, INCIDENT), 0)
    assert _state(db, ns) == before and _dups(db, ns) == 0
    assert not current_plan(r.spec, INCIDENT).built


def test_the_delta_replay_applies_one_row_per_key_even_when_the_log_holds_a_key_twice(planned):
    r, plan = planned
    db = r.spec.warehouse.path
    w = r.writer
    w.register_generation("ingest-2", "ingest")
    e = expected_rows_sql(r.spec, None)
    res = w.write(
        "ingest-2",
        f"SELECT * REPLACE (qty + 1 AS qty, src_rev + 10 AS src_rev) FROM ({e}) "
        f"WHERE region = 'west' ORDER BY order_no LIMIT 3",
        mode="upsert_keys",
    )
    with r.engine.transaction() as s:  # a second entry for one key in the same commit (a log another tool appended to)
        s.execute(
            f"INSERT INTO {DELTA} SELECT * REPLACE (qty + 5 AS qty) FROM {DELTA} WHERE _delta_seq = ? "
            f"ORDER BY order_no LIMIT 1",
            [res.seq],
        )
    fresh = current_plan(r.spec, INCIDENT)
    with r.engine.transaction() as s:
        replayed = replay_in(s, w, fresh, after_seq=fresh.low_seq, through_seq=committed_seq(s), stage="test")
    assert replayed.upserted == 3
    assert _dups(db, plan.namespace) == 0


def test_a_guarded_backfill_whose_recompute_writes_a_key_twice_is_stopped_by_the_invariants_gate_unpublished(
    example_copy,
):
    from recovery_tests.support.recurrence import APPROVER, clean_baseline, launch, public_hash

    dataset = clean_baseline(example_copy)
    before = public_hash(dataset)

    def recompute_with_a_retry_duplicate(ctx):
        e = expected_rows_sql(ctx.writer.spec, ctx.watermark)
        rows = f"SELECT * FROM ({e}) WHERE event_date = DATE '2024-03-01'"
        ctx.writer.write(
            ctx.generation,
            f"{rows} UNION ALL ({rows} ORDER BY txn_id LIMIT 1)",
            mode="replace_partitions",
            partitions=["2024-03-01"],
        )

    out = launch(dataset, "2024-03-01", "2024-03-01", fn=recompute_with_a_retry_duplicate, approved_by=(APPROVER,))
    assert out.status == "stopped" and "unique key" in out.reason, (out.status, out.reason)
    assert out.failed_gates == ["invariants"] and "occurs 2 times in one batch" in out.gates["invariants"].details
    assert public_hash(dataset) == before
    gen = f"guarded-{out.backfill_id}"
    spec = load_spec(dataset, check_warehouse=False)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        assert s.scalar(f"SELECT count(*) FROM {SCHEMA}.writes WHERE generation = ? AND note IS NULL", [gen]) == 0


# ---- keys compared as the namespace stores them (after the cast) and NULL key parts (issue 39 item 4)


def _one_new_row(spec, order_no: str = "555555", region: str = "'north'") -> str:
    """One source row re-keyed: ``order_no`` and ``region`` are SQL expressions (a DOUBLE, a NULL)."""
    e = expected_rows_sql(spec, None)
    return (
        f"SELECT * REPLACE ({region} AS region, {order_no} AS order_no) FROM ({e}) "
        f"WHERE region = 'north' ORDER BY order_no LIMIT 1"
    )


def _rows_for(db: Path, order_no: int) -> int:
    return fetch(db, f"SELECT count(*) FROM {NS} WHERE order_no = ?", [order_no])[0][0]


@pytest.mark.parametrize("mode", ["upsert_keys", "replace_partitions", "append", "delete_keys"])
def test_a_null_key_part_is_refused_in_every_mode_naming_the_column(mode, loaded):
    spec, w, db = loaded
    batch = _one_new_row(spec, region="CAST(NULL AS VARCHAR)")
    if mode == "delete_keys":
        batch = f"SELECT region, order_no, src_rev FROM ({batch})"
    before = _state(db)
    with pytest.raises(
        DuplicateKeyError, match=r"has NULL parts \(region in 1 rows\).*Fix: give every row a value for region"
    ) as err:
        w.write("ingest-1", batch, mode=mode)
    assert "\n" not in str(err.value)
    assert _state(db) == before


def test_a_null_key_part_appended_in_separate_batches_never_lands(loaded):
    """The harness's case: (NULL, 555555) appended three times left three rows for one key."""
    spec, w, db = loaded
    before = _state(db)
    for _ in range(3):
        with pytest.raises(DuplicateKeyError, match="NULL parts"):
            w.write("ingest-1", _one_new_row(spec, region="CAST(NULL AS VARCHAR)"), mode="append")
        with pytest.raises(DuplicateKeyError, match="NULL parts"):
            w.write("ingest-1", _one_new_row(spec, region="CAST(NULL AS VARCHAR)"), mode="upsert_keys")
    assert _rows_for(db, 555555) == 0
    assert _state(db) == before


@pytest.mark.parametrize("mode", ["upsert_keys", "replace_partitions", "append", "delete_keys"])
def test_two_keys_that_are_one_after_the_cast_to_the_key_type_are_refused_in_one_batch(mode, loaded):
    """DOUBLE 100000.0 and 100000.4 differ, but the INTEGER key stores both as 100000."""
    spec, w, db = loaded
    batch = (
        f"({_one_new_row(spec, order_no='CAST(100000.0 AS DOUBLE)')}) "
        f"UNION ALL ({_one_new_row(spec, order_no='CAST(100000.4 AS DOUBLE)')})"
    )
    if mode == "delete_keys":
        batch = f"SELECT region, order_no, src_rev FROM ({batch})"
    before = _state(db)
    with pytest.raises(DuplicateKeyError, match=r"= \('north', 100000\) occurs 2 times in one batch"):
        w.write("ingest-1", batch, mode=mode)
    assert _state(db) == before and _rows_for(db, 100000) == 0


def test_a_key_offered_as_another_type_is_compared_with_the_held_key_it_becomes(loaded):
    spec, w, db = loaded
    e = expected_rows_sql(spec, None)
    held = fetch(db, f"SELECT order_no, shard FROM {NS} WHERE region = 'north' ORDER BY order_no LIMIT 1")[0]
    order_no, shard = held
    as_double = f"CAST({order_no} AS DOUBLE) + 0.4"
    offered = f"SELECT * REPLACE ({as_double} AS order_no) FROM ({e}) WHERE region = 'north' AND order_no = {order_no}"
    before = _state(db)
    # append: the key is already there, whatever type it is offered as
    with pytest.raises(DuplicateKeyError, match=rf"= \('north', {order_no}\) is already in the table"):
        w.write("ingest-1", offered, mode="append")
    # replace_partitions of another shard: the key is held outside it
    other = fetch(db, f"SELECT min(shard) FROM {NS} WHERE region = 'south'")[0][0]
    moved = f"SELECT * REPLACE ('{other}' AS shard) FROM ({offered})"
    with pytest.raises(DuplicateKeyError, match=r"is outside the replaced partitions"):
        w.write(
            "ingest-1",
            f"SELECT * FROM ({e}) WHERE shard = '{other}' UNION ALL ({moved})",
            mode="replace_partitions",
            partitions=[other],
        )
    assert _state(db) == before
    # upsert: the offered row replaces the held one (one row for the key, qty changed)
    w.write("ingest-1", f"SELECT * REPLACE (qty + 7 AS qty) FROM ({offered})", mode="upsert_keys")
    assert fetch(db, f"SELECT count(*), min(shard) FROM {NS} WHERE region = 'north' AND order_no = ?", [order_no]) == [
        (1, shard)
    ]
    # delete_keys: the tombstone offered as a DOUBLE deletes the key it becomes
    w.write("ingest-1", f"SELECT region, order_no, src_rev FROM ({offered})", mode="delete_keys")
    assert fetch(db, f"SELECT count(*) FROM {NS} WHERE region = 'north' AND order_no = ?", [order_no]) == [(0,)]
    assert _dups(db, NS) == 0


def test_a_key_value_the_key_type_cannot_hold_is_refused_in_one_line(loaded):
    spec, w, db = loaded
    before = _state(db)
    with pytest.raises(SchemaMismatchError, match=r"do not fit its column types \(order_no INTEGER\).*Fix:") as err:
        w.write("ingest-1", _one_new_row(spec, order_no="'five'"), mode="append")
    assert "\n" not in str(err.value)
    assert _state(db) == before


# ---- the same through the Dagster IO manager (a team's asset returning a pandas frame)


def _frame_asset(frame_rows: list[dict], *, mode: str = "append"):
    @dg.asset(key=["mart", "orders"], metadata={"recovery/write_mode": mode})
    def orders() -> pd.DataFrame:
        return pd.DataFrame(frame_rows)

    return orders


def _io_row(region, order_no, qty: int = 3) -> dict:
    return {
        "region": region,
        "order_no": order_no,
        "shard": "north-202403",
        "placed_at": datetime(2024, 3, 5),
        "qty": qty,
        "sku": "SKU-1",
        "src_rev": 1,
    }


def _materialize(spec_path: Path, db: Path, asset):
    from recovery_tests.support.io_manager import resources

    return dg.materialize([asset], resources=resources(spec_path, db), raise_on_error=False)


def test_the_io_manager_refuses_a_float64_key_column_whose_values_collide_after_the_cast(loaded):
    from recovery_tests.support.io_manager import failure_message

    spec, w, db = loaded
    spec_path = Path(str(spec.spec_path))
    before = _state(db)
    for mode in ("append", "upsert_keys"):
        both = _materialize(
            spec_path, db, _frame_asset([_io_row("north", 100000.0), _io_row("north", 100000.4)], mode=mode)
        )
        assert not both.success
        message = failure_message(both)
        assert "('north', 100000) occurs 2 times in one batch" in message and "nothing was written" in message, message
    assert _state(db)[:3] == before[:3] and _rows_for(db, 100000) == 0  # (the run's generation is registered)
    # in separate runs: the first lands 100000, the second (100000.4) is that key again
    assert _materialize(spec_path, db, _frame_asset([_io_row("north", 100000.0)])).success
    again = _materialize(spec_path, db, _frame_asset([_io_row("north", 100000.4)]))
    assert not again.success and "is already in the table" in failure_message(again)
    assert _rows_for(db, 100000) == 1
    assert _materialize(spec_path, db, _frame_asset([_io_row("north", 100000.4, qty=9)], mode="upsert_keys")).success
    assert fetch(db, f"SELECT count(*), max(qty) FROM {NS} WHERE order_no = 100000") == [(1, 9)]


def test_the_io_manager_refuses_a_null_key_part_in_separate_runs(loaded):
    from recovery_tests.support.io_manager import failure_message

    spec, w, db = loaded
    spec_path = Path(str(spec.spec_path))
    before = _state(db)
    for _ in range(3):
        run = _materialize(spec_path, db, _frame_asset([_io_row(None, 555555)]))
        assert not run.success
        message = failure_message(run)
        assert "has NULL parts (region in 1 rows)" in message and "nothing was written" in message, message
    assert _rows_for(db, 555555) == 0 and _state(db)[:3] == before[:3]
