"""The same recovery on Spark for a warehouse the package never wrote (issue #40).

``sample_data/shipments`` (a change log, a target with its own metadata columns, the team's run
registry, a failed backfill, all written by the team's own pandas/SQL jobs) is driven exactly as
docs/spark.md tells a new user: the spec switched to ``warehouse.engine: spark``, ``recovery
spark-import --spec``, then ``recovery recover --incident``, through the CLI's ``main`` in this
process (so ``spark-import`` and every phase share one JVM). The same incident recovered on DuckDB
is the reference: every key gets the same label, the published table the same content, the
consumers the same restatement. Adoption used to stop it: ``ALTER TABLE ... RENAME`` had no Spark
path (exit 3).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from bench.measure import use_spark
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.engine.spark_engine import CATALOG
from recovery_tests.support.foreign_warehouse import KEY, build_shipments, cli, fresh_copy, labels_vs_truth
from recovery_tests.support.rows import present

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None or not (shutil.which("java") or os.environ.get("JAVA_HOME")),
        reason="needs pyspark (the spark extra) and Java",
    ),
]

INCIDENT = "INC-SHIP-7"
# what the public name serves (cost as DOUBLE: DECIMAL's text differs between the engines' Arrow types)
PUBLISHED = (
    "SELECT carrier_code, tracking_no, ship_month, weight_kg, CAST(cost_usd AS DOUBLE) AS cost_usd, service, "
    "load_id, src_rev FROM mart.shipments"
)
LEDGER = (
    "SELECT consumer, consumer_key, change, original_value, corrected_value, material "
    'FROM _recovery."restatement_ledger__shipments" WHERE incident_id = ?'
)


@pytest.fixture(scope="module")
def recovered(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The shipments incident recovered through the CLI on each engine: its folder, outputs and seconds."""
    built = build_shipments(shared_dir)
    base = tmp_path_factory.mktemp("foreign_engines")
    out: dict[str, dict] = {}
    for engine in ("duckdb", "spark"):
        root = fresh_copy(built, base / engine / "shipments")
        home = base / engine / "home"
        t0 = time.monotonic()
        run: dict = {"root": root}
        if engine == "spark":
            # small data: adaptive planning, many shuffle tasks and compiling each stage only add latency
            use_spark(
                root / "spec.yaml",
                {
                    "spark.sql.adaptive.enabled": "false",
                    "spark.sql.shuffle.partitions": "2",
                    "spark.sql.codegen.wholeStage": "false",
                },
            )
            run["import"] = cli(home, "spark-import", "--spec", str(root / "spec.yaml"))
        # one wave after the canary: the waves are the same code path, and each costs Spark seconds
        run["recover"] = cli(home, "recover", "--incident", str(root / "incident.yaml"), "--wave-size", "200")
        run["seconds"] = time.monotonic() - t0
        run["published"] = _read(root, PUBLISHED)
        run["ledger"] = _read(root, LEDGER, [INCIDENT])
        if engine == "spark":  # then the verbs after the incident: the next backfill through its gates, hand-back
            run["control"] = _control_file(root)
            t1 = time.monotonic()
            spec = ("--spec", str(root / "spec.yaml"))
            window = (*spec, "--start", "2013-05", "--end", "2013-06", "--approved-by", "data-platform-lead")
            run["backfill"] = cli(home, "backfill", "run", *window)
            run["release"] = cli(home, "release", *spec)
            run["after"] = time.monotonic() - t1
        out[engine] = run
    print(
        f"\nshipments recovered through the CLI: duckdb {out['duckdb']['seconds']:.0f} s, "
        f"spark {out['spark']['seconds']:.0f} s (spark-import included); backfill run + release on spark "
        f"{out['spark']['after']:.0f} s"
    )
    return out


def _read(root: Path, sql: str, params: list | None = None) -> pa.Table:
    with open_engine(parse_spec(root / "spec.yaml").warehouse).session(read_only=True) as s:
        return s.arrow(sql, params)


def _control_file(root: Path) -> tuple[dict[str, str], set[str], tuple]:
    """What the control file holds after the recovery: the Spark catalog's kinds, the schemas of its
    own relations, and the target's first namespace with its note."""
    import duckdb

    with duckdb.connect(str(parse_spec(root / "spec.yaml").warehouse.path), read_only=True) as conn:
        catalog = dict(conn.execute(f"SELECT name, kind FROM {CATALOG}").fetchall())
        in_control = {
            r[0]
            for r in conn.execute(
                "SELECT schema_name FROM duckdb_tables() WHERE NOT internal "
                "UNION SELECT schema_name FROM duckdb_views() WHERE NOT internal"
            ).fetchall()
        }
        adopted = conn.execute(
            "SELECT namespace, note FROM _recovery.namespaces WHERE public_name = 'mart.shipments' "
            "ORDER BY created_seq LIMIT 1"
        ).fetchone()
    return catalog, in_control, present(adopted)


def _content_hash(table: pa.Table, order: list[str]) -> str:
    """Engine-independent content hash: rows sorted, values as text."""
    frame = table.to_pandas().sort_values(order).reset_index(drop=True)
    return hashlib.sha256(frame.astype(str).to_csv(index=False).encode()).hexdigest()


def test_spark_import_then_recover_exit_0_on_a_warehouse_written_by_plain_sql(recovered):
    imported, spark = recovered["spark"]["import"], recovered["spark"]["recover"]
    assert imported.code == 0 and "moved 3 relations" in imported.out, imported.out
    assert spark.code == 0, spark.out
    assert recovered["duckdb"]["recover"].code == 0, recovered["duckdb"]["recover"].out
    assert "adopted mart.shipments" in spark.out and "bf-0007: fenced" in spark.out, spark.out
    assert "Traceback" not in spark.out and "NotImplementedError" not in spark.out


def test_every_key_gets_the_duckdb_label_on_spark(recovered):
    def labels(engine: str) -> pd.DataFrame:
        path = recovered[engine]["root"] / "reports" / INCIDENT / "reconciliation.parquet"
        return pd.read_parquet(path)[KEY + ["label"]]

    duck, spark = labels("duckdb"), labels("spark")
    assert len(duck) > 500 and duck["label"].nunique() >= 3
    both = duck.merge(spark, on=KEY, how="outer", suffixes=("_duckdb", "_spark"), indicator=True)
    assert (both["_merge"] == "both").all(), both[both["_merge"] != "both"].head()
    assert (both["label_duckdb"] == both["label_spark"]).all(), both[both["label_duckdb"] != both["label_spark"]]
    root = recovered["spark"]["root"]
    assert labels_vs_truth(root / "reports" / INCIDENT / "reconciliation.parquet", root).empty


def test_the_published_table_and_the_restatement_are_the_same_on_both_engines(recovered):
    duck, spark = (recovered[e]["published"] for e in ("duckdb", "spark"))
    assert duck.num_rows > 1000 and spark.num_rows == duck.num_rows
    assert _content_hash(spark, KEY) == _content_hash(duck, KEY)
    assert "bf-0007" not in set(spark.column("load_id").to_pylist())  # the failed backfill's rows were repaired
    order = ["consumer", "consumer_key", "change"]
    duck_l, spark_l = (recovered[e]["ledger"] for e in ("duckdb", "spark"))
    assert duck_l.num_rows > 0
    assert _content_hash(spark_l, order) == _content_hash(duck_l, order)


def test_the_adopted_target_lives_in_spark_as_generation_one_behind_a_managed_view(recovered):
    catalog, in_control, adopted = recovered["spark"]["control"]
    assert in_control <= {"_recovery", "main"}, "a data relation stayed in the control file"
    assert catalog["mart.shipments"] == "view" and catalog["mart.shipments__g0001"] == "table"
    assert catalog["ops.load_runs"] == "table" and catalog["raw.shipment_events"] == "table"
    assert adopted[0] == "mart.shipments__g0001" and "adopted" in adopted[1]


def test_the_next_backfill_publishes_through_its_gates_and_release_hands_back_a_plain_table_on_spark(recovered):
    """The verbs after the incident, on Spark: the backfill's value gates profile with Spark's own
    quantile and its preview samples text widths on Spark; ``release`` writes the published rows as
    the table. What it hands back is the generator's expected content (its own truth)."""
    run = recovered["spark"]
    assert run["backfill"].code == 0, run["backfill"].out
    assert "published: mart.shipments now points at mart.shipments__g0003" in run["backfill"].out, run["backfill"].out
    assert run["release"].code == 0 and "plain table again" in run["release"].out, run["release"].out
    root = run["root"]
    expected = pd.read_parquet(root / "truth" / "expected.parquet")
    cols = ", ".join("CAST(cost_usd AS DOUBLE) AS cost_usd" if c == "cost_usd" else c for c in expected.columns)
    released = _read(root, f"SELECT {cols} FROM mart.shipments").to_pandas()
    diff = released.merge(expected, how="outer", indicator=True)
    assert len(released) == len(expected) and (diff["_merge"] == "both").all(), diff[diff["_merge"] != "both"]
    spec = parse_spec(root / "spec.yaml")
    import duckdb

    with duckdb.connect(str(spec.warehouse.path), read_only=True) as conn:
        kind = conn.execute(f"SELECT kind FROM {CATALOG} WHERE name = 'mart.shipments'").fetchone()
    assert kind == ("table",)


def test_adoption_and_release_are_catalog_moves_on_spark_with_missing_metadata_read_as_null(tmp_path: Path):
    """``adopt_table`` copies no data (the namespace names the plain table's directories) and a metadata
    column the team's table lacks reads as NULL; ``release_table`` writes the view's rows under the name."""
    from recovery.lib.engine.spark_engine import SparkEngine
    from recovery.lib.identifiers import TableName

    engine = SparkEngine(str(tmp_path / "control.duckdb"), str(tmp_path / "data"))
    public = TableName("mart", "t")
    with engine.transaction() as s:
        s.create_table("mart.t", "k INTEGER, v VARCHAR")
        s.replace_rows("mart.t", ["k", "v"], insert="SELECT * FROM (VALUES (1, 'a'), (2, 'b'))")
    with engine.session(read_only=True) as s:
        dirs = s.scalar(f"SELECT dirs FROM {CATALOG} WHERE name = 'mart.t'")
    with engine.transaction() as s:
        s.adopt_table(public, "t__g0001", [("gen", "VARCHAR"), ("written", "TIMESTAMP"), ("rev", "BIGINT")])
        assert s.object_kind("mart", "t") is None  # nothing at the public name until the pointer moves
        s.swap_pointer(public.sql(), "SELECT k, v, gen FROM mart.t__g0001")
    with engine.session(read_only=True) as s:
        assert s.columns("mart.t__g0001") == [
            ("k", "INTEGER"),
            ("v", "VARCHAR"),
            ("gen", "VARCHAR"),
            ("written", "TIMESTAMP"),
            ("rev", "BIGINT"),
        ]
        assert s.fetchall("SELECT k, v, gen, written, rev FROM mart.t__g0001 ORDER BY k") == [
            (1, "a", None, None, None),
            (2, "b", None, None, None),
        ]
        assert s.scalar(f"SELECT dirs FROM {CATALOG} WHERE name = 'mart.t__g0001'") == dirs
        assert s.object_kind("mart", "t") == "view"
    with engine.transaction() as s:
        s.release_table(public)
    with engine.session(read_only=True) as s:
        assert s.object_kind("mart", "t") == "table"
        assert s.fetchall("SELECT k, v, gen FROM mart.t ORDER BY k") == [(1, "a", None), (2, "b", None)]
