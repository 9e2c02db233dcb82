"""A team's own Dagster asset downstream of the managed target is a consumer (issue 34, item 4).

The team's project (``downstream_assets.py``, built by ``sensor_readings.py``): ``clean/readings``
written through ``ManagedDuckDBIOManager``, ``marts/sensor_daily`` computed from it; a backfill
converted no units on three days and the mart followed it. Recovered through the CLI, step by
step, with the mart named in the spec by asset key and its code location's file. Shown: the
mart is in the impact with the partitions and rows the damage reached, and its rows there are
kept before anything is repaired; ``restate`` launches its materialization through Dagster, after
which its table equals its truth (computed in pandas from the change log alone) and the ledger
holds exactly the rows that changed, original and corrected values, material where the spec says;
a restatement whose own check fails exits 1 with one sentence.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml
from filelock import FileLock

from recovery.lib.consumers.assets import CAPTURED_AT_IMPACT
from recovery.lib.control.plane import SCHEMA
from recovery_tests.support.foreign_warehouse import cli
from recovery_tests.support.rows import present
from recovery_tests.support.sensor_readings import BACKFILL_DAYS, INCIDENT, MART, Built, build, change_log, mart_truth

LEDGER = f'{SCHEMA}."restatement_ledger__readings"'
MART_SQL = "SELECT sensor_id, CAST(day AS DATE) AS day, n_readings, avg_celsius FROM marts.sensor_daily"


@pytest.fixture(scope="module")
def published(shared_dir: Path) -> tuple[Built, pd.DataFrame, str]:
    """Damaged, then contained, assessed, repaired and published through the CLI, once per test session
    (xdist workers share it under a lock; tests that write copy it); the mart as the damage left it (read
    before any recovery step) and what ``assess`` printed."""
    root = shared_dir / "readings"
    with FileLock(str(shared_dir / "readings.lock")):
        if not (root / "published").exists():
            shutil.rmtree(root, ignore_errors=True)
            b = build(root / "project")
            b.frame(MART_SQL).to_parquet(root / "damaged.parquet")
            for verb in ("contain", "assess", "repair", "publish"):
                r = cli(b.home, verb, "--incident", str(b.incident))
                assert r.code == 0 and "Traceback" not in r.out, (verb, r.out)
                if verb == "assess":
                    (root / "assess.txt").write_text(r.out)
            (root / "published").touch()
    return (
        Built(root / "project", root / "home"),
        pd.read_parquet(root / "damaged.parquet"),
        (root / "assess.txt").read_text(),
    )


def _checklists(b: Built) -> dict[str, dict[str, dict[str, str]]]:
    """The three reports' Done checklists, rendered by ``recovery report`` and read back."""
    from recovery_tests.support.report_checks import ReportPage, checklist

    r = cli(b.home, "report", "--incident", str(b.incident))
    assert r.code == 0, r.out
    out = b.root / "reports" / INCIDENT
    return {
        n: checklist(ReportPage((out / f"{n}.html").read_text())) for n in ("timeline", "reconciliation", "recovery")
    }


def _by_key(frame: pd.DataFrame) -> dict[tuple, tuple]:
    return {
        (int(r.sensor_id), pd.Timestamp(r.day).date()): (int(r.n_readings), float(r.avg_celsius))
        for r in frame.itertuples()
    }


def test_the_downstream_asset_is_in_the_impact_with_the_partitions_and_rows_the_damage_reached(published):
    b, damaged, said = published
    impact = b.fetch(
        f'SELECT partitions, rows_reached, original_namespace, basis FROM {SCHEMA}."asset_impact__readings" '
        f"WHERE incident_id = ? AND asset = 'marts/sensor_daily'",
        [INCIDENT],
    )
    assert len(impact) == 1
    partitions, rows, original, basis = impact[0]
    assert partitions == BACKFILL_DAYS and basis == CAPTURED_AT_IMPACT
    in_range = damaged[damaged["day"].astype(str).isin(BACKFILL_DAYS)]
    assert rows == len(in_range) == 18
    # the rows kept at assess time are the mart as the damage left it, in those partitions
    kept = b.frame(f"SELECT sensor_id, CAST(day AS DATE) AS day, n_readings, avg_celsius FROM {original}")
    assert _by_key(kept) == _by_key(in_range)
    assert "marts/sensor_daily" in said and "2025-03-02, 2025-03-03, 2025-03-04" in said and "| 18 |" in said


def test_restate_rematerializes_the_asset_through_dagster_and_the_ledger_holds_what_changed(published, tmp_path):
    src, damaged, _ = published
    b = src.copy(tmp_path)
    r = cli(b.home, "restate", "--incident", str(b.incident))
    assert r.code == 0 and "Traceback" not in r.out, r.out
    assert "marts/sensor_daily" in r.out

    # the mart equals its truth, computed from the change log alone, on every day
    truth = _by_key(mart_truth(change_log()))
    got = _by_key(b.frame(MART_SQL))
    assert got.keys() == truth.keys()
    for key, (n, avg) in truth.items():
        assert got[key][0] == n and got[key][1] == pytest.approx(avg, abs=1e-9), key

    # the ledger: exactly the keys whose value the damage changed, original beside corrected
    before = _by_key(damaged)
    changed = {k for k in truth if abs(before[k][1] - truth[k][1]) > 1e-9 or before[k][0] != truth[k][0]}
    assert len(changed) == 9  # the three Fahrenheit sensors on the three backfilled days
    ledger = b.fetch(
        f"SELECT consumer_key, change, original_value, corrected_value, material, decision, owner FROM {LEDGER} "
        f"WHERE incident_id = ? AND consumer = 'marts/sensor_daily'",
        [INCIDENT],
    )
    rows = {
        (int(k.split("|")[0]), pd.Timestamp(k.split("|")[1]).date()): row for k, *row in ledger
    }  # key text: sensor_id|day
    assert rows.keys() == changed
    for key, (change, orig, corr, material, decision, owner) in rows.items():
        assert change == "changed" and owner == "plant-analytics"
        assert orig == pytest.approx(before[key][1]) and corr == pytest.approx(truth[key][1])
        assert material == (abs(corr - orig) >= 0.5)
        assert decision == ("dashboard figure corrected" if material else "none: below materiality")
    assert sum(1 for *_, m, _, _ in rows.values() if m) == 6  # the cold-room sensor moves by less than 0.5

    # a real run of the team's asset, tagged with the incident, in the project's instance
    with dg.DagsterInstance.from_config(str(b.home)) as instance:
        runs = instance.get_runs(dg.RunsFilter(tags={"recovery/restates": "marts/sensor_daily"}))
        assert [x.status for x in runs] == [dg.DagsterRunStatus.SUCCESS]
        assert runs[0].tags["recovery/incident"] == INCIDENT
        assert runs[0].tags["dagster/asset_partition_range_start"] == BACKFILL_DAYS[0]
        assert runs[0].tags["dagster/asset_partition_range_end"] == BACKFILL_DAYS[-1]
        assert present(instance.get_latest_materialization_event(dg.AssetKey(MART))).run_id == runs[0].run_id

    # the reports: each Done row that reads the asset is verified from these records
    done = _checklists(b)
    assert (
        "1 of 1 downstream Dagster assets reached: marts/sensor_daily (3 partitions, 18 rows)"
        in (done["reconciliation"]["downstream"]["evidence"])
    )
    assert "marts/sensor_daily (3 partitions, 18 rows)" in done["timeline"]["propagation"]["evidence"]
    correction = done["recovery"]["downstream correction"]
    assert correction["status"] == "verified", correction
    assert "1 consumers restated, 9 ledger rows, 6 material; 1 of 1 restatement checks passed" in correction["evidence"]

    # a second restate changes nothing: the same ledger, the corrected copy reused
    namespaces = b.fetch(f"SELECT count(*) FROM {SCHEMA}.namespaces")
    assert cli(b.home, "restate", "--incident", str(b.incident)).code == 0
    assert b.fetch(
        f"SELECT consumer_key, original_value, corrected_value, material FROM {LEDGER} ORDER BY 1"
    ) == sorted((k, o, c, m) for k, _, o, c, m, _, _ in ledger)
    assert b.fetch(f"SELECT count(*) FROM {SCHEMA}.namespaces") == namespaces


def test_a_restatement_whose_check_fails_exits_1_with_one_sentence(published, tmp_path):
    """The team's table drifted (a column added by hand): the asset's run cannot store its rows, so
    nothing was corrected, and ``restate`` says so instead of exiting 0 with an empty ledger."""
    b = published[0].copy(tmp_path)
    con = __import__("duckdb").connect(str(b.warehouse))
    try:
        con.execute("ALTER TABLE marts.sensor_daily ADD COLUMN note VARCHAR")
    finally:
        con.close()
    r = cli(b.home, "restate", "--incident", str(b.incident))
    assert r.code == 1, r.out
    line = " ".join(r.out.split())
    assert "the restatement's check failed for 1 of 1 consumers: marts/sensor_daily: the re-materialization of " in line
    assert "partition 2025-03-02...2025-03-04 failed in run" in line and "Traceback" not in r.out
    checks = b.fetch(
        f"SELECT consumer, passed, observed FROM {SCHEMA}.restatement_checks WHERE incident_id = ?", [INCIDENT]
    )
    assert checks == [("marts/sensor_daily", False, 1)]
    correction = _checklists(b)["recovery"]["downstream correction"]  # and the report does not call it done
    assert correction["status"] == "not verified", correction
    assert "check failed: marts/sensor_daily: the re-materialization of partition" in correction["why"]


def test_a_downstream_asset_the_spec_names_in_a_location_that_lacks_it_is_refused_before_any_write(published, tmp_path):
    b = published[0].copy(tmp_path)
    doc = yaml.safe_load(b.spec.read_text())
    doc["downstream_assets"][0]["asset"] = "marts/sensor_hourly"
    b.spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = b.fetch(f"SELECT count(*) FROM {SCHEMA}.timeline")
    r = cli(b.home, "restate", "--incident", str(b.incident))
    assert r.code == 2 and "Traceback" not in r.out
    line = " ".join(r.out.split())
    assert "downstream_assets[0].asset: marts/sensor_hourly is not an asset of the code location in" in line, line
    assert b.fetch(f"SELECT count(*) FROM {SCHEMA}.timeline") == before


def test_the_spec_refuses_a_malformed_downstream_asset_naming_the_field(tmp_path: Path):
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery.lib.errors import SpecError
    from recovery_tests.support.sensor_readings import SPEC, TRANSFORM

    (tmp_path / "readings.sql").write_text(TRANSFORM)
    (tmp_path / "team_project.py").write_text("")
    for change, field in (
        ({"asset": "marts/sensor daily"}, "downstream_assets[0].asset"),
        ({"key": []}, "downstream_assets[0].key"),
        ({"table": "sensor_daily;drop"}, "downstream_assets[0].table"),
        ({"definitions": "team_project.txt"}, "downstream_assets[0].definitions"),
        ({"definitions": "missing.py"}, "downstream_assets[0].definitions"),
    ):
        doc = dict(SPEC, downstream_assets=[dict(SPEC["downstream_assets"][0], **change)])
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
        with pytest.raises(SpecError) as err:
            parse_spec(tmp_path / "spec.yaml")
        assert err.value.field == field, (change, str(err.value))
        assert "Fix:" in str(err.value)


@dg.asset(
    key=["marts", "sensor_alerts"],
    partitions_def=dg.DailyPartitionsDefinition(start_date="2025-03-01", end_date="2025-03-07"),
    ins={"daily": dg.AssetIn(key=MART)},
    metadata={
        "partition_expr": "day",
        "recovery/key": ["sensor_id", "day"],
        "recovery/materiality": {"column": "hot", "abs": 1},
    },
    owners=["team:plant-ops"],
)
def sensor_alerts(daily: pd.DataFrame) -> pd.DataFrame:
    """A second team asset, one day per run, two steps below the target: sensors running hot."""
    out = daily[["sensor_id", "day"]].copy()
    out["hot"] = (daily["avg_celsius"] > 30).astype("int64")
    return out


def test_assets_in_the_same_code_location_are_found_through_its_asset_graph_and_restated_upstream_first(
    published, tmp_path
):
    """A team that merges the package's definitions into its own code location lists nothing in the
    spec: its assets downstream of the target declare their key in metadata. The mart is restated
    from the impact's copy; the alerts two steps down, never traced, from a copy taken before their
    own runs (one per day: no single-run policy), after the mart they read."""
    from recovery.definitions import definitions_for
    from recovery.launch import Launcher
    from recovery.lib.consumers.assets import CAPTURED_AT_RESTATEMENT
    from recovery.lib.incident.model import check_incident, parse_incident
    from recovery.lib.incident.phases import RESTATE
    from recovery_tests.support.example_build import env
    from recovery_tests.support.sensor_readings import team_definitions

    b = published[0].copy(tmp_path)
    doc = yaml.safe_load(b.spec.read_text())
    del doc["downstream_assets"]
    b.spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    team = team_definitions(b.root)
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    alerts_key = dg.AssetKey(["marts", "sensor_alerts"])
    with env(DAGSTER_HOME=str(b.home)), dg.DagsterInstance.get() as instance:
        own = dg.Definitions.merge(team, dg.Definitions(assets=[sensor_alerts]))
        job = own.resolve_implicit_global_asset_job_def()
        for day in [*BACKFILL_DAYS, "2025-03-05"]:  # computed from the damaged mart, as the team's automation did
            assert job.execute_in_process(
                partition_key=day, asset_selection=[alerts_key], instance=instance, run_config=quiet
            ).success
        damaged_alerts = b.frame("SELECT sensor_id, CAST(day AS DATE) AS day, hot FROM marts.sensor_alerts")
        merged = dg.Definitions.merge(definitions_for(b.spec), own)
        incident = parse_incident(b.incident)
        launcher = Launcher(incident, check_incident(incident), instance=instance, definitions=merged)
        launcher.run(RESTATE)
        runs = instance.get_runs(dg.RunsFilter(tags={"recovery/incident": INCIDENT}))
    launched = sorted(
        (r.tags["recovery/restates"], r.tags.get("dagster/partition", "range"), r.status.value)
        for r in runs
        if "recovery/restates" in r.tags
    )
    assert launched == [("marts/sensor_alerts", day, "SUCCESS") for day in BACKFILL_DAYS] + [
        ("marts/sensor_daily", "range", "SUCCESS")
    ]
    restated = b.fetch(
        f"SELECT consumer, restated_at FROM {SCHEMA}.restatements WHERE incident_id = ? ORDER BY restated_at",
        [INCIDENT],
    )
    assert [c for c, _ in restated] == ["marts/sensor_daily", "marts/sensor_alerts"]  # upstream first

    # the alerts now follow the corrected mart, day by day; the day the damage never reached is untouched
    truth = mart_truth(change_log())
    truth_hot = {(int(r.sensor_id), r.day): int(r.avg_celsius > 30) for r in truth.itertuples()}
    got = {
        (int(r.sensor_id), pd.Timestamp(r.day).date()): (int(r.hot))
        for r in b.frame("SELECT sensor_id, CAST(day AS DATE) AS day, hot FROM marts.sensor_alerts").itertuples()
    }
    before = {(int(r.sensor_id), pd.Timestamp(r.day).date()): int(r.hot) for r in damaged_alerts.itertuples()}
    for key, hot in got.items():
        assert hot == (truth_hot[key] if str(key[1]) in BACKFILL_DAYS else before[key]), key
    ledger = b.fetch(
        f"SELECT consumer_key, original_value, corrected_value, material FROM {LEDGER} "
        f"WHERE incident_id = ? AND consumer = 'marts/sensor_alerts' ORDER BY 1",
        [INCIDENT],
    )
    flipped = sorted(f"{k[0]}|{k[1]} 00:00:00" for k in got if str(k[1]) in BACKFILL_DAYS and before[k] != truth_hot[k])
    assert [row[0] for row in ledger] == flipped and len(flipped) == 6
    assert all(o == 1.0 and c == 0.0 and m for _, o, c, m in ledger)
    notes = b.fetch(
        f"SELECT note FROM {SCHEMA}.namespaces WHERE public_name = 'consumers.marts__sensor_alerts' "
        "ORDER BY created_seq"
    )
    assert CAPTURED_AT_RESTATEMENT in notes[0][0], notes


def test_an_asset_downstream_of_the_target_that_declares_no_key_is_named_with_the_fix(published, tmp_path):
    """Found in the code location's graph but declaring no key: reported apart (assess prints it),
    and restate refuses it in one line before anything is written."""
    from recovery.definitions import definitions_for
    from recovery.defs.asset_consumers import resolve
    from recovery.defs.location import remember
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery_tests.support.sensor_readings import team_definitions

    b = published[0].copy(tmp_path)
    doc = yaml.safe_load(b.spec.read_text())
    del doc["downstream_assets"]
    b.spec.write_text(yaml.safe_dump(doc, sort_keys=False))

    @dg.asset(key=["marts", "sensor_weekly"], deps=[dg.AssetKey(["clean", "readings"])])
    def sensor_weekly() -> None: ...

    remember(
        b.spec,
        dg.Definitions.merge(definitions_for(b.spec), team_definitions(b.root), dg.Definitions(assets=[sensor_weekly])),
    )
    found, undeclared = resolve(None, parse_spec(b.spec), str(b.spec))
    assert [a.consumer.asset for a in found] == ["marts/sensor_daily"]  # declared in its metadata
    assert [u.asset for u in undeclared] == ["marts/sensor_weekly"]
    err = str(undeclared[0].error("clean.readings"))
    assert err.startswith("asset marts/sensor_weekly: is downstream of clean.readings but declares no key")
    assert "Fix: list it under downstream_assets (asset: marts/sensor_weekly, key: [columns])" in err
