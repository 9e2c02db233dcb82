"""Runbook steps 4-7: every damaged key gets the right label, the impact and the decision follow.

The worked example is checked against its ground truth (computed independently in
pandas); a second dataset with other names, a composite key and string partitions
is damaged by hand, one key per label, and reconciled from its spec alone.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.consumers.impact import assess_impact, impact_table
from recovery.lib.consumers.sql import consumer_sql, consumer_table, materialize_consumer
from recovery.lib.decision import decide
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.pointers.namespaces import move_pointer
from recovery.lib.reconcile.classify import partition_table, recon_table, reconcile
from recovery.lib.reconcile.expected_cache import kept_watermark
from recovery.lib.reconcile.inputs import ReconcileInputs
from recovery.lib.reconcile.labels import DAMAGE_LABELS
from recovery.lib.reconcile.run import run_reconciliation
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.ingest import apply_changes
from recovery_tests.support.example_build import build_example, copy_dataset
from recovery_tests.support.rows import present
from recovery_tests.support.small_orders import ingested_small, latest_rows_sql, now

FAILED = "backfill-0042"


def _reconcile_example(spec_path: Path, out: Path):
    incident = parse_incident(spec_path.with_name("incident.yaml"))
    spec = check_incident(incident)
    summary, files = run_reconciliation(
        spec, incident.failed_generations, incident_id=incident.incident_id, out_dir=out
    )
    return spec, incident, summary, files


def _assert_matches_truth(spec, incident) -> None:
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    try:
        per_label = con.execute(
            f"""SELECT coalesce(t.label, r.label) AS label,
                       count(*) FILTER (WHERE r.label = t.label) AS tp,
                       count(*) FILTER (WHERE t.label IS NULL OR r.label IS DISTINCT FROM t.label
                           AND r.label IS NOT NULL) AS fp,
                       count(*) FILTER (WHERE r.label IS NULL OR r.label IS DISTINCT FROM t.label
                           AND t.label IS NOT NULL) AS fn
                FROM (SELECT txn_id, label FROM {recon_table(spec)} WHERE incident_id = ?) r
                FULL OUTER JOIN truth.damage t USING (txn_id) GROUP BY 1 ORDER BY 1""",
            [incident.incident_id],
        ).fetchall()
        for label, tp, fp, fn in per_label:
            precision = tp / (tp + fp) if tp + fp else 1.0
            recall = tp / (tp + fn) if tp + fn else 1.0
            assert (precision, recall) == (1.0, 1.0), (
                f"{label}: precision {precision}, recall {recall} (tp {tp}, fp {fp}, fn {fn})"
            )
        found = {row[0] for row in per_label}
        assert found == set(DAMAGE_LABELS), f"labels found: {sorted(found)}"
        findings = set(
            con.execute(
                f"""SELECT CAST(partition AS DATE), f FROM {partition_table(spec)},
                       unnest([CASE WHEN partially_updated THEN 'partially_updated' END,
                               CASE WHEN count_mismatch THEN 'count_mismatch' END,
                               CASE WHEN total_mismatch THEN 'total_mismatch' END]) AS u(f)
                WHERE incident_id = ? AND f IS NOT NULL""",
                [incident.incident_id],
            ).fetchall()
        )
        truth = set(con.execute("SELECT CAST(event_date AS DATE), finding FROM truth.partition_findings").fetchall())
        assert findings == truth
    finally:
        con.close()


def test_every_damaged_key_of_the_worked_example_gets_its_true_label(example_copy, tmp_path):
    spec, incident, summary, files = _reconcile_example(example_copy, tmp_path / "out")
    _assert_matches_truth(spec, incident)
    assert summary.unexplained == 0
    assert summary.partition_findings["partially_updated"] == 1
    doc = (files["summary"]).read_text()
    assert '"labels_by_partition"' in doc and '"total_expected"' in doc
    con = duckdb.connect()
    cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM '{files['parquet']}'").fetchall()]
    assert {
        "txn_id",
        "label",
        "generation",
        "expected_version",
        "actual_version",
        "differing_columns",
        "actual_partition",
        "expected_partition",
    } <= set(cols)
    assert present(con.execute(f"SELECT count(*) FROM '{files['parquet']}'").fetchone())[0] == summary.damaged_keys


@pytest.mark.slow
def test_reconciliation_is_exact_at_a_second_size(shared_dir, tmp_path):
    # the Spark module's build (20k events, a tenth of the default example), built once per session
    small = build_example(shared_dir, events=20_000)
    spec_path = copy_dataset(small.root, tmp_path / "small")
    spec, incident, summary, _ = _reconcile_example(spec_path, tmp_path / "out")
    _assert_matches_truth(spec, incident)
    assert summary.damaged_keys > 1_000


def test_reconciliation_rerun_gives_identical_outputs(example_copy, tmp_path):
    _reconcile_example(example_copy, tmp_path / "a")
    _reconcile_example(example_copy, tmp_path / "b")
    con = duckdb.connect()
    digest = [
        present(
            con.execute(
                "SELECT md5(string_agg(CAST(r AS VARCHAR), '|' ORDER BY CAST(r AS VARCHAR))) "
                f"FROM '{tmp_path / d / 'reconciliation.parquet'}' r"
            ).fetchone()
        )[0]
        for d in ("a", "b")
    ]
    assert digest[0] == digest[1]
    assert (tmp_path / "a" / "summary.json").read_text() == (tmp_path / "b" / "summary.json").read_text()


def test_impact_equals_consumer_on_truth_minus_consumer_on_damage(example_copy, tmp_path):
    spec, incident, _, _ = _reconcile_example(example_copy, tmp_path / "out")
    engine = open_engine(spec.warehouse)
    with engine.transaction() as s:
        impacts = {i.consumer: i for i in assess_impact(s, spec, incident_id=incident.incident_id, watermark=None)}
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    try:
        for c in spec.downstream:
            truth = consumer_sql(spec, c, "SELECT * FROM truth.expected")
            damaged = f"SELECT * FROM {consumer_table(spec, c).sql()}"
            key = ", ".join(c.key)
            wrong = present(
                con.execute(
                    f"SELECT count(*) FROM (SELECT {key} FROM (({damaged}) EXCEPT ALL ({truth})) UNION SELECT {key} "
                    f"FROM (({truth}) EXCEPT ALL ({damaged})))"
                ).fetchone()
            )[0]
            i = impacts[c.name]
            assert i.rows_changed + i.rows_missing + i.rows_extra == wrong, c.name
            col = c.materiality.column
            # per consumer key: a key published twice (a duplicated source row) counts its copies' sum
            expected_total = present(
                con.execute(
                    f"SELECT sum(abs(coalesce(t.{col}, 0) - coalesce(d.{col}, 0))) FROM ({truth}) t "
                    f"FULL OUTER JOIN (SELECT {key}, sum({col}) AS {col} FROM ({damaged}) GROUP BY ALL) d USING ({key})"
                ).fetchone()
            )[0]
            assert i.magnitude == pytest.approx(float(expected_total), rel=1e-9), c.name
            n = present(
                con.execute(
                    f"SELECT count(*) FROM {impact_table(spec)} WHERE incident_id = ? AND consumer = ?",
                    [incident.incident_id, c.name],
                ).fetchone()
            )[0]
            assert n == wrong
    finally:
        con.close()
    assert impacts["customer_statements"].material_rows > 0
    assert impacts["customer_statements"].decision == "customer statements must be re-issued"


def test_worked_example_decides_repair_because_the_backfill_wrote_in_place(example_copy):
    spec = load_spec(example_copy)
    with open_engine(spec.warehouse).session() as s:
        d = decide(s, spec, [FAILED])
    assert d.choice == "repair"
    assert any("no complete prior generation" in r for r in d.reasons)


# ---- a dataset this package never saw: composite key, string partitions, no amounts ----


def test_a_dataset_with_other_names_reconciles_from_its_spec_alone(tmp_path):
    spec, writer = ingested_small(tmp_path)
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    live = con.execute("""SELECT region, order_no, max(rev) FROM src.order_events GROUP BY ALL
                          HAVING arg_max(change, rev) = 'put' ORDER BY ALL""").fetchall()
    multi = con.execute("""SELECT region, order_no, list(rev ORDER BY rev) FROM src.order_events GROUP BY ALL
                           HAVING count(*) >= 2 AND arg_max(change, rev) = 'put' ORDER BY ALL""").fetchall()
    dropped = con.execute("""SELECT region, order_no, arg_max(rev, rev) FILTER (WHERE change = 'put')
                                 FROM src.order_events
                             GROUP BY ALL HAVING arg_max(change, rev) = 'drop' ORDER BY ALL""").fetchall()
    con.close()
    key = lambda r: f"region = '{r[0]}' AND order_no = {r[1]}"  # noqa: E731
    stale_k, over_k, ooo_k = multi[0], multi[1], multi[2]
    dup_k, del_k, mis_k, bad_k = live[10], live[20], live[30], live[40]
    assert len({tuple(x[:2]) for x in (stale_k, over_k, ooo_k, dup_k, del_k, mis_k, bad_k)}) == 7
    # a newer version of over_k arrives after the failed generation starts and ingestion writes it
    writer.register_generation("bf-7", "backfill")
    later = now() + timedelta(seconds=1)
    with writer.engine.transaction() as s:
        s.execute(
            "INSERT INTO src.order_events SELECT region, order_no, rev + 100, 'put', ?, placed_at, qty + 5, sku "
            "FROM src.order_events WHERE region = ? AND order_no = ? AND rev = ?",
            [later, over_k[0], over_k[1], over_k[2][-1]],
        )
        s.execute(
            "INSERT INTO src.order_events VALUES ('zeta', 777, 1, 'put', ?, TIMESTAMP '2026-02-02', 3, 'SKU-001')",
            [later],
        )
    writer.register_generation("ingest-2", "ingest")
    apply_changes(writer, "ingest-2", since=later - timedelta(microseconds=1), until=later)
    with writer.engine.transaction() as s:  # the new 'zeta' order is never ingested: it stays missing
        s.execute("DELETE FROM mart.orders__g0001 WHERE region = 'zeta'")
    # the failed generation's damage, one key per label
    writer.write("bf-7", latest_rows_sql(spec, key(dup_k)), mode="append", allow_duplicate_keys=True)
    writer.write("bf-7", latest_rows_sql(spec, key(dropped[0]), rev=dropped[0][2]), mode="upsert_keys")
    writer.write(
        "bf-7",
        "SELECT 'nowhere' AS region, 1 AS order_no, 'nowhere-202601' AS shard, TIMESTAMP '2026-01-05' AS placed_at, "
        "1 AS qty, 'SKU-999' AS sku, 1 AS src_rev",
        mode="append",
    )
    writer.write("bf-7", f"SELECT region, order_no, src_rev FROM mart.orders WHERE {key(del_k)}", mode="delete_keys")
    writer.write(
        "bf-7",
        f"SELECT * REPLACE ('moved-000000' AS shard) FROM ({latest_rows_sql(spec, key(mis_k))})",
        mode="upsert_keys",
    )
    writer.write("bf-7", latest_rows_sql(spec, key(stale_k), rev=stale_k[2][0]), mode="upsert_keys")
    writer.write("bf-7", latest_rows_sql(spec, key(over_k), rev=over_k[2][-1]), mode="upsert_keys")
    writer.write(
        "bf-7", f"SELECT * REPLACE (qty + 1 AS qty) FROM ({latest_rows_sql(spec, key(bad_k))})", mode="upsert_keys"
    )
    # out of order: the latest version, then an earlier one on top; and the tombstone, then an earlier put
    writer.write("bf-7", latest_rows_sql(spec, key(ooo_k), rev=ooo_k[2][-1]), mode="upsert_keys")
    writer.write("bf-7", latest_rows_sql(spec, key(ooo_k), rev=ooo_k[2][0]), mode="upsert_keys")
    writer.write(
        "bf-7",
        f"SELECT region, order_no, max(rev) AS src_rev FROM src.order_events WHERE {key(dropped[1])} GROUP BY ALL",
        mode="delete_keys",
    )
    writer.write("bf-7", latest_rows_sql(spec, key(dropped[1]), rev=dropped[1][2]), mode="upsert_keys")

    summary, _ = run_reconciliation(spec, ["bf-7"], incident_id="INC-small")
    with writer.engine.session() as s:
        got = {
            (r[0], r[1]): r[2]
            for r in s.fetchall(
                f"SELECT region, order_no, label FROM {recon_table(spec)} WHERE incident_id = 'INC-small'"
            )
        }
    assert got == {
        tuple(dup_k[:2]): "duplicate",
        tuple(dropped[0][:2]): "resurrected",
        ("nowhere", 1): "unexpected",
        tuple(del_k[:2]): "deleted",
        ("zeta", 777): "missing",
        tuple(mis_k[:2]): "mispartitioned",
        tuple(over_k[:2]): "overwritten",
        tuple(stale_k[:2]): "stale",
        tuple(bad_k[:2]): "incorrectly_transformed",
        tuple(ooo_k[:2]): "out_of_order",
        tuple(dropped[1][:2]): "out_of_order",
    }
    assert summary.unexplained == 0
    assert summary.out_of_order_basis == "write_log"
    assert "moved-000000" in {p.partition for p in summary.partitions}


def test_out_of_order_without_a_write_log_is_read_from_the_metadata_columns(tmp_path):
    """A foreign target keeps no write log of the failed generation: one write that read a key's
    newer version (it wrote other keys' later arrivals) yet holds an older one is out_of_order;
    a write whose whole read predates the newer version is stale."""
    spec, writer = ingested_small(tmp_path)
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    multi = con.execute("""SELECT region, order_no, list(rev ORDER BY rev), max(loaded_at) FROM src.order_events
                               GROUP BY ALL
                           HAVING count(*) >= 2 AND arg_max(change, rev) = 'put' ORDER BY 4""").fetchall()
    newest = con.execute("""SELECT region, order_no FROM src.order_events GROUP BY ALL
                            HAVING arg_max(change, rev) = 'put' ORDER BY max(loaded_at) DESC LIMIT 1""").fetchone()
    assert newest is not None
    con.close()
    key = lambda r: f"region = '{r[0]}' AND order_no = {r[1]}"  # noqa: E731
    ooo_k, stale_k = multi[0], multi[1]
    assert tuple(newest) not in {tuple(ooo_k[:2]), tuple(stale_k[:2])}
    writer.register_generation("bf-8", "backfill")
    at = now()
    # one write: ooo_k's first version together with the newest arrival of the source
    writer.write(
        "bf-8",
        f"SELECT * FROM ({latest_rows_sql(spec, key(ooo_k), rev=ooo_k[2][0])}) UNION ALL SELECT * "
        f"FROM ({latest_rows_sql(spec, key(newest))})",
        mode="upsert_keys",
        at=at,
    )
    # another write that read nothing newer than stale_k's first version
    writer.write(
        "bf-8", latest_rows_sql(spec, key(stale_k), rev=stale_k[2][0]), mode="upsert_keys", at=at + timedelta(seconds=1)
    )
    with writer.engine.transaction() as s:  # as on a foreign target: no write log of the failed generation
        s.execute("DELETE FROM _recovery.\"delta__orders\" WHERE gen_id = 'bf-8'")
    summary, _ = run_reconciliation(spec, ["bf-8"], incident_id="INC-meta")
    with writer.engine.session() as s:
        got = {
            (r[0], r[1]): r[2]
            for r in s.fetchall(
                f"SELECT region, order_no, label FROM {recon_table(spec)} WHERE incident_id = 'INC-meta'"
            )
        }
    assert got == {tuple(ooo_k[:2]): "out_of_order", tuple(stale_k[:2]): "stale"}
    assert summary.out_of_order_basis == "metadata"


def test_rollback_is_chosen_only_when_a_complete_prior_generation_exists_and_nothing_would_be_lost(tmp_path):
    spec, writer = ingested_small(tmp_path)
    ns = writer.register_generation("bf-ns", "backfill", own_namespace=True)
    writer.write(
        "bf-ns", f"SELECT * REPLACE (qty * 10 AS qty) FROM ({expected_rows_sql(spec, None)})", mode="replace_partitions"
    )
    with writer.engine.transaction() as s:
        move_pointer(s, spec, ns, actor="test", reason="publish the failed backfill")
    with writer.engine.session() as s:
        d = decide(s, spec, ["bf-ns"])
    assert (d.choice, d.rollback_to) == ("rollback", "mart.orders__g0001")
    # normal ingestion then writes into the published namespace: a rollback would lose it
    writer.register_generation("ingest-9", "ingest")
    writer.write("ingest-9", latest_rows_sql(spec, "region = 'north' AND order_no = 1000"), mode="upsert_keys")
    with writer.engine.session() as s:
        d = decide(s, spec, ["bf-ns"])
    assert d.choice == "repair" and d.valid_writes_since == 1
    assert any("would lose" in r for r in d.reasons)


def test_consumers_refuse_to_materialize_from_a_fenced_generation(tmp_path):
    spec, writer = ingested_small(tmp_path)
    writer.register_generation("bf-x", "backfill")
    writer.write("bf-x", latest_rows_sql(spec, "region = 'north' AND order_no = 1000"), mode="upsert_keys")
    assert materialize_consumer(writer.engine, spec, spec.downstream[0]) > 0
    writer.fence("bf-x", incident_id="INC-x", fenced_by="test")
    from recovery.lib.errors import FencedGenerationError

    with pytest.raises(FencedGenerationError):
        materialize_consumer(writer.engine, spec, spec.downstream[0])


def _reconcile_in_a_fresh_instance(spec_path: Path, tmp_path: Path, monkeypatch) -> Path:
    """``recovery reconcile`` (the CLI's entry point) on a Dagster instance of its own; returns the incident file."""
    import shutil

    from recovery.cli import main

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(Path(__file__).resolve().parents[3] / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(spec_path))
    incident_file = spec_path.with_name("incident.yaml")
    assert main(["reconcile", "--incident", str(incident_file), "--out", str(tmp_path / "out")]) == 0
    return incident_file


def test_reconcile_cli_and_assess_job_run_through_dagster(example_copy, tmp_path, monkeypatch, failed_example):
    """The CLI launches the partitioned reconciliation asset over every target partition in one run;
    assess_incident materializes reconciliation, impact and decision from the launchpad config."""
    import dagster as dg

    from recovery.defs.target_partitions import reconciliation_tags
    from recovery.orchestration import run_job

    incident_file = _reconcile_in_a_fresh_instance(example_copy, tmp_path, monkeypatch)
    import json

    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["labels"] == {k: v for k, v in failed_example.info["truth_labels"].items()}
    with dg.DagsterInstance.get() as instance:
        key = dg.AssetKey(["incident", "reconciliation"])
        partitions = instance.get_materialized_partitions(key)
        assert len(partitions) == len(summary["partitions"]) == 187
        # each partition's materialization carries its own labels and findings beside the run's figures
        by_partition = summary["labels_by_partition"]
        damaged = max(by_partition, key=lambda p: sum(by_partition[p].values()))
        clean = next(
            p["partition"] for p in summary["partitions"] if not by_partition.get(p["partition"]) and not p["findings"]
        )
        for partition in (damaged, clean):
            [event] = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
            ).records
            meta = present(event.asset_materialization).metadata
            assert meta["partition/labels"].value == by_partition.get(partition, {})
            assert meta["partition/damaged_keys"].value == sum(by_partition.get(partition, {}).values())
            assert meta["damaged_keys"].value == summary["damaged_keys"]
        assert meta["partition/findings"].value == "none"
        from recovery.definitions import defs

        spec = load_spec(example_copy)
        config = {"incident_file": str(incident_file)}
        code_location = defs()
        # contained first: the assess job refuses an incident whose generations are not fenced yet
        run_job(
            code_location, "contain_backfill", instance, run_config={"ops": {"validate_incident": {"config": config}}}
        )
        result = run_job(
            code_location,
            "assess_incident",
            instance,
            tags=reconciliation_tags(instance, spec),
            run_config={
                "ops": {
                    k: {"config": config}
                    for k in ("incident__reconciliation", "incident__impact", "incident__decision")
                }
            },
        )
        decision = result.asset_materializations_for_node("incident__decision")[0].metadata
        impact = result.asset_materializations_for_node("incident__impact")[0].metadata
    assert decision["choice"].value == "repair"
    assert impact["consumers_affected"].value == 5
    # the consumers, the restatement of each, and the restatement of the Dagster assets downstream of the
    # target are reached through the asset graph
    lineage = impact["lineage_downstream_of_target"].value
    assert isinstance(lineage, list)
    assert sorted(lineage) == sorted(
        [f"consumers/{c.name}" for c in spec.downstream]
        + [f"restatement/{c.name}" for c in spec.downstream]
        + ["restatement/downstream_assets"]
    )


def test_a_partition_only_the_source_holds_is_registered_and_materialized_by_the_first_run(
    example_copy, tmp_path, monkeypatch
):
    """A fresh instance learns the target's partitions before the first run (one pass over the
    target); a partition the backfill emptied entirely is found by the classification itself,
    registered, and materialized with its own damage."""
    import dagster as dg

    from recovery.defs.target_partitions import TARGET_PARTITIONS_NAME

    spec = load_spec(example_copy)
    con = duckdb.connect(str(spec.warehouse.path))
    emptied = str(present(con.execute("SELECT min(event_date) FROM analytics.transactions").fetchone())[0])
    gone = present(
        con.execute(
            "SELECT count(DISTINCT txn_id) FROM analytics.transactions__g0001 WHERE event_date = CAST(? AS DATE)",
            [emptied],
        ).fetchone()
    )[0]
    con.execute("DELETE FROM analytics.transactions__g0001 WHERE event_date = CAST(? AS DATE)", [emptied])
    con.close()
    assert gone > 0

    _reconcile_in_a_fresh_instance(example_copy, tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        assert emptied in instance.get_dynamic_partitions(TARGET_PARTITIONS_NAME)
        key = dg.AssetKey(["incident", "reconciliation"])
        assert emptied in instance.get_materialized_partitions(key)
        [event] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[emptied]), limit=1
        ).records
    meta = present(event.asset_materialization).metadata
    # like every partition's, its materialization carries the run's figures beside its own
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert meta["damaged_keys"].value == summary["damaged_keys"] > 0
    # every expected key of the emptied partition is now absent from the target
    labels, damaged = meta["partition/labels"].value, meta["partition/damaged_keys"].value
    assert isinstance(labels, dict) and isinstance(damaged, int)
    absent = sum(n for label, n in labels.items() if label in ("missing", "deleted"))
    assert absent > gone // 2 and damaged >= absent


def test_a_classification_reading_the_kept_expected_rows_labels_every_key_as_the_change_log_does(
    example_copy, tmp_path
):
    """The repair's before/after classification reads E kept by the reconciliation and resolves each
    key's latest change only for the keys that differ: on the damaged example, every key's label and
    evidence are those of the classification that resolves the whole change log."""
    spec, incident, summary, _ = _reconcile_example(example_copy, tmp_path / "out")
    with open_engine(spec.warehouse).transaction() as s:
        assert kept_watermark(s, spec) is not None  # the reconciliation kept E (the example has consumers)
        reconcile(s, ReconcileInputs(spec, tuple(incident.failed_generations), incident_id="reused", reuse_kept=True))
        # the kept rows were read (the latest changes were resolved for the differing keys only)
        assert s.scalar("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = '__diff_keys'") == 1
        rows = f"SELECT * EXCLUDE (incident_id) FROM {recon_table(spec)} WHERE incident_id = ?"
        differ = s.scalar(
            f"SELECT count(*) FROM (({rows} EXCEPT ALL {rows}) UNION ALL ({rows} EXCEPT ALL {rows}))",
            [incident.incident_id, "reused", "reused", incident.incident_id],
        )
        reused = s.scalar(f"SELECT count(*) FROM ({rows})", ["reused"])
    assert differ == 0 and reused == summary.damaged_keys > 0


def test_partition_counts_and_totals_taken_from_the_diff_are_those_of_the_expected_rows(tmp_path):
    """When E is read once, by the diff, each partition's expected rows and total come from the
    target's rows the diff left out plus the diff's expected side. Against a direct count of E on a
    target holding an extra copy equal to its expected row, a row with a NULL key, a moved row, a
    missing row and a changed amount, every partition agrees."""
    spec, writer = ingested_small(tmp_path)
    spec = spec.model_copy(update={"target": spec.target.model_copy(update={"amount": "qty"})})
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    keys = con.execute("SELECT region, order_no FROM mart.orders ORDER BY ALL").fetchall()
    con.close()
    key = lambda r: f"region = '{r[0]}' AND order_no = {r[1]}"  # noqa: E731
    writer.register_generation("bf-9", "backfill")
    writer.write("bf-9", latest_rows_sql(spec, key(keys[3])), mode="append", allow_duplicate_keys=True)  # an equal copy
    writer.write(
        "bf-9",
        f"SELECT * REPLACE ('moved-000000' AS shard) FROM ({latest_rows_sql(spec, key(keys[5]))})",
        mode="upsert_keys",
    )
    writer.write(
        "bf-9", f"SELECT * REPLACE (qty + 4 AS qty) FROM ({latest_rows_sql(spec, key(keys[7]))})", mode="upsert_keys"
    )
    writer.write("bf-9", f"SELECT region, order_no, src_rev FROM mart.orders WHERE {key(keys[9])}", mode="delete_keys")
    with writer.engine.transaction() as s:  # a row no expected row can match: its key is NULL
        s.execute(
            f"INSERT INTO mart.orders__g0001 SELECT * REPLACE (NULL AS order_no) FROM mart.orders WHERE {key(keys[11])}"
        )
    inputs = ReconcileInputs(spec, ("bf-9",), incident_id="INC-parts", persist=False)
    with open_engine(spec.warehouse).session() as s:
        reconcile(s, inputs)
        assert s.scalar("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = '__e'") == 1
        got = s.fetchall(
            "SELECT partition, expected_rows, expected_total FROM __partitions WHERE expected_rows > 0 ORDER BY 1"
        )
        want = s.fetchall(
            f"SELECT shard, count(*), sum(qty) FROM ({expected_rows_sql(spec, None)}) GROUP BY 1 ORDER BY 1"
        )
        mismatched = s.scalar("SELECT count(*) FROM __partitions WHERE count_mismatch")
    assert got == want and len(got) > 3
    assert mismatched >= 3  # the copy's, the NULL key's, the moved and the missing rows' partitions


@pytest.mark.parametrize("joins", [False, True])
def test_the_diff_chooses_its_build_sides_only_around_a_transform_that_joins_nothing(tmp_path, monkeypatch, joins):
    """Build sides as written hold for the whole diff statement, the streamed transform's SQL
    included: a transform with a join of its own (here a lookup of SKU names) is left to
    DuckDB's planning, and both label the same keys."""
    from recovery.lib.engine.duckdb_engine import DuckDBSession

    spec, writer = ingested_small(tmp_path)
    if joins:
        with writer.engine.transaction() as s:
            s.execute("CREATE TABLE src.skus AS SELECT DISTINCT sku FROM src.order_events")
        spec = spec.model_copy(
            update={
                "transform_sql": spec.transform_sql.replace(
                    "FROM {{ source }}", "FROM {{ source }} JOIN src.skus USING (sku)"
                )
            }
        )
    with writer.engine.session() as s:
        region, order_no = s.fetchrow("SELECT region, order_no FROM mart.orders ORDER BY ALL LIMIT 1 OFFSET 2")
    writer.register_generation("bf-10", "backfill")
    changed = latest_rows_sql(spec, f"region = '{region}' AND order_no = {order_no}")
    writer.write("bf-10", f"SELECT * REPLACE (qty + 1 AS qty) FROM ({changed})", mode="upsert_keys")
    taken = []
    original = DuckDBSession.joins_as_written

    def counted(self):
        taken.append(1)
        return original(self)

    monkeypatch.setattr(DuckDBSession, "joins_as_written", counted)
    with open_engine(spec.warehouse).session() as s:
        reconcile(s, ReconcileInputs(spec, ("bf-10",), incident_id="INC-sides", persist=False))
        labels = s.fetchall("SELECT region, order_no, label FROM __recon")
    assert taken == ([] if joins else [1])
    assert labels == [(region, order_no, "incorrectly_transformed")]
