"""The runbook on a Delta Lake and an Apache Iceberg table, through the CLI, with the table's history as the write log.

``sample_data/shipments/build_lakehouse.py`` (it imports nothing from the package) writes the
shipments mart as a sequence of commits: the team's loads, the failed backfill ``bf-0007``
one commit per partition and a retry that applies revisions out of order. No registry is
given: ``overwritten``, ``deleted`` and ``out_of_order`` can only come from the table's own
history. The Delta run goes step by step with the writers a real incident has: a writer
outside the package commits after the fence (reported, kept out of the repair, its rows
kept), the package's own writer keeps ingesting (captured and replayed), and a foreign
change in a repaired partition stops the publish until it is restored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from filelock import FileLock

from recovery.config import PROJECT_ROOT
from recovery_tests.support.foreign_warehouse import CliResult, cli, labels_vs_truth
from recovery_tests.support.rows import present

pytestmark = pytest.mark.slow

BUILDER = PROJECT_ROOT / "sample_data" / "shipments" / "build_lakehouse.py"
INCIDENT = "INC-SHIP-7"
COLUMNS = ["carrier_code", "tracking_no", "ship_month", "weight_kg", "cost_usd", "service", "src_rev"]


def builder():
    import importlib.util
    import sys

    spec = present(importlib.util.spec_from_file_location("shipments_build_lakehouse", BUILDER))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    present(spec.loader).exec_module(module)
    return module


def built(shared: Path, fmt: str) -> Path:
    """The lakehouse dataset of ``fmt`` (built once per session), copied to be changed."""
    root = shared / f"shipments-{fmt}"
    with FileLock(str(shared / f"shipments-{fmt}.lock")):
        if not (root / "truth" / "labels.parquet").exists():
            builder().build(root, fmt=fmt, shipments=3000)
    return root


def delta_rows(path: Path, version: int | None = None) -> pd.DataFrame:
    from deltalake import DeltaTable

    df = DeltaTable(str(path), version=version).to_pandas()
    return df.assign(cost_usd=df["cost_usd"].astype(float))


def differences(rows: pd.DataFrame, expected: pd.DataFrame) -> int:
    m = rows[COLUMNS].merge(expected[COLUMNS], how="outer", indicator=True)
    return int((m["_merge"] != "both").sum())


@dataclass
class DeltaRun:
    root: Path
    out: dict[str, CliResult] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def delta_run(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DeltaRun:
    import shutil

    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.lakehouse.writer import write

    work = tmp_path_factory.mktemp("delta")
    root = work / "shipments"
    shutil.copytree(built(shared_dir, "delta"), root)
    home, incident = work / "home", str(root / "incident.yaml")
    table, events = root / "lake" / "shipments", root / "lake" / "shipment_events"
    run = DeltaRun(root)
    log_before = sorted(p.name for p in (table / "_delta_log").iterdir())
    run.out["reconcile"] = cli(home, "reconcile", "--incident", incident)
    run.facts["log_untouched"] = sorted(p.name for p in (table / "_delta_log").iterdir()) == log_before
    run.facts["labels_before_containment"] = labels_vs_truth(
        root / "reports" / INCIDENT / "reconciliation.parquet", root
    )
    run.out["contain"] = cli(home, "contain", "--incident", incident)

    # a writer outside the package (no recovery stamps) adds a shipment to June after the fence
    foreign = pa.table(
        {
            "carrier_code": ["OPS"],
            "tracking_no": pa.array([990001], pa.int64()),
            "ship_month": ["2013-06"],
            "weight_kg": [1.5],
            "cost_usd": pa.array([12.34]).cast(pa.decimal128(12, 2)),
            "service": ["ground"],
            "load_id": ["ops-hotfix"],
            "src_rev": pa.array([1], pa.int32()),
            "loaded_at": pa.array([pd.Timestamp("2013-07-08 09:00")], pa.timestamp("us")),
        }
    )
    write_deltalake(
        str(table),
        foreign,
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"load_id": "ops-hotfix"}),
    )
    run.facts["foreign_version"] = DeltaTable(str(table)).version()
    for verb in (("evidence", "build"), ("evidence", "verify"), ("assess",), ("repair",)):
        run.out[" ".join(verb)] = cli(home, *verb, "--incident", incident)

    # normal ingestion keeps running through the package's own writer: a new revision of a 2013-03 shipment
    src = DeltaTable(str(events)).to_pandas()
    latest = src.sort_values("rev").groupby(["carrier_code", "tracking_no"]).tail(1)
    change = latest[(latest["change"] != "D") & (latest["shipped_on"].astype(str).str[:7] == "2013-03")].iloc[[0]]
    change = change.assign(
        rev=change["rev"] + 1,
        change="U",
        cost_cents=change["cost_cents"] + 500,
        arrived_at=pd.Timestamp("2013-07-08 10:00"),
    )
    write_deltalake(
        str(events),
        pa.Table.from_pandas(
            change, schema=pa.schema(DeltaTable(str(events)).schema().to_arrow()), preserve_index=False
        ),
        mode="append",
    )
    spec = load_spec(root / "spec.yaml", check_warehouse=False)
    row = change.iloc[0]
    ingested = pa.table(
        {
            "carrier_code": [row["carrier_code"]],
            "tracking_no": pa.array([int(row["tracking_no"])], pa.int64()),
            "ship_month": ["2013-03"],
            "weight_kg": [int(row["weight_g"]) / 1000.0],
            "cost_usd": pa.array([round(int(row["cost_cents"]) / 100, 2)], pa.float64()).cast(pa.decimal128(12, 2)),
            "service": [row["service"]],
            "src_rev": pa.array([int(row["rev"])], pa.int32()),
        }
    )
    run.facts["captured_version"] = write(
        spec, "inc-live-1", ingested, mode="upsert", at=pd.Timestamp("2013-07-08 10:05").to_pydatetime()
    )
    run.facts["captured_key"] = (row["carrier_code"], int(row["tracking_no"]))

    # a foreign change inside a repaired partition stops the publish; restoring it lets the publish go
    before = DeltaTable(str(table)).version()
    feb = DeltaTable(str(table)).to_pyarrow_table(filters=[("ship_month", "=", "2013-02")])
    write_deltalake(str(table), feb.slice(1), mode="overwrite", predicate="ship_month = '2013-02'")
    run.facts["foreign_in_scope_version"] = DeltaTable(str(table)).version()
    run.out["publish refused"] = cli(home, "publish", "--incident", incident)
    DeltaTable(str(table)).restore(before)
    for step in ("publish", "verify"):
        run.out[step] = cli(home, step, "--incident", incident)
    run.out["publish again"] = cli(home, "publish", "--incident", incident)
    run.facts["published_version"] = DeltaTable(str(table)).version()
    return run


def test_before_containment_the_labels_come_from_the_delta_history_and_nothing_is_committed(delta_run):
    r = delta_run.out["reconcile"]
    assert r.code == 0, r.out
    assert delta_run.facts["log_untouched"]
    assert delta_run.facts["labels_before_containment"].empty
    assert "the delta history of" in r.out and "not fenced yet" in r.out


def test_contain_fences_the_table_itself(delta_run):
    from deltalake import DeltaTable

    r = delta_run.out["contain"]
    assert r.code == 0, r.out
    assert "bf-0007 fenced on the table" in r.out
    props = DeltaTable(str(delta_run.root / "lake" / "shipments")).metadata().configuration
    assert props["recovery.fenced_generations"] == "bf-0007"


def test_labels_equal_the_truth_with_overwritten_and_out_of_order_from_the_history_alone(delta_run):
    r = delta_run.out["assess"]
    assert r.code == 0 and "decision: repair" in r.out, r.out
    reports = delta_run.root / "reports" / INCIDENT
    assert labels_vs_truth(reports / "reconciliation.parquet", delta_run.root).empty
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["labels"]["overwritten"] > 0 and summary["labels"]["out_of_order"] > 0
    assert summary["labels"]["deleted"] > 0
    assert summary["basis"]["older"] == summary["basis"]["out_of_order"] == "write_log"
    assert summary["history"]["format"] == "delta" and summary["history"]["commits_in_write_log"] > 20
    recon = pd.read_parquet(reports / "reconciliation.parquet")
    assert set(recon.loc[recon["label"].isin(["overwritten", "out_of_order"]), "basis"]) == {"write_log"}


def test_a_foreign_commit_after_the_fence_is_reported_and_kept_out_of_the_repair(delta_run):
    v = delta_run.facts["foreign_version"]
    assert f"version {v}" in delta_run.out["assess"].out and "kept out of the repair" in delta_run.out["assess"].out
    summary = json.loads((delta_run.root / "reports" / INCIDENT / "summary.json").read_text())
    kept = {c["version"]: c for c in summary["history"]["kept_out_of_repair"]}
    assert kept[v]["status"] == "foreign" and kept[v]["partitions"] == ["2013-06"]
    con = duckdb.connect(str(delta_run.root / "recovery.duckdb"), read_only=True)
    try:  # in no generation of the warehouse file, and still in the table after the publish
        assert present(con.execute("SELECT count(*) FROM mart.shipments WHERE carrier_code = 'OPS'").fetchone())[0] == 0
        statuses = dict(
            con.execute("SELECT version, status FROM _recovery.lakehouse_commits WHERE version > ?", [v - 1]).fetchall()
        )
    finally:
        con.close()
    assert statuses[v] == "foreign" and statuses[delta_run.facts["captured_version"]] == "captured"
    rows = delta_rows(delta_run.root / "lake" / "shipments")
    assert len(rows[rows["carrier_code"] == "OPS"]) == 1


def test_a_foreign_change_in_a_repaired_partition_refuses_the_publish_until_restored(delta_run):
    r = delta_run.out["publish refused"]
    assert r.code == 1, r.out
    assert f"version {delta_run.facts['foreign_in_scope_version']}" in r.out and "2013-02" in r.out
    assert "Traceback" not in r.out
    assert delta_run.out["publish"].code == 0, delta_run.out["publish"].out


def test_the_published_table_version_equals_the_truth_with_the_captured_ingestion(delta_run):
    r = delta_run.out["publish"]
    assert "published as one commit, version" in r.out, r.out
    version = delta_run.facts["published_version"]
    from deltalake import DeltaTable

    info = DeltaTable(str(delta_run.root / "lake" / "shipments")).history(1)[0]
    assert info["recovery.incident"] == INCIDENT and info["recovery.writer"] == "publish"
    expected = pd.read_parquet(delta_run.root / "truth" / "expected.parquet")
    carrier, tracking = delta_run.facts["captured_key"]
    captured = (expected["carrier_code"] == carrier) & (expected["tracking_no"] == tracking)
    assert captured.sum() == 1
    expected.loc[captured, "cost_usd"] = round(expected.loc[captured, "cost_usd"].iloc[0] + 5.0, 2)
    expected.loc[captured, "src_rev"] += 1
    rows = delta_rows(delta_run.root / "lake" / "shipments", version)
    assert differences(rows[rows["carrier_code"] != "OPS"], expected) == 0
    assert delta_run.out["verify"].code == 0, delta_run.out["verify"].out
    again = delta_run.out["publish again"]
    assert again.code == 0 and "already published at version" in again.out, again.out
    assert delta_run.facts["published_version"] == version


def test_evidence_pins_the_versions_and_copies_the_commit_log(delta_run):
    from recovery.lib.evidence.manifest import sha256_file

    assert delta_run.out["evidence verify"].code == 0, delta_run.out["evidence verify"].out
    bundle = delta_run.root / "evidence" / INCIDENT
    manifest = json.loads((bundle / "manifest.json").read_text())
    target = manifest["lakehouse"]["target"]
    assert target["fence_version"] is not None and target["synced_version"] >= target["fence_version"]
    logged = [f for f in manifest["files"] if f["path"].startswith("lakehouse/target/_delta_log/")]
    assert len(logged) > target["fence_version"]
    assert all(sha256_file(bundle / f["path"]) == f["sha256"] for f in logged)


def test_an_iceberg_table_is_contained_repaired_and_published_through_the_cli(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    root = tmp_path / "shipments"  # built in place: an Iceberg catalog records its files' absolute paths
    builder().build(root, fmt="iceberg", shipments=3000)
    for verb in ("contain", "assess", "repair", "publish"):  # the Delta run above takes every other verb
        r = cli(tmp_path / "home", verb, "--incident", str(root / "incident.yaml"))
        assert r.code == 0, (verb, r.out)
    reports = root / "reports" / INCIDENT
    assert labels_vs_truth(reports / "reconciliation.parquet", root).empty
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["history"]["format"] == "iceberg" and summary["labels"]["out_of_order"] > 0
    catalog = SqlCatalog(
        "lake", uri=f"sqlite:///{root / 'lake' / 'catalog.db'}", warehouse=(root / "lake" / "warehouse").as_uri()
    )
    table = catalog.load_table("mart.shipments")
    assert present(present(table.current_snapshot()).summary).additional_properties["recovery.incident"] == INCIDENT
    rows = table.scan().to_pandas()
    rows = rows.assign(cost_usd=rows["cost_usd"].astype(float))
    assert differences(rows, pd.read_parquet(root / "truth" / "expected.parquet")) == 0
