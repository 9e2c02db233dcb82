"""The writers containment now refuses, named up front with the change that keeps each ingesting.

Once a target is contained its public name is a managed view, and DuckDB refuses to write
through a view: a team's asset that stores the table with dagster-duckdb's plain
``DuckDBIOManager`` (or any SQL ``INSERT``/``DELETE`` on it) fails with DuckDB's own "Binder
Error: Can only delete from base table", raised in the team's process before any code of
this package runs, so that message cannot be reworded where it happens. What can be done is
to say it first: the Dagster instance records every materialization of the target's asset,
and one not stored through ``ManagedDuckDBIOManager`` (whose outputs carry
``recovery/generation`` metadata) comes from a writer the fence now refuses. And afterwards:
the fencing sensor finds such a failed run and tags it with one sentence (the run page
shows it), puts it on the incident's timeline and alerts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg
from dagster._core.events import DagsterEventType

from recovery.lib.dataset_spec.models import DatasetSpec

MANAGED_METADATA = "recovery/generation"
RECENT = 200  # materializations looked at: the writers active lately


@dataclass(frozen=True)
class RefusedWriter:
    asset: str
    job: str
    location: str | None
    last_run: str

    def sentence(self, spec: DatasetSpec, spec_path: str) -> str:
        where = f"job {self.job}" + (f" of code location {self.location}" if self.location else "")
        return (
            f"asset {self.asset} ({where}, last run {self.last_run}) writes {spec.target.table} directly: its next "
            f"write fails (DuckDB cannot write through the managed view: 'Can only delete from base table'); to keep "
            f"ingesting, store it with io_manager=ManagedDuckDBIOManager(database={str(spec.warehouse.path)!r}, "
            f"specs=[{spec_path!r}])"
        )


def refused_writers(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> list[RefusedWriter]:
    """The jobs whose recent materializations of ``asset_key`` did not go through the package's IO manager."""
    found: dict[str, RefusedWriter] = {}  # by job: the same job run in process has no code location
    page = instance.fetch_materializations(asset_key, limit=RECENT, ascending=False)
    for record in page.records:
        materialization = record.asset_materialization
        if materialization is None or MANAGED_METADATA in (materialization.metadata or {}):
            continue
        run = instance.get_run_by_id(record.run_id)
        if run is None:
            continue
        origin = run.remote_job_origin
        location = origin.location_name if origin is not None else None
        seen = found.get(run.job_name)
        if seen is None or (seen.location is None and location is not None):
            found[run.job_name] = RefusedWriter(
                asset_key.to_user_string(), run.job_name, location or (seen.location if seen else None), run.run_id
            )
    return list(found.values())


REFUSED_TAG = "recovery/refused_write"
"""The tag a failed run of a refused writer gets: the sentence its run page shows."""
VIEW_WRITE_ERRORS = ("Can only delete from base table", "Can only insert into base table", "Can only update base table")
RECENT_FAILURES = 50


def refusal_sentence(table: str, incident_id: str | None, spec: DatasetSpec, spec_path: str) -> str:
    return (
        f"{table} is contained (incident {incident_id or 'unknown'}) and managed by backfill-recovery: it is a view "
        f"now, so this run's write was refused and nothing was written; to keep ingesting, store the asset with "
        f"io_manager=ManagedDuckDBIOManager(database={str(spec.warehouse.path)!r}, specs=[{spec_path!r}])"
    )


def refused_runs(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, since: datetime
) -> list[tuple[dg.DagsterRun, str]]:
    """Runs of ``asset_key`` that failed after ``since`` on DuckDB's refusal to write through the
    managed view, not yet tagged: (run, the error's first line)."""
    found = []
    records = instance.get_run_records(
        dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=since.replace(tzinfo=UTC)),
        limit=RECENT_FAILURES,
    )
    for record in records:
        run = record.dagster_run
        if REFUSED_TAG in run.tags or asset_key not in (run.asset_selection or set()):
            continue
        for entry in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_FAILURE):
            data = entry.dagster_event.step_failure_data if entry.dagster_event else None
            text = str(data.error.to_string()) if data and data.error else ""
            said = next((e for e in VIEW_WRITE_ERRORS if e in text), None)
            if said:
                found.append((run, said))
                break
    return found
