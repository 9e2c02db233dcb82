"""Containment of a lakehouse table: the fence recorded on the table itself, and the version it pins.

The fence is a table property (``recovery.fenced_generations``) set by one commit: on
Delta a metadata commit, which makes any writer's concurrent optimistic commit conflict;
on Iceberg a table-metadata update. The package's writers (its IO managers) read it
before every write and refuse a fenced generation. The version at the fence is recorded
in the control plane first, then the history is synced: every commit up to it is the
damaged generation's history, every commit after it is judged by who wrote it
(``history.py``). Idempotent: a second containment of the incident finds its fence.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib import faults
from recovery.lib.control.plane import EventSource, utcnow
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.lakehouse.formats import TableLog, open_log
from recovery.lib.lakehouse.history import FENCES, TABLES, SyncResult, ensure_tables, sync
from recovery.lib.retry import retrying

FENCE_PROPERTY = "recovery.fenced_generations"
INCIDENT_PROPERTY = "recovery.fenced_by"


@dataclass(frozen=True)
class TableFence:
    location: str
    version: int | None
    fenced_now: bool
    generations: tuple[str, ...]
    synced: tuple[SyncResult, ...] = ()

    def line(self) -> str:
        verb = "fenced on the table" if self.fenced_now else "already fenced on the table"
        return (
            f"{self.location}: {', '.join(self.generations)} {verb} (property {FENCE_PROPERTY}, version "
            f"{self.version}); commits after it by writers outside the package are reported and kept out of the repair"
        )


def fenced_generations(properties: dict[str, str]) -> set[str]:
    """The generations a table's fence property names."""
    return {g for g in properties.get(FENCE_PROPERTY, "").split(",") if g}


def _fence_commit(log: TableLog, after: int | None, incident_id: str) -> int | None:
    """The version of the commit that set this incident's fence on the table after version ``after``
    (Delta: a metadata commit carrying the properties); None when none did (Iceberg: a property update is
    no snapshot)."""
    for c in reversed(log.commits(after=after)):
        if c.properties.get(INCIDENT_PROPERTY) == incident_id and c.properties.get(FENCE_PROPERTY):
            return c.version
    return None


def fence_table(
    engine: Engine, spec: DatasetSpec, incident_id: str, generations: list[str], *, actor: str
) -> TableFence:
    lake = spec.target.lakehouse
    assert lake is not None  # called for a lakehouse target only
    log = open_log(lake)
    props = log.properties()
    on_table = fenced_generations(props)
    with engine.transaction() as s:
        ensure_tables(s)
        found = s.fetchone(
            f"SELECT version FROM {FENCES} WHERE dataset = ? AND incident_id = ?", [spec.dataset, incident_id]
        )
        synced = s.scalar(f"SELECT version FROM {TABLES} WHERE dataset = ? AND role = 'target'", [spec.dataset])
    if found is not None and set(generations) <= on_table:
        return TableFence(lake.location, found[0], False, tuple(generations), tuple(sync(engine, spec)))
    version = None
    if found is None and set(generations) <= on_table and props.get(INCIDENT_PROPERTY) == incident_id:
        # a containment killed after the table's fence commit, before its record: that commit is the fence.
        # (Syncing first would judge the commits after it the damaged history, and fencing again would pin
        # a later version: a writer's commit in between would count as history, not as after the fence.)
        version = _fence_commit(log, synced, incident_id)
    if version is None:
        sync(engine, spec)  # every commit before the fence recorded as the damaged generation's history
        names = sorted(on_table | set(generations))
        version = log.set_properties({FENCE_PROPERTY: ",".join(names), INCIDENT_PROPERTY: incident_id})
        faults.checkpoint("lake_fence:table_fenced")  # the table fenced, the control plane not told yet

    def txn() -> None:
        with engine.transaction() as s:
            ensure_tables(s)
            s.execute(
                f"INSERT INTO {FENCES} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    spec.dataset,
                    incident_id,
                    lake.location,
                    version,
                    str(version),
                    utcnow(),
                    generations,
                    FENCE_PROPERTY,
                ],
            )
            EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor).record(
                s,
                "lakehouse_fence",
                f"{lake.location}: {', '.join(generations)} fenced on the table (property {FENCE_PROPERTY}) "
                f"at version {version}; the damaged generation is pinned at that version",
            )
            faults.checkpoint("lake_fence:recorded")  # the fence row and its event, not committed

    if found is None:
        retrying(txn)
    faults.checkpoint("lake_fence:committed")  # the fence commit itself not synced yet
    return TableFence(lake.location, version, True, tuple(generations), tuple(sync(engine, spec)))
