"""The three reports: built from the worked example's run, they state the control plane's figures.

The failed example (with its Dagster instance, so the timeline has the backfill's
real run ids) is assessed through Dagster (``assess_incident``: reconciliation,
impact, decision), then ``recovery report`` renders the reports through the
``incident/reports`` asset. The HTML tables are read back and compared with the
control plane, number by number; and no report may load anything from the network.
A second test fills the repair's tables by hand and checks that the recovery
report shows them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from recovery.cli import main
from recovery.lib.catalog_checks import load_spec
from recovery.lib.consumers.impact import impact_table
from recovery.lib.control.plane import ensure_control_plane
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import Incident, parse_incident
from recovery.lib.reconcile.classify import partition_table, recon_table
from recovery.lib.reports import REPORT_NAMES, build_reports, write_reports
from recovery.lib.reports.recovery import SECTIONS
from recovery_tests.support.report_checks import ReportPage
from recovery_tests.support.rows import present

REPORTS_KEY = dg.AssetKey(["incident", "reports"])


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def _assert_offline(name: str, html: str) -> None:
    page = ReportPage(html)
    external = [u for u in page.links if "http" in u.lower() or u.startswith("//")]
    assert not external, f"{name}: external references {external[:5]}"
    assert not {"script", "link", "iframe", "object", "embed"} & page.tags, f"{name}: {page.tags}"
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", html), f"{name}: a stylesheet loads something"
    for uri in (u for u in page.links if u.startswith("data:")):
        assert uri.startswith("data:image/png;base64,"), uri[:40]


@pytest.fixture
def reported(example_copy: Path, failed_example, tmp_path: Path, monkeypatch):
    """The failed example, contained and assessed through Dagster, then reported by ``recovery report``."""
    from recovery.definitions import defs
    from recovery.defs.target_partitions import reconciliation_tags
    from recovery.lib.incident.phases import CONTAIN
    from recovery.orchestration import run_job

    home = tmp_path / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home, ignore=shutil.ignore_patterns("*.log"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(example_copy))
    incident_file = example_copy.with_name("incident.yaml")
    spec = load_spec(example_copy)
    config = {"incident_file": str(incident_file)}
    with dg.DagsterInstance.get() as instance:
        code_location = defs()
        # contained first: the assess job refuses an incident whose generations are not fenced yet
        run_job(code_location, "contain_backfill", instance, run_config=CONTAIN.run_config(str(incident_file)))
        run_job(
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
    out = tmp_path / "reports"
    assert main(["report", "--incident", str(incident_file), "--out", str(out)]) == 0
    return spec, parse_incident(incident_file), out


def test_reports_state_the_figures_the_control_plane_holds(reported, failed_example):
    spec, incident, out = reported
    for name in REPORT_NAMES:
        assert (out / f"{name}.html").stat().st_size > 0 and (out / f"{name}.md").stat().st_size > 0
    html = {name: (out / f"{name}.html").read_text() for name in REPORT_NAMES}
    for name, text in html.items():
        _assert_offline(name, text)

    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    try:
        labels = dict(
            con.execute(
                f"SELECT label, count(*) FROM {recon_table(spec)} WHERE incident_id = ? GROUP BY 1",
                [incident.incident_id],
            ).fetchall()
        )
        damaged_partitions = present(
            con.execute(
                f"SELECT count(*) FROM {partition_table(spec)} WHERE incident_id = ? AND (damaged_keys > 0 "
                "OR partially_updated "
                f"OR count_mismatch OR total_mismatch OR written_after_fence)",
                [incident.incident_id],
            ).fetchone()
        )[0]
        compared, partially = present(
            con.execute(
                f"SELECT count(*), count(*) FILTER (WHERE partially_updated) FROM {partition_table(spec)} "
                "WHERE incident_id = ?",
                [incident.incident_id],
            ).fetchone()
        )
        material = dict(
            con.execute(
                f"SELECT consumer, count(*) FILTER (WHERE material) FROM {impact_table(spec)} "
                f"WHERE incident_id = ? GROUP BY 1",
                [incident.incident_id],
            ).fetchall()
        )
    finally:
        con.close()
    assert labels == failed_example.info["truth_labels"]  # the control plane holds the true damage

    # reconciliation: label counts, partitions, consumers' material rows, the decision
    recon = ReportPage(html["reconciliation"])
    shown = {label: _n(cells[0]) for label, cells in recon.rows("labels").items() if label != "total"}
    assert shown == labels
    assert _n(recon.rows("labels")["total"][0]) == sum(labels.values()) == _n(recon.texts["damaged-keys"])
    assert _n(recon.texts["damaged-partitions"]) == damaged_partitions == len(recon.rows("partitions"))
    assert (
        f"of {compared}" in html["reconciliation"] and f"<b>partially_updated</b> {partially}" in html["reconciliation"]
    )
    per_partition = recon.rows("partitions")
    header = recon.tables["partitions"][0]
    for label in labels:  # the per-partition counts add up to each label's total
        col = header.index(label) - 1
        assert sum(_n(cells[col]) for cells in per_partition.values() if cells[col]) == labels[label], label
    impact = recon.rows("impact")
    material_col = recon.tables["impact"][0].index("material") - 1
    assert {c: _n(cells[material_col]) for c, cells in impact.items()} == {
        c.name: material[c.name] for c in spec.downstream
    }
    assert material["customer_statements"] > 0
    assert recon.texts["decision"] == "repair"
    decisions = recon.rows("decisions")
    assert decisions["customer_statements"][1] == "customer statements must be re-issued"
    assert html["reconciliation"].count('src="data:image/png;base64,') == 2  # heatmap and impact bars

    md = (out / "reconciliation.md").read_text()
    for label, n in labels.items():
        assert f"| {label} | {n:,} |" in md
    for c in spec.downstream:
        assert f"| {material[c.name]:,} |" in md

    # timeline: the failed backfill's real run ids, in the events table
    timeline = ReportPage(html["timeline"])
    run_ids = {row[-1] for row in timeline.tables["events"][1:] if row[-1]}
    assert set(failed_example.info["run_ids"]["backfill"]) <= run_ids
    assert any(row[4] == "reconciliation" for row in timeline.tables["events"][1:])

    # Done checklists: the reconciliation's items are verified from its records; the recovery's phases
    # after the assessment have not run, so each recovery item names the command that would verify it
    recon_done = {r[0]: r[1:] for r in recon.tables["done-checklist"][1:]}
    assert all(v[0] == "verified" for k, v in recon_done.items()), recon_done
    assert f"{sum(labels.values()):,} damaged keys" in recon_done["keys"][1]
    assert "out of order" in recon_done["concurrent"][1] and "write log" in recon_done["concurrent"][1]
    rec_done = {r[0]: r[1:] for r in ReportPage(html["recovery"]).tables["done-checklist"][1:]}
    assert {k: v[0] for k, v in rec_done.items() if k != "tested backfill gates"} == {
        k: "not verifiable" for k in rec_done if k != "tested backfill gates"
    }
    assert all("recovery " in v[2] for v in rec_done.values())
    tl_done = {r[0]: r[1:] for r in timeline.tables["done-checklist"][1:]}
    assert tl_done["runs"][0] == tl_done["retries"][0] == tl_done["decisions"][0] == "verified"
    assert any(r[:8] in tl_done["runs"][1] for r in failed_example.info["run_ids"]["backfill"])
    # containment ran before the assessment (the assess job refuses an incident not contained yet)
    assert tl_done["containment"][0] == "verified" and "backfill-0042 fenced" in tl_done["containment"][1]
    assert tl_done["evidence"][0] == "not verifiable" and "recovery evidence" in tl_done["evidence"][2]

    # recovery: every section present; none has run on the failed example, and the recurrence
    # gates of the spec's policy are listed as in force
    recovery = html["recovery"]
    for sid, title, _ in SECTIONS:
        section = recovery[recovery.index(f'<section id="{sid}">') :]
        section = section[: section.index("</section>")]
        expected = "in force" if sid == "recurrence_gates" else "not run yet"
        assert title in section and expected in section, sid

    # the asset's metadata carries the Markdown the UI shows
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(REPORTS_KEY)
    metadata = present(present(event).asset_materialization).metadata
    assert isinstance(metadata["reconciliation_report"], dg.MarkdownMetadataValue)
    assert f"| duplicate | {labels['duplicate']:,} |" in metadata["reconciliation_report"].value
    assert {f"{n}_report" for n in REPORT_NAMES} <= set(metadata)


def test_the_recovery_report_shows_what_the_repair_recorded(tmp_path):
    """Sections read the repair's tables when they exist (filled by hand here) and say so per section."""
    from recovery.lib.convergence.verify import HISTORY_COLUMNS, history_table
    from recovery.lib.repair.tables import DIFFS, GATES, PARTITIONS, PLANS, REPLAYS, ensure_repair_tables
    from recovery.lib.restatement.checks import RestatementCheck, record_checks
    from recovery.lib.restatement.ledger import ensure_ledger, ledger_table
    from recovery_tests.support.small_dataset import build_small_dataset

    spec = load_spec(build_small_dataset(tmp_path / "orders", n_orders=20))
    incident = Incident(incident_id="INC-7", spec=spec.spec_path, failed_generations=["bf-7"], requested_by="oncall")
    engine = open_engine(spec.warehouse)
    with engine.transaction() as s:
        ensure_control_plane(s)
        ensure_repair_tables(s)
        s.execute(
            f"INSERT INTO {PLANS} (incident_id, dataset, generation, namespace, status, source_watermark) "
            f"VALUES ('INC-7', ?, 'repair-7', 'mart.orders__g0002', 'published', TIMESTAMP '2026-01-31')",
            [spec.dataset],
        )
        s.execute(
            f"INSERT INTO {PARTITIONS} (incident_id, partition, wave, action, rows_before, rows_expected, rows_after, "
            f"total_before, total_expected, total_after, status) VALUES "
            f"('INC-7', 'north-202601', 0, 'rebuild', 10, 9, 9, 100.0, 90.0, 90.0, 'built'), "
            f"('INC-7', 'south-202601', 1, 'rebuild', 7, 8, 8, 70.0, 80.0, 80.0, 'built'), "
            f"('INC-7', 'east-202601', 1, 'carry', 5, 5, 5, 50.0, 50.0, 50.0, 'built')"
        )
        s.execute(
            f"INSERT INTO {GATES} (incident_id, generation, stage, gate, passed, blocking, observed, evaluated_seq) "
            "VALUES "
            f"('INC-7', 'repair-7', 'canary', 'unique_keys', true, true, 0, 1), "
            f"('INC-7', 'repair-7', 'wave-1', 'totals_match_snapshot', false, true, 3, 2), "
            f"('INC-7', 'repair-7', 'rerun', 'idempotent_rerun', true, true, 0, 3)"
        )
        s.execute(
            f"INSERT INTO {GATES} (incident_id, generation, stage, gate, passed, blocking, observed, details, "
            f"evaluated_seq) VALUES ('INC-7', 'repair-7', 'publish', 'repair_concurrent_writes', true, true, 0, "
            "'49 keys written during the repair, in 2 partitions: each equals the snapshot plus the captured writes', "
            "22)"
        )
        s.execute(
            f"INSERT INTO {REPLAYS} (incident_id, stage, after_seq, through_seq, upserted, deleted, skipped_older) "
            "VALUES "
            f"('INC-7', 'before_publish', 10, 20, 41, 3, 2), ('INC-7', 'in_publish', 20, 22, 5, 0, 0)"
        )
        s.execute(f"INSERT INTO {DIFFS} VALUES ('INC-7', 'north-202601', 'duplicate', 4, 0)")
        ensure_ledger(s, spec)
        s.execute(
            f"INSERT INTO {ledger_table(spec)} (incident_id, consumer, kind, owner, consumer_key, original_value, "
            f"corrected_value, material, notified_at) VALUES "
            f"('INC-7', 'order_totals', 'report', 'ops', 'north', 100, 90, true, NULL), "
            f"('INC-7', 'order_totals', 'report', 'ops', 'south', 10, 10.5, false, NULL), "
            f"('INC-8', 'order_totals', 'report', 'ops', 'south', 1, 2, false, NULL)"
        )
        record_checks(
            s,
            spec.dataset,
            "INC-7",
            [
                RestatementCheck(
                    consumer="order_totals", check="equals_consumer_on_source", passed=True, observed=0, details=""
                )
            ],
            run_id=None,
        )
        s.execute(f"CREATE TABLE {history_table(spec)} ({HISTORY_COLUMNS})")
        s.execute(
            f"INSERT INTO {history_table(spec)} (check_id, checked_at, incident_id, partition, recent, repaired, "
            "drift_keys) "
            f"VALUES (1, TIMESTAMP '2026-02-01', 'INC-7', 'north-202601', false, true, 2), "
            f"(2, TIMESTAMP '2026-02-02', 'INC-7', 'north-202601', false, true, 0), "
            f"(2, TIMESTAMP '2026-02-02', NULL, 'west-202602', true, false, 0)"
        )
    reports = build_reports(incident, spec, engine, None)
    paths = write_reports(reports, tmp_path / "out")
    html = paths["recovery"].read_text()
    _assert_offline("recovery", html)
    status = {s["id"]: s["status"] for s in reports.contexts["recovery"]["sections"]}
    assert status == {
        "isolated_repair": "published",
        "idempotency": "passed",
        "concurrent_writes": "recorded",
        "waves": "blocked",
        "totals": "recorded",
        "downstream_corrections": "recorded",
        "convergence": "converged",
        "recurrence_gates": "in force",
    }
    gates = {
        r["gate"] for r in {s["id"]: s for s in reports.contexts["recovery"]["sections"]}["recurrence_gates"]["rows"]
    }
    assert {
        "approval",
        "scope",
        "capacity",
        "manifest",
        "fencing",
        "invariants",
        "anomaly",
        "values",
        "profile",
        "rollback_readiness",
    } == gates
    sections = {s["id"]: s for s in reports.contexts["recovery"]["sections"]}
    assert sections["concurrent_writes"]["totals"] == {"upserted": 46, "deleted": 3, "skipped_older": 2}
    assert [(w["wave"], w["partitions"]) for w in sections["waves"]["waves"]] == [(0, 1), (1, 2)]
    assert sections["waves"]["blocking_failures"] == 1
    assert sections["totals"]["sums"] == {"rows_before": 22, "rows_expected": 22, "rows_after": 22}
    corrections = sections["downstream_corrections"]  # only this incident's ledger rows
    assert (corrections["rows_restated"], corrections["material"], corrections["unnotified"]) == (
        2,
        1,
        ["order_totals"],
    )
    assert [(c["check_id"], c["partitions"], c["drift_keys"]) for c in sections["convergence"]["checks"]] == [
        (2, 2, 0),
        (1, 1, 2),
    ]
    assert "Owners not notified yet: order_totals" in html and "no drift" in html
    assert "1 blocking gate(s) failed" in html and "mart.orders__g0002" in html and "totals_match_snapshot" in html
    assert html.count('src="data:image/png;base64,') == 1  # before/after totals
    md = (tmp_path / "out" / "recovery.md").read_text()
    assert "| Recurrence gates in force | in force |" in md and "| order_totals | ops | 2 | 1 | not yet |" in md
    assert "upserted 46, deleted 3, skipped_older 2" in md
    # the Done checklist reads the same records: what ran and held is verified, what did not names its command
    done = {r["item"]: r for r in reports.contexts["recovery"]["done"]}
    assert (
        done["concurrent-write preservation"]["status"] == "verified"
        and "46 upserts and 3 deletes" in done["concurrent-write preservation"]["evidence"]
        and "49 keys written during the repair" in done["concurrent-write preservation"]["evidence"]
    )
    assert done["canaries"]["status"] == "verified" and "canary of 1 partitions" in done["canaries"]["evidence"]
    assert done["current-ingestion validation"]["status"] == "verified"
    assert (
        done["downstream correction"]["status"] == "verified"
        and "2 ledger rows, 1 material" in done["downstream correction"]["evidence"]
    )
    assert done["isolated repair"]["status"] == "not verified" and "recovery publish" in done["isolated repair"]["why"]
    assert (
        done["tested backfill gates"]["status"] == "not verified"
        and "recovery backfill plan" in done["tested backfill gates"]["why"]
    )
    assert (
        done["idempotency"]["status"] == "verified"
        and "1 idempotency gates (idempotent_rerun)" in (done["idempotency"]["evidence"])
    )
    assert ReportPage(html).tables["done-checklist"][1][0] == "isolated repair"
    recon_done = {r["item"]: r for r in reports.contexts["reconciliation"]["done"]}
    assert {r["status"] for r in recon_done.values()} == {"not verifiable"}
    assert all("recovery reconcile" in r["why"] or "assess_incident" in r["why"] for r in recon_done.values())
    assert {r["item"]: r["status"] for r in reports.contexts["timeline"]["done"]}["evidence"] == "not verifiable"
    # no reconciliation in this warehouse: that report says so instead of failing
    assert reports.contexts["reconciliation"]["labels"]["status"] == "not run yet"
    assert "not run yet" in (tmp_path / "out" / "reconciliation.html").read_text()


def test_report_refuses_a_bad_incident_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "incident.yaml"
    bad.write_text(yaml.safe_dump({"incident_id": "INC-1", "spec": "missing.yaml", "failed_generations": ["g"]}))
    assert main(["report", "--incident", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "requested_by" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()
