"""Read a generation's Dagster runs, backfills and event logs from the instance.

The only module that turns Dagster's run storage into :mod:`recovery.lib.control.run_history`
records, so evidence and the timeline stay Dagster-free. A generation's runs are
found three ways and united, because each alone can miss some: the backfill ids
the control plane holds (``generations.backfill_id``, tag ``dagster/backfill``),
the generation tag the launcher sets (``recovery/generation``), and the run ids
the writer recorded with each write. Runs that retry one of those (Dagster copies
the tags to a retry) are found by the same tags.

It also resolves a failed Dagster backfill to one incident subject (``resolve_backfill``):
whatever the incident calls it (its id, ``backfill-<id>``, one of its runs), every phase,
the draft-incident sensor and ``recovery registry dagster`` see the same generations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import overload

import dagster as dg
from dagster._core.events import DagsterEventType

from recovery.lib.control.run_history import (
    BackfillInfo,
    GenerationRefs,
    RunEvent,
    RunHistory,
    RunInfo,
    generation_refs,
)
from recovery.lib.control.write_registry import backfill_generations
from recovery.lib.engine import open_engine
from recovery.lib.incident.draft import partition_range
from recovery.lib.incident.model import Incident
from recovery.lib.write.fencing import GENERATION_TAG

BACKFILL_TAG = "dagster/backfill"
BACKFILL_STAMP = "backfill-"  # the IO manager's generation for every run of a backfill
RUN_STAMP = "run-"  # ...and for a run outside any backfill

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
        # a generation may be one of a Dagster backfill's names (a run id the rows carry, backfill-<id>)
        named = backfill_named(instance, ref.generation)
        own_ids = list(ref.backfill_ids) + ([named] if named and named not in ref.backfill_ids else [])
        filters = [dg.RunsFilter(tags={"dagster/backfill": b}) for b in own_ids]
        filters.append(dg.RunsFilter(tags={GENERATION_TAG: ref.generation}))
        run_ids = {
            *ref.run_ids,
            *(g for g in (ref.generation, ref.generation.removeprefix(RUN_STAMP)) if _looks_like_run_id(g)),
        }
        if run_ids:
            filters.append(dg.RunsFilter(run_ids=sorted(run_ids)))
        for f in filters:
            for record in instance.get_run_records(filters=f):
                records[record.dagster_run.run_id] = record
        backfill_ids = set(own_ids) | {
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


@dataclass(frozen=True)
class BackfillSubject:
    """A failed Dagster backfill as one incident subject: its runs and the stamps its rows may carry."""

    backfill_id: str
    run_ids: tuple[str, ...]  # every run of it, finished, failed, queued: oldest first
    partitions: tuple[str, ...]  # the partitions it targeted
    status: str | None  # None when only its runs are left in the instance
    tagged: tuple[str, ...] = ()  # a launcher-named generation (``recovery/generation``) its runs write as

    @property
    def stamp(self) -> str:
        return f"{BACKFILL_STAMP}{self.backfill_id}"


def backfill_named(instance: dg.DagsterInstance, name: str) -> str | None:
    """The Dagster backfill ``name`` means: its id, its IO-manager stamp ``backfill-<id>``, the id of
    one of its runs, or that run's ``run-<id>`` stamp. None when it names none."""
    for candidate in (name, name.removeprefix(BACKFILL_STAMP)):
        if instance.get_backfill(candidate) is not None:
            return candidate
    for candidate in (name, name.removeprefix(RUN_STAMP)):
        run = instance.get_run_by_id(candidate) if _looks_like_run_id(candidate) else None
        if run is not None and run.tags.get(BACKFILL_TAG):
            return run.tags[BACKFILL_TAG]
    if name.startswith(BACKFILL_STAMP) and instance.get_run_ids(
        dg.RunsFilter(tags={BACKFILL_TAG: name.removeprefix(BACKFILL_STAMP)}), limit=1
    ):
        return name.removeprefix(BACKFILL_STAMP)  # the backfill record was deleted; its runs are left
    return None


def _looks_like_run_id(text: str) -> bool:
    return len(text) == 36 and text.count("-") == 4


def backfill_subject(instance: dg.DagsterInstance, backfill_id: str) -> BackfillSubject:
    records = instance.get_run_records(dg.RunsFilter(tags={BACKFILL_TAG: backfill_id}), ascending=True)
    backfill = instance.get_backfill(backfill_id)
    parts: tuple[str, ...] = ()
    if backfill is not None:
        parts = _backfill_partitions(backfill)
    if not parts:  # from the runs' own partition tags
        keys = set()
        for r in records:
            run_tags = r.dagster_run.tags
            if run_tags.get("dagster/partition"):
                keys.add(run_tags["dagster/partition"])
            lo = run_tags.get("dagster/asset_partition_range_start")
            hi = run_tags.get("dagster/asset_partition_range_end")
            keys |= {k for k in (lo, hi) if k}
        parts = tuple(sorted(keys))
    tags: list[Mapping[str, str]] = [dict(backfill.tags or {})] if backfill is not None else []
    tags += [r.dagster_run.tags for r in records]
    return BackfillSubject(
        backfill_id,
        tuple(r.dagster_run.run_id for r in records),
        parts,
        backfill.status.value if backfill is not None else None,
        tuple(sorted({t[GENERATION_TAG] for t in tags if t.get(GENERATION_TAG)})),
    )


def resolve_backfill(instance: dg.DagsterInstance, incident: Incident) -> Incident:
    """The incident with a failed Dagster backfill resolved to one subject.

    When the incident names a backfill (``dagster_backfill``) or any generation that Dagster
    knows as one of a backfill's names (its id, ``backfill-<id>``, a run of it, ``run-<id>``),
    the failed generations become every stamp the backfill's rows may carry: each run's id
    (also the runs that wrote nothing, such as one that deleted a partition and died), the
    generations the warehouse records for the backfill (a team's own load ids), and the IO
    manager's ``backfill-<id>``, fenced so that no later run of it writes. A backfill launched
    with a ``recovery/generation`` tag writes as that generation only (every run, the IO
    manager's included), so that generation is its one stamp. A missing partition range is the
    backfill's own. An incident naming no backfill is returned as it is.
    """
    named = [incident.dagster_backfill] if incident.dagster_backfill else []
    named += [b for b in (backfill_named(instance, g) for g in incident.failed_generations) if b]
    ids = list(dict.fromkeys(named))
    if not ids:
        return incident
    spec = incident.load_spec(check_warehouse=False)
    generations = list(incident.failed_generations)
    subject: list[str] = []
    aliases: list[str] = []
    partitions: list[str] = []
    for backfill_id in ids:
        found = backfill_subject(instance, backfill_id)
        with open_engine(spec.warehouse).session(read_only=True) as s:
            recorded = backfill_generations(s, spec, backfill_id) if spec.warehouse.path.exists() else []
        subject += list(found.tagged) if found.tagged else [*found.run_ids, *recorded, found.stamp]
        aliases += [] if found.tagged else [found.stamp]
        partitions += found.partitions
    subject = list(dict.fromkeys(subject))
    generations += [g for g in subject if g not in generations]
    update: dict = {
        "failed_generations": generations,
        "dagster_backfill": incident.dagster_backfill or ids[0],
        "subject_generations": tuple(subject),
        "fence_aliases": tuple(aliases),
    }
    if incident.partitions is None and partitions:
        days = partition_range(partitions)  # a daily backfill's range as dates, else its first and last key
        update["partitions"] = (
            {"start": days[0], "end": days[1]} if days else {"start": min(partitions), "end": max(partitions)}
        )
    return Incident.model_validate({**incident.model_dump(), **update}).model_copy(
        update={k: v for k, v in update.items() if k in ("subject_generations", "fence_aliases")}
        | {"incident_path": incident.incident_path, "spec": incident.spec}
    )


def backfill_incident(
    instance: dg.DagsterInstance, spec_path: str | Path, backfill_id: str, *, incident_id: str, requested_by: str
) -> Incident:
    """The incident a failed Dagster backfill opens, resolved (``resolve_backfill``): what the
    draft-incident sensor and ``recovery registry dagster`` both write."""
    skeleton = Incident(
        incident_id=incident_id,
        spec=Path(spec_path).resolve(),
        dagster_backfill=backfill_id,
        requested_by=requested_by,
    )
    return resolve_backfill(instance, skeleton)
