"""Read a generation's Dagster runs, backfills and event logs from the instance.

The only module that turns Dagster's run storage into :mod:`recovery.lib.run_history`
records, so evidence and the timeline stay Dagster-free. A generation's runs are
found three ways and united, because each alone can miss some: the backfill ids
the control plane holds (``generations.backfill_id``, tag ``dagster/backfill``),
the generation tag the launcher sets (``recovery/generation``), and the run ids
the writer recorded with each write. Runs that retry one of those (Dagster copies
the tags to a retry) are found by the same tags.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

import dagster as dg
from dagster._core.events import DagsterEventType

from recovery.lib.fencing import GENERATION_TAG
from recovery.lib.run_history import BackfillInfo, GenerationRefs, RunEvent, RunHistory, RunInfo, generation_refs

TIMELINE_EVENT_TYPES = {
    DagsterEventType.RUN_ENQUEUED,
    DagsterEventType.RUN_STARTING,
    DagsterEventType.RUN_START,
    DagsterEventType.RUN_SUCCESS,
    DagsterEventType.RUN_FAILURE,
    DagsterEventType.RUN_CANCELING,
    DagsterEventType.RUN_CANCELED,
    DagsterEventType.STEP_FAILURE,
    DagsterEventType.STEP_UP_FOR_RETRY,
    DagsterEventType.STEP_RESTARTED,
}


@overload
def _utc(ts: float) -> datetime: ...
@overload
def _utc(ts: float | None) -> datetime | None: ...
def _utc(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def _message(entry) -> str:
    event = entry.dagster_event
    data = getattr(event, "event_specific_data", None)
    error = getattr(data, "error", None) or entry.error_info
    text = entry.user_message or (event.message if event else "") or ""
    if error is not None and getattr(error, "message", None):
        text = f"{text} {error.message.strip().splitlines()[0]}".strip()
    return text[:300]


def _run_info(instance: dg.DagsterInstance, record, generation: str, *, with_logs: bool) -> RunInfo:
    run = record.dagster_run
    entries = instance.all_logs(run.run_id)
    events = tuple(
        RunEvent(_utc(e.timestamp), run.run_id, e.dagster_event.event_type.name, e.step_key, _message(e))
        for e in entries
        if e.dagster_event is not None and e.dagster_event.event_type in TIMELINE_EVENT_TYPES
    )
    lines = tuple(dg.serialize_value(e) for e in entries) if with_logs else ()
    return RunInfo(
        run_id=run.run_id,
        job_name=run.job_name,
        status=run.status.value,
        created_at=_utc(record.create_timestamp.timestamp()),
        started_at=_utc(record.start_time),
        ended_at=_utc(record.end_time),
        tags=dict(run.tags),
        run_config=dict(run.run_config or {}),
        generation=generation,
        parent_run_id=run.parent_run_id,
        events=events,
        event_log_lines=lines,
    )


def _backfill_partitions(backfill) -> tuple[str, ...]:
    if backfill.partition_names:
        return tuple(backfill.partition_names)
    data = backfill.asset_backfill_data
    if data is None:
        return ()
    return tuple(sorted({p.partition_key for p in data.target_subset.iterate_asset_partitions() if p.partition_key}))


def _backfill_info(instance: dg.DagsterInstance, backfill_id: str, generation: str) -> BackfillInfo | None:
    backfill = instance.get_backfill(backfill_id)
    if backfill is None:
        return None
    return BackfillInfo(
        backfill_id=backfill_id,
        generation=generation,
        status=backfill.status.value,
        requested_at=_utc(backfill.backfill_timestamp),
        ended_at=_utc(backfill.backfill_end_timestamp),
        tags=dict(backfill.tags or {}),
        title=backfill.title,
        description=backfill.description,
        partitions=_backfill_partitions(backfill),
    )


def collect_run_history(
    instance: dg.DagsterInstance, refs: list[GenerationRefs], *, with_logs: bool = False
) -> RunHistory:
    """The runs and backfills of each generation in ``refs``; notes name generations with none."""
    runs: dict[str, RunInfo] = {}
    backfills: dict[str, BackfillInfo] = {}
    notes: list[str] = []
    for ref in refs:
        records = {}
        filters = [dg.RunsFilter(tags={"dagster/backfill": b}) for b in ref.backfill_ids]
        filters.append(dg.RunsFilter(tags={GENERATION_TAG: ref.generation}))
        if ref.run_ids:
            filters.append(dg.RunsFilter(run_ids=list(ref.run_ids)))
        for f in filters:
            for record in instance.get_run_records(filters=f):
                records[record.dagster_run.run_id] = record
        backfill_ids = set(ref.backfill_ids) | {
            r.dagster_run.tags["dagster/backfill"] for r in records.values() if "dagster/backfill" in r.dagster_run.tags
        }
        for b in sorted(backfill_ids):
            info = _backfill_info(instance, b, ref.generation)
            if info is None:
                notes.append(f"generation {ref.generation}: backfill {b} is not in this Dagster instance")
            else:
                backfills[b] = info
        for run_id, record in records.items():
            runs.setdefault(run_id, _run_info(instance, record, ref.generation, with_logs=with_logs))
        if not records:
            notes.append(
                f"generation {ref.generation}: no Dagster runs found in this instance "
                f"(written by another tool, or by runs recorded elsewhere)"
            )
    ordered = tuple(sorted(runs.values(), key=lambda r: (r.created_at or datetime.min, r.run_id)))
    return RunHistory("dagster", tuple(backfills.values()), ordered, tuple(notes))


def run_history_for(
    instance: dg.DagsterInstance, engine, generations: list[str], *, with_logs: bool = False
) -> RunHistory:
    """The failed generations' run history, looked up from what the control plane recorded (read-only)."""
    with engine.session(read_only=True) as s:
        refs = generation_refs(s, generations)
    return collect_run_history(instance, refs, with_logs=with_logs)
