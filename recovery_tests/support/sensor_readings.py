"""The sensor-readings incident of ``downstream_assets.py``, built for the tests, with its truth.

Six sensors, six days, four readings each a day; sensors 0 and 1 report Fahrenheit,
sensor 2 too but sits in a cold room at about -40 (where both scales meet, so its damage
stays below materiality), sensors 3-5 report Celsius. Some readings are corrected (rev 2)
and some withdrawn (a ``delete``). Normal ingestion materializes both assets for every
day; then backfill ``bfunits`` re-runs ``clean/readings`` for 03-02..03-04 with the unit
bug and the team's mart is re-materialized from it, as its automation would.

The truth of ``marts.sensor_daily`` is computed here in pandas from the change log alone.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import yaml

from recovery.config import PROJECT_ROOT
from recovery_tests.support.example_build import env

DAYS = [date(2025, 3, 1) + timedelta(days=i) for i in range(6)]
BACKFILL_DAYS = ["2025-03-02", "2025-03-03", "2025-03-04"]
BACKFILL = "bfunits"
INCIDENT = "INC-readings"
UNITS = {0: "F", 1: "F", 2: "F", 3: "C", 4: "C", 5: "C"}
MART = ["marts", "sensor_daily"]
TEAM_FILE = Path(__file__).with_name("downstream_assets.py")
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
QUIET = {"console": {"config": {"log_level": "CRITICAL"}}}


@dataclass(frozen=True)
class Built:
    root: Path
    home: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def incident(self) -> Path:
        return self.root / "incident.yaml"

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    def fetch(self, sql: str, params: list | None = None) -> list[tuple]:
        con = duckdb.connect(str(self.warehouse), read_only=True)
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()

    def frame(self, sql: str) -> pd.DataFrame:
        con = duckdb.connect(str(self.warehouse), read_only=True)
        try:
            return con.execute(sql).df()
        finally:
            con.close()

    def copy(self, dest: Path) -> Built:
        shutil.copytree(self.root, dest / "project")
        shutil.copytree(self.home, dest / "home")
        return Built(dest / "project", dest / "home")


def change_log(seed: int = 11) -> pd.DataFrame:
    rng = random.Random(seed)
    at = datetime(2025, 3, 7, 1, 0)
    rows = []
    for sensor, unit in UNITS.items():
        for d, day in enumerate(DAYS):
            for r in range(4):
                no = d * 10 + r
                base = -40.0 if sensor == 2 else (60.0 if unit == "F" else 20.0)
                value = round(base + rng.uniform(-0.5, 0.5) if sensor == 2 else base + rng.uniform(-8, 8), 2)
                rows.append((sensor, no, 1, "upsert", at, day, value, unit))
                if (sensor + no) % 5 == 0:
                    rows.append((sensor, no, 2, "upsert", at + timedelta(hours=1), day, round(value + 1.5, 2), unit))
                if (sensor + no) % 7 == 3:
                    rows.append((sensor, no, 3, "delete", at + timedelta(hours=2), day, value, unit))
    cols = ["sensor_id", "reading_no", "rev", "op", "ingested_at", "day", "value", "unit"]
    return pd.DataFrame(rows, columns=cols)


def mart_truth(log: pd.DataFrame) -> pd.DataFrame:
    """``marts.sensor_daily`` as the source says it should be: latest live version of each reading,
    in Celsius, averaged per sensor and day."""
    latest = log.sort_values("rev").groupby(["sensor_id", "reading_no"], as_index=False).last()
    live = latest[latest["op"] == "upsert"].copy()
    live["celsius"] = [(v - 32) * 5 / 9 if u == "F" else v for v, u in zip(live["value"], live["unit"], strict=True)]
    out = live.groupby(["sensor_id", "day"], as_index=False).agg(
        n_readings=("reading_no", "count"), avg_celsius=("celsius", "mean")
    )
    out["day"] = pd.to_datetime(out["day"]).dt.date
    return out.sort_values(["sensor_id", "day"]).reset_index(drop=True)


SPEC: dict[str, Any] = {
    "dataset": "readings",
    "warehouse": {"engine": "duckdb", "path": "warehouse.duckdb"},
    "source": {
        "table": "raw.readings_log",
        "key": ["sensor_id", "reading_no"],
        "version": "rev",
        "op": "op",
        "ingested_at": "ingested_at",
    },
    "target": {"table": "clean.readings", "partition": "day", "transform": "readings.sql"},
    "downstream_assets": [
        {
            "asset": "marts/sensor_daily",
            "key": ["sensor_id", "day"],
            "partition": "day",
            "owner": "plant-analytics",
            "kind": "dashboard",
            "materiality": {"column": "avg_celsius", "abs": 0.5},
            "definitions": "team_project.py",
        }
    ],
}
TRANSFORM = (
    "SELECT sensor_id, reading_no, day, CASE WHEN unit = 'F' THEN (value - 32) * 5 / 9 ELSE value END AS celsius "
    "FROM {{ source }}\n"
)


def team_definitions(root: Path) -> dg.Definitions:
    """The team's code location, loaded from its copy the way ``dagster dev -f`` loads it."""
    from dagster._core.code_pointer import load_python_file

    return load_python_file(str(root / "team_project.py"), str(root)).defs


def build(root: Path) -> Built:
    """The warehouse, spec, incident and the team's project, ingested then damaged through Dagster."""
    root.mkdir(parents=True)
    home = root.parent / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    shutil.copy(TEAM_FILE, root / "team_project.py")
    (root / "readings.sql").write_text(TRANSFORM)
    (root / "spec.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    (root / "incident.yaml").write_text(
        yaml.safe_dump(
            {
                "incident_id": INCIDENT,
                "spec": "spec.yaml",
                "failed_generations": [f"backfill-{BACKFILL}"],
                "partitions": {"start": BACKFILL_DAYS[0], "end": BACKFILL_DAYS[-1]},
                "requested_by": "plant-oncall",
                "approved_by": ["head-of-data"],
            },
            sort_keys=False,
        )
    )
    log = change_log()
    con = duckdb.connect(str(root / "warehouse.duckdb"))
    try:
        con.execute("CREATE SCHEMA raw")
        con.register("log", log)
        con.execute("CREATE TABLE raw.readings_log AS SELECT * FROM log")
    finally:
        con.close()
    defs = team_definitions(root)
    job = defs.resolve_implicit_global_asset_job_def()
    readings, mart = dg.AssetKey(["clean", "readings"]), dg.AssetKey(MART)
    with env(DAGSTER_HOME=str(home)), dg.DagsterInstance.get() as instance:

        def run(first: str, last: str, keys: list, tags: dict | None = None, **config) -> None:
            result = job.execute_in_process(
                asset_selection=keys,
                instance=instance,
                tags={RANGE_START: first, RANGE_END: last, **(tags or {})},
                run_config={"loggers": QUIET, **({"ops": {"clean__readings": {"config": config}}} if config else {})},
            )
            assert result.success

        run(str(DAYS[0]), str(DAYS[-1]), [readings, mart])  # normal ingestion
        run(BACKFILL_DAYS[0], BACKFILL_DAYS[-1], [readings], {"dagster/backfill": BACKFILL}, ignore_unit=True)
        run(BACKFILL_DAYS[0], BACKFILL_DAYS[-1], [mart])  # the team's automation: the mart follows its input
    return Built(root, home)
