"""The reconcile bench's floor: the whole classification as one hand-written DuckDB query.

One statement reads the same inputs as the package (the source change log, the spec's
transform, the target, the package's write log and generations registry) and assigns
every damaged key the label the package assigns (ARCHITECTURE.md "Damage vocabulary",
first match wins): resolve the change log to each key's latest version, apply the
transform, join with the target folded to its number of copies per key, and read the
write log once for the differing keys only. It is what a person who knows the rules
would write by hand, with nothing staged, persisted or summarized: the cost any
reconciliation has to pay.

It covers datasets written through the package (the write log covers the time
before the failed generation started, and holds the failed generation's writes); the
bench checks its labels key by key against the package's on every run.
"""

from __future__ import annotations

from recovery.lib.control.plane import SCHEMA, delta_table
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.identifiers import quote
from recovery.lib.snapshot import str_list


def floor_sql(spec: DatasetSpec, failed_generations: list[str], columns: list[str]) -> str:
    """``SELECT <key>, label`` for every damaged key. ``columns``: the target's columns
    (key, partition, payload, source version, generation, written-at)."""
    src, meta = spec.source, spec.target.metadata
    q = quote
    keys = [q(k) for k in spec.key]
    key = ", ".join(keys)
    gens = str_list(list(failed_generations))
    deletes = str_list(src.delete_ops)
    gen, sv, wat = q(meta.generation), q(meta.source_version), q(meta.written_at)
    part = spec.target.partition
    values = [c for c in columns if c not in spec.key and c not in (meta.generation, meta.written_at)]
    payload = [c for c in values if c != meta.source_version]
    same = lambda cs: " AND ".join([f"t.{q(c)} IS NOT DISTINCT FROM e.{q(c)}" for c in cs] or ["true"])  # noqa: E731
    no_part = [c for c in payload if c != part]
    failed_start = f"(SELECT min(started_at) FROM {SCHEMA}.generations WHERE generation IN ({gens}))"
    return f"""
    WITH latest AS (
        SELECT * FROM {src.table_name.sql()}
        QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY {q(src.version)} DESC) = 1),
    live AS (SELECT * FROM latest WHERE {q(src.op)} NOT IN ({deletes})),
    e AS (SELECT x.*, s.{q(src.version)} AS {sv}
          FROM ({render(spec.transform_sql, source="SELECT * FROM live")}) x JOIN live s USING ({key})),
    t AS (SELECT *, count(*) OVER (PARTITION BY {key}) AS __n FROM {spec.target.table_name.sql()}),
    d AS (SELECT {key}, t.__n, e.{sv} AS __esv, t.{sv} AS __tsv, t.{gen} AS __gen,
                 CASE
                   WHEN t.__n IS NULL THEN 'absent'
                   WHEN e.{sv} IS NULL THEN 'extra'
                   WHEN {same(no_part)} AND t.{q(part)} IS DISTINCT FROM e.{q(part)} THEN 'mispartitioned'
                   WHEN t.{sv} = e.{sv} AND NOT ({same(payload)}) THEN 'incorrectly_transformed'
                 END AS __shape
          FROM t FULL OUTER JOIN e USING ({key})
          WHERE t.__n IS NULL OR e.{sv} IS NULL OR t.__n > 1 OR NOT ({same(values)})),
    log AS (SELECT {key}, {gen} IN ({gens}) AS failed, {sv} AS v, {wat} AS w, _delta_seq AS seq, _delta_op AS op,
                   _delta_op = 'upsert' OR _delta_seq IN (SELECT seq FROM {SCHEMA}.writes WHERE mode = 'delete_keys'
                                                          AND generation IN ({gens})) AS applied
            FROM {delta_table(spec.dataset)} SEMI JOIN d USING ({key})),
    facts AS (
        SELECT {key},
               -- what the target held when the failed generation started: the key's last logged write by then
               arg_max(op, seq * 2 + CAST(op = 'upsert' AS INT)) FILTER (WHERE w <= {failed_start}) = 'upsert' AS held,
               -- a concurrent generation wrote a newer version before the failed generation's last write of the key
               min(seq) FILTER (WHERE NOT failed AND op = 'upsert' AND v > __tsv)
                 < max(seq) FILTER (WHERE failed AND op = 'upsert') AS concurrent,
               -- the failed generation applied a newer version (or the tombstone) before writing the one held
               min(seq) FILTER (WHERE failed AND applied AND v > __tsv)
                 < max(seq) FILTER (WHERE failed AND op = 'upsert' AND v = __tsv) AS reordered
        FROM log JOIN (SELECT DISTINCT {key}, __tsv FROM d WHERE coalesce(__n, 1) = 1) USING ({key}) GROUP BY ALL),
    one AS (
        SELECT d.*, f.held, coalesce(f.concurrent, false) AS concurrent, coalesce(f.reordered, false) AS reordered,
               l.{q(src.op)} IN ({deletes}) AS tomb, l.{q(src.ingested_at)} AS arrived
        FROM d LEFT JOIN facts f USING ({key}) LEFT JOIN latest l USING ({key}))
    SELECT DISTINCT {key},
           CASE
             WHEN __n > 1 THEN 'duplicate'
             WHEN __n = 1 AND __gen IN ({gens}) AND reordered THEN 'out_of_order'
             WHEN __shape = 'extra' AND tomb THEN 'resurrected'
             WHEN __shape = 'extra' THEN 'unexpected'
             WHEN __shape = 'absent' THEN CASE WHEN held THEN 'deleted' ELSE 'missing' END
             WHEN __shape = 'mispartitioned' THEN 'mispartitioned'
             WHEN __tsv < __esv AND __gen IN ({gens}) AND arrived > {failed_start} AND concurrent THEN 'overwritten'
             WHEN __tsv < __esv AND __gen IN ({gens}) THEN 'stale'
             WHEN __shape = 'incorrectly_transformed' THEN 'incorrectly_transformed'
             ELSE 'unexplained'
           END AS label
    FROM one
    """
