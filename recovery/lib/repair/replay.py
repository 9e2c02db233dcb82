"""Replay the delta log onto the repair generation: each key's captured writes, in order.

Normal ingestion keeps writing to the published namespace during the repair; each
of its writes is in the dataset's append-only delta log with its commit sequence.
The replay folds, per key, every entry written by a non-fenced generation into the
published namespace in ``(after_seq, through_seq]``, in commit order, over what the
repair holds, with each write's own semantics:

- an upsert replaces the key's row (wherever it sits) when its source version is
  newer than the row's;
- a ``delete_keys`` tombstone removes the key wherever it sits, when the row is of
  the same or an older version;
- a row a partition replace removed is removed from that partition only (a replace
  of day P that drops the backfill's misfiled copy of a key whose right day is Q
  must not delete the repaired row in Q).

That is for the keys the repair rebuilt from its snapshot. A carried key (outside the
rebuilt partitions: nothing to repair) that a write touched ends as the published
table holds it, so publish changes nothing there.

Because it compares versions instead of re-applying writes, replaying a window
twice, or a wider window, changes nothing. The fold is set-based: one statement per
rank (a key's n-th entry), so its rounds are the most entries one key has in the
window, not the number of keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib.control.plane import SCHEMA, delta_table, utcnow
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.repair.plan import RepairPlan
from recovery.lib.repair.tables import REPLAYS, snapshot_table
from recovery.lib.snapshot import str_list
from recovery.lib.write.writer import Writer


@dataclass(frozen=True)
class ReplayResult:
    after_seq: int
    through_seq: int
    upserted: int
    deleted: int
    skipped_older: int


def window_delta_sql(writer: Writer, plan: RepairPlan, after_seq: int, through_seq: int) -> str:
    """Every valid delta entry in the window (payload columns, ``_delta_seq``, ``_delta_op`` and
    ``_delta_scoped``: a delete that a partition replace made, which removes the key from the
    entry's own partition only)."""
    spec = writer.spec
    gen = quote(spec.target.metadata.generation)
    return (
        f"SELECT d.*, coalesce(d._delta_op = 'delete' AND w.__w_mode = 'replace_partitions', false) AS _delta_scoped "
        f"FROM {delta_table(spec.dataset)} d "
        f"LEFT JOIN (SELECT seq AS __w_seq, mode AS __w_mode FROM {SCHEMA}.writes) w ON w.__w_seq = d._delta_seq "
        f"WHERE d._delta_seq > {int(after_seq)} AND d._delta_seq <= {int(through_seq)} "
        f"AND d._delta_namespace = {str_list([plan.from_namespace])} "
        f"AND d.{gen} NOT IN (SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL)"
    )


def latest_delta_sql(writer: Writer, plan: RepairPlan, after_seq: int, through_seq: int) -> str:
    """The last valid delta entry per key in the window: which keys the window touched, and where."""
    key = quote_all(writer.spec.key)
    return (
        f"SELECT * FROM ({window_delta_sql(writer, plan, after_seq, through_seq)}) "
        f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY _delta_seq DESC, _delta_op DESC) = 1"
    )


def fold_delta(
    s: Session,
    writer: Writer,
    plan: RepairPlan,
    *,
    after_seq: int,
    through_seq: int,
    start: str,
    columns: list[str],
    out: str,
) -> int:
    """Create temp table ``out``: for every key with an entry in the window, the row it ends with
    when the window's entries are applied in commit order to its row in ``start`` (a relation
    with ``columns``; its newest row per key). Columns: ``columns``, ``__present`` (the key
    still has a row), ``__started`` (``start`` held it), ``__from_entry`` (the row is an entry's).
    Returns the number of keys."""
    spec = writer.spec
    key = quote_all(spec.key)
    sv, part = quote(spec.target.metadata.source_version), quote(spec.target.partition)
    cols = quote_all(columns)
    s.temp_table(
        "__fold_entries",
        f"SELECT {cols}, _delta_op, _delta_scoped, "
        f"row_number() OVER (PARTITION BY {key} ORDER BY _delta_seq, _delta_op, {sv}) AS __rank "
        f"FROM ({window_delta_sql(writer, plan, after_seq, through_seq)})",
    )
    # each statement creates a temp table, none writes one in place (the Spark engine keeps temp tables
    # as query results it cannot update)
    absent = ", ".join(quote(c) if c in spec.key else f"NULL AS {quote(c)}" for c in columns)
    s.temp_table(
        "__fold_state_0",
        f"SELECT {cols}, true AS __present, true AS __started, false AS __from_entry FROM {start} "
        f"SEMI JOIN (SELECT {key} FROM __fold_entries) USING ({key}) "
        f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY {sv} DESC) = 1 "
        f"UNION ALL "
        f"SELECT {absent}, false AS __present, false AS __started, false AS __from_entry "
        f"FROM (SELECT DISTINCT {key} FROM __fold_entries) ANTI JOIN {start} USING ({key})",
    )
    rounds = int(s.scalar("SELECT coalesce(max(__rank), 0) FROM __fold_entries") or 0)
    up = f"coalesce(e._delta_op = 'upsert' AND (NOT o.__present OR e.{sv} > o.{sv}), false)"
    down = (
        f"coalesce(e._delta_op = 'delete' AND o.__present AND o.{sv} <= e.{sv} AND "
        f"(NOT e._delta_scoped OR CAST(o.{part} AS VARCHAR) IS NOT DISTINCT FROM CAST(e.{part} AS VARCHAR)), false)"
    )
    picked = ", ".join(
        f"o.{quote(c)}" if c in spec.key else f"CASE WHEN {up} THEN e.{quote(c)} ELSE o.{quote(c)} END AS {quote(c)}"
        for c in columns
    )
    for rank in range(1, rounds + 1):
        s.temp_table(
            f"__fold_state_{rank % 2}",
            f"SELECT {picked}, "
            f"CASE WHEN {up} THEN true WHEN {down} THEN false ELSE o.__present END AS __present, o.__started, "
            f"CASE WHEN {up} THEN true WHEN {down} THEN false ELSE o.__from_entry END AS __from_entry "
            f"FROM __fold_state_{(rank - 1) % 2} o LEFT JOIN (SELECT * FROM __fold_entries WHERE __rank = {rank}) e "
            f"ON {' AND '.join(f'e.{quote(k)} = o.{quote(k)}' for k in spec.key)}",
        )
    s.temp_table(out, f"SELECT * FROM __fold_state_{rounds % 2}")
    for t in ("__fold_state_0", "__fold_state_1", "__fold_entries"):
        s.drop_relation(t)
    return int(s.scalar(f"SELECT count(*) FROM {out}") or 0)


def replay_in(
    s: Session,
    writer: Writer,
    plan: RepairPlan,
    *,
    after_seq: int,
    through_seq: int,
    stage: str,
    run_id: str | None = None,
) -> ReplayResult:
    """Replay ``(after_seq, through_seq]`` inside the caller's transaction."""
    spec = writer.spec
    key = quote_all(spec.key)
    sv = quote(spec.target.metadata.source_version)
    ns = namespace_sql(plan.namespace)
    cols = [c for c, _ in s.columns(ns)]
    total = fold_delta(
        s, writer, plan, after_seq=after_seq, through_seq=through_seq, start=ns, columns=cols, out="__replay"
    )
    rebuilt = f"({key}) IN (SELECT {key} FROM {snapshot_table(spec)})"
    upserts = f"SELECT {quote_all(cols)} FROM __replay WHERE __present AND __from_entry AND {rebuilt}"
    deletes = f"SELECT {key}, {sv} FROM __replay WHERE __started AND NOT __present AND {rebuilt}"
    n_up = int(s.scalar(f"SELECT count(*) FROM ({upserts})") or 0)
    n_del = int(s.scalar(f"SELECT count(*) FROM ({deletes})") or 0)
    note = f"delta replay ({stage}) of seq ({after_seq}, {through_seq}]"
    # a carried key (one the snapshot does not rebuild) needs no repair: it ends as the published
    # table holds it now, the backfill's fenced rows left out (only keys whose rows differ are rewritten,
    # so a second replay of the window changes nothing)
    gen = quote(spec.target.metadata.generation)
    all_cols = quote_all(cols)
    s.temp_table("__replay_carried", f"SELECT {key} FROM __replay WHERE NOT ({rebuilt})")
    mirrored = removed = 0
    if int(s.scalar("SELECT count(*) FROM __replay_carried") or 0):
        s.temp_table(
            "__replay_all_mirror",
            f"SELECT {all_cols} FROM "
            f"{namespace_sql(plan.from_namespace)} SEMI JOIN __replay_carried USING ({key}) "
            f"WHERE {gen} NOT IN (SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL)",
        )
        held = f"SELECT {all_cols} FROM {ns} SEMI JOIN __replay_carried USING ({key})"
        s.temp_table(
            "__replay_changed",
            f"SELECT DISTINCT {key} FROM ("
            f"(SELECT * FROM __replay_all_mirror EXCEPT {held}) UNION ALL ({held} EXCEPT SELECT * "
            "FROM __replay_all_mirror))",
        )
        s.temp_table(
            "__replay_carried_del",
            f"SELECT {key}, max({sv}) AS {sv} FROM {ns} SEMI JOIN __replay_changed USING ({key}) GROUP BY ALL",
        )
        s.temp_table("__replay_mirror", f"SELECT * FROM __replay_all_mirror SEMI JOIN __replay_changed USING ({key})")
        mirrored = int(s.scalar(f"SELECT count(DISTINCT ({key})) FROM __replay_mirror") or 0)
        removed = int(s.scalar("SELECT count(*) FROM __replay_changed") or 0) - mirrored
        if int(s.scalar("SELECT count(*) FROM __replay_carried_del") or 0):
            writer.write_in(
                s, plan.generation, "SELECT * FROM __replay_carried_del", mode="delete_keys", run_id=run_id, note=note
            )
        if mirrored:
            writer.write_in(
                s,
                plan.generation,
                "SELECT * FROM __replay_mirror",
                mode="append",
                run_id=run_id,
                note=note + " (carried keys, as published)",
                keep_stamps=True,
                existing_keys=False,
            )
    if n_up:
        s.temp_table("__replay_up", f"{upserts}")
        writer.write_in(
            s,
            plan.generation,
            "SELECT * FROM __replay_up",
            mode="upsert_keys",
            run_id=run_id,
            note=note,
            keep_stamps=True,
        )
    if n_del:
        s.temp_table("__replay_del", f"{deletes}")
        writer.write_in(s, plan.generation, "SELECT * FROM __replay_del", mode="delete_keys", run_id=run_id, note=note)
    n_up, n_del = n_up + mirrored, n_del + removed
    result = ReplayResult(after_seq, through_seq, n_up, n_del, total - n_up - n_del)
    s.execute(
        f"INSERT INTO {REPLAYS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [plan.incident_id, stage, after_seq, through_seq, n_up, n_del, result.skipped_older, utcnow(), run_id],
    )
    for t in (
        "__replay",
        "__replay_up",
        "__replay_del",
        "__replay_carried",
        "__replay_carried_del",
        "__replay_mirror",
        "__replay_changed",
        "__replay_all_mirror",
    ):
        s.drop_relation(t)
    return result


def committed_seq(s: Session) -> int:
    """The last commit sequence visible to this transaction; a later commit conflicts with it."""
    return int(s.scalar(f"SELECT seq FROM {SCHEMA}.clock WHERE id = 1"))
