"""Publishing a repair onto the lakehouse table: one commit, after every gate, conditioned on the version.

The warehouse file's publish (``recovery.lib.repair.publish``) has moved the pointer once
every gate passed. This writes the same rows onto the table the consumers read, as ONE
commit: an overwrite of the partitions the repair plan covers in which the published
generation differs from the table (Delta: an overwrite with a predicate; Iceberg: one
catalog commit of a delete and an append snapshot), read at the version just synced. A
commit that lands meanwhile makes it conflict (Delta's conflict check, Iceberg's
snapshot-id requirement): the history is synced again (the package's own writers'
commits are replayed into the published generation) and the commit is retried.

A commit by a writer outside the package after the fence, in a partition this commit
would overwrite, stops it: overwriting would drop that writer's rows, and including them
would publish rows no gate saw. Its other partitions are left as they are. A publish
killed after its commit is found on the rerun by the commit's own property
(``recovery.incident``), so it is never committed twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import GateRefusedError, RecoveryError
from recovery.lib.identifiers import quote, str_list
from recovery.lib.lakehouse.formats import open_log
from recovery.lib.lakehouse.history import (
    COMMITS,
    GENERATION_PROPERTY,
    INCIDENT_PROPERTY,
    WRITER_PROPERTY,
    sync,
)
from recovery.lib.lakehouse.relations import duckdb_columns, files_sql
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.retry import retrying

ATTEMPTS = 5


@dataclass(frozen=True)
class TablePublish:
    location: str
    version: int | None
    partitions: tuple[str, ...]
    rows: int
    already: bool

    def line(self) -> str:
        if self.already:
            return f"{self.location}: already published at version {self.version}; nothing to do"
        if not self.partitions:
            return f"{self.location}: the table already holds the published rows; no commit needed"
        return (
            f"{self.location}: published as one commit, version {self.version} ({len(self.partitions)} partitions "
            f"overwritten, {self.rows:,} rows), equal to the published generation"
        )


def _digest_sql(relation: str, columns: list[str], partition: str) -> str:
    cols = ", ".join(quote(c) for c in columns)
    part = quote(partition)
    return f"SELECT CAST({part} AS VARCHAR) AS p, count(*) AS n, sum(hash({cols})) AS h FROM {relation} GROUP BY 1"


def refuse_foreign_changes(s, spec: DatasetSpec, from_namespace: str, partitions: list[str]) -> None:
    """Refuse (``GateRefusedError``) when a commit after the fence by a writer outside the package (or a
    fenced generation) changed one of ``partitions`` and its change is still there: the table's rows there
    (``__lh_head``) differ from what the package's own history holds (``from_namespace``). A foreign commit
    undone since (a restore) no longer blocks."""
    lake = spec.target.lakehouse
    assert lake is not None
    touched = s.fetchall(
        f"SELECT version, coalesce(generation, 'unknown'), status, list_intersect(partitions, ?) FROM {COMMITS} "
        f"WHERE dataset = ? AND status IN ('foreign', 'fenced') AND len(list_intersect(partitions, ?)) > 0 "
        f"ORDER BY version",
        [partitions, spec.dataset, partitions],
    )
    if not touched:
        return
    columns = [c for c, _ in s.columns("__lh_head")]
    parts = sorted({p for row in touched for p in row[3]})
    still = {
        r[0]
        for r in s.fetchall(
            "SELECT coalesce(a.p, b.p) FROM "
            f"({_digest_sql(namespace_sql(from_namespace), columns, spec.target.partition)}) a "
            f"FULL JOIN ({_digest_sql('__lh_head', columns, spec.target.partition)}) b USING (p) "
            f"WHERE coalesce(a.p, b.p) IN ({str_list(parts)}) AND (a.n, a.h) IS DISTINCT FROM (b.n, b.h)"
        )
    }
    for v, gen, status, hit in touched:
        present = [p for p in hit if p in still]
        if present:
            raise GateRefusedError(
                f"publish onto {lake.location} refused: version {v} (generation {gen}, "
                f"{'a fenced generation' if status == 'fenced' else 'a writer outside the package'}) changed partition "
                f"{present[0]} after the fence and the change is still there; overwriting it would drop that "
                f"writer's rows. Review the commit, restore it or re-apply it through the package's writer, then "
                f"run publish again"
            )


def check_publishable(engine: Engine, spec: DatasetSpec, from_namespace: str, scope: list[str]) -> None:
    """Before the warehouse's pointer moves: sync the table and refuse a foreign change in the repair's scope."""
    lake = spec.target.lakehouse
    assert lake is not None
    sync(engine, spec)
    log = open_log(lake)
    columns = duckdb_columns(log.schema(), "target.lakehouse")
    with engine.session(read_only=True) as s:
        s.temp_view("__lh_head", f"{files_sql(log.files(log.head()), columns)}")
        refuse_foreign_changes(s, spec, from_namespace, scope)


def _published_commit(engine: Engine, spec: DatasetSpec, incident_id: str) -> int | None:
    with engine.session(read_only=True) as s:
        return s.scalar(
            f"SELECT max(version) FROM {COMMITS} WHERE dataset = ? AND status = 'published' AND incident_id = ?",
            [spec.dataset, incident_id],
        )


def _published_event(s, incident_id: str) -> bool:
    return bool(
        s.scalar(
            f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = 'lakehouse_publish' AND incident_id = ?",
            [incident_id],
        )
    )


def _record_publish(
    s: Session,
    spec: DatasetSpec,
    incident_id: str,
    actor: str,
    namespace: str,
    version: int,
    parts: list[str],
    rows: int,
    read_version: int | None,
    *,
    found: bool = False,
) -> None:
    """The ``lakehouse_publish`` event of the table's commit, read at ``read_version``; ``found``: found
    committed on the table by the rerun of an interrupted publish."""
    lake = spec.target.lakehouse
    assert lake is not None
    how = "found committed by an interrupted publish" if found else f"read at version {read_version}"
    EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor).record(
        s,
        "lakehouse_publish",
        f"{lake.location}: {namespace} published as one commit, version {version} "
        f"({len(parts)} partitions overwritten, {rows:,} rows; {how})",
        {"version": version, "read_version": read_version, "partitions": parts},
    )


def _record_found(
    engine: Engine, spec: DatasetSpec, incident_id: str, version: int, namespace: str, actor: str
) -> None:
    """The ``lakehouse_publish`` event of a commit found on the table (its history synced), unless recorded."""

    def txn() -> None:
        with engine.transaction() as s:
            if _published_event(s, incident_id):
                return
            row = s.fetchone(
                f"SELECT partitions, rows_added FROM {COMMITS} WHERE dataset = ? AND version = ?",
                [spec.dataset, version],
            )
            parts, rows = (list(row[0] or []), int(row[1] or 0)) if row else ([], 0)
            _record_publish(s, spec, incident_id, actor, namespace, version, parts, rows, None, found=True)

    retrying(txn)


def publish_to_table(
    engine: Engine,
    spec: DatasetSpec,
    incident_id: str,
    *,
    namespace: str,
    from_namespace: str,
    generation: str,
    scope: list[str],
    actor: str = "publish",
) -> TablePublish:
    """Commit the published ``namespace`` (the repair ``generation``) onto the table, on the partitions of
    ``scope`` (the repair plan's) where the two differ."""
    lake = spec.target.lakehouse
    assert lake is not None  # a lakehouse target
    for _attempt in range(ATTEMPTS):
        sync(engine, spec)
        done = _published_commit(engine, spec, incident_id)
        if done is not None:
            # a publish killed after its commit and before its event: the rerun records what it finds committed
            _record_found(engine, spec, incident_id, done, namespace, actor)
            return TablePublish(lake.location, done, (), 0, True)
        log = open_log(lake)
        head = log.head()
        columns = duckdb_columns(log.schema(), "target.lakehouse")
        with engine.session(read_only=True) as s:
            part = quote(spec.target.partition)
            ns = namespace_sql(namespace)
            s.temp_view("__lh_head", f"{files_sql(log.files(head), columns)}")
            cols = ", ".join(quote(c) for c, _ in columns)
            names = [c for c, _ in columns]
            differing = [
                r[0]
                for r in s.fetchall(
                    f"SELECT coalesce(a.p, b.p) FROM ({_digest_sql(ns, names, spec.target.partition)}) a "
                    f"FULL JOIN ({_digest_sql('__lh_head', names, spec.target.partition)}) b "
                    f"USING (p) WHERE (a.n, a.h) IS DISTINCT FROM (b.n, b.h) ORDER BY 1"
                )
                if r[0] in scope
            ]
            refuse_foreign_changes(s, spec, from_namespace, differing)
            if not differing:
                return TablePublish(lake.location, head, (), 0, False)
            data = s.arrow(f"SELECT {cols} FROM {ns} WHERE CAST({part} AS VARCHAR) IN ({str_list(differing)})").cast(
                log.schema()
            )
            s.drop_relation("__lh_head", view=True)
        props = {
            WRITER_PROPERTY: "publish",
            INCIDENT_PROPERTY: incident_id,
            GENERATION_PROPERTY: generation,
            "recovery.namespace": namespace,
        }
        try:
            version = log.overwrite(data, spec.target.partition, differing, props, head)
        except Exception as e:  # a concurrent commit won the race: sync it and try again
            if (
                "conflict" not in str(e).lower()
                and "moved since" not in str(e).lower()
                and "commit" not in str(e).lower()
            ):
                raise
            continue
        faults.checkpoint("lake_publish:committed")  # the table's commit landed, not synced nor on the timeline
        sync(engine, spec)

        def record() -> None:
            with engine.transaction() as s:
                if _published_event(s, incident_id):  # a concurrent publisher's rerun recorded it first
                    return
                _record_publish(s, spec, incident_id, actor, namespace, version, differing, data.num_rows, head)
                faults.checkpoint("lake_publish:recorded")  # the event in its transaction, not committed

        retrying(record)
        faults.checkpoint("lake_publish:event_committed")  # the commit synced and on the timeline
        return TablePublish(lake.location, version, tuple(differing), data.num_rows, False)
    raise RecoveryError(
        f"publish onto {lake.location}: other commits kept landing ({ATTEMPTS} attempts); run publish again"
    )
