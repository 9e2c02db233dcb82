"""Build the team's failed backfill once per test session: real runs, a real daemon, the truth.

1. The change log of 8 sensors over 24 days; normal ingestion materializes every day (one
   in-process run over the range, as the team's hourly job would).
2. The team's snapshot cache is taken; then changes arrive (new versions, tombstones, new
   readings) and normal ingestion writes them: the snapshot is now stale.
3. The backfill of 16 days (both assets) is launched through Dagster's GraphQL mutation, as
   the UI's "Launch backfill" does, and executed by ``dagster-daemon`` (8 runs of 2 days).
4. While its first run is in flight (held at a gate after reading the snapshot), new versions
   of some of its readings arrive and a normal run writes them; then the run clobbers them.
   Normal ingestion of the days after the range keeps running meanwhile.
5. The third run dies after clearing its days; the fourth is in flight (held before it does
   anything) and two are queued when the on-call person acts (``_on_call``): the package's
   draft-incident sensor ticks, ``recovery registry dagster`` runs (twice), and ``recovery contain``
   runs on the sensor's draft unchanged. Then the held run goes on and meets the contained table.
6. Once the daemon has finished cancelling the backfill, the truth is computed from what the test
   recorded (``truth.py``) and kept as Parquet beside the data.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
import yaml
from filelock import FileLock

from recovery.orchestration import LAUNCH_BACKFILL, Daemon, backfill_finished, workspace_context
from recovery_tests.support.example_build import env
from recovery_tests.support.rows import present
from recovery_tests.team_project import definitions as team
from recovery_tests.team_project.truth import History, expected_rows, labels, mart_rows

WORKSPACE = Path(__file__).with_name("workspace.yaml")
SENSORS = [f"S{i}" for i in range(1, 9)]
FAHRENHEIT = {"S2", "S5"}
PER_DAY = 12  # readings per sensor and day
READINGS_KEY = ["clean", "readings"]
MART_KEY = ["marts", "sensor_daily"]

TRANSFORM = (
    "SELECT reading_id, CAST(reading_ts AS DATE) AS reading_day, sensor_id, reading_ts,\n"
    "       round(CASE WHEN unit = 'F' THEN (value - 32) * 5 / 9 ELSE value END, 3) AS value_c\n"
    "FROM {{ source }}\n"
)
SPEC = """dataset: readings
warehouse: {engine: duckdb, path: warehouse.duckdb}
source: {table: raw.readings, key: [reading_id], version: version, op: op, upsert_ops: [I, U], delete_ops: [D],
         ingested_at: ingested_at}
target:
  table: clean.readings
  partition: reading_day
  transform: readings.sql
  metadata: {generation: _run_id, source_version: src_version, written_at: _loaded_at}
  amount: value_c
"""


@dataclass(frozen=True)
class Built:
    root: Path  # spec.yaml, readings.sql, warehouse.duckdb, truth/
    home: Path  # the Dagster instance the team's runs were recorded in
    info: dict

    @property
    def spec(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def backfill_id(self) -> str:
        return self.info["backfill_id"]


def _connect(db: Path) -> duckdb.DuckDBPyConnection:
    """The warehouse, waiting while a run of the daemon holds DuckDB's file lock."""
    for _ in range(300):
        try:
            return duckdb.connect(str(db))
        except duckdb.IOException:
            time.sleep(0.1)
    return duckdb.connect(str(db))


def _sql(db: Path, sql: str, params: list | None = None) -> None:
    con = _connect(db)
    try:
        con.execute(sql, params or [])
    finally:
        con.close()


def _events(db: Path, frame: pd.DataFrame) -> None:
    """Append change events, arriving now."""
    con = _connect(db)
    try:
        con.register("batch", frame)
        con.execute(
            "INSERT INTO raw.readings SELECT reading_id, version, op, sensor_id, reading_ts, value, unit, "
            "CAST(? AS TIMESTAMP) FROM batch",
            [team.utcnow()],
        )
    finally:
        con.close()


def _initial(db: Path, rng: random.Random) -> pd.DataFrame:
    rows = []
    rid = 0
    day0 = date.fromisoformat(team.FIRST_DAY)
    for d in range(24):
        for s in SENSORS:
            for i in range(PER_DAY):
                rid += 1
                ts = pd.Timestamp(day0 + timedelta(days=d)) + pd.Timedelta(hours=2 * i, minutes=int(s[1:]) * 3)
                celsius = round(rng.uniform(-5, 30), 2)
                value = round(celsius * 9 / 5 + 32, 2) if s in FAHRENHEIT else celsius
                rows.append((rid, 1, "I", s, ts, value, "F" if s in FAHRENHEIT else "C"))
    return pd.DataFrame(rows, columns=["reading_id", "version", "op", "sensor_id", "reading_ts", "value", "unit"])


def _changes(current: pd.DataFrame, keys: list[int], rng: random.Random, *, op: str = "U") -> pd.DataFrame:
    latest = current.sort_values("version").groupby("reading_id").last().loc[keys].reset_index()
    return latest.assign(
        version=latest["version"] + 1, op=op, value=[round(v + rng.uniform(1, 3), 2) for v in latest["value"]]
    )


def _read(db: Path, sql: str) -> pd.DataFrame:
    con = _connect(db)
    try:
        return con.execute(sql).df()
    finally:
        con.close()


def ingest(instance: dg.DagsterInstance, defs: dg.Definitions, first: str, last: str, *, mart: bool = True) -> str:
    """The team's normal ingestion: one run over a range of days (not a backfill)."""
    job = defs.resolve_implicit_global_asset_job_def()
    selection = [dg.AssetKey(READINGS_KEY)] + ([dg.AssetKey(MART_KEY)] if mart else [])
    result = job.execute_in_process(
        instance=instance,
        asset_selection=selection,
        tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
    )
    assert result.success
    return result.run_id


def _launch(instance: dg.DagsterInstance) -> str:
    from dagster_graphql.cli import execute_query

    first, last = team.BACKFILL_RANGE
    days = [k for k in team.DAYS.get_partition_keys() if first <= k <= last]
    params = {
        "assetSelection": [{"path": READINGS_KEY}, {"path": MART_KEY}],
        "partitionNames": days,
        "title": "rebuild readings from the snapshot",
    }
    with workspace_context(instance, WORKSPACE) as ctx:
        result = execute_query(ctx, LAUNCH_BACKFILL, variables={"backfillParams": params})
    payload = result["data"]["launchPartitionBackfill"]
    assert payload["__typename"] == "LaunchBackfillSuccess", result
    return payload["backfillId"]


DAGSTER_YAML = """run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config: {max_concurrent_runs: 1, dequeue_interval_seconds: 1}
run_retries: {enabled: true, max_retries: 0}
telemetry: {enabled: false}
"""


def _run_states(instance: dg.DagsterInstance, backfill_id: str) -> dict[str, str]:
    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    return {r.tags.get("dagster/asset_partition_range_start", "?"): r.status.value for r in runs}


def _on_call(root: Path, home: Path, instance: dg.DagsterInstance, backfill_id: str) -> dict:
    """What the on-call person does once a run of the backfill has failed, with the backfill still going:
    the package's draft-incident sensor ticks, ``recovery registry dagster`` builds the registry (twice:
    it must be idempotent once its section is in the spec), and ``recovery contain`` runs on the
    sensor's draft, unchanged."""
    from recovery.defs.alerts.resources import NotifierResource
    from recovery.defs.intake.sensors import backfill_incident_sensor
    from recovery.defs.resources import warehouse_resource
    from recovery_tests.support.foreign_warehouse import cli

    spec = root / "spec.yaml"
    with dg.build_sensor_context(
        instance=instance,
        resources={
            "warehouse": warehouse_resource(str(spec)),
            "notifier": NotifierResource(kind="file", path=str(root / "alerts.jsonl")),
        },
    ) as context:
        tick = backfill_incident_sensor(context)
    assert isinstance(tick, dg.SkipReason), tick  # the sensor drafts the incident and skips its run
    draft = root / "incidents" / f"INC-DRAFT-{backfill_id}.yaml"
    drafted = draft.read_text() if draft.exists() else None  # as the sensor wrote it
    first = cli(
        home,
        "registry",
        "dagster",
        "--spec",
        str(spec),
        "--backfill",
        backfill_id,
        "--incident-out",
        str(root / "registry-incident.yaml"),
    )
    assert first.code == 0, first.out
    section = yaml.safe_load(first.out.split("add to the spec:\n", 1)[1].split("draft incident", 1)[0])
    spec.write_text(spec.read_text() + yaml.safe_dump(section, sort_keys=False))
    again = cli(home, "registry", "dagster", "--spec", str(spec), "--backfill", backfill_id)
    states_at_contain = _run_states(instance, backfill_id)
    taken = draft.read_text()  # what contain is given: the sensor's draft, no field edited
    contained = cli(home, "contain", "--incident", str(draft))
    return {
        "sensor": tick.skip_message,
        "registry_out": first.out,
        "registry_again_code": again.code,
        "registry_again_out": again.out,
        "runs_at_contain": states_at_contain,
        "contain_code": contained.code,
        "contain_out": contained.out,
        "draft": str(draft),
        "draft_unchanged": drafted == taken,
    }


def build(root: Path, home: Path) -> Built:
    t0 = time.monotonic()
    rng = random.Random(34)
    root.mkdir(parents=True)
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    db = root / "warehouse.duckdb"
    (root / "readings.sql").write_text(TRANSFORM)
    (root / "spec.yaml").write_text(SPEC)
    gate = root / "gate"
    gate.mkdir()
    _sql(
        db,
        "CREATE SCHEMA raw; CREATE SCHEMA clean; CREATE SCHEMA marts; CREATE SCHEMA cache; "
        "CREATE TABLE raw.readings (reading_id BIGINT, version INTEGER, op VARCHAR, sensor_id VARCHAR, "
        "reading_ts TIMESTAMP, value DOUBLE, unit VARCHAR, ingested_at TIMESTAMP); "
        # the team's migrations create its tables (a frame alone would make reading_day a TIMESTAMP)
        "CREATE TABLE clean.readings (reading_id BIGINT, reading_day DATE, sensor_id VARCHAR, reading_ts TIMESTAMP, "
        "value_c DOUBLE, src_version INTEGER, _run_id VARCHAR, _loaded_at TIMESTAMP); "
        "CREATE TABLE marts.sensor_daily (reading_day DATE, sensor_id VARCHAR, readings BIGINT, avg_c DOUBLE)",
    )
    initial = _initial(db, rng)
    _events(db, initial)
    first, last = team.BACKFILL_RANGE
    in_range = initial[initial["reading_ts"].dt.strftime("%Y-%m-%d").between(first, last)]["reading_id"].tolist()
    with env(DAGSTER_HOME=str(home), TEAM_WAREHOUSE=str(db), TEAM_GATE_DIR=str(gate)):
        with dg.DagsterInstance.get() as instance:
            defs = team.build_defs(str(db))
            ingest(instance, defs, team.FIRST_DAY, team.LAST_DAY)
            _sql(db, "CREATE TABLE cache.readings_snapshot AS SELECT * FROM raw.readings")
            # after the snapshot: new versions, tombstones and new readings, written by normal ingestion
            picked = rng.sample(in_range, 160)
            _events(db, _changes(initial, picked[:100], rng))
            _events(db, _changes(initial, picked[100:140], rng, op="D"))
            late = _initial(db, random.Random(7)).sample(20, random_state=7)
            late = late[late["reading_ts"].dt.strftime("%Y-%m-%d").between(first, last)]
            _events(db, late.assign(reading_id=late["reading_id"] + 100_000))
            ingest(instance, defs, team.FIRST_DAY, team.LAST_DAY)
            before = _read(db, "SELECT reading_id FROM clean.readings")
            backfill_id = _launch(instance)
            prepared_s = time.monotonic() - t0
            with Daemon(WORKSPACE, home / "daemon.log") as daemon:
                daemon.wait_until(lambda: (gate / "waiting").exists(), timeout_s=180)
                # while the backfill's first run is in flight: newer versions of its readings, written by a normal run
                gated = _read(
                    db,
                    f"SELECT reading_id FROM ({team.EXPECTED_SQL}) WHERE reading_day = DATE '{team.GATED_DAY}' "
                    f"AND sensor_id <> '{team.SHIFTED_SENSOR}' ORDER BY reading_id LIMIT 12",
                )["reading_id"].tolist()
                current = _read(db, "SELECT * EXCLUDE (ingested_at) FROM raw.readings")
                _events(db, _changes(current, gated, rng))
                ingest(instance, defs, team.GATED_DAY, team.GATED_DAY, mart=False)
                # the days after the range keep being loaded
                extra = _initial(db, random.Random(11))
                extra = extra[extra["reading_ts"].dt.strftime("%Y-%m-%d") >= "2025-03-22"].sample(30, random_state=3)
                _events(db, extra.assign(reading_id=extra["reading_id"] + 200_000))
                ingest(instance, defs, "2025-03-22", team.LAST_DAY)
                (gate / "go").touch()
                daemon.wait_until(lambda: (gate / f"held-{team.HELD_FROM}").exists(), timeout_s=240)
                ran_s = time.monotonic() - t0
                on_call = _on_call(root, home, instance, backfill_id)
                (gate / "release").touch()  # the held run goes on: its writes now meet the contained table
                daemon.wait_until(lambda: backfill_finished(instance, backfill_id), timeout_s=180)
            runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            history = History(frozenset(before["reading_id"]), frozenset(r.run_id for r in runs), frozenset(gated))
            final_states = _run_states(instance, backfill_id)
            backfill_status = present(instance.get_backfill(backfill_id)).status.value
    truth = root / "truth"
    truth.mkdir()
    con = _connect(db)
    try:
        events = con.execute("SELECT * FROM raw.readings").df()
        target = con.execute("SELECT * FROM clean.readings").df()
        expected = expected_rows(con)
    finally:
        con.close()
    got = labels(events, target, expected, history)
    pd.DataFrame(sorted(got.items()), columns=["reading_id", "label"]).to_parquet(truth / "labels.parquet")
    expected.to_parquet(truth / "expected.parquet")
    mart_rows(expected).to_parquet(truth / "mart.parquet")
    info = {
        "backfill_id": backfill_id,
        "run_ids": sorted(history.backfill_runs),
        "runs_final": final_states,
        "backfill_status": backfill_status,
        "concurrent_keys": sorted(history.concurrent_keys),
        "prepared_s": round(prepared_s, 1),
        "backfill_ran_s": round(ran_s, 1),
        "build_s": round(time.monotonic() - t0, 1),
        "labels": pd.Series(got).value_counts().to_dict(),
        **on_call,
    }
    (root / "built.json").write_text(json.dumps(info, indent=1))
    return Built(root, home, info)


def build_once(shared: Path) -> Built:
    """The built project under ``shared`` (built on first use, under a file lock: xdist workers share it)."""
    root, home = shared / "team_project", shared / "team_dagster_home"
    with FileLock(str(shared / "team_project.lock")):
        if not (root / "built.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
            return build(root, home)
    return Built(root, home, json.loads((root / "built.json").read_text()))
