"""The sensor team's Dagster definitions: ``clean/readings`` and ``marts/sensor_daily``.

Both are daily-partitioned and stored by a plain dagster-duckdb ``DuckDBIOManager`` with a
pandas type handler (what dagster-duckdb-pandas ships; written out here because that
package pins pandas below 3). Each row of ``clean.readings`` carries the run that wrote it
(``_run_id``, from ``context.run.run_id``) and when (``_loaded_at``), as the package's docs
ask of a team's own assets.

Normal ingestion computes a range of days from the change log. A backfill (a run carrying
Dagster's ``dagster/backfill`` tag) instead rebuilds from the team's cached snapshot, and
that path holds the bugs of the incident this project replays:

- it reads ``cache.readings_snapshot``, taken before later changes arrived (stale reads);
- it ignores the ``unit`` column (Fahrenheit readings stored as Celsius);
- it drops tombstones before picking each reading's latest version (deleted readings return);
- it shifts sensor ``S7``'s readings a day forward (a time-zone bug: misfiled days);
- it appends each sensor's pull to a staging table, so the retry of a pull that failed
  half-way appends the first sensors again (duplicate rows);
- it clears its days before pulling, and the pull for ``DYING_DAY`` fails every time: the run
  dies with its days deleted and nothing written.

``TEAM_IO=managed`` switches ``clean/readings`` to the package's ``ManagedDuckDBIOManager``,
the change a team makes once its table is contained.
"""

import os
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
from dagster._core.storage.db_io_manager import DbTypeHandler, TableSlice
from dagster_duckdb import DuckDBIOManager, DuckDBResource
from dagster_duckdb.io_manager import DuckDbClient

FIRST_DAY, LAST_DAY = "2025-03-01", "2025-03-24"
DAYS = dg.DailyPartitionsDefinition(start_date=FIRST_DAY, end_date="2025-03-25")
BACKFILL_RANGE = ("2025-03-05", "2025-03-20")  # the 16 days the failed backfill rebuilt
PER_RUN = 3  # the backfill's runs: three days each (six runs)
SHIFTED_SENSOR = "S7"
FLAKY_DAY, FLAKY_SENSOR = "2025-03-08", "S3"  # the pull of S3 fails once in the run starting on this day
DYING_DAY = "2025-03-11"  # the run starting on this day dies after clearing its days
# timing hooks of the test (TEAM_GATE_DIR): the run starting on GATED_DAY waits for <dir>/go before it
# writes, and runs starting on or after HELD_FROM wait for <dir>/release before doing anything (in
# flight when containment comes); see build.py
GATED_DAY = "2025-03-05"
HELD_FROM = "2025-03-14"

EXPECTED_SQL = """
SELECT reading_id, CAST(reading_ts AS DATE) AS reading_day, sensor_id, reading_ts,
       round(CASE WHEN unit = 'F' THEN (value - 32) * 5 / 9 ELSE value END, 3) AS value_c,
       version AS src_version
FROM (SELECT * FROM raw.readings QUALIFY row_number() OVER (PARTITION BY reading_id ORDER BY version DESC) = 1)
WHERE op <> 'D'
"""


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _stamp(frame: pd.DataFrame, context: dg.AssetExecutionContext) -> pd.DataFrame:
    return frame.assign(_run_id=context.run.run_id, _loaded_at=utcnow())


def _days(context: dg.AssetExecutionContext) -> tuple[str, str]:
    r = context.partition_key_range
    return r.start, r.end


def _wait_for(gate: str | None, mark: str, go: str) -> None:
    if not gate:
        return
    (Path(gate) / mark).touch()
    deadline = time.monotonic() + 300
    while not (Path(gate) / go).exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def _rebuild_from_snapshot(context: dg.AssetExecutionContext, warehouse: DuckDBResource) -> pd.DataFrame:
    first, last = _days(context)
    gate = os.environ.get("TEAM_GATE_DIR")
    if first >= HELD_FROM:
        _wait_for(gate, f"held-{first}", "release")
    pull_from = (date.fromisoformat(first) - timedelta(days=1)).isoformat()
    with warehouse.get_connection() as con:
        con.execute("DELETE FROM clean.readings WHERE reading_day BETWEEN ? AND ?", [first, last])
        if first == DYING_DAY:
            raise RuntimeError(f"snapshot store: the export of {first} is corrupt")
        con.execute("CREATE SCHEMA IF NOT EXISTS staging")
        con.execute(
            "CREATE TABLE IF NOT EXISTS staging.pulled AS "
            "SELECT CAST(NULL AS VARCHAR) AS run_id, * FROM cache.readings_snapshot LIMIT 0"
        )
        for (sensor,) in con.execute("SELECT DISTINCT sensor_id FROM cache.readings_snapshot ORDER BY 1").fetchall():
            if first == FLAKY_DAY and sensor == FLAKY_SENSOR and context.retry_number == 0:
                raise RuntimeError("snapshot store: connection reset while pulling S3")
            con.execute(
                "INSERT INTO staging.pulled SELECT ?, * FROM cache.readings_snapshot "
                "WHERE sensor_id = ? AND CAST(reading_ts AS DATE) BETWEEN ? AND ?",
                [context.run.run_id, sensor, pull_from, last],
            )
        frame = con.execute(
            """
            WITH pulled AS (SELECT * EXCLUDE (run_id) FROM staging.pulled WHERE run_id = ? AND op <> 'D'),
                 latest AS (SELECT * FROM pulled QUALIFY version = max(version) OVER (PARTITION BY reading_id))
            SELECT * FROM (
                SELECT reading_id,
                       CAST(reading_ts + CASE WHEN sensor_id = ? THEN INTERVAL 1 DAY ELSE INTERVAL 0 DAY END AS DATE)
                           AS reading_day,
                       sensor_id, reading_ts, round(value, 3) AS value_c, version AS src_version
                FROM latest)
            WHERE reading_day BETWEEN ? AND ?""",
            [context.run.run_id, SHIFTED_SENSOR, first, last],
        ).df()
    if first == GATED_DAY:
        _wait_for(gate, "waiting", "go")
    return _stamp(frame, context)


@dg.asset(
    key=["clean", "readings"],
    partitions_def=DAYS,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=PER_RUN),
    retry_policy=dg.RetryPolicy(max_retries=1),
    metadata={"partition_expr": "reading_day"},
)
def readings(context: dg.AssetExecutionContext, warehouse: DuckDBResource) -> pd.DataFrame:
    """Each reading's latest version, in Celsius, filed under its day."""
    if context.run.tags.get("dagster/backfill"):
        return _rebuild_from_snapshot(context, warehouse)
    first, last = _days(context)
    with warehouse.get_connection() as con:
        frame = con.execute(f"SELECT * FROM ({EXPECTED_SQL}) WHERE reading_day BETWEEN ? AND ?", [first, last]).df()
    return _stamp(frame, context)


@dg.asset(
    key=["marts", "sensor_daily"],
    partitions_def=DAYS,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=PER_RUN),
    ins={"readings": dg.AssetIn(["clean", "readings"])},
    metadata={"partition_expr": "reading_day"},
)
def sensor_daily(readings: pd.DataFrame) -> pd.DataFrame:
    """Readings per sensor and day, and their mean."""
    return duckdb.query_df(
        readings,
        "r",
        "SELECT reading_day, sensor_id, count(*) AS readings, round(avg(value_c), 3) AS avg_c FROM r GROUP BY ALL",
    ).df()


class FrameHandler(DbTypeHandler[pd.DataFrame]):
    """What dagster-duckdb-pandas's handler does: create the table from the frame, insert by name."""

    def handle_output(self, context: dg.OutputContext, table_slice: TableSlice, obj: pd.DataFrame, connection):
        name = f"{table_slice.schema}.{table_slice.table}"
        connection.register("__frame", obj)
        try:
            connection.execute(f"CREATE TABLE IF NOT EXISTS {name} AS SELECT * FROM __frame LIMIT 0")
            connection.execute(f"INSERT INTO {name} BY NAME SELECT * FROM __frame")
        finally:
            connection.unregister("__frame")
        return {"dagster/row_count": len(obj)}

    def load_input(self, context: dg.InputContext, table_slice: TableSlice, connection) -> pd.DataFrame:
        return connection.execute(DuckDbClient.get_select_statement(table_slice)).df()

    @property
    def supported_types(self):
        return [pd.DataFrame]


class TeamDuckDBIOManager(DuckDBIOManager):
    @staticmethod
    def type_handlers():
        return [FrameHandler()]

    @staticmethod
    def default_load_type():
        return pd.DataFrame


def build_defs(database: str, *, io: str = "plain", spec: str | None = None) -> dg.Definitions:
    """The team's definitions over ``database``; ``io='managed'`` writes ``clean/readings`` through the
    package's ``ManagedDuckDBIOManager`` for the dataset ``spec`` (the marts stay plain)."""
    plain = TeamDuckDBIOManager(database=database)
    resources: dict = {"warehouse": DuckDBResource(database=database), "io_manager": plain}
    if io == "managed":
        from recovery.io import ManagedDuckDBIOManager

        resources["io_manager"] = ManagedDuckDBIOManager(database=database, specs=[spec or ""])
    return dg.Definitions(assets=[readings, sensor_daily], resources=resources, executor=dg.in_process_executor)


@dg.definitions
def defs() -> dg.Definitions:
    return build_defs(
        os.environ["TEAM_WAREHOUSE"], io=os.environ.get("TEAM_IO", "plain"), spec=os.environ.get("TEAM_SPEC")
    )
