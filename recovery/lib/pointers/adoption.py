"""Taking a target another tool wrote under management, and handing it back.

Containment starts here for a warehouse the package never wrote: in one
transaction the control plane is created, the plain table is renamed into the
package's first versioned namespace (``<table>__g0001``), the public name becomes a
view over it, the team's run registry (if the spec names one) is copied into the
generation registry, and the timeline records what was adopted (rows, columns,
a checksum of the content). From that commit on a foreign ``INSERT``/``UPDATE``/
``DELETE`` on the public name fails (DuckDB does not write through views): that is
the fence for writers outside the package.

``release`` is the way back once the incident is closed: the public name becomes a
plain table again holding the currently published rows, in one transaction; the
versioned namespaces stay, as history.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib import faults
from recovery.lib.control.plane import (
    SCHEMA,
    EventSource,
    control_plane_exists,
    delta_table,
    ensure_control_plane,
    next_seq,
    utcnow,
)
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError
from recovery.lib.pointers.namespaces import create_or_adopt, is_managed, namespace_sql, published_namespace
from recovery.lib.retry import retrying


@dataclass(frozen=True)
class Adoption:
    namespace: str
    adopted_now: bool
    rows: int
    columns: list[str]
    checksum: str | None
    registry_rows: int
    note: str = ""  # what else containment did (a lakehouse table's fence), for the same line

    def line(self, spec: DatasetSpec) -> str:
        note = f"; {self.note}" if self.note else ""
        if not self.adopted_now:
            return f"{spec.target.table} is already managed (a view over {self.namespace}); nothing to adopt{note}"
        reg = f"; {self.registry_rows:,} runs of {spec.registry.table} registered" if spec.registry else ""
        return (
            f"adopted {spec.target.table}: {self.rows:,} rows, {len(self.columns)} columns moved to {self.namespace} "
            f"(checksum {self.checksum}); the public name is now a managed view{reg}{note}"
        )


def content_checksum(s: Session, relation_sql: str) -> tuple[int, str]:
    """Row count and an order-independent checksum of a relation's content (sum of row hashes)."""
    n, h = s.fetchrow(f"SELECT count(*), CAST(coalesce(sum(hash(t)), 0) AS VARCHAR) FROM {relation_sql} t")
    return int(n), h


def point_write_log_at(s: Session, spec: DatasetSpec, namespace: str) -> None:
    """After adoption renamed the public table into its first namespace, the write log's rows (a lakehouse
    target's synced history among them) say so too."""
    public = str(spec.target.table_name)
    s.update_rows(
        delta_table(spec.dataset), [("_delta_namespace", "?")], where="_delta_namespace = ?", params=[namespace, public]
    )
    s.execute(
        f"UPDATE {SCHEMA}.writes SET namespace = ? WHERE dataset = ? AND namespace = ?",
        [namespace, spec.dataset, public],
    )


def adopt(engine: Engine, spec: DatasetSpec, *, actor: str, incident_id: str | None = None) -> Adoption:
    """Manage the target (idempotent): a second call returns ``adopted_now=False`` and changes nothing."""
    public = spec.target.table_name
    with engine.session(read_only=True) as s:
        if is_managed(s, spec):
            ns = published_namespace(s, spec)
            return Adoption(ns, False, 0, [c for c, _ in s.columns(namespace_sql(ns))], None, 0)
        kind = s.object_kind(public.schema, public.name)
    if kind is None:
        raise RecoveryError(
            f"target {public} does not exist in {spec.warehouse.path.name}: "
            f"nothing to contain; check target.table in the spec"
        )

    def txn() -> Adoption:
        with engine.transaction() as s:
            ensure_control_plane(s)
            if is_managed(s, spec):  # another process adopted it meanwhile
                ns = published_namespace(s, spec)
                return Adoption(ns, False, 0, [c for c, _ in s.columns(namespace_sql(ns))], None, 0)
            rows, checksum = content_checksum(s, public.sql()) if kind == "table" else (0, None)
            columns = [c for c, _ in s.columns(public.sql())]
            ns = create_or_adopt(s, spec, actor=actor)
            if spec.target.lakehouse is not None:  # the table's synced history follows its rows, in the same commit
                point_write_log_at(s, spec, ns)
            registered = int(
                s.scalar(
                    f"SELECT count(*) FROM {SCHEMA}.generations WHERE dataset = ? AND note LIKE 'from registry %'",
                    [spec.dataset],
                )
                or 0
            )
            EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor).record(
                s,
                "target_adopted",
                f"{public} taken under management: {rows:,} rows, {len(columns)} columns moved to {ns} "
                f"(checksum {checksum}); foreign writes to the public name now fail",
                {
                    "namespace": ns,
                    "rows": rows,
                    "columns": columns,
                    "checksum": checksum,
                    "registry_rows": registered,
                    "was": kind,
                },
            )
            faults.checkpoint("adopt:recorded")  # everything written, not committed
            return Adoption(ns, True, rows, columns, checksum, registered)

    adoption = retrying(txn)
    faults.checkpoint("adopt:committed")
    return adoption


def _released(s: Session, spec: DatasetSpec) -> tuple[str, int] | None:
    """(namespace, rows) of the release that last moved the public name, when it did."""
    last = s.fetchone(
        f"SELECT from_namespace, reason FROM {SCHEMA}.pointer_history WHERE public_name = ? ORDER BY seq DESC LIMIT 1",
        [str(spec.target.table_name)],
    )
    if last is None or last[1] != "released":
        return None
    rows = s.scalar(
        f"SELECT CAST(json_extract(details, '$.rows') AS BIGINT) FROM {SCHEMA}.timeline WHERE kind = "
        "'target_released' AND dataset = ? ORDER BY event_id DESC LIMIT 1",
        [spec.dataset],
    )
    return last[0], int(rows or 0)


def release(engine: Engine, spec: DatasetSpec, *, actor: str) -> tuple[str, int]:
    """Hand the public name back as a plain table holding the published rows. Returns the
    namespace it was reading and the rows handed back. Refuses while a repair is unpublished. A rerun
    after the release committed returns what it handed back and writes nothing."""
    public = spec.target.table_name

    def txn() -> tuple[str, int]:
        with engine.transaction() as s:
            if not control_plane_exists(s) or not is_managed(s, spec):
                done = _released(s, spec) if control_plane_exists(s) else None
                if done is not None:  # released before (a rerun after a kill past the commit): nothing to do
                    return done
                raise RecoveryError(f"{public} is not managed by this package: nothing to release")
            building = s.scalar(
                f"SELECT string_agg(namespace, ', ') FROM {SCHEMA}.namespaces "
                f"WHERE dataset = ? AND status = 'building'",
                [spec.dataset],
            )
            if building:
                raise RecoveryError(
                    f"a repair generation is still being built ({building}): publish or abandon it "
                    f"before handing {public} back"
                )
            ns = published_namespace(s, spec)
            seq = next_seq(s)
            s.release_table(public)
            faults.checkpoint("release:table_released")  # a plain table at the public name, its pointer not yet gone
            rows, checksum = content_checksum(s, public.sql())
            s.execute(f"DELETE FROM {SCHEMA}.pointers WHERE public_name = ?", [str(public)])
            s.execute(
                f"INSERT INTO {SCHEMA}.pointer_history VALUES (?, ?, ?, NULL, ?, ?, ?, 'released')",
                [str(public), spec.dataset, ns, seq, utcnow(), actor],
            )
            s.execute(
                f"UPDATE {SCHEMA}.namespaces SET status = 'retained' WHERE dataset = ? AND status = 'published'",
                [spec.dataset],
            )
            EventSource(dataset=spec.dataset, actor=actor).record(
                s,
                "target_released",
                f"{public} handed back as a plain table: {rows:,} rows of {ns} (checksum {checksum}); "
                f"the package's namespaces are kept as history",
                {"namespace": ns, "rows": rows, "checksum": checksum},
            )
            faults.checkpoint("release:recorded")  # everything written, not committed
            return ns, rows

    released = retrying(txn)
    faults.checkpoint("release:committed")
    return released
