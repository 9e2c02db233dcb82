"""``make run``'s recovery of the worked example, phase by phase through Dagster, while normal
ingestion keeps writing: the example's ``ingest_transactions`` job applies the changes that
arrive during the repair to the published table between the canary and the waves. The
promise (runbook step 8): the published repair holds the source's expected rows including
every one of those changes, the delta replay accounts for them, and the recovery report
says how many were carried over.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest
from rich.console import Console

from recovery.example.demo import ingest_during_repair
from recovery.example.scenario import SCENARIO
from recovery.launch.recover import run_recovery
from recovery.lib.control.plane import SCHEMA, delta_table
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.repair.plan import load_plan
from recovery.lib.snapshot import expected_rows_sql
from recovery_tests.support.report_checks import ReportPage, check_done_reports
from recovery_tests.support.rows import present


@pytest.fixture
def recovered(failed_example, example_copy: Path, tmp_path: Path, monkeypatch):
    home = tmp_path / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home, ignore=shutil.ignore_patterns("*.log"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(example_copy))
    from recovery.definitions import defs

    incident = parse_incident(example_copy.with_name("incident.yaml"))
    spec = check_incident(incident)
    notes = []
    with dg.DagsterInstance.get() as instance:
        code_location = defs()

        def during_repair() -> str:
            notes.append(ingest_during_repair(spec, instance=instance))
            return notes[-1]

        run = run_recovery(
            incident,
            spec,
            instance=instance,
            defs=code_location,
            console=Console(quiet=True),
            after_canary=during_repair,
        )
    return incident, spec, run, notes


def test_ingestion_during_the_repair_is_replayed_into_the_published_table_and_reported(recovered, failed_example):
    incident, spec, run, notes = recovered
    assert [p.phase for p in run.phases] == [
        "contain",
        "evidence",
        "assess",
        "repair",
        "publish",
        "restate",
        "verify",
        "reports",
    ]
    assert len(notes) == 1 and "during the repair" in notes[0]
    engine = open_engine(spec.warehouse)
    public = spec.target.table_name.sql()
    meta = spec.target.metadata
    with engine.session(read_only=True) as s:
        plan = present(load_plan(s, incident.incident_id))
        assert plan.status == "published"
        # the window's changes reached the source and were ingested after the repair's low watermark,
        # into the namespace that was published then (not the repair's)
        window = s.scalar(f"SELECT count(*) FROM {spec.source.table_name.sql()} WHERE ingested_at > ?", [SCENARIO.end])
        assert window >= 40
        during = s.fetchall(
            f"SELECT w.seq, w.namespace, w.rows_inserted, w.rows_deleted FROM {SCHEMA}.writes w "
            f"JOIN {SCHEMA}.generations g USING (generation) WHERE g.kind = 'ingest' AND w.seq > ? AND w.seq <= ?",
            [plan.low_seq, plan.high_seq],
        )
        assert during and {ns for _, ns, _, _ in during} == {plan.from_namespace}
        upserts = sum(r[2] for r in during)
        assert upserts > 0 and sum(r[3] for r in during) > 0
        # the delta log holds them, and the replay applied them: nothing left for the publish step
        logged = s.scalar(
            f"SELECT count(*) FILTER (WHERE _delta_op = 'upsert') FROM {delta_table(spec.dataset)} "
            f"WHERE _delta_seq > ? AND _delta_seq <= ? AND _delta_namespace = ?",
            [plan.low_seq, plan.high_seq, plan.from_namespace],
        )
        assert logged == upserts
        replayed = s.fetchall(
            "SELECT stage, sum(upserted), sum(deleted) FROM _recovery.delta_replays WHERE incident_id = ? GROUP BY 1",
            [incident.incident_id],
        )
        assert sum(r[1] for r in replayed) > 0 and sum(r[2] for r in replayed) > 0
        # the published table is the source's expected table as of now, row for row (window included)
        columns = [c for c, _ in s.columns(public) if c not in (meta.generation, meta.written_at)]
        cols = ", ".join(f'"{c}"' for c in columns)
        expected = f"SELECT {cols} FROM ({expected_rows_sql(spec, None)})"
        assert s.scalar(f"SELECT count(*) FROM (SELECT {cols} FROM {public} EXCEPT ALL {expected})") == 0
        assert s.scalar(f"SELECT count(*) FROM ({expected} EXCEPT ALL SELECT {cols} FROM {public})") == 0
        # in particular every window change is visible: a tombstoned key is gone, a correction is at its new version
        gone = s.scalar(
            f"SELECT count(*) FROM {public} p JOIN {spec.source.table_name.sql()} e USING (txn_id) "
            f"WHERE e.ingested_at > ? AND e.op = 'delete'",
            [SCENARIO.end],
        )
        assert gone == 0
        # each wave reconciled its own partitions key by key; the earlier waves' were checked by fingerprint
        built_before = 0
        for wave in sorted(plan.waves):
            summary = s.scalar(
                "SELECT summary FROM _recovery.timeline WHERE kind = 'repair_wave' AND incident_id = ? "
                "AND summary LIKE ? ORDER BY event_id DESC LIMIT 1",
                [incident.incident_id, ("canary" if wave == 0 else f"wave {wave}") + " of %"],
            )
            assert (
                f"{len(plan.waves[wave])} partitions rebuilt and gated; {built_before} earlier partitions unchanged "
                f"since their gate, 0 changed: passed" in summary
            ), summary
            built_before += len(plan.waves[wave])
        totals = {
            k: s.scalar(f"SELECT sum({k}) FROM _recovery.delta_replays WHERE incident_id = ?", [incident.incident_id])
            for k in ("upserted", "deleted", "skipped_older")
        }

    section = "".join(
        ReportPage((incident.reports_dir(spec) / "recovery.html").read_text()).texts["concurrent_writes"].split()
    )
    assert section.startswith("Concurrentwritespreserved")
    for name, value in totals.items():
        assert f"{value:,}{name}" in section, (name, value, section[:300])
    # the three reports' Done checklists: every item verified or qualified with its reason, from this run's records
    result = check_done_reports(
        incident.reports_dir(spec),
        evidence_dir=incident.evidence_dir(spec),
        run_ids=set(failed_example.info["run_ids"]["backfill"]),
        consumers=[c.name for c in spec.downstream],
    )
    timeline = result["lists"]["timeline"]
    assert timeline["retries"]["status"] == "verified" and "retry" in timeline["retries"]["evidence"]
    assert "out of order" in result["lists"]["reconciliation"]["concurrent"]["evidence"]
