"""Drift per partition: the public target vs the source's expected rows, in SQL.

For the partitions in scope, every key present on either side (in scope on either
side, so a key that moved partition is seen from both) is compared by its full
expected row (partition, payload and source version; a target row that carries no
source version, as an IO-manager frame may not, by its payload). A key is

- ``missing``: expected, not in the target;
- ``extra``: in the target, not expected (e.g. a tombstone never applied);
- ``changed``: both, but the row differs (an update never applied);
- ``duplicate``: more than one row in the target.

Each key counts in the partitions it sits in on either side. Only per-partition
counts and a few sample keys leave the engine. On DuckDB a partition whose rows have the
same count and the same sum of row hashes on both sides holds the same rows, so only the
keys with a row in a partition that differs are compared one by one. A convergence
check compares with the source as it is now and leaves out the keys whose changes
are still pending in that partition (``recovery.lib.convergence.pending``): for
every other key, the source now and as of the watermark agree.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib.convergence.pending import same_row_sql
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.reconcile.expected_cache import drop_staged, expected_rows

SAMPLE_KEYS = 5


def key_text(spec: DatasetSpec, alias: str = "") -> str:
    prefix = f"{alias}." if alias else ""
    return " || '|' || ".join(f"coalesce(CAST({prefix}{quote(k)} AS VARCHAR), '∅')" for k in spec.key)


def stage_sides(s: Session, spec: DatasetSpec, watermark: datetime | None) -> list[str]:
    """Temp relations ``__cv_e`` (the expected rows as of ``watermark``, None: the source now) and
    ``__cv_t`` (the public target), each with its partition as text in ``__p``; returns the
    columns compared besides the key (partition, payload and source version)."""
    part = quote(spec.target.partition)
    # a view: the expected rows are kept (or caught up from the kept rows by the few changed keys), and
    # reading them four times costs less than copying them once, also with the keys changed since
    # caught up on every read
    relation = expected_rows(s, spec, watermark, keep=True)
    drop_staged(s, "__cv_e")
    cv_e = f"SELECT *, CAST({part} AS VARCHAR) AS __p FROM ({relation})"
    if isinstance(s, DuckDBSession):
        s.temp_view("__cv_e", cv_e)
    else:  # Spark: as it always was
        s.temp_table("__cv_e", cv_e)
    s.temp_view("__cv_t", f"SELECT *, CAST({part} AS VARCHAR) AS __p FROM {spec.target.table_name.sql()}")
    return [c for c, _ in s.columns("__cv_e") if c not in spec.key and c != "__p"]


def compare_partitions(
    s: Session, spec: DatasetSpec, scope: list[str], values: list[str], *, leave_out: str | None = None
) -> None:
    """Temp table ``__cv_drift`` (one row per partition of ``scope`` with its counts) from the staged
    sides: the partitions of ``scope``, compared key by key where
    they differ. ``leave_out`` names a relation of (key, ``p``) pairs that are not drift in that
    partition (pending changes, which ingestion has not reached yet)."""
    key = quote_all(spec.key)
    part = quote(spec.target.partition)
    s.temp_table("__cv_scope", "SELECT DISTINCT unnest(CAST(? AS VARCHAR[])) AS p", [scope])
    compared = quote_all(spec.key + values)
    if isinstance(s, DuckDBSession):
        # a partition whose rows hash to the same sum (and count) on both sides holds the same rows:
        # only the keys with a row in another partition are compared key by key (every drifting key has
        # a row in a partition that differs, and it is still counted in each partition it sits in), where
        # comparing every key joins the whole table. Spark's 32-bit hash is too narrow for this: it
        # compares every key.
        s.temp_table(
            "__cv_counts",
            f"""
            WITH ef AS (SELECT __p AS p, count(*) AS n, sum(hash({compared})) AS h FROM __cv_e
                        WHERE __p IN (SELECT p FROM __cv_scope) GROUP BY 1),
                 tf AS (SELECT __p AS p, count(*) AS n, sum(hash({compared})) AS h FROM __cv_t
                        WHERE __p IN (SELECT p FROM __cv_scope) GROUP BY 1)
            SELECT sc.p, coalesce(ef.n, 0) AS e_n, coalesce(tf.n, 0) AS t_n,
                   coalesce(ef.n, 0) = coalesce(tf.n, 0) AND ef.h IS NOT DISTINCT FROM tf.h AS same
            FROM __cv_scope sc LEFT JOIN ef ON ef.p = sc.p LEFT JOIN tf ON tf.p = sc.p""",
        )
        differing = [r[0] for r in s.fetchall("SELECT p FROM __cv_counts WHERE NOT same ORDER BY p")]
    else:
        s.temp_table(
            "__cv_counts",
            """
            WITH ec AS (SELECT __p AS p, count(*) AS n FROM __cv_e WHERE __p IN (SELECT p FROM __cv_scope) GROUP BY 1),
                 tc AS (SELECT __p AS p, count(*) AS n FROM __cv_t WHERE __p IN (SELECT p FROM __cv_scope) GROUP BY 1)
            SELECT sc.p, coalesce(ec.n, 0) AS e_n, coalesce(tc.n, 0) AS t_n, false AS same
            FROM __cv_scope sc LEFT JOIN ec ON ec.p = sc.p LEFT JOIN tc ON tc.p = sc.p""",
        )
        differing = scope
    s.temp_table("__cv_compared", "SELECT DISTINCT unnest(CAST(? AS VARCHAR[])) AS p", [differing])
    # the keys with a row in a differing partition on either side, every row of each compared (a key
    # moved into or out of scope is drift too); when those partitions are most of the table, the whole
    # table is compared instead and the rows out of scope dropped at the end, the same result without
    # collecting the keys (a pass over both sides) and joining both sides with them
    partitions = s.scalar(f"SELECT count(DISTINCT {part}) FROM {spec.target.table_name.sql()}") or 0
    if not differing:
        t_rows = e_rows = None
    elif 2 * len(set(differing)) >= partitions:
        t_rows, e_rows = "SELECT * FROM __cv_t", "SELECT * FROM __cv_e"
    else:
        s.temp_table(
            "__cv_keys",
            f"SELECT {key} FROM __cv_e WHERE __p IN (SELECT p FROM __cv_compared) "
            f"UNION SELECT {key} FROM __cv_t WHERE __p IN (SELECT p FROM __cv_compared)",
        )
        t_rows = f"SELECT * FROM __cv_t SEMI JOIN __cv_keys USING ({key})"
        e_rows = f"SELECT * FROM __cv_e SEMI JOIN __cv_keys USING ({key})"
    same = same_row_sql(spec, values)
    if t_rows is None:  # every partition in scope hashes alike on both sides: no key to compare
        s.temp_table(
            "__cv_keydiff",
            f"SELECT {key}, CAST(NULL AS VARCHAR) AS p, CAST(NULL AS VARCHAR) AS status FROM __cv_t WHERE false",
        )
    else:
        s.temp_table(
            "__cv_keydiff",
            f"""
        WITH t0 AS ({t_rows}),
             dup AS (SELECT {key}, count(*) AS __n FROM t0 GROUP BY ALL HAVING count(*) > 1),
             t AS (SELECT t0.*, coalesce(dup.__n, 1) AS __n, true AS __in_t FROM t0 LEFT JOIN dup USING ({key})),
             e AS (SELECT *, true AS __in_e FROM ({e_rows})),
             d AS (SELECT {key}, t.__p AS t_p, e.__p AS e_p,
                          CASE WHEN t.__n > 1 THEN 'duplicate' WHEN e.__in_e IS NULL THEN 'extra'
                               WHEN t.__in_t IS NULL THEN 'missing' WHEN NOT ({same}) THEN 'changed' END AS status
                   FROM t FULL OUTER JOIN e USING ({key}))
        SELECT * FROM (
            SELECT DISTINCT {key}, p, status FROM (SELECT *, unnest(list_distinct([t_p, e_p])) AS p FROM d
                WHERE status IS NOT NULL)
            WHERE p IN (SELECT p FROM __cv_scope)){f" ANTI JOIN {leave_out} USING ({key}, p)" if leave_out else ""}""",
        )
    s.temp_table(
        "__cv_drift",
        f"""
        WITH kd AS (SELECT p, count(DISTINCT ({key})) FILTER (WHERE status = 'missing') AS missing,
                           count(DISTINCT ({key})) FILTER (WHERE status = 'extra') AS extra,
                           count(DISTINCT ({key})) FILTER (WHERE status = 'changed') AS changed,
                           count(DISTINCT ({key})) FILTER (WHERE status = 'duplicate') AS duplicate,
                           count(DISTINCT ({key})) AS drift_keys,
                           array_slice(list_sort(list(DISTINCT {key_text(spec)})), 1, {SAMPLE_KEYS}) AS sample_keys
                    FROM __cv_keydiff GROUP BY 1)
        SELECT sc.p AS partition, sc.e_n AS expected_rows, sc.t_n AS actual_rows,
               coalesce(kd.missing, 0) AS missing, coalesce(kd.extra, 0) AS extra, coalesce(kd.changed, 0) AS changed,
               coalesce(kd.duplicate, 0) AS duplicate, coalesce(kd.drift_keys, 0) AS drift_keys,
               coalesce(kd.sample_keys, CAST([] AS VARCHAR[])) AS sample_keys
        FROM __cv_counts sc LEFT JOIN kd ON kd.p = sc.p""",
    )
    for t in ("__cv_keys", "__cv_keydiff", "__cv_counts", "__cv_compared"):
        s.drop_relation(t)
