"""Runbook step 11, downstream restatement, as promises (on the small dataset, repaired and published):

- every consumer, restated, equals the consumer's SQL over the source's expected rows;
- the ledger's original values are what was published before the repair, beside the
  corrected values, with the owner, the decision affected and both namespaces;
- the original output is kept in its namespace, byte for byte; the consumer's public
  name moved to the correction through the same pointer mechanism as the target;
- each owner is told once, material items first, even when the job re-runs, and a
  re-run changes nothing;
- a normal refresh afterwards never rewrites a kept output; a plain consumer table is
  adopted as the first namespace;
- restating before the repair is published is refused, naming the fix, and writes nothing.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import dagster as dg
import pytest

from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.resources import warehouse_resource
from recovery.defs.restatement.assets import CHECK, RESTATE_JOB, restatement_asset
from recovery.lib.consumers.sql import consumer_sql, materialize_consumer
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import DownstreamSpec
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.incident.phases import RESTATE
from recovery.lib.notify import Notifier, WebhookChannel
from recovery.lib.restatement import restate_consumers
from recovery.lib.restatement.ledger import SIGN_CHANGE, ledger_table, write_ledger
from recovery.lib.restatement.restate import source_mismatches
from recovery.lib.snapshot import expected_rows_sql
from recovery_tests.support.repaired_small import (
    FAILED,
    INCIDENT,
    Receiver,
    build_damaged,
    build_repaired,
    publish_repair,
)
from recovery_tests.support.rows import present

LEDGER_COLUMNS = (
    "incident_id, consumer, kind, owner, consumer_key, change, original_value, corrected_value, difference, "
    "material, decision, original_namespace, corrected_namespace, notified_at"
)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _digest(rows) -> str:
    return hashlib.sha256(repr(sorted(rows, key=repr)).encode()).hexdigest()


def _diff(r, a: str, b: str) -> int:
    return r.fetch(
        f"SELECT (SELECT count(*) FROM (({a}) EXCEPT ALL ({b}))) + (SELECT count(*) FROM (({b}) EXCEPT ALL ({a})))"
    )[0][0]


def test_restated_consumers_equal_the_consumer_on_the_source_and_the_ledger_keeps_the_original(tmp_path, receiver):
    r = build_repaired(tmp_path / "orders")
    results = restate_consumers(
        r.engine,
        r.spec,
        INCIDENT,
        failed_generations=[FAILED],
        notifier=Notifier(WebhookChannel(receiver.url), r.engine),
    )
    assert [x.consumer for x in results] == ["orders_by_shard", "region_units"]
    for c, res in zip(r.spec.downstream, results):
        # the consumer as published equals its SQL over the source's expected rows
        truth = consumer_sql(r.spec, c, expected_rows_sql(r.spec, None))
        assert _diff(r, f"SELECT * FROM consumers.{c.name}", truth) == 0, c.name
        assert res.mismatches_vs_source == 0 and res.affected and res.material_rows > 0
        # the original output is kept as it was published, and the public name moved through its pointer
        assert res.original_namespace == f"consumers.{c.name}__g0001"
        assert res.corrected_namespace == f"consumers.{c.name}__g0002"
        assert _digest(r.fetch(f"SELECT * FROM {res.original_namespace}")) == _digest(r.published_before[c.name])
        assert r.fetch(f"SELECT namespace FROM {SCHEMA}.pointers WHERE public_name = ?", [f"consumers.{c.name}"]) == [
            (res.corrected_namespace,)
        ]
        assert r.fetch(
            f"SELECT from_namespace, reason FROM {SCHEMA}.pointer_history WHERE to_namespace = ?",
            [res.corrected_namespace],
        ) == [(res.original_namespace, f"restatement of incident {INCIDENT}")]
        assert r.fetch(f"SELECT status FROM {SCHEMA}.namespaces WHERE namespace = ?", [res.original_namespace]) == [
            ("retained",)
        ]

        # the ledger: every key whose published value changed, the original value beside the corrected one
        col = present(c.materiality).column
        cols = [x[0] for x in r.fetch(f"DESCRIBE SELECT * FROM {res.original_namespace}")]
        before = {
            str(row[0]): row for row in r.published_before[c.name]
        }  # both consumers are keyed by their first column
        truth_rows = {str(row[0]): row for row in r.fetch(truth)}
        changed = {k for k in before.keys() | truth_rows.keys() if before.get(k) != truth_rows.get(k)}
        ledger = r.fetch(f"SELECT {LEDGER_COLUMNS} FROM {ledger_table(r.spec)} WHERE consumer = ?", [c.name])
        assert {row[4] for row in ledger} == changed
        for inc, consumer, kind, owner, k, change, orig, corr, diff, material, decision, ons, cns, notified in ledger:
            assert (inc, kind, owner, ons, cns) == (
                INCIDENT,
                c.kind,
                c.owner,
                res.original_namespace,
                res.corrected_namespace,
            )
            assert orig == (float(before[k][cols.index(col)]) if k in before else None)
            assert corr == float(truth_rows[k][cols.index(col)]) and diff == pytest.approx(corr - (orig or 0))
            assert notified is not None
            assert decision == (
                {"report": "report re-issue", "experiment": "experiment readout changes significance"}[c.kind]
                if material
                else "none: below materiality"
            )
    # each owner told once, material items first and largest first
    assert sorted(m["owner"] for m in receiver.received) == ["growth", "ops"]
    for m in receiver.received:
        lines = m["body"].splitlines()
        items = [line for line in lines if line.startswith("  - ")]
        assert items and all(": report re-issue" in i or ": experiment readout" in i for i in items)
        diffs = [abs(float(i.rsplit("(difference ", 1)[1].split(")")[0].replace(",", ""))) for i in items]
        assert diffs == sorted(diffs, reverse=True)
        assert m["dedupe_key"] == f"restatement:orders:{INCIDENT}:{m['body'].split()[2]}"


def test_a_restated_output_that_differs_from_the_consumer_on_the_source_is_counted(tmp_path):
    """The cross-check is computed after the consumers' transactions (the expected rows once per
    watermark): a row missing from one restated output is counted for that consumer only."""
    r = build_repaired(tmp_path / "orders")
    results = restate_consumers(r.engine, r.spec, INCIDENT, failed_generations=[FAILED])
    assert [x.mismatches_vs_source for x in results] == [0, 0]
    tampered = results[0].corrected_namespace
    with r.engine.transaction() as s:
        s.execute(f"DELETE FROM {tampered} WHERE rowid IN (SELECT min(rowid) FROM {tampered})")
    again = source_mismatches(r.engine, r.spec, results)
    assert [x.mismatches_vs_source for x in again] == [1, 0]
    assert [x.consumer for x in again] == [x.consumer for x in results]


def test_the_job_rerun_changes_nothing_and_each_owner_is_notified_once(tmp_path, receiver):
    r = build_repaired(tmp_path / "orders")
    defs = dg.Definitions(
        assets=[restatement_asset(r.spec)],
        jobs=[dg.define_asset_job(RESTATE_JOB, selection=dg.AssetSelection.groups("restatement"))],
        resources={
            "warehouse": warehouse_resource(str(r.spec_path)),
            "notifier": NotifierResource(kind="webhook", url=receiver.url),
        },
    )
    job = defs.resolve_job_def(RESTATE_JOB)
    snapshots = []
    with dg.instance_for_test() as instance:
        for _ in range(2):
            result = job.execute_in_process(run_config=RESTATE.run_config(str(r.incident_path)), instance=instance)
            assert result.success
            checks = result.get_asset_check_evaluations()
            assert sorted(c.asset_key.path[-1] for c in checks if c.check_name == CHECK and c.passed) == [
                "orders_by_shard",
                "region_units",
            ]
            snapshots.append(
                (
                    r.fetch(f"SELECT {LEDGER_COLUMNS} FROM {ledger_table(r.spec)} ORDER BY ALL"),
                    r.fetch(f"SELECT namespace, status FROM {SCHEMA}.namespaces ORDER BY ALL"),
                    r.fetch(f"SELECT * FROM {SCHEMA}.pointer_history ORDER BY seq"),
                )
            )
        mats = result.asset_materializations_for_node("restatement")
    assert snapshots[0] == snapshots[1]  # same ledger (notified_at included), no new namespace, no pointer move
    assert {m.asset_key.path[-1]: m.metadata["reused"].value for m in mats if "reused" in m.metadata} == {
        "orders_by_shard": True,
        "region_units": True,
    }
    assert sorted(m["owner"] for m in receiver.received) == ["growth", "ops"]  # once each, across both runs
    assert r.fetch(f"SELECT count(*) FROM {SCHEMA}.notifications") == [(2,)]


def test_a_refresh_after_restatement_never_rewrites_a_kept_output(tmp_path):
    r = build_repaired(tmp_path / "orders")
    restate_consumers(r.engine, r.spec, INCIDENT, failed_generations=[FAILED])
    c = r.spec.downstream[0]
    kept = {ns: _digest(r.fetch(f"SELECT * FROM consumers.{ns}")) for ns in (f"{c.name}__g0001", f"{c.name}__g0002")}
    materialize_consumer(r.engine, r.spec, c)  # the correction is recorded by the restatement: a new namespace
    materialize_consumer(r.engine, r.spec, c)  # an ordinary output: rewritten in place
    assert r.fetch(
        f"SELECT namespace, status FROM {SCHEMA}.namespaces WHERE public_name = ? ORDER BY 1", [f"consumers.{c.name}"]
    ) == [
        (f"consumers.{c.name}__g0001", "retained"),
        (f"consumers.{c.name}__g0002", "retained"),
        (f"consumers.{c.name}__g0003", "published"),
    ]
    assert {ns: _digest(r.fetch(f"SELECT * FROM consumers.{ns}")) for ns in kept} == kept


def test_a_plain_consumer_table_is_adopted_as_the_first_namespace(tmp_path):
    r = build_damaged(tmp_path / "orders")
    c = r.spec.downstream[0]
    with r.engine.transaction() as s:  # a consumer table written before this package managed consumers
        s.execute(f"DROP VIEW consumers.{c.name}")
        for table in ("pointers", "pointer_history", "namespaces", "consumer_builds"):
            column = (
                "namespace LIKE 'consumers.%' AND true"
                if table == "consumer_builds"
                else f"public_name = 'consumers.{c.name}'"
            )
            s.execute(f"DELETE FROM {SCHEMA}.{table} WHERE {column}")
        s.execute(f"ALTER TABLE consumers.{c.name}__g0001 RENAME TO legacy")
        s.execute(f"CREATE TABLE consumers.{c.name} AS SELECT * FROM consumers.legacy")
        s.execute("DROP TABLE consumers.legacy")
    publish_repair(r)
    res = restate_consumers(r.engine, r.spec, INCIDENT, failed_generations=[FAILED], consumers=[c.name])[0]
    assert res.original_namespace == f"consumers.{c.name}__g0001"  # adopted: what it was built from is unknown, so kept
    assert _digest(r.fetch(f"SELECT * FROM {res.original_namespace}")) == _digest(r.published_before[c.name])
    assert r.fetch(
        "SELECT table_type FROM information_schema.tables WHERE table_schema = 'consumers' AND table_name = ?", [c.name]
    ) == [("VIEW",)]
    assert r.fetch(
        f"SELECT reason FROM {SCHEMA}.pointer_history WHERE public_name = ? ORDER BY seq", [f"consumers.{c.name}"]
    ) == [("adopted",), (f"restatement of incident {INCIDENT}",)]


def test_a_consumer_never_materialized_from_the_damage_gets_its_original_from_the_preserved_damaged_generation(
    tmp_path,
):
    r = build_damaged(tmp_path / "orders")
    c, d = r.spec.downstream  # c: only ever materialized after the repair; d: never materialized at all
    with r.engine.transaction() as s:  # as if neither consumer existed while the damage was exposed
        for name in (c.name, d.name):
            s.execute(f"DROP VIEW consumers.{name}")
            s.execute(f"DELETE FROM {SCHEMA}.consumer_builds WHERE consumer = ?", [name])
            for table in ("pointers", "pointer_history", "namespaces"):
                s.execute(f"DELETE FROM {SCHEMA}.{table} WHERE public_name = ?", [f"consumers.{name}"])
            s.execute(f"DROP TABLE consumers.{name}__g0001")
    damaged_ns = r.fetch(f"SELECT namespace FROM {SCHEMA}.pointers WHERE public_name = 'mart.orders'")[0][0]
    publish_repair(r)
    materialize_consumer(r.engine, r.spec, c)  # built from the repaired target: not the original outcome
    results = restate_consumers(r.engine, r.spec, INCIDENT, failed_generations=[FAILED])
    for x, res in zip((c, d), results):
        assert res.original_basis.startswith("original computed from the preserved damaged generation " + damaged_ns)
        assert res.original_total is not None and res.corrected_total is not None
        assert res.original_total != res.corrected_total and res.affected and res.material_rows > 0
        # the original equals the consumer's SQL over the damaged namespace; the public name never pointed at it
        assert (
            _diff(r, f"SELECT * FROM {res.original_namespace}", consumer_sql(r.spec, x, f"SELECT * FROM {damaged_ns}"))
            == 0
        )
        assert r.fetch(
            f"SELECT count(*) FROM {SCHEMA}.pointer_history WHERE to_namespace = ?", [res.original_namespace]
        ) == [(0,)]
        assert r.fetch(f"SELECT status FROM {SCHEMA}.namespaces WHERE namespace = ?", [res.original_namespace]) == [
            ("retained",)
        ]
        ledger = r.fetch(
            f"SELECT original_value, corrected_value FROM {ledger_table(r.spec)} WHERE consumer = ?", [x.name]
        )
        assert ledger and all(o is not None or cv is not None for o, cv in ledger)
        assert any(o is not None and cv is not None and o != cv for o, cv in ledger)
    # a re-run keeps the same original (it is recorded by the restatement)
    again = restate_consumers(r.engine, r.spec, INCIDENT, failed_generations=[FAILED])
    assert [x.original_namespace for x in again] == [x.original_namespace for x in results]


def test_restating_before_the_repair_is_published_or_with_bad_input_is_refused_and_writes_nothing(tmp_path):
    r = build_damaged(tmp_path / "orders")
    db = r.spec.warehouse.path
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(RecoveryError, match="exposes rows of fenced generation 'bf-7'.*Fix: publish the repair first"):
        restate_consumers(r.engine, r.spec, INCIDENT, failed_generations=[FAILED])
    with pytest.raises(SpecError, match=r"incident_id: .*Fix: use letters"):
        restate_consumers(r.engine, r.spec, "INC 1; DROP TABLE x", failed_generations=[FAILED])
    with pytest.raises(SpecError, match=r"consumers\[0\]: 'nope' is not a downstream consumer"):
        restate_consumers(r.engine, r.spec, INCIDENT, consumers=["nope"])
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_an_experiment_readout_that_changes_sign_is_material_and_says_so(tmp_path):
    r = build_repaired(tmp_path / "orders")
    c = DownstreamSpec(
        name="lift",
        kind="experiment",
        owner="growth",
        sql=Path("lift.sql"),
        key=["arm"],
        materiality={"column": "lift", "rel": 0.5},
    )
    with r.engine.transaction() as s:
        s.execute(
            "CREATE TABLE consumers.lift__a AS SELECT * FROM (VALUES ('a', 0.02), ('b', 0.30), ('c', 0.10)) t(arm, "
            "lift)"
        )
        s.execute(
            "CREATE TABLE consumers.lift__b AS SELECT * FROM (VALUES ('a', -0.01), ('b', 0.31), ('c', 0.10)) t(arm, "
            "lift)"
        )
        write_ledger(
            s,
            r.spec,
            c,
            incident_id=INCIDENT,
            original_namespace="consumers.lift__a",
            corrected_namespace="consumers.lift__b",
        )
    rows = r.fetch(
        f"SELECT consumer_key, material, decision FROM {ledger_table(r.spec)} WHERE consumer = 'lift' ORDER BY 1"
    )
    assert rows == [("a", True, SIGN_CHANGE), ("b", False, "none: below materiality")]


def test_the_code_location_has_one_restatement_asset_per_consumer_of_the_served_spec_and_the_job(monkeypatch, tmp_path):
    r = build_damaged(tmp_path / "orders")
    monkeypatch.setenv("RECOVERY_SPEC", str(r.spec_path))
    from recovery.definitions import defs as code_location

    defs = code_location()
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys() if k.path[0] == "restatement"}
    assert keys == {"restatement/orders_by_shard", "restatement/region_units", "restatement/downstream_assets"}
    assert defs.resolve_job_def(RESTATE_JOB) is not None


def test_the_restate_cli_refuses_before_publish_then_restates_and_prints_each_consumer(tmp_path, monkeypatch, capsys):
    import shutil

    from recovery.cli import main
    from recovery.config import PROJECT_ROOT

    r = build_damaged(tmp_path / "orders")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(r.spec_path))
    assert main(["restate", "--incident", str(r.incident_path)]) == 2
    assert "Fix: publish the repair first" in " ".join(capsys.readouterr().out.split())
    publish_repair(r)
    assert main(["restate", "--incident", str(r.incident_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "orders_by_shard" in out and "region_units" in out and "consumers.region_units__g0002" in out
    with dg.DagsterInstance.get() as instance:  # the run is in the project's instance, as a UI launch would be
        assert instance.get_latest_materialization_event(dg.AssetKey(["restatement", "region_units"])) is not None


def test_a_restatement_whose_own_check_fails_exits_1_naming_it_and_tells_no_owner(
    tmp_path, monkeypatch, capsys, receiver
):
    """The issue's case: a corrected output that differs from the consumer on the source used to
    exit 0, the failure showing only in the alerts file. A row deleted from the published target
    behind the package's back (so the repair no longer holds the source's rows) makes both
    consumers' checks fail: the run stops with one sentence, the command exits 1, and the
    corrections are recorded but no owner is told of them."""
    import shutil

    from recovery.cli import main
    from recovery.config import PROJECT_ROOT

    r = build_damaged(tmp_path / "orders")
    ns = publish_repair(r)
    with r.engine.transaction() as s:
        s.execute(f"DELETE FROM {ns} WHERE rowid IN (SELECT min(rowid) FROM {ns})")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(r.spec_path))
    monkeypatch.setenv("RECOVERY_ALERT_WEBHOOK", receiver.url)
    assert main(["restate", "--incident", str(r.incident_path)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(
        r"restate_consumers \(run [0-9a-f-]+\) stopped: restatement/\w+ equals_consumer_on_source: \w+: the corrected "
        r"output has \d+ rows that differ from the consumer on the source's expected rows",
        out,
    ), out
    assert "Traceback" not in out
    checks = r.fetch(f"SELECT consumer, passed, observed > 0 FROM {SCHEMA}.restatement_checks ORDER BY 1")
    assert checks == [("orders_by_shard", False, True), ("region_units", False, True)]
    assert r.fetch(f"SELECT count(*) FROM {ledger_table(r.spec)} WHERE notified_at IS NOT NULL") == [(0,)]
    assert receiver.received == []
