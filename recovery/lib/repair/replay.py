"""Replay the delta log onto the repair generation: by key and source version.

Normal ingestion keeps writing to the published namespace during the repair; each
of its writes is in the dataset's append-only delta log with its commit sequence.
The replay takes, per key, the last entry written by a non-fenced generation into
the published namespace in ``(after_seq, through_seq]`` and applies it when it is
newer than what the repair holds: an upsert with a higher source version replaces
the row (wherever it sits), a delete removes a row of the same or an older version.
Because it compares versions instead of re-applying writes, replaying a window
twice, or a wider window, changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib.control_plane import SCHEMA, delta_table, utcnow
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.namespaces import namespace_sql
from recovery.lib.repair.plan import RepairPlan
from recovery.lib.repair.tables import REPLAYS
from recovery.lib.snapshot import str_list
from recovery.lib.writer import Writer


@dataclass(frozen=True)
class ReplayResult:
    after_seq: int
    through_seq: int
    upserted: int
    deleted: int
    skipped_older: int


def latest_delta_sql(writer: Writer, plan: RepairPlan, after_seq: int, through_seq: int) -> str:
    """The last valid delta entry per key in the window (payload columns plus ``_delta_op``)."""
    spec = writer.spec
    key = quote_all(spec.key)
    gen = quote(spec.target.metadata.generation)
    return (
        f"SELECT * FROM {delta_table(spec.dataset)} "
        f"WHERE _delta_seq > {int(after_seq)} AND _delta_seq <= {int(through_seq)} "
        f"AND _delta_namespace = {str_list([plan.from_namespace])} "
        f"AND {gen} NOT IN (SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL) "
        f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY _delta_seq DESC, _delta_op DESC) = 1"
    )


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
    meta = spec.target.metadata
    key = quote_all(spec.key)
    sv = quote(meta.source_version)
    ns = namespace_sql(plan.namespace)
    s.execute(
        f"CREATE OR REPLACE TEMP TABLE __latest_delta AS {latest_delta_sql(writer, plan, after_seq, through_seq)}"
    )
    # the held version of the window's keys only (grouping the whole generation for a handful of
    # replayed keys took 1 s at 10M events, and a publish replays three times)
    s.execute(
        f"CREATE OR REPLACE TEMP TABLE __replay AS SELECT d.*, r.{sv} AS __held_version FROM __latest_delta d "
        f"LEFT JOIN (SELECT {key}, max({sv}) AS {sv} FROM {ns} SEMI JOIN __latest_delta USING ({key}) GROUP BY ALL) r "
        f"USING ({key})"
    )
    cols = [c for c, _ in s.columns(ns)]
    upserts = (
        f"SELECT {quote_all(cols)} FROM __replay WHERE _delta_op = 'upsert' "
        f"AND (__held_version IS NULL OR {sv} > __held_version)"
    )
    deletes = (
        f"SELECT {key}, {sv} FROM __replay WHERE _delta_op = 'delete' "
        f"AND __held_version IS NOT NULL AND __held_version <= {sv}"
    )
    n_up = int(s.scalar(f"SELECT count(*) FROM ({upserts})") or 0)
    n_del = int(s.scalar(f"SELECT count(*) FROM ({deletes})") or 0)
    total = int(s.scalar("SELECT count(*) FROM __replay") or 0)
    note = f"delta replay ({stage}) of seq ({after_seq}, {through_seq}]"
    if n_up:
        s.execute(f"CREATE OR REPLACE TEMP TABLE __replay_up AS {upserts}")
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
        s.execute(f"CREATE OR REPLACE TEMP TABLE __replay_del AS {deletes}")
        writer.write_in(s, plan.generation, "SELECT * FROM __replay_del", mode="delete_keys", run_id=run_id, note=note)
    result = ReplayResult(after_seq, through_seq, n_up, n_del, total - n_up - n_del)
    s.execute(
        f"INSERT INTO {REPLAYS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [plan.incident_id, stage, after_seq, through_seq, n_up, n_del, result.skipped_older, utcnow(), run_id],
    )
    for t in ("__latest_delta", "__replay", "__replay_up", "__replay_del"):
        s.execute(f"DROP TABLE IF EXISTS {t}")
    return result


def committed_seq(s: Session) -> int:
    """The last commit sequence visible to this transaction; a later commit conflicts with it."""
    return int(s.scalar(f"SELECT seq FROM {SCHEMA}.clock WHERE id = 1"))
