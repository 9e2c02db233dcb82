"""Managed views and pointer moves: the one home of the pointer SQL, for the target and consumers alike.

The target (``recovery.lib.pointers.namespaces``) and each consumer's output are both a
``ManagedName``. A consumer's output lives in physical tables ``<schema>.<name>__gNNNN``; its public
name is a view with an explicit column list over exactly one of them, recorded in
the same control-plane tables as the target's (``namespaces``, ``pointers``,
``pointer_history``), and moving the view and the pointer row happens in the
caller's transaction. A plain table already at the public name is adopted as the
first namespace in that same transaction (renamed, then replaced by the view), as
``recovery.lib.pointers.namespaces.create_or_adopt`` does for a target.

Namespace rows carry a ``dataset`` label of their own (``<dataset>:<consumer>``), so
the target's namespace numbering and every ``WHERE dataset = ?`` over the target
never see them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.lib.control.plane import SCHEMA, EventSource, next_seq, utcnow
from recovery.lib.engine.base import Session
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import TableName, is_plain_identifier, quote

ADOPTED_NOTE = "adopted from a plain table"


@dataclass(frozen=True)
class ManagedName:
    """A public name served through namespaces, and the label its control-plane rows carry."""

    public: TableName
    label: str
    dataset: str | None = None  # the dataset whose timeline records the moves

    def namespace(self, number: int) -> str:
        name = f"{self.public.name}__g{number:04d}"
        if not is_plain_identifier(name):
            raise RecoveryError(
                f"{self.public}: namespace name {name!r} is longer than 63 characters. "
                f"Fix: give the consumer a shorter name (at most 56 characters)"
            )
        return str(self.public.with_name(name))


def quote_any(column: str) -> str:
    """Quote a column name a user's SQL produced (it need not be plain, e.g. ``count_star()``)."""
    return '"' + column.replace('"', '""') + '"'


def namespace_sql(namespace: str) -> str:
    return TableName.parse(namespace).sql()


def current(s: Session, m: ManagedName) -> str | None:
    """The namespace the public name points at (None when it is not managed yet)."""
    return s.scalar(f"SELECT namespace FROM {SCHEMA}.pointers WHERE public_name = ?", [str(m.public)])


def pointer_seq(s: Session, public_name: str) -> int | None:
    """The commit sequence number of the public name's last pointer move (None when unmanaged)."""
    return s.scalar(f"SELECT seq FROM {SCHEMA}.pointers WHERE public_name = ?", [public_name])


def namespaces_of(s: Session, m: ManagedName) -> list[tuple[str, str, str]]:
    """(namespace, status, note) of every namespace of the public name, oldest first."""
    return s.fetchall(
        f"SELECT namespace, status, note FROM {SCHEMA}.namespaces WHERE public_name = ? ORDER BY created_seq, "
        "namespace",
        [str(m.public)],
    )


def _next_name(s: Session, m: ManagedName) -> str:
    n = int(s.scalar(f"SELECT count(*) FROM {SCHEMA}.namespaces WHERE public_name = ?", [str(m.public)]) or 0) + 1
    while True:
        ns = m.namespace(n)
        t = TableName.parse(ns)
        if s.object_kind(t.schema, t.name) is None:
            return ns
        n += 1


def register_namespace(s: Session, m: ManagedName, ns: str, *, seq: int, actor: str, status: str, note: str) -> None:
    s.execute(
        f"INSERT INTO {SCHEMA}.namespaces VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [ns, m.label, str(m.public), seq, utcnow(), actor, status, note],
    )


def point_view(s: Session, m: ManagedName, ns: str) -> None:
    """(Re)create the public view over ``ns`` with its explicit column list."""
    cols = ", ".join(quote_any(c) for c, _ in s.columns(namespace_sql(ns)))
    s.swap_pointer(m.public.sql(), f"SELECT {cols} FROM {namespace_sql(ns)}")


def adopt_if_plain(s: Session, m: ManagedName, *, actor: str) -> str | None:
    """Make the public name managed if it is a plain table; returns the current namespace
    (None when nothing exists at the public name yet). The caller owns the transaction."""
    pointer = current(s, m)
    kind = s.object_kind(m.public.schema, m.public.name)
    if pointer is not None:
        if kind == "view":
            return pointer
        if kind is None:  # the view was dropped: the pointer row says where it points
            point_view(s, m, pointer)
            return pointer
        raise RecoveryError(
            f"{m.public} is a table although the control plane points it at {pointer}. "
            f"Fix: rename or drop that table; the public name must stay the managed view"
        )
    if kind == "view":
        raise RecoveryError(
            f"{m.public} is a view that this package does not manage. Fix: drop it, or rename the consumer in the spec"
        )
    if kind is None:
        return None
    seq = next_seq(s)
    ns = _next_name(s, m)
    s.adopt_table(m.public, TableName.parse(ns).name)
    register_namespace(s, m, ns, seq=seq, actor=actor, status="published", note=ADOPTED_NOTE)
    move(s, m, ns, actor=actor, reason="adopted", seq=seq)
    EventSource(dataset=m.dataset, actor=actor).record(
        s, "namespace_adopted", f"{m.public} now a managed view over {ns} ({ADOPTED_NOTE})"
    )
    return ns


def build(s: Session, m: ManagedName, select_sql: str, *, actor: str, seq: int, note: str = "") -> str:
    """A new namespace holding ``select_sql``'s rows (status ``building`` until pointed at)."""
    ns = _next_name(s, m)
    s.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(m.public.schema)}")
    s.materialize(namespace_sql(ns), select_sql)
    register_namespace(s, m, ns, seq=seq, actor=actor, status="building", note=note)
    return ns


def rebuild_in_place(s: Session, m: ManagedName, ns: str, select_sql: str) -> None:
    """Replace a namespace's rows (a normal refresh of an output nothing needs to keep)."""
    s.materialize(namespace_sql(ns), f"{select_sql}")
    point_view(s, m, ns)


def move(
    s: Session, m: ManagedName, to_namespace: str, *, actor: str, reason: str, seq: int, at: datetime | None = None
) -> str | None:
    """Point the public view and the pointer row at ``to_namespace`` (the first pointer row when
    there is none yet); the prior namespace is retained. Returns it. The caller owns the transaction."""
    before = current(s, m)
    at = at or utcnow()
    point_view(s, m, to_namespace)
    if before is None:
        s.execute(
            f"INSERT INTO {SCHEMA}.pointers VALUES (?, ?, ?, ?, ?)", [str(m.public), m.label, to_namespace, seq, at]
        )
    else:
        s.execute(
            f"UPDATE {SCHEMA}.pointers SET namespace = ?, seq = ?, updated_at = ? WHERE public_name = ?",
            [to_namespace, seq, at, str(m.public)],
        )
    s.execute(
        f"INSERT INTO {SCHEMA}.pointer_history VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [str(m.public), m.label, before, to_namespace, seq, at, actor, reason],
    )
    s.execute(f"UPDATE {SCHEMA}.namespaces SET status = 'published' WHERE namespace = ?", [to_namespace])
    if before and before != to_namespace:
        s.execute(f"UPDATE {SCHEMA}.namespaces SET status = 'retained' WHERE namespace = ?", [before])
    return before
