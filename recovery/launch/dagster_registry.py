"""A run registry from the Dagster instance, for targets a team's own Dagster assets wrote.

A target whose rows carry the Dagster run id that wrote them (a ``_run_id`` column the
asset stamps from ``context.run.run_id``) has its run registry already: the instance
knows every run that materialized the asset, when each started and ended, and which of
them belong to a backfill (the ``dagster/backfill`` tag). This module resolves a failed
Dagster backfill id to its runs (the incident's failed generations) and writes those
runs, with the other runs of the asset, as a registry table the spec's ``registry``
section names. Dagster does not know what a run read: each run is assumed to read the
source as it was when it started (what an incremental load does), and the table says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from recovery.dagster_history import backfill_incident
from recovery.lib import faults
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import TableName, quote
from recovery.lib.retry import retrying
from recovery.lib.snapshot import str_list

BACKFILL_TAG = "dagster/backfill"
WATERMARK_BASIS = "run start (Dagster does not record what a run read)"


@dataclass(frozen=True)
class DagsterRun:
    run_id: str
    kind: str  # backfill | ingest
    backfill_id: str | None
    status: str
    started_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True)
class DagsterRegistry:
    backfill_id: str
    failed_generations: tuple[str, ...]  # the backfill's runs whose id the target's rows carry
    runs: tuple[DagsterRun, ...]
    table: str
    rows_of_backfill: int

    def spec_section(self) -> dict:
        """The spec's ``registry`` section that reads this table."""
        return {
            "table": self.table,
            "generation": "generation",
            "kind": "kind",
            "started_at": "started_at",
            "ended_at": "ended_at",
            "source_watermark": "source_watermark",
            "backfill_kinds": ["backfill"],
            "backfill_id": "backfill_id",
        }


def _utc(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def _run(record) -> DagsterRun:
    run = record.dagster_run
    backfill = run.tags.get(BACKFILL_TAG)
    return DagsterRun(
        run.run_id,
        "backfill" if backfill else "ingest",
        backfill,
        run.status.value,
        _utc(record.start_time),
        _utc(record.end_time),
    )


def runs_of_asset(instance: dg.DagsterInstance, asset: dg.AssetKey, backfill_id: str) -> list[DagsterRun]:
    """The backfill's runs (failed ones included: they may have written before failing) and every
    other run that materialized ``asset``."""
    backfill = instance.get_run_records(dg.RunsFilter(tags={BACKFILL_TAG: backfill_id}))
    if not backfill:
        raise RecoveryError(
            f"no run of Dagster backfill {backfill_id!r} is in the Dagster instance at {instance.root_directory}. "
            f"Fix: set DAGSTER_HOME to the instance that ran the backfill, and give its id as the UI shows it"
        )
    ids: set[str] = set()
    cursor: str | None = None
    while True:
        page = instance.fetch_materializations(asset, limit=1000, cursor=cursor)
        ids.update(r.run_id for r in page.records)
        if not page.has_more:
            break
        cursor = page.cursor
    ids -= {r.dagster_run.run_id for r in backfill}
    others = instance.get_run_records(dg.RunsFilter(run_ids=sorted(ids))) if ids else []
    return sorted((_run(r) for r in [*backfill, *others]), key=lambda r: (r.started_at or datetime.min, r.run_id))


def write_registry(spec: DatasetSpec, runs: list[DagsterRun], backfill_id: str, table: str) -> DagsterRegistry:
    """Write the runs as ``table`` (replaced whole, in one transaction) and count the rows the
    backfill's runs wrote (``failed_generations``: the run ids the target's generation column holds;
    the incident names every run of the backfill, see ``draft_incident``)."""
    try:
        name = TableName.parse(table)
    except ValueError as err:
        raise RecoveryError(f"--table {table!r}: {err}. Fix: give schema.table, e.g. ops.dagster_runs") from err
    mine = [r.run_id for r in runs if r.backfill_id == backfill_id]
    gen = quote(spec.target.metadata.generation)
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        rows = s.scalar(
            f"SELECT count(*) FROM {spec.target.table_name.sql()} WHERE CAST({gen} AS VARCHAR) IN ({str_list(mine)})"
        )
        carried = [
            r[0]
            for r in s.fetchall(
                f"SELECT DISTINCT CAST({gen} AS VARCHAR) FROM {spec.target.table_name.sql()} "
                f"WHERE CAST({gen} AS VARCHAR) IN ({str_list(mine)}) ORDER BY 1"
            )
        ]
    if not rows and not _managed_rows(engine, spec, backfill_id):
        raise RecoveryError(
            f"no row of {spec.target.table} carries a run id of Dagster backfill {backfill_id!r} in its "
            f"{spec.target.metadata.generation} column ({len(mine)} runs). Fix: a registry from Dagster fits a "
            "target whose "
            "generation column holds the run id that wrote each row; otherwise name the backfill's generation in "
            "the incident"
        )

    def txn() -> None:
        with engine.transaction() as s:
            s.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(name.schema)}")
            s.execute(
                f"CREATE OR REPLACE TABLE {name.sql()} (generation VARCHAR, kind VARCHAR, backfill_id VARCHAR, "
                f"status VARCHAR, started_at TIMESTAMP, ended_at TIMESTAMP, source_watermark TIMESTAMP, "
                f"watermark_basis VARCHAR)"
            )
            for r in runs:
                s.execute(
                    f"INSERT INTO {name.sql()} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        r.run_id,
                        r.kind,
                        r.backfill_id,
                        r.status,
                        r.started_at,
                        r.ended_at,
                        r.started_at,
                        WATERMARK_BASIS,
                    ],
                )
            faults.checkpoint("registry:recorded")  # the registry table replaced, not committed

    retrying(txn)
    faults.checkpoint("registry:committed")
    return DagsterRegistry(backfill_id, tuple(carried), tuple(runs), str(name), int(rows))


def _managed_rows(engine, spec: DatasetSpec, backfill_id: str) -> int:
    """Rows the backfill wrote through the package's IO manager (stamped ``backfill-<id>``)."""
    gen = quote(spec.target.metadata.generation)
    with engine.session(read_only=True) as s:
        return int(
            s.scalar(
                f"SELECT count(*) FROM {spec.target.table_name.sql()} WHERE CAST({gen} AS VARCHAR) = ?",
                [f"backfill-{backfill_id}"],
            )
        )


def asset_key_of(spec: DatasetSpec, asset: str | None) -> dg.AssetKey:
    """``--asset a/b`` as given, else the target table's parts (``mart.orders`` -> ``mart/orders``)."""
    text = asset or str(spec.target.table_name).replace(".", "/")
    return dg.AssetKey([p for p in text.split("/") if p])


def registry_from_dagster(
    spec: DatasetSpec,
    backfill_id: str,
    *,
    table: str,
    asset: str | None = None,
    instance: dg.DagsterInstance | None = None,
) -> DagsterRegistry:
    if instance is None:
        with dg.DagsterInstance.get() as inst:
            return registry_from_dagster(spec, backfill_id, table=table, asset=asset, instance=inst)
    runs = runs_of_asset(instance, asset_key_of(spec, asset), backfill_id)
    return write_registry(spec, runs, backfill_id, table)


def draft_incident(
    instance: dg.DagsterInstance, reg: DagsterRegistry, spec_file: Path, incident_id: str, requested_by: str
) -> dict:
    """The incident file for the backfill, as the draft-incident sensor writes it: the backfill
    resolved to one subject (every run of it, the ones that wrote nothing too; its partition
    range), approvals left to a person."""
    incident = backfill_incident(
        instance, spec_file, reg.backfill_id, incident_id=incident_id, requested_by=requested_by
    )
    doc = {
        "incident_id": incident_id,
        "spec": str(spec_file.resolve()),
        "dagster_backfill": reg.backfill_id,
        "failed_generations": list(incident.failed_generations),
        "partitions": incident.partitions.model_dump() if incident.partitions else None,
        "requested_by": requested_by,
        "approved_by": [],
        "notes": f"failed generations resolved from Dagster backfill {reg.backfill_id} ({len(reg.runs)} runs in "
        f"{reg.table})",
    }
    return {k: v for k, v in doc.items() if v is not None}
