"""The writers containment now refuses, named up front with the change that keeps each ingesting.

Once a target is contained its public name is a managed view, and DuckDB refuses to write
through a view: a team's asset that stores the table with dagster-duckdb's plain
``DuckDBIOManager`` (or any SQL ``INSERT``/``DELETE`` on it) fails with DuckDB's own "Binder
Error: Can only delete from base table", raised in the team's process before any code of
this package runs, so that message cannot be reworded where it happens. What can be done is
to say it first: the Dagster instance records every materialization of the target's asset,
and one not stored through ``ManagedDuckDBIOManager`` (whose outputs carry
``recovery/generation`` metadata) comes from a writer the fence now refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from recovery.lib.spec import DatasetSpec

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
