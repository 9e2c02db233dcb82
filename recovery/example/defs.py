"""The worked example's pipeline in Dagster: ingestion, the faulty history asset, consumers.

- ``ingest_transactions``: daily-partitioned change-data-capture job with a schedule;
  each run writes as generation ``ingest-<day>`` through the writer.
- ``analytics/transactions``: the history asset at code version 2.3.0, whose
  backfill is the incident. Backfills run it over partition ranges
  (``BackfillPolicy.multi_run``); a failed step is retried once.

Its own code location (``recovery.example.location``, loaded beside the package's by
``workspace.yaml``): a location serving a team's dataset shows none of it. The consumers
downstream of the target are the package's (``recovery/defs/datasets/served.py``).
"""

import time
from datetime import date, datetime, timedelta
from pathlib import Path

import dagster as dg
from pydantic import Field

from recovery.config import spec_path
from recovery.defs.resources import WarehouseResource, warehouse_resource
from recovery.example.faulty_backfill import CatalogTimeout, WorkerLost, recompute_partition, stage_sql, stage_table
from recovery.example.scenario import SCENARIO
from recovery.lib.control.plane import SCHEMA, utcnow
from recovery.lib.errors import FencedGenerationError
from recovery.lib.write.fencing import GENERATION_TAG
from recovery.lib.write.ingest import apply_changes

TARGET_KEY = dg.AssetKey(["analytics", "transactions"])
DAILY = dg.DailyPartitionsDefinition(
    start_date=SCENARIO.first_day.isoformat(), end_date=(SCENARIO.last_day + timedelta(days=1)).isoformat()
)
SIMULATED_TAG = "example/simulated"
PAUSE_TAG = "example/partition_pause_s"
"""Seconds the example's backfill waits after each partition (0 to 10; default 0): a slow backfill, so
that a test can contain a run while it executes rather than between its runs."""


class IngestConfig(dg.Config):
    until: str | None = Field(
        None, description="Apply changes ingested up to this ISO timestamp (default: end of the partition day)."
    )
    written_at: str | None = Field(None, description="Simulated commit time for the writes (default: now).")


@dg.op(description="Apply the day's source changes to analytics.transactions through the writer.")
def ingest_changes(context: dg.OpExecutionContext, config: IngestConfig, warehouse: WarehouseResource) -> dg.Output:
    day = date.fromisoformat(context.partition_key)
    until = (
        datetime.fromisoformat(config.until)
        if config.until
        else datetime.combine(day + timedelta(days=1), datetime.min.time())
    )
    at = datetime.fromisoformat(config.written_at) if config.written_at else None
    writer = warehouse.writer(actor="ingest_transactions")
    writer.ensure()
    generation = f"ingest-{day.isoformat()}"
    writer.register_generation(
        generation, "ingest", started_at=at, run_id=context.run.run_id, code_version="ingest-1.4.2"
    )
    result = apply_changes(writer, generation, until=until, at=at, run_id=context.run.run_id)
    context.log.info(f"{generation}: upserted {result.upserted}, deleted {result.deleted} up to {until}")
    return dg.Output(None, metadata={"upserted": result.upserted, "deleted": result.deleted, "until": str(until)})


@dg.job(partitions_def=DAILY, description="Normal ingestion: apply the source change log to analytics.transactions.")
def ingest_transactions():
    ingest_changes()


ingest_schedule = dg.build_schedule_from_partitioned_job(ingest_transactions, name="ingest_transactions_daily")


def _generation_for(context: dg.AssetExecutionContext) -> str:
    tags = context.run.tags
    if GENERATION_TAG in tags:
        return tags[GENERATION_TAG]
    if "dagster/backfill" in tags:
        return f"backfill-{tags['dagster/backfill']}"
    return f"recompute-{context.run.run_id[:8]}"


@dg.asset(
    key=TARGET_KEY,
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=SCENARIO.max_partitions_per_run),
    retry_policy=dg.RetryPolicy(max_retries=1),
    code_version="2.3.0",
    kinds={"duckdb"},
    group_name="example_pipeline",
    description="History recompute of analytics.transactions (code 2.3.0, the faulty backfill of the worked example).",
)
def transactions_history(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    writer = warehouse.writer(actor="transactions_history")
    writer.ensure()
    generation = _generation_for(context)
    simulated = context.run.tags.get(SIMULATED_TAG) == "true"
    try:
        pause = min(max(float(context.run.tags.get(PAUSE_TAG, "0")), 0.0), 10.0)
    except ValueError:
        pause = 0.0
    try:
        writer.register_generation(
            generation,
            "backfill",
            run_id=context.run.run_id,
            backfill_id=context.run.tags.get("dagster/backfill"),
            code_version="2.3.0",
        )
    except FencedGenerationError as err:  # contained: retrying would only be refused again
        raise dg.Failure(description=str(err), allow_retries=False) from err
    with writer.engine.transaction() as s:
        snapshot = s.scalar(
            f"SELECT coalesce(source_watermark, started_at) FROM {SCHEMA}.generations WHERE generation = ?",
            [generation],
        )
        s.execute("CREATE SCHEMA IF NOT EXISTS example")
        s.execute(
            "CREATE TABLE IF NOT EXISTS example.backfill_checkpoints (run_id VARCHAR, partition_key VARCHAR, "
            "state VARCHAR)"
        )
        checkpoint = dict(
            s.fetchall(
                "SELECT partition_key, state FROM example.backfill_checkpoints WHERE run_id = ?", [context.run.run_id]
            )
        )
    snapshot = snapshot or utcnow()
    todo = [date.fromisoformat(k) for k in context.partition_keys if checkpoint.get(k) != "done"]
    stage = stage_table(context.run.run_id)
    if todo:
        with writer.engine.transaction() as s:
            s.materialize(stage, stage_sql(todo, snapshot))
    done = 0
    for key in context.partition_keys:
        if checkpoint.get(key) == "done":
            continue
        partition = date.fromisoformat(key)
        at = (
            SCENARIO.backfill_writes + timedelta(seconds=10 * (partition - SCENARIO.first_day).days)
            if simulated
            else None
        )
        try:
            state = recompute_partition(
                writer,
                generation,
                partition,
                stage=stage,
                checkpoint=checkpoint,
                retry_number=context.retry_number,
                at=at,
                run_id=context.run.run_id,
            )
        except (WorkerLost, FencedGenerationError) as err:
            raise dg.Failure(description=str(err), allow_retries=False) from err
        except CatalogTimeout:
            _save_checkpoint(writer, context.run.run_id, checkpoint)
            raise
        checkpoint[key] = state
        done += 1
        _save_checkpoint(writer, context.run.run_id, checkpoint)
        time.sleep(pause)
    with writer.engine.transaction() as s:
        s.drop_relation(stage)
    return dg.MaterializeResult(metadata={"generation": generation, "partitions_written": done})


def _save_checkpoint(writer, run_id: str, checkpoint: dict[str, str]) -> None:
    with writer.engine.transaction() as s:
        s.execute("DELETE FROM example.backfill_checkpoints WHERE run_id = ?", [run_id])
        for k, v in checkpoint.items():
            s.execute("INSERT INTO example.backfill_checkpoints VALUES (?, ?, ?)", [run_id, k, v])


def example_definitions(spec: str | Path | None = None) -> dg.Definitions:
    """The worked example's own code location (``recovery.example.location``): the faulty history
    asset, its ingestion job and schedule, bound to the example's warehouse (``spec``, default the
    served one). The package's location (``recovery.definitions``) holds none of them."""
    return dg.Definitions(
        assets=[transactions_history],
        jobs=[ingest_transactions],
        schedules=[ingest_schedule],
        resources={"warehouse": warehouse_resource(str(spec or spec_path()))},
        # each run executes its steps in its own run process: one subprocess per step would only
        # add start-up time to the backfill's runs (the worked example's steps are DuckDB-bound)
        executor=dg.in_process_executor,
    )
