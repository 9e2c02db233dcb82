"""The incident timeline: every kind of event the runbook lists, real run ids, a sensible order across clocks.

The worked example's failed backfill (real Dagster runs, one step retry, a lost
worker) is copied with its Dagster instance; containment is simulated with the
writer's own fence and one refused write (the containment job is tested in its
own module), then the timeline asset is materialized through Dagster.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from recovery.defs.resources import warehouse_resource
from recovery.defs.timeline.assets import incident_timeline
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.errors import FencedGenerationError
from recovery.lib.timeline import RUNBOOK_KINDS
from recovery.lib.timeline.events import CommitClock, TimelineEvent, order_events
from recovery.lib.write.writer import Writer
from recovery_tests.support.example_build import copy_dataset, env
from recovery_tests.support.rows import present

GEN = "backfill-0042"
INCIDENT = "INC-2024-031"


@dataclass(frozen=True)
class Case:
    root: Path
    home: Path
    backfill_id: str
    backfill_runs: set[str]
    retried_runs: set[str]
    result: dg.ExecuteInProcessResult

    def timeline(self) -> dict:
        return json.loads((self.root / "reports" / INCIDENT / "timeline.json").read_text())

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in self.timeline()["events"] if kind is None or e["kind"] == kind]


@pytest.fixture(scope="module")
def case(failed_example, tmp_path_factory) -> Case:
    base = tmp_path_factory.mktemp("timeline")
    root = copy_dataset(failed_example.root, base / "transactions").parent
    home = base / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home)
    spec = parse_spec(root / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec, actor="test-containment")
    writer.fence(GEN, incident_id=INCIDENT, fenced_by="data-platform-oncall", reason="test containment")
    with pytest.raises(FencedGenerationError):
        writer.write(GEN, "SELECT * FROM analytics.transactions LIMIT 1", mode="append", run_id="late-writer")
    backfill_id = failed_example.info["backfill_id"]
    with env(DAGSTER_HOME=str(home)), dg.DagsterInstance.get() as instance:
        result = dg.materialize(
            [incident_timeline],
            instance=instance,
            resources={"warehouse": warehouse_resource(str(root / "spec.yaml"))},
            run_config={"ops": {"incident__timeline": {"config": {"incident_file": str(root / "incident.yaml")}}}},
        )
        runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        retried = {r.run_id for r in runs if instance.all_logs(r.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)}
    assert result.success
    return Case(root, home, backfill_id, {r.run_id for r in runs}, retried, result)


def test_the_asset_materializes_through_dagster_with_markdown_and_a_report_file(case: Case):
    (mat,) = [e.materialization for e in case.result.get_asset_materialization_events()]
    assert mat.asset_key == dg.AssetKey(["incident", "timeline"])
    markdown = mat.metadata["timeline"]
    assert isinstance(markdown, dg.MarkdownMetadataValue)
    report = case.root / "reports" / INCIDENT / "timeline.md"
    assert mat.metadata["report"].value == str(report)
    assert report.read_text() == markdown.md_str
    assert mat.metadata["dagster/row_count"].value == len(case.events()) > 20


def test_every_runbook_kind_is_present_with_the_backfills_real_run_ids(case: Case):
    kinds = {e["kind"] for e in case.events()}
    # decisions come from later phases; the example's step retry is recorded unless its run never started
    assert case.retried_runs, "the worked example's backfill recorded no step retry (a run that never started?)"
    present_now = set(RUNBOOK_KINDS) - {"decisions"}
    assert present_now <= kinds, present_now - kinds
    assert case.timeline()["missing_kinds"] == ["decisions"]
    assert "**Not recorded yet:** decisions" in (case.root / "reports" / INCIDENT / "timeline.md").read_text()

    assert len(case.backfill_runs) == 7
    run_events = {e["run_id"] for e in case.events("runs")}
    assert case.backfill_runs <= run_events  # every run of the Dagster backfill, by its real id
    with env(DAGSTER_HOME=str(case.home)), dg.DagsterInstance.get() as instance:
        for run_id in {e["run_id"] for e in case.events() if e["run_id"]} - {"late-writer"}:
            assert instance.get_run_by_id(run_id) is not None, run_id  # no invented ids
    for run_id in case.backfill_runs:
        said = [e["summary"] for e in case.events("runs") if e["run_id"] == run_id]
        assert any(s.startswith("run created") for s in said) and any(
            s.startswith(("succeeded", "failed")) for s in said
        )
    assert case.retried_runs and {e["run_id"] for e in case.events("retries")} == case.retried_runs


def test_request_approval_snapshot_code_configuration_and_ranges_say_what_the_record_says(case: Case):
    def said(kind: str) -> str:
        return " / ".join(e["summary"] for e in case.events(kind))

    assert f"Dagster backfill {case.backfill_id} requested" in said("request")
    assert "data-platform-oncall" in {e["actor"] for e in case.events("request")}
    assert "approved by head-of-data" in said("approval")
    assert "as of 2024-07-05 01:00:00 (source_watermark)" in said("input_snapshot")
    assert "code version 2.3.0" in said("code")
    assert "spec fingerprint" in said("configuration") and "run config" in said("configuration")
    assert "187 partitions 2024-01-01..2024-07-05; 5 beyond the intended 2024-01-01..2024-06-30" in said("ranges")
    assert "fenced for incident INC-2024-031" in said("containment")
    assert "write:append attempt by fenced generation backfill-0042 refused" in said("alerts")


def test_writes_are_summarised_per_generation_and_run_not_row_by_row(case: Case):
    import duckdb

    con = duckdb.connect(str(case.root / "warehouse.duckdb"), read_only=True)
    try:
        groups = present(
            con.execute(
                "SELECT count(*), sum(n), count(*) FILTER (WHERE generation = ?) FROM (SELECT generation, run_id, "
                "count(*) AS n "
                "FROM _recovery.writes WHERE seq >= (SELECT registered_seq FROM _recovery.generations "
                "WHERE generation = ?) "
                "GROUP BY ALL)",
                [GEN, GEN],
            ).fetchone()
        )
    finally:
        con.close()
    writes = case.events("writes")
    assert len(writes) == groups[0] < groups[1] / 10  # one event per (generation, run), not one per write
    backfill = [e for e in writes if e["actor"] == GEN]
    assert len(backfill) == groups[2] >= 3 and {e["run_id"] for e in backfill} <= case.backfill_runs
    assert all(e["clock"] == "declared" and e["at"].startswith("2024-07-05") for e in backfill)
    assert any(e["actor"] == "ingest-2024-07-05" for e in writes)  # concurrent ingestion is in the story
    assert not any("AFTER THE FENCE" in e["summary"] for e in writes)


def test_the_order_is_sensible_across_the_simulated_and_the_wall_clock(case: Case):
    events = case.events()
    positions = [e["order_at"] for e in events]
    assert positions == sorted(positions)
    index = {id(e): i for i, e in enumerate(events)}

    def first(pred) -> int:
        return min(index[id(e)] for e in events if pred(e))

    def last(pred) -> int:
        return max(index[id(e)] for e in events if pred(e))

    registered = first(lambda e: e["kind"] == "input_snapshot")
    requested = first(lambda e: e["summary"].startswith("Dagster backfill"))
    assert registered < requested  # the generation fixed its snapshot, then the backfill was launched
    for run_id in {e["run_id"] for e in events if e["kind"] == "writes" and e["actor"] == GEN}:
        created = first(lambda e: e["run_id"] == run_id and e["summary"].startswith("run created"))
        wrote = first(lambda e: e["run_id"] == run_id and e["kind"] == "writes")
        ended = last(lambda e: e["run_id"] == run_id and e["summary"].startswith(("succeeded", "failed")))
        assert created < wrote < ended, run_id  # a run's writes sit inside the run, whatever their declared time
    fence = first(lambda e: e["kind"] == "containment")
    assert fence > last(lambda e: e["kind"] == "writes" and e["actor"] == GEN)
    assert fence > last(lambda e: e["run_id"] in case.backfill_runs)
    assert first(lambda e: e["kind"] == "alerts") > fence
    clocks = {e["kind"]: e["clock"] for e in events}
    assert clocks["runs"] == "wall" and clocks["input_snapshot"] == "declared"


def test_a_declared_time_is_placed_by_its_commit_sequence():
    t = datetime(2026, 1, 1, 12, 0)
    clock = CommitClock([(1, t), (3, t + timedelta(minutes=10))])
    simulated = TimelineEvent(datetime(2024, 7, 5, 1), "declared", "request", None, "registered", seq=2)
    late = TimelineEvent(t + timedelta(hours=1), "declared", "containment", None, "fenced", seq=4)
    wall = TimelineEvent(t + timedelta(minutes=5), "wall", "runs", None, "run started", run_id="r")
    ordered = order_events([late, wall, simulated], clock)
    assert [e.summary for e in ordered] == ["registered", "run started", "fenced"]
    assert ordered[0].at == datetime(2024, 7, 5, 1) and ordered[0].order_at == t  # own time kept, placed after seq 1
    assert ordered[2].order_at == late.at  # a time inside its window is its own position
