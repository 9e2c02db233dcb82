"""A platform team's own assets write a managed dataset through ``ManagedDuckDBIOManager``.

Fast: the small orders dataset (composite key, string partition ``shard``), real Dagster
runs in process (``dg.materialize``), no worked example.
"""

from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.control.plane import SCHEMA, delta_table
from recovery.lib.engine import open_engine
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.fencing import GENERATION_TAG
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.managed_output import generation_for_run, stage_table
from recovery.lib.write.writer import Writer
from recovery.orchestration import failure_reason
from recovery_tests.support.io_manager import failure_message, resources
from recovery_tests.support.repaired_small import now
from recovery_tests.support.small_dataset import build_small_dataset, fetch


@pytest.fixture
def orders(tmp_path: Path):
    """The small dataset, ingested once (generation ``ingest-1``); returns (spec path, spec, db, shards)."""
    spec_path = build_small_dataset(tmp_path / "orders", n_orders=120)
    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    writer.ensure()
    writer.register_generation("ingest-1", "ingest")
    apply_changes(writer, "ingest-1", until=now())
    db = Path(spec.warehouse.path)
    shards = [r[0] for r in fetch(db, "SELECT DISTINCT shard FROM mart.orders ORDER BY 1")]
    return spec_path, spec, db, shards


def user_asset(spec, shards: list[str], *, qty_factor: int = 2, spill: bool = False, with_version: bool = True):
    """What a team writes: a partitioned asset computing its shard from the source, returning a frame."""
    parts = dg.StaticPartitionsDefinition(shards)

    @dg.asset(key=["mart", "orders"], partitions_def=parts, code_version="5.0.0")
    def orders(context: dg.AssetExecutionContext) -> pd.DataFrame:
        con = duckdb.connect(str(spec.warehouse.path), read_only=True)
        try:
            scope = "true" if spill else "shard = ?"
            frame = con.execute(
                f"SELECT * REPLACE (qty * {qty_factor} AS qty) FROM ({expected_rows_sql(spec, None)}) WHERE {scope}",
                [] if spill else [context.partition_key],
            ).df()
        finally:
            con.close()
        return frame if with_version else frame.drop(columns=["src_rev"])

    return orders


def shard_rows(db: Path, shard: str) -> list[tuple]:
    return fetch(
        db, "SELECT region, order_no, qty, src_rev, gen_id FROM mart.orders WHERE shard = ? ORDER BY 1, 2", [shard]
    )


def test_generation_is_the_tag_else_the_backfill_else_the_run():
    assert generation_for_run({GENERATION_TAG: "bf-1", "dagster/backfill": "abc"}, "r1").generation == "bf-1"
    assert generation_for_run({"dagster/backfill": "abc"}, "r1") == generation_for_run(
        {"dagster/backfill": "abc"}, "r2"
    )
    backfill = generation_for_run({"dagster/backfill": "abc"}, "r1")
    assert (backfill.generation, backfill.kind, backfill.backfill_id) == ("backfill-abc", "backfill", "abc")
    plain = generation_for_run({}, "r1")
    assert (plain.generation, plain.kind) == ("run-r1", "ingest")


def test_partitioned_output_replaces_its_partition_only_stamped_with_the_runs_generation(orders):
    spec_path, spec, db, shards = orders
    target, other = shards[0], shards[1:]
    before = {s: shard_rows(db, s) for s in other}
    old = {r[:2]: r for r in shard_rows(db, target)}

    result = dg.materialize(
        [user_asset(spec, shards)],
        partition_key=target,
        tags={GENERATION_TAG: "bf-9"},
        resources=resources(spec_path, db),
    )
    assert result.success
    rows = shard_rows(db, target)
    assert {r[:2] for r in rows} == set(old)
    for region, order_no, qty, rev, gen in rows:
        assert gen == "bf-9"
        assert qty == 2 * old[(region, order_no)][2]
        assert rev == old[(region, order_no)][3]  # the source version the asset provided
    assert {s: shard_rows(db, s) for s in other} == before
    # one write of the registered backfill generation, logged in the delta log, staging dropped
    assert fetch(db, f"SELECT kind, code_version, writes FROM {SCHEMA}.generations WHERE generation = 'bf-9'") == [
        ("ingest", "5.0.0", 1)
    ]
    assert fetch(db, f"SELECT mode, partitions FROM {SCHEMA}.writes WHERE generation = 'bf-9'") == [
        ("replace_partitions", [target])
    ]
    logged = fetch(
        db, f"SELECT count(*) FROM {delta_table(spec.dataset)} WHERE gen_id = 'bf-9' AND _delta_op = 'upsert'"
    )
    assert logged == [(len(rows),)]
    assert fetch(db, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'recovery_io'") == [(0,)]
    mat = result.asset_materializations_for_node("mart__orders")[0]
    assert mat.metadata["recovery/generation"].value == "bf-9"
    assert mat.metadata["dagster/row_count"].value == len(rows)


def test_a_run_re_executed_after_a_kill_clears_the_killed_attempts_stage_and_empty_generation(orders):
    """Run ``r-killed`` died after its IO manager staged its output and registered ``run-r-killed``; Dagster's
    re-execution (a new run naming it as parent and root) writes its output and leaves nothing of it behind."""
    spec_path, spec, db, shards = orders
    target = shards[0]
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    with writer.engine.transaction() as s:  # what the killed attempt left: its stage, its generation without a write
        s.execute("CREATE SCHEMA IF NOT EXISTS recovery_io")
        s.execute(f"CREATE TABLE {stage_table('r-killed', 'mart__orders')} AS SELECT * FROM mart.orders LIMIT 2")
    writer.register_generation("run-r-killed", "ingest", run_id="r-killed")

    result = dg.materialize(
        [user_asset(spec, shards)],
        partition_key=target,
        tags={"dagster/parent_run_id": "r-killed", "dagster/root_run_id": "r-killed"},
        resources=resources(spec_path, db),
    )
    assert result.success
    assert fetch(db, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'recovery_io'") == [(0,)]
    ended = fetch(db, f"SELECT status, writes, note FROM {SCHEMA}.generations WHERE generation = 'run-r-killed'")
    assert ended == [("failed", 0, f"superseded by its re-execution, run {result.run_id}")]
    assert {r[4] for r in shard_rows(db, target)} == {f"run-{result.run_id}"}


def test_a_fenced_generations_write_is_refused_in_the_run_while_another_run_lands(orders):
    spec_path, spec, db, shards = orders
    target, live = shards[0], shards[1]
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    asset = user_asset(spec, shards)
    assert dg.materialize(
        [asset], partition_key=target, tags={GENERATION_TAG: "bf-9"}, resources=resources(spec_path, db)
    ).success
    writer.fence("bf-9", incident_id="INC-io", fenced_by="oncall")
    fenced_rows, live_before = shard_rows(db, target), shard_rows(db, live)

    refused = dg.materialize(
        [user_asset(spec, shards, qty_factor=5)],
        partition_key=target,
        tags={GENERATION_TAG: "bf-9"},
        resources=resources(spec_path, db),
        raise_on_error=False,
    )
    assert not refused.success
    message = failure_message(refused)
    assert "generation 'bf-9' is fenced" in message and "nothing was written" in message, message
    assert "mart.orders" in message
    assert shard_rows(db, target) == fenced_rows
    assert fetch(db, f"SELECT count(*) FROM {SCHEMA}.fence_attempts WHERE generation = 'bf-9'")[0][0] >= 1
    assert not refused.asset_materializations_for_node("mart__orders")
    # the refusal is not retried: one failed step, no retry
    assert sum(1 for e in refused.all_events if e.event_type_value == "STEP_UP_FOR_RETRY") == 0

    # a valid run (no generation tag: its own run generation) lands in another partition
    valid = dg.materialize(
        [user_asset(spec, shards, qty_factor=3)], partition_key=live, resources=resources(spec_path, db)
    )
    assert valid.success
    rows = shard_rows(db, live)
    assert {r[4] for r in rows} == {f"run-{valid.run_id}"}
    assert [r[2] for r in rows] == [3 * r[2] for r in live_before]


def test_rows_outside_the_runs_partition_are_refused_and_nothing_lands(orders):
    spec_path, spec, db, shards = orders
    before = fetch(db, "SELECT * FROM mart.orders ORDER BY region, order_no")
    result = dg.materialize(
        [user_asset(spec, shards, spill=True)],
        partition_key=shards[0],
        resources=resources(spec_path, db),
        raise_on_error=False,
    )
    assert not result.success
    message = failure_message(result)
    assert "fall outside the run's partitions" in message and "filter the frame on shard" in message, message
    assert fetch(db, "SELECT * FROM mart.orders ORDER BY region, order_no") == before
    assert fetch(db, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'recovery_io'") == [(0,)]


def test_source_version_is_optional_and_arrow_and_relations_write_too(orders):
    spec_path, spec, db, shards = orders
    result = dg.materialize(
        [user_asset(spec, shards, with_version=False)], partition_key=shards[2], resources=resources(spec_path, db)
    )
    assert result.success
    assert {r[3] for r in shard_rows(db, shards[2])} == {None}

    def as_arrow() -> pa.Table:
        con = duckdb.connect(str(spec.warehouse.path), read_only=True)
        try:
            return con.sql(
                f"SELECT * REPLACE (qty + 100 AS qty) FROM ({expected_rows_sql(spec, None)}) "
                f"WHERE region = 'west' AND order_no % 3 = 0"
            ).to_arrow_table()
        finally:
            con.close()

    def as_relation() -> duckdb.DuckDBPyRelation:
        con = duckdb.connect(str(spec.warehouse.path), read_only=True)
        try:
            table = con.sql(
                f"SELECT * REPLACE (qty + 1000 AS qty) FROM ({expected_rows_sql(spec, None)}) "
                f"WHERE region = 'west' AND order_no % 3 = 0"
            ).to_arrow_table()
        finally:
            con.close()
        return duckdb.from_arrow(table)

    # upserts by key when the asset has no partitions, whether it returns an Arrow table or a relation
    for kind, compute in (("arrow", as_arrow), ("relation", as_relation)):
        unpartitioned = dg.asset(key=["mart", "orders"])(compute)
        run = dg.materialize([unpartitioned], resources=resources(spec_path, db))
        assert run.success, kind
        got = fetch(db, "SELECT DISTINCT gen_id, qty > 100 FROM mart.orders WHERE region = 'west' AND order_no % 3 = 0")
        assert got == [(f"run-{run.run_id}", True)], kind
        assert fetch(db, f"SELECT mode FROM {SCHEMA}.writes WHERE generation = ?", [f"run-{run.run_id}"]) == [
            ("upsert_keys",)
        ]


def test_a_downstream_asset_reads_the_managed_partition_through_the_public_view(orders):
    spec_path, spec, db, shards = orders
    asset = user_asset(spec, shards)

    @dg.asset(partitions_def=asset.partitions_def, deps=[], ins={"orders": dg.AssetIn(key=["mart", "orders"])})
    def order_count(orders: pd.DataFrame) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"n": len(orders), "shards": sorted(set(orders["shard"]))})

    @dg.asset(partitions_def=asset.partitions_def, ins={"orders": dg.AssetIn(key=["mart", "orders"])})
    def order_units(orders: pa.Table) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"units": int(pa.compute.sum(orders["qty"]).as_py())})

    result = dg.materialize(
        [asset, order_count, order_units], partition_key=shards[0], resources=resources(spec_path, db)
    )
    assert result.success
    meta = result.asset_materializations_for_node("order_count")[0].metadata
    assert meta["n"].value == len(shard_rows(db, shards[0]))
    assert meta["shards"].value == [shards[0]]
    units = result.asset_materializations_for_node("order_units")[0].metadata["units"].value
    assert units == sum(r[2] for r in shard_rows(db, shards[0]))


def test_an_unmanaged_partitioned_output_keeps_the_other_partitions_and_a_failed_one_changes_nothing(orders):
    """Stored as dagster-duckdb stores it: the run's partition replaced, the others kept; a write that
    fails (a column added to the table by hand) leaves the partition as it was, all in one transaction."""
    spec_path, spec, db, shards = orders
    parts = dg.StaticPartitionsDefinition(shards[:3])

    @dg.asset(key=["mart", "shard_units"], partitions_def=parts, metadata={"partition_expr": "shard"})
    def shard_units(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return pd.DataFrame({"shard": [context.partition_key], "units": [len(context.partition_key)]})

    for shard in shards[:3]:
        assert dg.materialize([shard_units], partition_key=shard, resources=resources(spec_path, db)).success
    assert fetch(db, "SELECT shard FROM mart.shard_units ORDER BY 1") == [(s,) for s in sorted(shards[:3])]
    con = duckdb.connect(str(db))
    try:
        con.execute("ALTER TABLE mart.shard_units ADD COLUMN note VARCHAR")
    finally:
        con.close()
    failed = dg.materialize(
        [shard_units], partition_key=shards[0], resources=resources(spec_path, db), raise_on_error=False
    )
    assert not failed.success and "values were supplied" in failure_reason(failed)
    assert fetch(db, "SELECT shard FROM mart.shard_units ORDER BY 1") == [(s,) for s in sorted(shards[:3])]


# ---- the worked example: a team's own history asset under the incident ------------------------------


def test_under_the_incident_the_fenced_backfills_write_is_refused_and_a_valid_run_survives_the_repair(example_copy):
    """The team's own ``analytics/transactions`` asset, written through the IO manager: once the
    incident fences ``backfill-0042``, a run of that backfill lands nothing; a valid run made while
    the repair is in flight lands on the published table, and the repair's publish carries it over."""
    from recovery.example.defs import DAILY, TARGET_KEY
    from recovery.lib.incident.model import parse_incident
    from recovery.lib.write.fencing import fence_incident
    from recovery_tests.support.repair_support import current_plan, gate_and_publish, repair_through_library

    spec = load_spec(example_copy)
    db = Path(spec.warehouse.path)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    fence_incident(writer, incident)

    @dg.asset(key=TARGET_KEY, partitions_def=DAILY, code_version="2.4.0")
    def transactions(context: dg.AssetExecutionContext) -> pd.DataFrame:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute(
                f"SELECT * FROM ({expected_rows_sql(spec, None)}) WHERE event_date = CAST(? AS DATE)",
                [context.partition_key],
            ).df()
        finally:
            con.close()

    io = resources(example_copy, db)
    day = "2024-03-15"
    public_day = (
        "SELECT txn_id, amount_usd, _source_version, _generation FROM analytics.transactions "
        "WHERE event_date = DATE '2024-03-15' ORDER BY 1"
    )
    damaged = fetch(db, public_day)

    # a retry of the failed backfill's run, after containment: refused, nothing lands
    refused = dg.materialize(
        [transactions],
        partition_key=day,
        resources=io,
        raise_on_error=False,
        tags={GENERATION_TAG: "backfill-0042", "dagster/backfill": "0042"},
    )
    assert not refused.success
    assert "generation 'backfill-0042' is fenced" in failure_message(refused)
    assert fetch(db, public_day) == damaged

    # the repair is built (not yet published); meanwhile the source corrects one transaction of the day
    plan = repair_through_library(spec, incident, wave_size=200)
    assert day in {p for wave in plan.waves.values() for p in wave}
    victim = fetch(db, f"SELECT min(txn_id) FROM ({expected_rows_sql(spec, None)}) WHERE event_date = DATE '{day}'")[0][
        0
    ]
    with open_engine(spec.warehouse).transaction() as s:
        s.execute(
            "INSERT INTO raw.transaction_events SELECT * REPLACE (version + 1 AS version, amount * 3 + 7 AS amount, "
            "now()::TIMESTAMP AS ingested_at) FROM raw.transaction_events WHERE txn_id = ? "
            "QUALIFY row_number() OVER (ORDER BY version DESC) = 1",
            [victim],
        )
    corrected = fetch(
        db, f"SELECT amount_usd, _source_version FROM ({expected_rows_sql(spec, None)}) WHERE txn_id = ?", [victim]
    )[0]
    assert corrected not in [(r[1], r[2]) for r in damaged if r[0] == victim]

    # the team's valid run of the day (its own run generation) lands on the published table
    valid = dg.materialize([transactions], partition_key=day, resources=io)
    assert valid.success
    landed = fetch(db, public_day)
    assert {r[3] for r in landed} == {f"run-{valid.run_id}"}
    assert [r[1:3] for r in landed if r[0] == victim] == [corrected]
    assert current_plan(spec, incident.incident_id).status != "published"

    # publishing the repair replays the valid run's write: the correction is in the repaired table
    gate_and_publish(spec, incident.incident_id)
    published = fetch(db, public_day)
    assert [r[1:3] for r in published if r[0] == victim] == [corrected]
    assert [r[0] for r in published] == [
        r[0]
        for r in fetch(
            db, f"SELECT txn_id FROM ({expected_rows_sql(spec, None)}) WHERE event_date = DATE '{day}' ORDER BY 1"
        )
    ]
    assert "backfill-0042" not in {r[3] for r in published}


def test_a_spark_dataset_is_refused_in_one_sentence_without_touching_anything(tmp_path):
    from recovery_tests.support.small_dataset import spec_dict, write_spec

    data = spec_dict()
    data["warehouse"] = {
        "engine": "spark",
        "path": "control.duckdb",
        "spark": {"data_path": str(tmp_path / "lake"), "master": "local[1]"},
    }
    (tmp_path / "orders.sql").write_text("SELECT region, order_no, 'x' AS shard, placed_at, qty, sku FROM {{ source }}")
    (tmp_path / "orders_by_shard.sql").write_text("SELECT shard, count(*) AS orders FROM {{ target }} GROUP BY shard")
    spec_path = write_spec(tmp_path, data)

    @dg.asset(key=["mart", "orders"])
    def orders() -> pd.DataFrame:
        return pd.DataFrame({"region": ["north"], "order_no": [1]})

    result = dg.materialize([orders], resources=resources(spec_path, tmp_path / "other.duckdb"), raise_on_error=False)
    assert not result.success
    message = failure_message(result)
    assert (
        "mart.orders: asset mart/orders is a spark dataset and ManagedDuckDBIOManager writes DuckDB warehouses only"
        in message
    )
    assert not (tmp_path / "control.duckdb").exists() and not (tmp_path / "lake").exists()
