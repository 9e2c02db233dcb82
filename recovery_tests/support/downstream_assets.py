"""A platform team's own Dagster project, next to the package: what ``test_downstream_assets`` recovers.

Sensor readings land in a change log ``raw.readings_log`` (a reading is corrected by a
newer ``rev``, withdrawn by a ``delete``; some sensors report Fahrenheit). The team's
``clean/readings`` asset cleans one day into Celsius and writes the managed target
``clean.readings`` through the package's ``ManagedDuckDBIOManager``; its
``marts/sensor_daily`` asset, downstream of it, averages each sensor's day into
``marts.sensor_daily`` (stored by the same IO manager like any dagster-duckdb asset).
The recovery package knows nothing of this code: the spec names ``marts/sensor_daily``
and this file, and the restatement launches the asset's runs through Dagster.

The test copies this file beside its spec and warehouse, so the paths below are the
copy's neighbours, as a team's ``definitions.py`` names its own files.
"""

from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd

from recovery.io import ManagedDuckDBIOManager

HERE = Path(__file__).resolve().parent
WAREHOUSE = HERE / "warehouse.duckdb"
SPEC = HERE / "spec.yaml"
DAILY = dg.DailyPartitionsDefinition(start_date="2025-03-01", end_date="2025-03-07")

CELSIUS_SQL = "CASE WHEN unit = 'F' THEN (value - 32) * 5 / 9 ELSE value END"


class ReadingsConfig(dg.Config):
    ignore_unit: bool = False  # the faulty backfill's bug: Fahrenheit kept as it is


@dg.asset(
    key=["clean", "readings"],
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),
    metadata={"partition_expr": "day"},
)
def readings(context: dg.AssetExecutionContext, config: ReadingsConfig) -> pd.DataFrame:
    """The run's days of readings in Celsius: each reading's latest version, withdrawn ones left out."""
    first, last = context.partition_key_range.start, context.partition_key_range.end
    celsius = "value" if config.ignore_unit else CELSIUS_SQL
    con = duckdb.connect(str(WAREHOUSE), read_only=True)
    try:
        return con.execute(
            f"""SELECT sensor_id, reading_no, day, {celsius} AS celsius, rev AS _source_version
                FROM raw.readings_log
                QUALIFY row_number() OVER (PARTITION BY sensor_id, reading_no ORDER BY rev DESC) = 1
                AND op = 'upsert' AND day BETWEEN CAST(? AS DATE) AND CAST(? AS DATE)""",
            [first, last],
        ).df()
    finally:
        con.close()


@dg.asset(
    key=["marts", "sensor_daily"],
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),
    ins={"readings": dg.AssetIn(key=["clean", "readings"])},
    # partition_expr: dagster-duckdb's partition column; recovery/*: how the recovery package compares
    # its rows when it restates them (a spec's downstream_assets entry says the same from outside)
    metadata={
        "partition_expr": "day",
        "recovery/key": ["sensor_id", "day"],
        "recovery/materiality": {"column": "avg_celsius", "abs": 0.5},
    },
    owners=["team:plant-analytics"],
    tags={"recovery/consumer_kind": "dashboard"},
)
def sensor_daily(readings: pd.DataFrame) -> pd.DataFrame:
    """Per sensor and day of the run's days: how many readings and their mean temperature."""
    out = readings.groupby(["sensor_id", "day"], as_index=False).agg(
        n_readings=("reading_no", "count"), avg_celsius=("celsius", "mean")
    )
    return out[["sensor_id", "day", "n_readings", "avg_celsius"]]


defs = dg.Definitions(
    assets=[readings, sensor_daily],
    resources={"io_manager": ManagedDuckDBIOManager(database=str(WAREHOUSE), specs=[str(SPEC)])},
)
