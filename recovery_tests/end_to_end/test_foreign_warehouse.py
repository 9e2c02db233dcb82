"""The runbook on a warehouse the package never wrote, through the documented CLI only.

``sample_data/shipments`` is a shipments mart loaded by the team's own pandas/SQL
jobs (composite key, ``'YYYY-MM'`` text partitions, its own run registry), and a
backfill that went wrong while those loads kept running. Its ground truth comes
from the generator's own history, not from the package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from recovery.config import PROJECT_ROOT
from recovery_tests.support.foreign_warehouse import (
    build_shipments,
    cli,
    file_digest,
    fresh_copy,
    labels_vs_truth,
    published_vs_truth,
)
from recovery_tests.support.rows import present

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def shipments(shared_dir: Path) -> Path:
    return build_shipments(shared_dir)


@pytest.fixture
def warehouse(shipments: Path, tmp_path: Path) -> Path:
    return fresh_copy(shipments, tmp_path / "shipments")


def test_responders_size_the_damage_before_containment_without_writing_to_the_warehouse(
    warehouse, tmp_path, monkeypatch
):
    from recovery.lib import catalog_checks

    shape_checks = []
    real = catalog_checks._check_shapes

    def counted(*a):
        shape_checks.append(1)
        return real(*a)

    monkeypatch.setattr(catalog_checks, "_check_shapes", counted)
    before = file_digest(warehouse / "warehouse.duckdb")
    r = cli(tmp_path / "home", "reconcile", "--incident", str(warehouse / "incident.yaml"))
    assert r.code == 0, r.out
    assert len(shape_checks) == 1  # the command checks the spec's SQL shapes; its Dagster run does not again
    assert "not fenced yet" in r.out and "read-only" in r.out
    assert file_digest(warehouse / "warehouse.duckdb") == before
    out = warehouse / "reports" / "INC-SHIP-7"
    assert labels_vs_truth(out / "reconciliation.parquet", warehouse).empty
    summary = json.loads((out / "summary.json").read_text())
    assert summary["contained"] is False
    assert summary["basis"]["older"] == summary["basis"]["absent"] == "registry ops.load_runs"
    assert summary["labels"]["overwritten"] > 0 and summary["labels"]["deleted"] > 0


def test_evidence_is_built_before_containment_without_writing_to_the_warehouse(warehouse, tmp_path):
    """The README's order: size the damage and freeze the evidence, then contain (issue 39: exit 3,
    ``_recovery.generations`` did not exist)."""
    home, incident = tmp_path / "home", str(warehouse / "incident.yaml")
    before = file_digest(warehouse / "warehouse.duckdb")
    r = cli(home, "evidence", "build", "--incident", incident)
    assert r.code == 0, r.out
    assert "built" in r.out and "mart.shipments was not contained when the bundle was built" in r.out, r.out
    assert cli(home, "evidence", "verify", "--incident", incident).code == 0
    assert file_digest(warehouse / "warehouse.duckdb") == before
    bundle = warehouse / "evidence" / "INC-SHIP-7"
    (failed,) = present(
        duckdb.sql(f"SELECT count(*) FROM '{bundle / 'target' / 'current' / 'bf-0007.parquet'}'")
    ).fetchall()
    assert failed[0] > 0  # the failed load's rows, as found in the plain table


def test_a_verb_run_before_the_one_it_needs_names_that_verb_and_writes_nothing(warehouse, tmp_path):
    incident = str(warehouse / "incident.yaml")
    before = file_digest(warehouse / "warehouse.duckdb")
    for verb, first in [("assess", "contain"), ("repair", "contain"), ("timeline", "contain"), ("report", "contain")]:
        r = cli(tmp_path / "home", verb, "--incident", incident)
        assert r.code == 2, (verb, r.out)
        assert f"run `recovery {first} --incident" in r.out, (verb, r.out)
        assert "Traceback" not in r.out
    assert file_digest(warehouse / "warehouse.duckdb") == before
    assert cli(tmp_path / "home", "contain", "--incident", incident).code == 0
    for verb, first in [("repair", "assess"), ("publish", "assess")]:
        r = cli(tmp_path / "home", verb, "--incident", incident)
        assert r.code == 2 and f"run `recovery {first} --incident" in r.out, (verb, r.out)
    r = cli(tmp_path / "home", "restate", "--incident", incident)
    assert r.code == 2 and "publish the repair first" in r.out, r.out


def test_partition_range_is_given_in_the_partition_columns_own_format(warehouse, tmp_path):
    incident = warehouse / "incident.yaml"
    text = incident.read_text()
    incident.write_text(text.replace("start: '2013-01'", "start: '2013-1'"))
    r = cli(tmp_path / "home", "reconcile", "--incident", str(incident))
    assert r.code == 2 and "partitions.start" in r.out and "'2013-01'" in r.out, r.out
    incident.write_text(
        text.replace("end: '2013-04'", "end: '2012-11'").replace("start: '2013-01'", "start: '2012-10'")
    )
    r = cli(tmp_path / "home", "reconcile", "--incident", str(incident))
    assert r.code == 2 and "outside the data" in r.out, r.out
    incident.write_text(text.replace("start: '2013-01'", "start: '2013-05'"))
    r = cli(tmp_path / "home", "reconcile", "--incident", str(incident))
    assert r.code == 2 and "before start" in r.out, r.out


@pytest.mark.parametrize("bound", ["end: '2013-13'", "end: '2013-00'", "start: '2012-13'"])
def test_a_partition_bound_of_the_right_shape_that_is_no_real_month_is_refused(bound, warehouse, tmp_path):
    """'2013-13' looks like '2013-02' but is no month of the 'YYYY-MM' partition column (issue 39)."""
    incident = warehouse / "incident.yaml"
    field = bound.split(":")[0]
    text = incident.read_text()
    incident.write_text(text.replace("end: '2013-04'" if field == "end" else "start: '2013-01'", bound))
    before = file_digest(warehouse / "warehouse.duckdb")
    r = cli(tmp_path / "home", "reconcile", "--incident", str(incident))
    assert r.code == 2, r.out
    lines = r.out.strip().splitlines()
    assert len(lines) == 1 and f"partitions.{field}:" in lines[0], r.out
    assert "is not a real YYYY-MM value" in r.out and "Fix:" in r.out
    assert file_digest(warehouse / "warehouse.duckdb") == before


def test_an_amount_naming_a_text_column_is_refused_before_contain_writes_anything(warehouse, tmp_path):
    """It used to pass: contain adopted and fenced the target, then reconcile crashed summing text (issue 39)."""
    spec = warehouse / "spec.yaml"
    spec.write_text(spec.read_text().replace("amount: cost_usd", "amount: service"))
    before = file_digest(warehouse / "warehouse.duckdb")
    for verb in ("contain", "reconcile"):
        r = cli(tmp_path / "home", verb, "--incident", str(warehouse / "incident.yaml"))
        assert r.code == 2, (verb, r.out)
        assert "target.amount: column 'service' is VARCHAR, not a number" in r.out, r.out
        assert len(r.out.strip().splitlines()) == 1 and "Traceback" not in r.out
    assert file_digest(warehouse / "warehouse.duckdb") == before


def test_the_whole_runbook_step_by_step_repairs_a_foreign_target_and_hands_it_back(warehouse, tmp_path):
    home, incident = tmp_path / "home", str(warehouse / "incident.yaml")
    db = warehouse / "warehouse.duckdb"

    r = cli(home, "contain", "--incident", incident)
    assert r.code == 0, r.out
    assert "adopted mart.shipments" in r.out and "bf-0007: fenced" in r.out
    again = cli(home, "contain", "--incident", incident)
    assert again.code == 0 and "already managed" in again.out and "already contained" in again.out
    con = duckdb.connect(str(db))
    try:  # the team's own loader can no longer write the public name: the fence for writers outside the package
        with pytest.raises(duckdb.Error):
            con.execute("INSERT INTO mart.shipments SELECT * FROM mart.shipments LIMIT 1")
        adopted = json.loads(
            present(con.execute("SELECT details FROM _recovery.timeline WHERE kind = 'target_adopted'").fetchone())[0]
        )
        assert adopted["rows"] == present(con.execute("SELECT count(*) FROM mart.shipments__g0001").fetchone())[0]
        assert adopted["checksum"] and "load_id" in adopted["columns"]
    finally:
        con.close()

    assert cli(home, "evidence", "build", "--incident", incident).code == 0
    assert cli(home, "evidence", "verify", "--incident", incident).code == 0
    assessed = cli(home, "assess", "--incident", incident)
    assert assessed.code == 0 and "decision: repair" in assessed.out, assessed.out
    reports = warehouse / "reports" / "INC-SHIP-7"
    assert labels_vs_truth(reports / "reconciliation.parquet", warehouse).empty
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["contained"] is True and summary["basis"]["older"].startswith("registry ops.load_runs")

    for verb in ("repair", "publish", "restate", "verify", "timeline", "report"):
        r = cli(home, verb, "--incident", incident)
        assert r.code == 0, (verb, r.out)
        assert "Traceback" not in r.out
    assert published_vs_truth(warehouse) == 0
    # the consumer no tool had materialized: its original computed from the adopted, damaged namespace,
    # so the ledger holds exactly the rows the impact found changed (it was empty, and restate said done)
    con = duckdb.connect(str(db), read_only=True)
    try:
        diff = (
            "SELECT consumer_key, change, original_value, corrected_value, material FROM {} "
            "WHERE incident_id = 'INC-SHIP-7' ORDER BY 1"
        )
        ledger = con.execute(diff.format('_recovery."restatement_ledger__shipments"')).fetchall()
        impact = con.execute(diff.format('_recovery."impact__shipments"')).fetchall()
    finally:
        con.close()
    assert [(k, c, m) for k, c, _, _, m in ledger] == [(k, c, m) for k, c, _, _, m in impact], (ledger, impact)
    for (_, _, o, n, _), (_, _, io, in_, _) in zip(ledger, impact, strict=True):
        assert o == pytest.approx(io) and n == pytest.approx(in_)
    assert sum(m for *_, m in ledger) == 17
    assert cli(home, "publish", "--incident", incident).out.count("already published") == 1
    for name in ("timeline", "reconciliation", "recovery"):
        assert (reports / f"{name}.html").stat().st_size > 1000

    # the next backfill of the adopted target goes through the recurrence gates: a correct recompute publishes
    backfill = (
        "--spec",
        str(warehouse / "spec.yaml"),
        "--start",
        "2013-05",
        "--end",
        "2013-06",
        "--approved-by",
        "data-platform-lead",
    )
    assert cli(home, "backfill", "plan", *backfill).code == 0
    r = cli(home, "backfill", "run", *backfill)
    assert r.code == 0 and "published: mart.shipments now points at" in r.out, r.out
    assert published_vs_truth(warehouse) == 0

    r = cli(home, "release", "--spec", str(warehouse / "spec.yaml"))
    assert r.code == 0, r.out
    con = duckdb.connect(str(db))
    try:
        kind = present(
            con.execute(
                "SELECT table_type FROM information_schema.tables "
                "WHERE table_schema = 'mart' AND table_name = 'shipments'"
            ).fetchone()
        )[0]
        assert kind == "BASE TABLE"
        con.execute("INSERT INTO mart.shipments SELECT * FROM mart.shipments LIMIT 0")  # writable again
    finally:
        con.close()
    assert published_vs_truth(warehouse) == 0


def _rows(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


def test_a_publish_killed_after_its_commit_is_finished_by_the_rerun_before_it_says_already_published(
    warehouse, tmp_path
):
    """Killed after the commit and before the read copy BI tools open (issue 39): the rerun used to
    say "already published ... nothing to do" and the copy stayed missing for good. The kill is
    injected at the commit (``RECOVERY_FAULT_AT``), not by timing."""
    home, incident = tmp_path / "home", str(warehouse / "incident.yaml")
    for verb in ("contain", "assess", "repair"):
        r = cli(home, verb, "--incident", incident)
        assert r.code == 0, (verb, r.out)
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from recovery.cli import main; sys.exit(main(sys.argv[1:]))"]
        + ["publish", "--incident", incident],
        cwd=PROJECT_ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(PROJECT_ROOT),
            "DAGSTER_HOME": str(home),
            "RECOVERY_LOG_DIR": str(home / "logs"),
            "RECOVERY_FAULT_AT": "publish:committed",
            "RECOVERY_FAULT_READY": str(ready),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while not ready.exists():
        assert child.poll() is None, child.stderr.read().decode()[-2000:] if child.stderr else ""
        assert time.monotonic() < deadline, "the publish never reached its commit"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    read_copy = warehouse / "published" / "mart.shipments" / "current.duckdb"
    alerts = home / "recovery-alerts.jsonl"
    assert published_vs_truth(warehouse) == 0  # the commit happened: the public view serves the repair
    assert not read_copy.exists() and not alerts.exists()  # ... and nothing after it did

    r = cli(home, "publish", "--incident", incident)
    assert r.code == 0, r.out
    assert "already published" not in r.out and "nothing to do" not in r.out, r.out
    assert "finished what that publish left undone: the read copy, the timeline entry, the notification" in r.out
    assert _rows(read_copy, "SELECT * FROM shipments") == _rows(
        warehouse / "warehouse.duckdb", "SELECT * FROM mart.shipments"
    )
    events = _rows(
        warehouse / "warehouse.duckdb",
        "SELECT kind, summary FROM _recovery.timeline WHERE incident_id = 'INC-SHIP-7' "
        "AND kind IN ('read_copy_refreshed', 'alert')",
    )
    assert [k for k, _ in events] == ["alert", "read_copy_refreshed"], events
    assert str(read_copy) in dict(events)["read_copy_refreshed"]
    notices = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [(n["owner"], n["incident_id"], n["severity"]) for n in notices] == [
        ("logistics-data-oncall", "INC-SHIP-7", "info")
    ]
    assert "mart.shipments is published" in notices[0]["subject"] and str(read_copy) in notices[0]["body"]

    again = cli(home, "publish", "--incident", incident)
    assert again.code == 0 and "already published" in again.out and "nothing to do" in again.out, again.out
    assert len(alerts.read_text().splitlines()) == 1  # told once


def test_recover_runs_every_phase_on_a_foreign_target(warehouse, tmp_path):
    r = cli(tmp_path / "home", "recover", "--incident", str(warehouse / "incident.yaml"), "--wave-size", "2")
    assert r.code == 0, r.out
    assert published_vs_truth(warehouse) == 0
    assert labels_vs_truth(warehouse / "reports" / "INC-SHIP-7" / "reconciliation.parquet", warehouse).empty


def test_an_unexpected_error_is_one_line_naming_a_log_file_with_the_trace(warehouse, tmp_path, monkeypatch):
    import recovery.commands.reconcile as reconcile

    def boom(*a, **k):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(reconcile, "print_summary", boom)
    r = cli(tmp_path / "home", "reconcile", "--incident", str(warehouse / "incident.yaml"))
    assert r.code == 3
    assert len(r.out.strip().splitlines()) == 1 and "ZeroDivisionError" in r.out and "Traceback" not in r.out
    log = Path(r.out.split("trace: ")[1].split(";")[0])
    assert "Traceback" in log.read_text() and "planted" in log.read_text()


PLAIN_SQL_WAREHOUSE = """
CREATE SCHEMA src; CREATE SCHEMA dw;
CREATE TABLE src.orders_cdc AS
SELECT i AS order_id, 1 AS seq, 'I' AS action, DATE '2024-03-01' + CAST(i % 20 AS INTEGER) AS order_date,
       (i * 7 % 1000) / 10.0 AS total, TIMESTAMP '2024-03-01 01:00:00' + to_days(CAST(i % 20 AS INTEGER)) AS loaded_ts
FROM range(1, 2001) t(i)
UNION ALL SELECT i, 2, 'U', DATE '2024-03-01' + CAST(i % 20 AS INTEGER), (i * 7 % 1000) / 10.0 + 1,
    TIMESTAMP '2024-03-25'
FROM range(1, 2001, 10) t(i)
UNION ALL SELECT i, 3, 'D', DATE '2024-03-01' + CAST(i % 20 AS INTEGER), NULL, TIMESTAMP '2024-03-26'
FROM range(3, 2001, 50) t(i);
CREATE TABLE dw.orders AS SELECT order_id, order_date, CAST(total AS DECIMAL(10, 2)) AS total,
    'nightly-0324' AS batch_id,
       seq AS src_seq, TIMESTAMP '2024-03-24 02:00' AS batch_ts FROM src.orders_cdc WHERE seq = 1;
DELETE FROM dw.orders WHERE order_date BETWEEN DATE '2024-03-05' AND DATE '2024-03-10' AND order_id % 13 = 0;
UPDATE dw.orders SET total = total * 2, batch_id = 'bf-march', batch_ts = TIMESTAMP '2024-03-27 01:00'
WHERE order_date BETWEEN DATE '2024-03-05' AND DATE '2024-03-10';
"""


def _plain_sql_dataset(root: Path) -> Path:
    """The plain-SQL warehouse above with its spec and incident; returns the incident file."""
    root.mkdir()
    con = duckdb.connect(str(root / "wh.duckdb"))
    con.execute(PLAIN_SQL_WAREHOUSE)
    con.close()
    (root / "t.sql").write_text(
        "SELECT order_id, order_date, CAST(total AS DECIMAL(10, 2)) AS total FROM {{ source }}\n"
    )
    (root / "spec.yaml").write_text(
        "dataset: orders\nwarehouse: {engine: duckdb, path: wh.duckdb}\n"
        "source: {table: src.orders_cdc, key: [order_id], version: seq, op: action, upsert_ops: [I, U], "
        "delete_ops: [D], "
        "ingested_at: loaded_ts}\n"
        "target: {table: dw.orders, partition: order_date, transform: t.sql, "
        "metadata: {generation: batch_id, source_version: src_seq, written_at: batch_ts}, amount: total}\n"
    )
    (root / "incident.yaml").write_text(
        "incident_id: INC-9\nspec: spec.yaml\nfailed_generations: [bf-march]\n"
        "partitions: {start: 2024-03-05, end: 2024-03-10}\nrequested_by: oncall\n"
    )
    return root / "incident.yaml"


def test_a_plain_sql_warehouse_with_date_partitions_no_registry_and_no_consumers_is_recovered(tmp_path):
    root = tmp_path / "orders"
    _plain_sql_dataset(root)
    r = cli(tmp_path / "home", "recover", "--incident", str(root / "incident.yaml"))
    assert r.code == 0, r.out
    assert "nothing to restate" in r.out and "Traceback" not in r.out
    con = duckdb.connect(str(root / "wh.duckdb"), read_only=True)
    try:  # the backfill's days equal the source (latest live version per key), computed here without the package
        wrong = present(
            con.execute("""
            WITH latest AS (SELECT * FROM src.orders_cdc QUALIFY row_number() OVER (PARTITION BY order_id
                ORDER BY seq DESC) = 1),
                 truth AS (SELECT order_id, order_date, CAST(total AS DECIMAL(10, 2)) AS total FROM latest
                           WHERE action <> 'D' AND order_date BETWEEN DATE '2024-03-05' AND DATE '2024-03-10'),
                 published AS (SELECT order_id, order_date, total FROM dw.orders
                               WHERE order_date BETWEEN DATE '2024-03-05' AND DATE '2024-03-10')
            SELECT count(*) FROM ((SELECT * FROM truth EXCEPT ALL SELECT * FROM published)
                                  UNION ALL (SELECT * FROM published EXCEPT ALL SELECT * FROM truth))""").fetchone()
        )[0]
    finally:
        con.close()
    assert wrong == 0


def test_on_a_warehouse_written_by_plain_sql_evidence_and_reconcile_run_read_only_before_contain(tmp_path):
    """Every order the README documents works: evidence and reconcile before ``contain`` write nothing
    to a warehouse the package never wrote (no control schema), and contain afterwards records the bundle."""
    home, incident = tmp_path / "home", _plain_sql_dataset(tmp_path / "orders")
    db = tmp_path / "orders" / "wh.duckdb"
    before = file_digest(db)
    for verb in (("evidence", "build"), ("evidence", "verify"), ("reconcile",), ("evidence", "build")):
        r = cli(home, *verb, "--incident", str(incident))
        assert r.code == 0, (verb, r.out)
        assert "Traceback" not in r.out
        assert file_digest(db) == before, verb
    assert "already existed: left untouched" in r.out
    assert "not fenced yet" in cli(home, "reconcile", "--incident", str(incident)).out
    con = duckdb.connect(str(db), read_only=True)
    try:
        schemas = {row[0] for row in con.execute("SELECT schema_name FROM information_schema.schemata").fetchall()}
    finally:
        con.close()
    assert "_recovery" not in schemas and {"src", "dw"} <= schemas
    assert cli(home, "contain", "--incident", str(incident)).code == 0
    assert cli(home, "evidence", "build", "--incident", str(incident)).code == 0  # now recorded in the timeline
    con = duckdb.connect(str(db), read_only=True)
    try:
        recorded = con.execute("SELECT count(*) FROM _recovery.timeline WHERE kind = 'evidence_preserved'").fetchone()
    finally:
        con.close()
    assert recorded == (1,)


def test_a_foreign_target_whose_amount_column_holds_text_is_refused_at_incident_validation(tmp_path):
    """The transform returns a number, but the table the other tool wrote holds text there."""
    incident = _plain_sql_dataset(tmp_path / "orders")
    con = duckdb.connect(str(tmp_path / "orders" / "wh.duckdb"))
    con.execute("ALTER TABLE dw.orders ALTER total TYPE VARCHAR")
    con.close()
    before = file_digest(tmp_path / "orders" / "wh.duckdb")
    r = cli(tmp_path / "home", "contain", "--incident", str(incident))
    assert r.code == 2 and "target.amount: column 'total' of dw.orders is VARCHAR, not a number" in r.out, r.out
    assert file_digest(tmp_path / "orders" / "wh.duckdb") == before
