"""Physical namespaces and the public pointer.

A dataset's rows live in physical tables named ``<table>__g<NNNN>`` beside the public
name; the public name is a view with an explicit column list (a ``SELECT *`` view
silently changes shape) over exactly one of them. Moving that view and the pointer
row in one transaction is publishing; moving it back is rollback. An existing
plain table is adopted the same way: renamed into namespace ``g0001`` and replaced
by the view, in one transaction.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, control_plane_exists, delta_table, next_seq
from recovery.lib.control.write_registry import registry_sql
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import TableName, quote
from recovery.lib.pointers.managed_views import ManagedName, current, move, namespace_sql, register_namespace
from recovery.lib.snapshot import expected_rows_sql

__all__ = ["create_or_adopt", "current_namespace", "is_managed", "move_pointer", "namespace_sql", "new_namespace"]


def target_name(spec: DatasetSpec) -> ManagedName:
    """The target's public name as a managed name: its control-plane rows carry the dataset."""
    return ManagedName(spec.target.table_name, spec.dataset, spec.dataset)


def _namespace_name(spec: DatasetSpec, number: int) -> str:
    public = spec.target.table_name
    return str(public.with_name(f"{public.name}__g{number:04d}"))


def _next_number(s: Session, spec: DatasetSpec) -> int:
    n = s.scalar(f"SELECT count(*) FROM {SCHEMA}.namespaces WHERE dataset = ?", [spec.dataset]) or 0
    return int(n) + 1


def _ensure_delta(s: Session, spec: DatasetSpec, ns: str) -> None:
    s.materialize(
        delta_table(spec.dataset),
        "SELECT *, CAST(NULL AS BIGINT) AS _delta_seq, "
        f"CAST(NULL AS VARCHAR) AS _delta_op, CAST(NULL AS VARCHAR) AS _delta_namespace FROM {namespace_sql(ns)} "
        "LIMIT 0",
        keep_existing=True,
    )


def new_namespace(s: Session, spec: DatasetSpec, *, created_by: str, seq: int) -> str:
    """An empty physical table shaped like the published one."""
    published = current_namespace(s, spec)
    if published is None:
        raise RecoveryError(f"dataset {spec.dataset!r} has no published namespace; run Writer.ensure() first")
    ns = _namespace_name(spec, _next_number(s, spec))
    s.materialize(namespace_sql(ns), f"SELECT * FROM {namespace_sql(published)} LIMIT 0")
    register_namespace(s, target_name(spec), ns, seq=seq, actor=created_by, status="building", note="")
    return ns


def create_or_adopt(s: Session, spec: DatasetSpec, *, actor: str) -> str:
    """Make the public name a managed view; returns the namespace it points at."""
    public = spec.target.table_name
    meta = spec.target.metadata
    pointer = current_namespace(s, spec)
    kind = s.object_kind(public.schema, public.name)
    if pointer is not None and kind == "view":
        return pointer
    if kind == "view":
        raise RecoveryError(
            f"{public} is a view that this package does not manage; drop it or point target.table elsewhere"
        )
    seq = next_seq(s)
    s.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(public.schema)}")
    ns = _namespace_name(spec, _next_number(s, spec))
    if kind == "table":
        have = {c for c, _ in s.columns(public.sql())}
        wanted = [(meta.generation, "VARCHAR"), (meta.source_version, "BIGINT"), (meta.written_at, "TIMESTAMP")]
        s.adopt_table(public, TableName.parse(ns).name, [(c, t) for c, t in wanted if c not in have])
        _infer_generations(s, spec, ns, seq)
        note, reason = "adopted from a plain table", "adopted"
    else:
        s.materialize(
            namespace_sql(ns),
            f"SELECT *, CAST(NULL AS VARCHAR) AS {quote(meta.generation)}, "
            f"CAST(NULL AS TIMESTAMP) AS {quote(meta.written_at)} FROM ({expected_rows_sql(spec, None)}) LIMIT 0",
        )
        note, reason = "created empty", "created"
    faults.checkpoint("adopt:renamed")  # the table moved into its namespace, nothing at the public name yet
    register_namespace(s, target_name(spec), ns, seq=seq, actor=actor, status="published", note=note)
    move(s, target_name(spec), ns, actor=actor, reason=reason, seq=seq)
    faults.checkpoint("adopt:view_moved")
    _ensure_delta(s, spec, ns)
    EventSource(dataset=spec.dataset, actor=actor).record(
        s, f"dataset_{reason}", f"{public} now a managed view over {ns} ({note})"
    )
    return ns


def _infer_generations(s: Session, spec: DatasetSpec, ns: str, seq: int) -> None:
    """Register the generations of an adopted table: first the team's registry rows (when the spec
    names one: kind, start, end, source watermark as recorded), then any other generation found
    in the rows, its start inferred from its first write."""
    meta = spec.target.metadata
    reg = registry_sql(spec)
    # the columns named, each value aliased: the rows are computed where the registry and the target
    # live (Spark: on Spark, as a DataFrame whose columns need distinct names), then land in the control plane
    cols = (
        "generation, dataset, kind, status, started_at, ended_at, source_watermark, token, writes, "
        "registered_seq, inferred, note"
    ).split(", ")
    if reg:
        s.replace_rows(
            f"{SCHEMA}.generations",
            cols,
            insert="SELECT generation, ? AS dataset, kind, 'complete' AS status, started_at, ended_at, "
            "source_watermark, 1 AS token, 0 AS writes, ? AS registered_seq, false AS inferred, "
            f"'from ' || basis AS note "
            f"FROM ({reg}) WHERE generation NOT IN (SELECT generation FROM {SCHEMA}.generations) "
            f"QUALIFY row_number() OVER (PARTITION BY generation ORDER BY started_at) = 1",
            params=[spec.dataset, seq],
        )
    s.replace_rows(
        f"{SCHEMA}.generations",
        cols,
        insert="SELECT g AS generation, ? AS dataset, 'unknown' AS kind, 'complete' AS status, "
        "first_write AS started_at, last_write AS ended_at, CAST(NULL AS TIMESTAMP) AS source_watermark, "
        "1 AS token, 0 AS writes, "
        "? AS registered_seq, true AS inferred, 'inferred from rows of an adopted table' AS note "
        f"FROM (SELECT {quote(meta.generation)} AS g, "
        f"min({quote(meta.written_at)}) AS first_write, "
        f"max({quote(meta.written_at)}) AS last_write FROM {namespace_sql(ns)} "
        f"WHERE {quote(meta.generation)} IS NOT NULL GROUP BY 1) "
        f"WHERE g NOT IN (SELECT generation FROM {SCHEMA}.generations)",
        params=[spec.dataset, seq],
    )


def is_managed(s: Session, spec: DatasetSpec) -> bool:
    """Whether the public name is already a view this package manages (adopted or created)."""
    return control_plane_exists(s) and current_namespace(s, spec) is not None


def current_namespace(s: Session, spec: DatasetSpec) -> str | None:
    return current(s, target_name(spec))


def published_namespace(s: Session, spec: DatasetSpec) -> str:
    """The namespace the public name points at, for a step that needs a managed target: none is a ``RecoveryError``."""
    ns = current_namespace(s, spec)
    if ns is None:
        raise RecoveryError(f"{spec.target.table} is not managed (no pointer): contain or adopt it first")
    return ns


def move_pointer(
    s: Session, spec: DatasetSpec, to_namespace: str, *, actor: str, reason: str, at: datetime | None = None
) -> int:
    """Point the public view at ``to_namespace``; the caller owns the transaction."""
    known = s.scalar(
        f"SELECT status FROM {SCHEMA}.namespaces WHERE namespace = ? AND dataset = ?", [to_namespace, spec.dataset]
    )
    if known is None:
        raise RecoveryError(f"namespace {to_namespace!r} is not a namespace of dataset {spec.dataset!r}")
    seq = next_seq(s)
    move(s, target_name(spec), to_namespace, actor=actor, reason=reason, seq=seq, at=at)
    return seq
