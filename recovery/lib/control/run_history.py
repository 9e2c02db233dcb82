"""What the orchestrator recorded about a generation's runs, in plain data.

Evidence and the timeline need the backfill's runs (ids, status, tags, configs,
step retries) and their raw event logs, but ``recovery/lib`` stays free of Dagster
so it can be tested without an instance. The Dagster adapter
(:mod:`recovery.dagster_history`) fills these records from a ``DagsterInstance``; any
other orchestrator could fill them too, and a generation written by another tool
simply has none (which evidence and the timeline then say).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from recovery.lib.control.plane import SCHEMA
from recovery.lib.engine.base import Session


@dataclass(frozen=True)
class RunEvent:
    """One event of a run's log worth a line in the timeline (run and step lifecycle, retries)."""

    at: datetime  # naive UTC, the orchestrator's wall clock
    run_id: str
    event_type: str  # e.g. RUN_START, RUN_FAILURE, STEP_UP_FOR_RETRY
    step_key: str | None
    message: str


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    job_name: str
    status: str
    created_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    tags: dict[str, str]
    run_config: dict
    generation: str | None  # which failed generation the run belongs to
    parent_run_id: str | None = None  # set when the run is a retry of another run
    events: tuple[RunEvent, ...] = ()
    event_log_lines: tuple[str, ...] = ()  # the whole raw log, one JSON document per line

    @property
    def partition_range(self) -> str | None:
        lo, hi = (
            self.tags.get("dagster/asset_partition_range_start"),
            self.tags.get("dagster/asset_partition_range_end"),
        )
        if lo and hi:
            return f"{lo}..{hi}"
        return self.tags.get("dagster/partition")


@dataclass(frozen=True)
class BackfillInfo:
    backfill_id: str
    generation: str | None
    status: str
    requested_at: datetime | None
    ended_at: datetime | None
    tags: dict[str, str]
    title: str | None
    description: str | None
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class RunHistory:
    """The runs and backfills of a set of generations; ``notes`` say what could not be found."""

    orchestrator: str
    backfills: tuple[BackfillInfo, ...] = ()
    runs: tuple[RunInfo, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def runs_of(self, generation: str) -> list[RunInfo]:
        return [r for r in self.runs if r.generation == generation]


@dataclass(frozen=True)
class GenerationRefs:
    """Where the control plane says a generation's runs can be found."""

    generation: str
    backfill_ids: tuple[str, ...]
    run_ids: tuple[str, ...]


def generation_refs(session: Session, generations: list[str]) -> list[GenerationRefs]:
    """Backfill ids and run ids the control plane recorded for each generation (registry and writes);
    none before containment, on a warehouse the package never wrote (read before ``contain``, as the
    runbook orders evidence: the runs are then found by the generations' own names and tags)."""
    if session.object_kind(SCHEMA, "generations") is None:
        return [GenerationRefs(g, (), ()) for g in generations]
    writes = (
        f"SELECT generation, run_id FROM {SCHEMA}.writes UNION "
        if session.object_kind(SCHEMA, "writes") is not None
        else ""
    )
    found = {
        g: (tuple(sorted(b or [])), tuple(sorted(r or [])))
        for g, b, r in session.fetchall(
            f"SELECT g.generation, list(DISTINCT g.backfill_id) FILTER (WHERE g.backfill_id IS NOT NULL), "
            f"list(DISTINCT x.run_id) FILTER (WHERE x.run_id IS NOT NULL) "
            f"FROM {SCHEMA}.generations g LEFT JOIN ({writes}SELECT generation, run_id FROM {SCHEMA}.generations) x "
            f"USING (generation) "
            f"WHERE g.generation IN (SELECT unnest(CAST(? AS VARCHAR[]))) GROUP BY 1",
            [list(generations)],
        )
    }
    return [GenerationRefs(g, *found.get(g, ((), ()))) for g in generations]
