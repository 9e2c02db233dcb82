"""A lakehouse table's commit log, brought into the package's write log, commit by commit.

Every commit of the target since the last sync becomes what a write of the package's
own writer would have left: its net rows (the rows of the files it added less those of
the files it removed, as multisets, so a rewritten file's unchanged rows cancel) appended
to the dataset's write log with one commit sequence per commit (upserts as they are,
removals stamped with the commit's generation and time), one row in ``writes`` (the
commit's operation as its mode), its generation registered, and the rows applied to the
target's copy in the warehouse file: the public name before containment, the published
namespace after it. So ``deleted``, ``overwritten``, ``stale`` and ``out_of_order`` rest on
the table's own history, with no registry.

After the fence (``fence.py``) only the package's own fenced-aware writers are applied
(commits stamped ``recovery.writer``: the concurrent ingestion a repair replays); a
commit by any other writer, or by a fenced generation, is recorded with its rows and
partitions and reported, never applied: it is kept out of the repair. The package's own
publish commit is recorded, not applied (the published namespace already holds it).

Heavy work is SQL: the data files of all new commits are read once, by one
``read_parquet`` per partition group, and netted by one ``GROUP BY``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, delta_table, ensure_control_plane, utcnow
from recovery.lib.control.tables import COMMITS, FENCES, LAKEHOUSE_DDL, TABLES  # noqa: F401 - re-exported
from recovery.lib.dataset_spec.lakehouse import LakehouseTable
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.identifiers import TableName, quote, quote_all
from recovery.lib.lakehouse.formats import Commit, TableLog, UnsupportedTable, open_log
from recovery.lib.lakehouse.relations import duckdb_columns, files_sql
from recovery.lib.pointers.namespaces import current_namespace, namespace_sql
from recovery.lib.retry import retrying

WRITER_PROPERTY = "recovery.writer"
GENERATION_PROPERTY = "recovery.generation"
INCIDENT_PROPERTY = "recovery.incident"
APPLIED = ("history", "captured")
STATUS_NOTES = {
    "history": "applied: history before the fence",
    "captured": "applied: the package's own writer after the fence (concurrent ingestion, replayed by the repair)",
    "foreign": "NOT applied: a writer outside the package committed after the fence; kept out of the repair",
    "fenced": "NOT applied: a fenced generation committed after the fence; kept out of the repair",
    "published": "the package's publish commit",
    "no_change": "no row changed (compaction, metadata)",
}


@dataclass(frozen=True)
class SyncResult:
    location: str
    version: int | None
    commits: int
    applied: int
    not_applied: list[dict]

    def lines(self) -> list[str]:
        out = []
        if self.commits:
            out.append(
                f"{self.location}: {self.commits} new commit(s) up to version {self.version} read from its history, "
                f"{self.applied} applied to the write log"
            )
        for c in self.not_applied:
            out.append(
                f"{self.location} version {c['version']} ({c['operation']}, "
                f"generation {c['generation'] or 'unknown'}): "
                f"{STATUS_NOTES[c['status']]}; partitions {', '.join(c['partitions'] or []) or 'none'}"
            )
        return out


def ensure_tables(s: Session) -> None:
    ensure_control_plane(s)
    for stmt in LAKEHOUSE_DDL:
        s.execute(stmt)


def has_lakehouse(spec: DatasetSpec) -> bool:
    return spec.target.lakehouse is not None or spec.source.lakehouse is not None


def sync(engine: Engine, spec: DatasetSpec) -> list[SyncResult]:
    """Bring the warehouse file up to date with the spec's lakehouse tables (idempotent, incremental)."""
    out = []
    if spec.source.lakehouse is not None:
        _sync_source(engine, spec, spec.source.lakehouse)
    if spec.target.lakehouse is not None:
        out.append(retrying(lambda: _sync_target(engine, spec, spec.target.lakehouse)))  # type: ignore[arg-type]
    return out


def _open(table: LakehouseTable, field: str) -> TableLog:
    try:
        return open_log(table)
    except UnsupportedTable:
        raise
    except Exception as e:  # the format libraries' own errors: a missing table, a catalog that is not there
        raise SpecError(
            field, f"cannot open {table.format} table {table.location}: {e}", "check its location"
        ) from None


def _sync_source(engine: Engine, spec: DatasetSpec, table: LakehouseTable) -> None:
    """The change log as a view over its current data files, re-pointed when the table moved."""
    log = _open(table, "source.lakehouse")
    head = log.head()
    name = spec.source.table_name
    with engine.transaction() as s:
        ensure_tables(s)
        known = s.scalar(f"SELECT version FROM {TABLES} WHERE dataset = ? AND role = 'source'", [spec.dataset])
        if known is not None and known == head and s.object_kind(name.schema, name.name) == "view":
            return
        columns = duckdb_columns(log.schema(), "source.lakehouse")
        s.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(name.schema)}")
        s.swap_pointer(name.sql(), files_sql(log.files(head), columns))
        s.execute(f"DELETE FROM {TABLES} WHERE dataset = ? AND role = 'source'", [spec.dataset])
        s.execute(
            f"INSERT INTO {TABLES} VALUES (?, 'source', ?, ?, ?, ?)",
            [spec.dataset, table.location, table.format, head, utcnow()],
        )


def _written_at(commit: Commit, table: LakehouseTable) -> datetime:
    raw = commit.properties.get(table.written_at_property) if table.written_at_property else None
    if raw:
        try:
            return datetime.fromisoformat(raw.replace("Z", "+00:00")).replace(tzinfo=None)
        except ValueError:
            pass
    return commit.committed_at


def _status(commit: Commit, fence: int | None, fenced: set[str], generation: str | None) -> str:
    writer = commit.properties.get(WRITER_PROPERTY)
    if writer == "publish":
        return "published"
    if fence is None or commit.version <= fence:
        return "history"
    if generation in fenced:
        return "fenced"
    return "captured" if writer else "foreign"


def target_relation(s: Session, spec: DatasetSpec) -> str:
    """Where the target's rows live in the warehouse file: the published namespace once managed."""
    ns = current_namespace(s, spec) if s.object_kind(SCHEMA, "pointers") else None
    return ns or str(spec.target.table_name)


def _sync_target(engine: Engine, spec: DatasetSpec, table: LakehouseTable) -> SyncResult:
    log = _open(table, "target.lakehouse")
    head = log.head()
    with engine.transaction() as s:
        ensure_tables(s)
        last = s.scalar(f"SELECT version FROM {TABLES} WHERE dataset = ? AND role = 'target'", [spec.dataset])
        if last is not None and last == head:
            return SyncResult(table.location, head, 0, 0, [])
        commits = log.commits(after=last)
        bad = next((c for c in commits if c.unsupported), None)
        if bad is not None:
            raise UnsupportedTable(
                f"{table.location} version {bad.version} uses {bad.unsupported}, which the package cannot read "
                f"from the data files correctly: recover this table another way (nothing was written)"
            )
        columns = duckdb_columns(log.schema(), "target.lakehouse")
        meta = spec.target.metadata
        missing = [c for c in meta.columns + spec.key + [spec.target.partition] if c not in dict(columns)]
        if missing:
            raise SpecError(
                "target.metadata",
                f"{table.location} has no column {missing[0]!r} (columns: {', '.join(c for c, _ in columns)})",
                "name the table's own generation, source-version and written-at columns (its rows must carry them)",
            )
        relation = target_relation(s, spec)
        rel = TableName.parse(relation)
        if s.object_kind(rel.schema, rel.name) is None:
            s.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(rel.schema)}")
            s.materialize(rel.sql(), files_sql([], columns))
        names = [c for c, _ in columns]
        s.materialize(
            delta_table(spec.dataset),
            "SELECT *, CAST(NULL AS BIGINT) AS _delta_seq, "
            f"CAST(NULL AS VARCHAR) AS _delta_op, CAST(NULL AS VARCHAR) AS _delta_namespace FROM {rel.sql()} LIMIT 0",
            keep_existing=True,
        )
        _net_rows(s, commits, columns)
        fence = s.scalar(f"SELECT min(version) FROM {FENCES} WHERE dataset = ?", [spec.dataset])
        fenced = {
            r[0]
            for r in s.fetchall(
                f"SELECT generation FROM {SCHEMA}.generations WHERE dataset = ? AND fenced_at IS NOT NULL",
                [spec.dataset],
            )
        }
        from_rows = dict(
            s.fetchall(
                f"SELECT __v, min({quote(meta.generation)}) FROM __lh_net WHERE __n > 0 GROUP BY __v "
                f"HAVING count(DISTINCT {quote(meta.generation)}) = 1"
            )
        )
        rows = []
        for c in commits:
            gen = c.properties.get(table.generation_property) or c.properties.get(GENERATION_PROPERTY)
            gen = gen or from_rows.get(c.version)
            rows.append((c, gen, _status(c, fence, fenced, gen)))
        counted = dict(
            (r[0], r[1:])
            for r in s.fetchall(
                f"SELECT __v, sum(__n) FILTER (WHERE __n > 0), -sum(__n) FILTER (WHERE __n < 0), "
                f"list(DISTINCT CAST({quote(spec.target.partition)} AS VARCHAR) ORDER BY 1) FROM __lh_net GROUP BY __v"
            )
        )
        base = int(s.scalar(f"SELECT seq FROM {SCHEMA}.clock WHERE id = 1"))
        seqs: dict[int, int] = {}
        for c, _gen, status in rows:
            if status in APPLIED and c.version in counted:
                seqs[c.version] = base + len(seqs) + 1
        if seqs:
            s.execute(f"UPDATE {SCHEMA}.clock SET seq = ? WHERE id = 1", [base + len(seqs)])
        s.temp_table(
            "__lh_commits",
            "SELECT unnest(?::BIGINT[]) AS __v, "
            "unnest(?::BIGINT[]) AS __seq, "
            "unnest(?::VARCHAR[]) AS __gen, unnest(?::TIMESTAMP[]) AS __at",
            [
                [c.version for c, _, _ in rows if c.version in seqs],
                [seqs[c.version] for c, _, _ in rows if c.version in seqs],
                [g for c, g, _ in rows if c.version in seqs],
                [_written_at(c, table) for c, _, _ in rows if c.version in seqs],
            ],
        )
        if seqs:
            _apply(s, spec, relation, names)
        now = utcnow()
        for c, gen, status in rows:
            added, removed, parts = counted.get(c.version, (0, 0, []))
            s.execute(
                f"INSERT INTO {COMMITS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    spec.dataset,
                    table.location,
                    c.version,
                    c.ref,
                    c.committed_at,
                    _written_at(c, table),
                    c.operation,
                    gen,
                    c.properties.get(WRITER_PROPERTY),
                    c.properties.get(INCIDENT_PROPERTY),
                    status if c.version in counted or status not in APPLIED else "no_change",
                    seqs.get(c.version),
                    len(c.added),
                    len(c.removed),
                    int(added or 0),
                    int(removed or 0),
                    parts,
                    json.dumps(c.properties),
                    now,
                ],
            )
            if c.version in seqs:
                _record_write(s, spec, c, gen, seqs[c.version], relation, int(added or 0), int(removed or 0), parts)
        _register_generations(s, spec, table)
        not_applied = []
        for c, gen, status in rows:
            if status in ("foreign", "fenced"):
                parts = counted.get(c.version, (0, 0, []))[2]
                not_applied.append(
                    {
                        "version": c.version,
                        "operation": c.operation,
                        "generation": gen,
                        "status": status,
                        "partitions": parts,
                    }
                )
                EventSource(dataset=spec.dataset, actor="lakehouse_sync").record(
                    s,
                    "lakehouse_commit_after_fence",
                    f"{table.location} version {c.version} ({c.operation}, generation {gen or 'unknown'}) "
                    f"committed after the fence: {STATUS_NOTES[status]}",
                    {"version": c.version, "status": status, "partitions": parts, "ref": c.ref},
                )
        s.execute(f"DELETE FROM {TABLES} WHERE dataset = ? AND role = 'target'", [spec.dataset])
        s.execute(
            f"INSERT INTO {TABLES} VALUES (?, 'target', ?, ?, ?, ?)",
            [spec.dataset, table.location, table.format, head, now],
        )
        for t in ("__lh_files", "__lh_net", "__lh_commits"):
            s.drop_relation(t)
        faults.checkpoint("lake_sync:recorded")  # the commits, their rows and writes recorded, not committed
        return SyncResult(table.location, head, len(commits), len(seqs), not_applied)


def _net_rows(s: Session, commits: list[Commit], columns: list[tuple[str, str]]) -> None:
    """``__lh_net``: each commit's net rows (the table's columns, ``__v`` its version, ``__n`` copies added,
    negative when removed)."""
    paths, versions, signs = [], [], []
    for c in commits:
        for f, sign in [(f, 1) for f in c.added] + [(f, -1) for f in c.removed]:
            paths.append(f.path)
            versions.append(c.version)
            signs.append(sign)
    s.temp_table(
        "__lh_files",
        "SELECT unnest(?::VARCHAR[]) AS filename, unnest(?::BIGINT[]) AS __v, unnest(?::INTEGER[]) AS __sign",
        [paths, versions, signs],
    )
    # a commit that only adds files (an append, a first load) adds every row of them: no netting needed
    appends = [c for c in commits if c.added and not c.removed]
    mixed = [c for c in commits if c.removed]
    cols = quote_all([c for c, _ in columns])
    parts = []
    if appends:
        files = list({f.path: f for c in appends for f in c.added}.values())
        parts.append(
            f"SELECT {cols}, f.__v, 1 AS __n FROM ({files_sql(files, columns, filename=True)}) r "
            f"JOIN __lh_files f USING (filename) WHERE f.__v IN ({', '.join(str(c.version) for c in appends)})"
        )
    if mixed:
        files = list({f.path: f for c in mixed for f in c.added + c.removed}.values())
        parts.append(
            f"SELECT {cols}, __v, sum(__sign) AS __n FROM ({files_sql(files, columns, filename=True)}) r "
            f"JOIN __lh_files f USING (filename) WHERE f.__v IN ({', '.join(str(c.version) for c in mixed)}) "
            f"GROUP BY ALL HAVING sum(__sign) <> 0"
        )
    s.temp_table(
        "__lh_net",
        f"{' UNION ALL '.join(parts)}"
        if parts
        else f"SELECT *, CAST(NULL AS BIGINT) AS __v, CAST(NULL AS HUGEINT) AS __n FROM ({files_sql([], columns)})",
    )


def _copies(where: str) -> str:
    """``__lh_net`` rows matching ``where``, each repeated ``abs(__n)`` times."""
    return (
        "SELECT * EXCLUDE (__k) FROM (SELECT *, unnest(range(CAST(abs(__n) AS BIGINT))) AS __k FROM __lh_net "
        f"WHERE {where})"
    )


def _apply(s: Session, spec: DatasetSpec, relation: str, names: list[str]) -> None:
    """Append the applied commits' rows to the write log and apply their net effect to ``relation``."""
    meta = spec.target.metadata
    cols = quote_all(names)
    applied = "__v IN (SELECT __v FROM __lh_commits)"
    stamped = ", ".join(
        "coalesce(c.__gen, x." + quote(n) + ")"
        if n == meta.generation
        else "c.__at"
        if n == meta.written_at
        else f"x.{quote(n)}"
        for n in names
    )
    log = delta_table(spec.dataset)
    s.replace_rows(
        log,
        [*names, "_delta_seq", "_delta_op", "_delta_namespace"],
        insert=f"SELECT {stamped}, c.__seq, 'delete', ? "
        f"FROM ({_copies(applied + ' AND __n < 0')}) x JOIN __lh_commits c USING (__v) "
        f"UNION ALL SELECT {', '.join(f'x.{quote(n)}' for n in names)}, c.__seq, 'upsert', ? "
        f"FROM ({_copies(applied + ' AND __n > 0')}) x JOIN __lh_commits c USING (__v)",
        params=[relation, relation],
    )
    target = namespace_sql(relation)
    s.temp_table(
        "__lh_batch", f"SELECT {cols}, sum(__n) AS __n FROM __lh_net WHERE {applied} GROUP BY ALL HAVING sum(__n) <> 0"
    )
    same = " AND ".join(f"t.{quote(n)} IS NOT DISTINCT FROM d.{quote(n)}" for n in names)
    s.execute(
        f"DELETE FROM {target} WHERE rowid IN (SELECT __rid FROM (SELECT t.rowid AS __rid, d.__n, "
        f"row_number() OVER (PARTITION BY {', '.join(f't.{quote(n)}' for n in names)}) AS __rn "
        f"FROM {target} t JOIN (SELECT * FROM __lh_batch WHERE __n < 0) d ON {same}) WHERE __rn <= -__n)"
    )
    s.execute(
        f"INSERT INTO {target} ({cols}) SELECT {cols} FROM (SELECT * EXCLUDE (__k) FROM "
        f"(SELECT *, unnest(range(CAST(__n AS BIGINT))) AS __k FROM __lh_batch WHERE __n > 0))"
    )
    s.drop_relation("__lh_batch")


def _mode(c: Commit, added: int, removed: int) -> str:
    """The writer's mode a commit amounts to. Only an explicit ``recovery.mode`` says ``delete_keys``
    (a tombstone applied): a format's delete also serves partition overwrites (Iceberg's overwrite is a
    delete and an append), whose removals are not source changes."""
    declared = c.properties.get("recovery.mode")
    if declared:
        return declared
    op = c.operation.upper()
    if not removed:
        return "append"
    if not added:
        return "delete_rows"
    if "OVERWRITE" in op or op in ("WRITE", "REPLACE TABLE", "CREATE OR REPLACE TABLE"):
        return "replace_partitions"
    return "upsert_keys"


def _record_write(
    s: Session,
    spec: DatasetSpec,
    c: Commit,
    gen: str | None,
    seq: int,
    relation: str,
    added: int,
    removed: int,
    parts: list[str],
) -> None:
    lake = spec.target.lakehouse
    assert lake is not None
    s.execute(
        f"INSERT INTO {SCHEMA}.writes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            seq,
            spec.dataset,
            gen,
            relation,
            _mode(c, added, removed),
            parts,
            added,
            removed,
            _written_at(c, lake),
            c.committed_at,
            c.properties.get("recovery.run_id"),
            f"{lake.format} version {c.version} ({c.operation}) of {lake.location}",
        ],
    )


def _register_generations(s: Session, spec: DatasetSpec, table: LakehouseTable) -> None:
    """Every generation the history shows, with its first and last write (inferred, as an adopted table's)."""
    kinds = {}
    if table.kind_property:
        for props, gen in s.fetchall(
            f"SELECT properties, generation FROM {COMMITS} WHERE dataset = ? AND generation IS NOT NULL",
            [spec.dataset],
        ):
            value = json.loads(props).get(table.kind_property)
            if value is not None:
                kinds[gen] = "backfill" if value == "backfill" else "ingest"
    known = {r[0] for r in s.fetchall(f"SELECT generation FROM {SCHEMA}.generations WHERE dataset = ?", [spec.dataset])}
    for gen, first, last, n in s.fetchall(
        f"SELECT generation, min(written_at), max(written_at), count(*) FROM {SCHEMA}.writes "
        f"WHERE dataset = ? AND generation IS NOT NULL GROUP BY 1",
        [spec.dataset],
    ):
        if gen in known:
            s.execute(
                f"UPDATE {SCHEMA}.generations SET started_at = least(started_at, ?), ended_at = greatest(ended_at, ?) "
                f"WHERE generation = ? AND inferred",
                [first, last, gen],
            )
            continue
        s.execute(
            f"INSERT INTO {SCHEMA}.generations VALUES (?, ?, ?, 'complete', NULL, ?, ?, NULL, NULL, NULL, NULL, 1, "
            "NULL, "
            f"?, NULL, NULL, true, NULL, NULL, ?)",
            [
                gen,
                spec.dataset,
                kinds.get(gen, "unknown"),
                first,
                last,
                n,
                f"from the {table.format} history of {table.location}",
            ],
        )


def history_facts(s: Session, spec: DatasetSpec) -> dict | None:
    """What the reconciliation's basis rests on, for a lakehouse target: the table, its versions, the
    commits kept out of the repair. None for a target in the warehouse file itself."""
    lake = spec.target.lakehouse
    if lake is None or s.object_kind(SCHEMA, "lakehouse_commits") is None:
        return None
    row = s.fetchone(
        f"SELECT min(version), max(version), count(*), count(*) FILTER (WHERE status IN ('history', 'captured')) "
        f"FROM {COMMITS} WHERE dataset = ?",
        [spec.dataset],
    )
    fence = s.fetchone(
        f"SELECT version, ref, incident_id FROM {FENCES} WHERE dataset = ? ORDER BY version LIMIT 1", [spec.dataset]
    )
    kept_out = [
        {"version": v, "operation": op, "generation": g, "status": st, "partitions": list(p or [])}
        for v, op, g, st, p in s.fetchall(
            f"SELECT version, operation, generation, status, partitions FROM {COMMITS} "
            f"WHERE dataset = ? AND status IN ('foreign', 'fenced') ORDER BY version",
            [spec.dataset],
        )
    ]
    return {
        "format": lake.format,
        "table": lake.location,
        "versions": [row[0], row[1]] if row else None,
        "commits": row[2] if row else 0,
        "commits_in_write_log": row[3] if row else 0,
        "fence_version": fence[0] if fence else None,
        "fenced_by_incident": fence[2] if fence else None,
        "kept_out_of_repair": kept_out,
    }


def refuse_lakehouse(spec: DatasetSpec, what: str) -> None:
    """A verb that acts on the warehouse file's copy only is refused for a lakehouse target (nothing written)."""
    if spec.target.lakehouse is not None:
        raise RecoveryError(
            f"{what} of a lakehouse target ({spec.target.lakehouse.location}) is not supported yet: it would change "
            f"the warehouse file's copy, not the table; see docs/lakehouse.md"
        )
