"""Stopping a fenced generation's Dagster work through Dagster's own instance APIs.

Cancellation here is advisory (a terminated run can still finish its step, a
retry policy can fire after a terminate; see shared/RELIABILITY.md): the fence in
the warehouse is what guarantees that nothing lands. These calls stop wasting
work and make the UI tell the truth:

- a backfill is cancelled the way the UI's "Cancel backfill" does it (GraphQL
  ``cancelPartitionBackfill`` sets status CANCELING; the daemon then cancels the
  runs it submitted and marks it CANCELED), which also stops it submitting more;
- a QUEUED run is cancelled from the queue and a STARTING/STARTED run terminated,
  both through ``run_coordinator.cancel_run`` (what the daemon does for backfills);
- run-level retries are stripped by tags the auto-reexecution daemon reads
  (``dagster/max_retries=0``, ``dagster/retry_on_asset_or_op_failure=false``,
  ``dagster/will_retry=false``), on every run of the generation, finished or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES, BulkActionsFilter, BulkActionStatus
from dagster._core.storage.tags import (
    BACKFILL_ID_TAG,
    MAX_RETRIES_TAG,
    RETRY_ON_ASSET_OR_OP_FAILURE_TAG,
    WILL_RETRY_TAG,
)

from recovery.dagster_history import RUN_STAMP, backfill_named
from recovery.lib.write.fencing import GENERATION_TAG

STOPPABLE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
NO_RETRY_TAGS = {MAX_RETRIES_TAG: "0", RETRY_ON_ASSET_OR_OP_FAILURE_TAG: "false", WILL_RETRY_TAG: "false"}


@dataclass(frozen=True)
class StoppedRun:
    run_id: str
    status_before: str
    action: str  # "canceled from the queue" | "terminated" | "termination requested, not confirmed: ..."
    backfill_id: str | None


def backfills_of(instance: dg.DagsterInstance, generation: str, known_backfill_id: str | None) -> list[str]:
    """Backfills that produced the generation: the registered one, the one the generation names
    (its id, ``backfill-<id>``, a run of it: ``backfill_named``), those tagged with the generation,
    and those its runs belong to."""
    ids = {known_backfill_id} if known_backfill_id else set()
    named = backfill_named(instance, generation)
    if named:
        ids.add(named)
    ids |= {b.backfill_id for b in instance.get_backfills(filters=BulkActionsFilter(tags={GENERATION_TAG: generation}))}
    for run in instance.get_runs(dg.RunsFilter(tags={GENERATION_TAG: generation})):
        if run.tags.get(BACKFILL_ID_TAG):
            ids.add(run.tags[BACKFILL_ID_TAG])
    return sorted(i for i in ids if instance.get_backfill(i) is not None)


def runs_of(
    instance: dg.DagsterInstance,
    generation: str,
    backfill_ids: list[str],
    statuses: list[dg.DagsterRunStatus] | None = None,
) -> list[dg.RunRecord]:
    """Runs tagged with the generation or belonging to one of its backfills, oldest first."""
    found: dict[str, dg.RunRecord] = {}
    filters = [dg.RunsFilter(tags={GENERATION_TAG: generation}, statuses=statuses or [])]
    run_id = generation.removeprefix(RUN_STAMP)
    if instance.get_run_by_id(run_id) is not None:  # the generation is the run's own id (or its run-<id>)
        filters.append(dg.RunsFilter(run_ids=[run_id], statuses=statuses or []))
    filters += [dg.RunsFilter(tags={BACKFILL_ID_TAG: b}, statuses=statuses or []) for b in backfill_ids]
    for f in filters:
        for record in instance.get_run_records(f, ascending=True):
            found.setdefault(record.dagster_run.run_id, record)
    return sorted(found.values(), key=lambda r: r.create_timestamp)


def live_backfill_status(instance: dg.DagsterInstance, backfill_id: str) -> str | None:
    """The status of a backfill still live (one a cancel would change), None when it is gone, cancelling or finished."""
    backfill = instance.get_backfill(backfill_id)
    if (
        backfill is None
        or backfill.status in BULK_ACTION_TERMINAL_STATUSES
        or backfill.status in (BulkActionStatus.CANCELING, BulkActionStatus.FAILING)
    ):
        return None
    return backfill.status.value


def cancel_backfill(instance: dg.DagsterInstance, backfill_id: str) -> str | None:
    """Move a live backfill to CANCELING, as the UI's cancel does. Returns the status it had,
    or None when it was already cancelling or finished (nothing changed)."""
    before = live_backfill_status(instance, backfill_id)
    backfill = instance.get_backfill(backfill_id)
    if before is None or backfill is None:
        return None
    instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELING))
    return before


def strip_retries(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> list[str]:
    """Tag runs so the auto-reexecution daemon never retries them. Returns the runs changed."""
    changed = []
    for run in runs:
        if any(run.tags.get(k) != v for k, v in NO_RETRY_TAGS.items()):
            instance.add_run_tags(run.run_id, NO_RETRY_TAGS)
            changed.append(run.run_id)
    return changed


def stop_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> StoppedRun:
    """Cancel a queued run or terminate a launched one (the coordinator picks which)."""
    try:
        confirmed = instance.run_coordinator.cancel_run(run.run_id)
        action = (
            ("canceled from the queue" if run.status == dg.DagsterRunStatus.QUEUED else "terminated")
            if confirmed
            else "termination requested, not confirmed by the run worker"
        )
    except Exception as err:  # the code server may be gone; run monitoring finishes the job
        action = f"termination requested, not confirmed: {type(err).__name__}: {err}"
    return StoppedRun(run.run_id, run.status.value, action, run.tags.get(BACKFILL_ID_TAG))
