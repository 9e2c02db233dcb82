"""The same recovery on Spark (issue #9): one small failed example, recovered through Dagster once
on DuckDB and once on the Spark engine (local mode), gives the same answers.

The promise: the engine is an implementation detail of the warehouse. The reconciliation
labels every damaged key the same way, the published table has the same content, the
consumers are restated with the same original and corrected values, and a fenced
generation cannot land a row on Spark either.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from rich.console import Console

from bench.measure import use_spark
from recovery.cli import main as cli
from recovery.launch.recover import run_recovery
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.engine.spark_engine import CATALOG, SparkEngine, SparkStatementError, SparkWarehouseSession
from recovery.lib.errors import FencedGenerationError
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.write.writer import Writer
from recovery_tests.support.example_build import build_example, copy_dataset, env
from recovery_tests.support.rows import present

SMALL_EVENTS = 20_000
FAILED = "backfill-0042"


def _recover(spec_path: Path, home: Path) -> None:
    with env(DAGSTER_HOME=str(home), RECOVERY_SPEC=str(spec_path)):
        from recovery.definitions import defs

        incident = parse_incident(spec_path.with_name("incident.yaml"))
        spec = check_incident(incident)
        with dg.DagsterInstance.get() as instance:
            # one wave after the canary: the waves are the same code path, and each costs Spark ~10 s
            run_recovery(incident, spec, instance=instance, defs=defs(), console=Console(quiet=True), wave_size=200)


@pytest.fixture(scope="module")
def recovered_twice(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Spec paths of the same failed example recovered on each engine."""
    built = build_example(shared_dir, events=SMALL_EVENTS)
    base = tmp_path_factory.mktemp("engines")
    specs = {}
    for engine in ("duckdb", "spark"):
        spec_path = copy_dataset(built.root, base / engine / "transactions")
        home = base / engine / "dagster_home"
        shutil.copytree(built.dagster_home, home, ignore=shutil.ignore_patterns("*.log"))
        if engine == "spark":
            # small data: adaptive planning and many shuffle tasks only add latency
            use_spark(spec_path, {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "2"})
            assert cli(["spark-import", "--spec", str(spec_path)]) == 0
        _recover(spec_path, home)
        specs[engine] = spec_path
    return specs


def _rows(spec_path: Path, sql: str) -> pa.Table:
    spec = parse_spec(spec_path)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return s.arrow(sql)


def _content_hash(table: pa.Table, order: list[str]) -> str:
    """Engine-independent content hash: rows sorted, values as text."""
    frame = table.to_pandas().sort_values(order).reset_index(drop=True)
    text = frame.astype(str).to_csv(index=False)
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_data_plane_lives_in_spark_not_in_the_control_file(recovered_twice):
    spec = parse_spec(recovered_twice["spark"])
    engine = open_engine(spec.warehouse)
    assert isinstance(engine, SparkEngine)
    import duckdb

    with duckdb.connect(str(spec.warehouse.path), read_only=True) as conn:
        in_duckdb = {
            r[0]
            for r in conn.execute(
                "SELECT schema_name FROM duckdb_tables() UNION SELECT schema_name FROM duckdb_views() "
                "WHERE NOT internal"
            ).fetchall()
        }
        catalog = dict(conn.execute(f"SELECT name, kind FROM {CATALOG}").fetchall())
    assert in_duckdb <= {"_recovery", "main"}, "a data relation stayed in the control file"
    assert catalog["raw.transaction_events"] == "table" and catalog["analytics.transactions"] == "view"
    assert catalog["_recovery.recon__transactions"] == "table"


def test_reconciliation_labels_every_key_the_same_on_both_engines(recovered_twice):
    sql = (
        "SELECT txn_id, label, actual_partition, expected_partition, actual_version, expected_version, "
        "rows_in_target FROM _recovery.recon__transactions"
    )
    duck, spark = (_rows(recovered_twice[e], sql) for e in ("duckdb", "spark"))
    assert duck.num_rows > 1000
    labels = set(duck.column("label").to_pylist())
    assert {"missing", "duplicate", "mispartitioned", "stale", "deleted"} <= labels
    assert _content_hash(spark, ["txn_id", "label"]) == _content_hash(duck, ["txn_id", "label"])


def test_the_published_table_has_the_same_content_on_both_engines(recovered_twice):
    spec = parse_spec(recovered_twice["duckdb"])
    cols = [
        c
        for c in (
            "txn_id",
            "account_id",
            "customer_id",
            "merchant_id",
            "event_ts",
            "event_date",
            "amount_usd",
            "status",
            "_source_version",
            "_generation",
        )
    ]
    sql = f"SELECT {', '.join(cols)} FROM {spec.target.table_name.sql()}"  # _written_at is when each run wrote
    duck, spark = (_rows(recovered_twice[e], sql) for e in ("duckdb", "spark"))
    assert duck.num_rows > 1000 and spark.num_rows == duck.num_rows
    assert _content_hash(spark, cols) == _content_hash(duck, cols)
    for engine in ("duckdb", "spark"):  # the repair generation wrote it, published by the pointer
        gens = set(
            _rows(recovered_twice[engine], f"SELECT DISTINCT _generation FROM {spec.target.table_name.sql()}")
            .column(0)
            .to_pylist()
        )
        assert FAILED not in gens


def test_consumers_are_restated_the_same_on_both_engines(recovered_twice):
    sql = (
        "SELECT consumer, consumer_key, change, original_value, corrected_value, difference, material, decision, "
        "original_namespace, corrected_namespace FROM _recovery.restatement_ledger__transactions"
    )
    duck, spark = (_rows(recovered_twice[e], sql) for e in ("duckdb", "spark"))
    assert duck.num_rows > 0 and len(set(duck.column("consumer").to_pylist())) >= 3
    order = ["consumer", "consumer_key", "change"]
    assert _content_hash(spark, order) == _content_hash(duck, order)


def test_publish_on_spark_is_the_view_move_and_keeps_the_old_namespace(recovered_twice):
    spec = parse_spec(recovered_twice["spark"])
    with open_engine(spec.warehouse).session(read_only=True) as s:
        view_sql = s.scalar(f"SELECT view_sql FROM {CATALOG} WHERE name = ?", [str(spec.target.table_name)])
        pointer = s.scalar(
            "SELECT namespace FROM _recovery.pointers WHERE public_name = ?", [str(spec.target.table_name)]
        )
        assert pointer.endswith("__g0002") and pointer.split(".")[1] in view_sql
        old = s.scalar("SELECT count(*) FROM analytics.transactions__g0001")
        assert old > 0  # the failed namespace is kept, not overwritten


def test_a_fenced_generation_cannot_land_a_row_on_spark(recovered_twice):
    spec = parse_spec(recovered_twice["spark"])
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        fenced_at, namespace = present(
            s.fetchone(
                "SELECT fenced_at, coalesce(namespace, '') FROM _recovery.generations WHERE generation = ?", [FAILED]
            )
        )
        assert fenced_at is not None
        before = s.scalar(f"SELECT count(*) FROM {spec.target.table_name.sql()}")
        dirs_before = s.fetchall(f"SELECT name, dirs FROM {CATALOG} ORDER BY name")
    data_files = {p for p in Path(present(spec.warehouse.spark).data_path).rglob("*.parquet")}
    rows = f"SELECT * EXCLUDE (_generation, _written_at) FROM {spec.target.table_name.sql()} LIMIT 5"
    with pytest.raises(FencedGenerationError):
        Writer(engine, spec, actor="test").write(FAILED, rows, mode="append")
    with engine.session(read_only=True) as s:
        assert s.scalar(f"SELECT count(*) FROM {spec.target.table_name.sql()}") == before
        assert s.fetchall(f"SELECT name, dirs FROM {CATALOG} ORDER BY name") == dirs_before
        assert s.scalar("SELECT count(*) FROM _recovery.fence_attempts WHERE generation = ?", [FAILED]) >= 1
    assert {p for p in Path(present(spec.warehouse.spark).data_path).rglob("*.parquet")} == data_files, (
        "the refused write left staged files behind"
    )


def test_a_spark_transaction_that_fails_leaves_no_version_behind(tmp_path: Path):
    engine = SparkEngine(str(tmp_path / "control.duckdb"), str(tmp_path / "data"))
    with engine.transaction() as s:
        s.create_table("raw.t", "k INTEGER, v VARCHAR")
        s.replace_rows("raw.t", ["k", "v"], insert="SELECT * FROM (VALUES (1, 'a'), (2, 'b'))")
    with engine.transaction() as s:  # a row whose condition is NULL is not updated (SQL's WHERE)
        s.update_rows("raw.t", [("v", "'z'")], where="v <> CAST(NULL AS VARCHAR) OR k = 2")
        s.update_rows("raw.t", [("v", "'b'")], where="k = 2")
    with engine.session(read_only=True) as s:
        assert s.fetchall("SELECT k, v FROM raw.t ORDER BY k") == [(1, "a"), (2, "b")]
    before = {str(p) for p in (tmp_path / "data" / "raw" / "t").iterdir()}
    with pytest.raises(RuntimeError):
        with engine.transaction() as s:
            s.replace_rows("raw.t", ["k", "v"], remove="k = 1", insert="SELECT 3, 'c'")
            assert s.fetchall("SELECT k FROM raw.t ORDER BY k") == [(2,), (3,)]  # the transaction sees its writes
            raise RuntimeError("the job failed half-way")
    with engine.session(read_only=True) as s:
        committed = s.scalar(f"SELECT dirs FROM {CATALOG} WHERE name = 'raw.t'")
        assert s.fetchall("SELECT k, v FROM raw.t ORDER BY k") == [(1, "a"), (2, "b")]
    on_disk = {str(p) for p in (tmp_path / "data" / "raw" / "t").iterdir()}
    assert set(committed) <= on_disk
    assert on_disk == before, "the rolled-back DELETE and INSERT left staged versions on disk"


def test_the_write_primitives_are_native_on_spark_one_version_per_change(tmp_path: Path, monkeypatch):
    """The writer's change and the pointer move reach Spark as primitives (ADR 0001), not as DuckDB
    DML text: same rows as on DuckDB (``recovery_tests/lib/engine``), one catalog version."""
    engine = SparkEngine(str(tmp_path / "control.duckdb"), str(tmp_path / "data"))
    with engine.transaction() as s:
        s.create_table("raw.t", "k INTEGER, p VARCHAR, v VARCHAR")
        s.replace_rows(
            "raw.t",
            ["k", "p", "v"],
            insert="SELECT * FROM (VALUES (1, 'a', 'x'), (2, 'a', 'y'), (3, 'b', 'z'), (4, NULL, 'n'))",
        )

    def as_text(*_args, **_kwargs):
        raise AssertionError("a write primitive went through SQL text")

    monkeypatch.setattr(SparkWarehouseSession, "execute", as_text)
    with engine.transaction() as s:
        s.replace_rows("raw.t", ["v", "k", "p"], remove="p = 'a'", insert="SELECT ?, 5, 'a'", params=["new"])
        s.swap_pointer("raw.pub", "SELECT k, v FROM raw.t")
    monkeypatch.undo()
    with engine.session(read_only=True) as s:
        assert s.fetchall("SELECT k, p, v FROM raw.t ORDER BY k") == [(3, "b", "z"), (4, None, "n"), (5, "a", "new")]
        assert s.fetchall("SELECT v FROM raw.pub ORDER BY k") == [("z",), ("n",), ("new",)]
        replaced = s.scalar(f"SELECT dirs FROM {CATALOG} WHERE name = 'raw.t'")
    assert len(replaced) == 2  # the kept rows and the added rows, committed as one catalog change
    monkeypatch.setattr(SparkWarehouseSession, "execute", as_text)
    with engine.transaction() as s:  # an append rewrites nothing: the version keeps its directories
        s.replace_rows("raw.t", ["k", "p", "v"], insert="SELECT 9, 'c', 'w'")
    monkeypatch.undo()
    with engine.session(read_only=True) as s:
        appended = s.scalar(f"SELECT dirs FROM {CATALOG} WHERE name = 'raw.t'")
        assert s.scalar("SELECT count(*) FROM raw.pub") == 4
    assert appended[:2] == replaced and len(appended) == 3


def test_the_named_writes_are_native_on_spark_and_dml_text_is_refused(tmp_path: Path, monkeypatch):
    """The operations ``test_write_primitives.py`` checks on DuckDB, with the same rows on Spark, none of
    them through SQL text; DML text that writes a Spark relation is refused rather than parsed back."""
    import pyarrow.parquet as pq

    engine = SparkEngine(str(tmp_path / "control.duckdb"), str(tmp_path / "data"))
    with engine.transaction() as s:
        s.create_table("raw.t", "k INTEGER, p VARCHAR, v VARCHAR")
        s.replace_rows(
            "raw.t",
            ["k", "p", "v"],
            insert="SELECT * FROM (VALUES (1, 'a', 'x'), (2, 'a', 'y'), (3, 'b', 'z'), (4, NULL, 'n'))",
        )
        with pytest.raises(SparkStatementError, match="Session operation"):
            s.execute("DELETE FROM raw.t WHERE k = 1")

    def as_text(*_args, **_kwargs):
        raise AssertionError("a named write went through SQL text")

    with engine.transaction() as s:
        monkeypatch.setattr(SparkWarehouseSession, "execute", as_text)
        s.create_table("raw.log", "k INTEGER, note VARCHAR")
        s.create_table("raw.log", "other BOOLEAN")  # exists: left as it is
        s.materialize("raw.a", "SELECT k, v FROM raw.t WHERE k <= ?", [2])
        s.materialize("raw.a", "SELECT 0 AS k, 'no' AS v", keep_existing=True)
        s.materialize("raw.b", "SELECT k FROM raw.t WHERE k = 1")
        s.update_rows("raw.t", [("v", "upper(v) || ?")], where="p = ?", params=["!", "a"])
        s.temp_table("__k", "SELECT k FROM raw.t WHERE p IS NULL")
        s.collect_table("__n", "SELECT count(*) AS n FROM raw.t")
        s.temp_view("__v", "SELECT v FROM raw.t JOIN __k USING (k)")
        s.drop_relation("__v", view=True)
        s.drop_relation("raw.b")
        s.drop_relation("raw.nothing")
        rows = s.export_parquet("SELECT k, v FROM raw.t WHERE k < ? ORDER BY k", str(tmp_path / "out.parquet"), [3])
        monkeypatch.undo()
        assert s.scalar("SELECT n FROM __n") == 4 and s.object_kind("raw", "b") is None
        assert s.control.scalar("SELECT n FROM __n") == 4  # collected into the control store
        # a Spark temp view (``__k``) and a control-store temp (``__n``) are both this session's temps
        assert s.has_temp("__k") and s.has_temp("__n") and not s.has_temp("t")
    assert rows == 2 and pq.read_table(tmp_path / "out.parquet").to_pylist() == [
        {"k": 1, "v": "X!"},
        {"k": 2, "v": "Y!"},
    ]
    with engine.session(read_only=True) as s:
        assert [c for c, _ in s.columns("raw.log")] == ["k", "note"]
        assert s.fetchall("SELECT k, v FROM raw.a ORDER BY k") == [(1, "x"), (2, "y")]
        assert s.fetchall("SELECT k, v FROM raw.t ORDER BY k")[2:] == [(3, "z"), (4, "n")]
