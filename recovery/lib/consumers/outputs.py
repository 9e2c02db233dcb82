"""Consumer outputs as namespaces: what each was built from, and which must be kept.

Every build of a consumer output is recorded in ``_recovery.consumer_builds`` with
what it read: the target's namespace, the commit sequence, and the generations
whose rows the public target exposed at that moment. That record is how a
restatement finds the output an incident's damage reached, and why a later
refresh may not rewrite it. An output is *preserved* (never rewritten in place,
never dropped) when

- it was adopted from a plain table (what it was built from is unknown),
- it was built while the target exposed rows of a generation fenced since, or
- a restatement recorded it, as an incident's original or corrected output.

A normal refresh rewrites the current namespace in place unless it is preserved;
then it builds a new namespace and moves the pointer, and the preserved one stays
as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib.control.plane import SCHEMA, delta_table, ensure_control_plane, has_dataset_table, next_seq, utcnow
from recovery.lib.control.tables import BUILDS, CONSUMER_OUTPUT_DDL, RESTATEMENTS  # noqa: F401 - re-exported
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import TableName, quote
from recovery.lib.pointers.managed_views import (
    ADOPTED_NOTE,
    ManagedName,
    adopt_if_plain,
    build,
    current,
    move,
    rebuild_in_place,
)
from recovery.lib.pointers.namespaces import current_namespace
from recovery.lib.snapshot import str_list

CONSUMER_SCHEMA = "consumers"


@dataclass(frozen=True)
class OutputBuild:
    consumer: str
    namespace: str
    rows: int
    new_namespace: bool
    preserved: str | None  # why the prior namespace was kept, if a new one was built


def managed(spec: DatasetSpec, consumer: str) -> ManagedName:
    return ManagedName(TableName(CONSUMER_SCHEMA, consumer), f"{spec.dataset}:{consumer}", spec.dataset)


def ensure_tables(s: Session) -> None:
    ensure_control_plane(s)
    for stmt in CONSUMER_OUTPUT_DDL:
        s.execute(stmt)


def record_build(s: Session, spec: DatasetSpec, consumer: str, ns: str, *, seq: int, actor: str, reason: str) -> int:
    """Record what ``ns`` was built from (the target's exposed generations, read in this transaction)."""
    gen = quote(spec.target.metadata.generation)
    s.execute(f"DELETE FROM {BUILDS} WHERE namespace = ?", [ns])
    s.replace_rows(  # the control-plane row reads the (data-plane) target and namespace
        BUILDS,
        [n for n, _ in s.columns(BUILDS)],
        insert="SELECT ?, ?, ?, ?, ?, ?, "
        f"(SELECT coalesce(list(DISTINCT {gen} ORDER BY {gen}), []) FROM {spec.target.table_name.sql()} "
        f"WHERE {gen} IS NOT NULL), "
        f"(SELECT count(*) FROM {TableName.parse(ns).sql()}), ?, ?",
        params=[ns, spec.dataset, consumer, seq, utcnow(), current_namespace(s, spec), actor, reason],
    )
    return int(s.scalar(f"SELECT row_count FROM {BUILDS} WHERE namespace = ?", [ns]))


def preserved_because(s: Session, ns: str) -> str | None:
    """Why ``ns`` must be kept as it is, or None when a refresh may rewrite it."""
    note = s.scalar(f"SELECT note FROM {SCHEMA}.namespaces WHERE namespace = ?", [ns])
    if note == ADOPTED_NOTE:
        return "adopted from a plain table: what it was built from is unknown"
    fenced = s.scalar(
        f"SELECT min(generation) FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL "
        f"AND generation IN (SELECT unnest(generations) FROM {BUILDS} WHERE namespace = ?)",
        [ns],
    )
    if fenced is not None:
        return f"built while the target exposed rows of generation {fenced}, fenced since"
    incident = s.scalar(
        f"SELECT min(incident_id) FROM {RESTATEMENTS} WHERE original_namespace = ? OR corrected_namespace = ?", [ns, ns]
    )
    if incident is not None:
        return f"recorded by the restatement of incident {incident}"
    return None


def refresh_output(
    s: Session, spec: DatasetSpec, consumer: str, select_sql: str, *, actor: str = "refresh"
) -> OutputBuild:
    """A normal refresh: rewrite the current namespace, or publish a new one when the current is
    preserved (or none exists). The caller owns the transaction."""
    ensure_tables(s)
    m = managed(spec, consumer)
    cur = adopt_if_plain(s, m, actor=actor)
    seq = next_seq(s)
    why = preserved_because(s, cur) if cur else None
    if cur is None or why:
        ns = build(s, m, select_sql, actor=actor, seq=seq, note="refresh")
        move(s, m, ns, actor=actor, reason="refresh" + (f" (prior output kept: {why})" if why else ""), seq=seq)
    else:
        ns = cur
        rebuild_in_place(s, m, ns, select_sql)
    rows = record_build(s, spec, consumer, ns, seq=seq, actor=actor, reason="refresh")
    return OutputBuild(consumer, ns, rows, ns != cur, why)


def publish_output(s: Session, spec: DatasetSpec, consumer: str, select_sql: str, *, actor: str, reason: str) -> str:
    """Build a new namespace and point the consumer's public name at it (the prior one is kept)."""
    ensure_tables(s)
    m = managed(spec, consumer)
    adopt_if_plain(s, m, actor=actor)
    seq = next_seq(s)
    ns = build(s, m, select_sql, actor=actor, seq=seq, note=reason)
    move(s, m, ns, actor=actor, reason=reason, seq=seq)
    record_build(s, spec, consumer, ns, seq=seq, actor=actor, reason=reason)
    return ns


def damaged_output(s: Session, spec: DatasetSpec, consumer: str, generations: list[str] | None) -> str | None:
    """The latest output of ``consumer`` built while the target exposed rows of ``generations``
    (default: of any generation fenced since)."""
    wanted = (
        f"[{str_list(generations)}]"
        if generations
        else f"(SELECT coalesce(list(generation), []) FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL)"
    )
    gens = f"list_has_any(b.generations, CAST({wanted} AS VARCHAR[]))"
    return s.scalar(
        f"SELECT b.namespace FROM {BUILDS} b JOIN {SCHEMA}.namespaces n USING (namespace) "
        f"WHERE b.dataset = ? AND b.consumer = ? AND {gens} ORDER BY b.seq DESC LIMIT 1",
        [spec.dataset, consumer],
    )


ORIGINAL_FROM_DAMAGE = "original computed from the preserved damaged generation"


def damaged_target(s: Session, spec: DatasetSpec, generations: list[str] | None) -> str | None:
    """The target namespace the failed generations last wrote (kept after the repair's publish):
    what a consumer built during the damage would have read. From the write log; for a target
    adopted after the damage (its log starts at adoption), the latest of the target's namespaces
    that holds their rows."""
    wanted = (
        str_list(generations)
        if generations
        else f"SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL AND dataset = '{spec.dataset}'"
    )
    gen = quote(spec.target.metadata.generation)
    ns = None
    if has_dataset_table(s, "delta", spec.dataset):
        ns = s.scalar(
            f"SELECT arg_max(_delta_namespace, _delta_seq) FROM {delta_table(spec.dataset)} WHERE {gen} IN ({wanted})"
        )
    if ns is not None and s.scalar(f"SELECT count(*) FROM {SCHEMA}.namespaces WHERE namespace = ?", [ns]):
        return ns
    for (candidate,) in s.fetchall(
        f"SELECT namespace FROM {SCHEMA}.namespaces WHERE dataset = ? ORDER BY created_seq DESC", [spec.dataset]
    ):
        t = TableName.parse(candidate)
        if s.object_kind(t.schema, t.name) is not None and s.scalar(
            f"SELECT count(*) FROM (SELECT 1 FROM {t.sql()} WHERE {gen} IN ({wanted}) LIMIT 1)"
        ):
            return candidate
    return None


def build_original(
    s: Session, spec: DatasetSpec, consumer: str, select_sql: str, damaged_ns: str, *, actor: str, incident_id: str
) -> str:
    """The consumer's output as the damage would have produced it (no earlier materialization
    exists): built over the damaged namespace into a kept namespace the public name never points
    at, and recorded as built from that namespace, so the ledger holds original values."""
    ensure_tables(s)
    m = managed(spec, consumer)
    seq = next_seq(s)
    note = f"{ORIGINAL_FROM_DAMAGE} {damaged_ns} (incident {incident_id})"
    ns = build(s, m, select_sql, actor=actor, seq=seq, note=note)
    s.execute(f"UPDATE {SCHEMA}.namespaces SET status = 'retained' WHERE namespace = ?", [ns])
    gen = quote(spec.target.metadata.generation)
    s.replace_rows(  # the control-plane row reads the (data-plane) target and namespace
        BUILDS,
        [n for n, _ in s.columns(BUILDS)],
        insert="SELECT ?, ?, ?, ?, ?, ?, "
        f"(SELECT coalesce(list(DISTINCT {gen} ORDER BY {gen}), []) FROM {TableName.parse(damaged_ns).sql()} "
        f"WHERE {gen} IS NOT NULL), "
        f"(SELECT count(*) FROM {TableName.parse(ns).sql()}), ?, ?",
        params=[ns, spec.dataset, consumer, seq, utcnow(), damaged_ns, actor, note],
    )
    return ns


def original_basis(s: Session, namespace: str | None) -> str:
    """How an incident's original output came to be: kept as materialized, or computed."""
    if namespace is None:
        return "none: never materialized and no damaged generation preserved"
    reason = s.scalar(f"SELECT reason FROM {BUILDS} WHERE namespace = ?", [namespace])
    if reason and reason.startswith(ORIGINAL_FROM_DAMAGE):
        return reason
    return f"materialized output kept as built ({namespace})"


def current_output(s: Session, spec: DatasetSpec, consumer: str) -> str | None:
    return current(s, managed(spec, consumer))
