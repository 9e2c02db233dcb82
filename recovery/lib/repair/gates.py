"""The gates a repair passes before it may expand or publish.

Each gate is evaluated over a *scope* of partitions of the repair generation (the
partitions built so far after a wave; every rebuilt and carried partition for the
publish candidate's key-by-key gate, its rebuilt ones for the row-level suites,
qualified partitions excepted) against the *reference*: the
fixed snapshot's expected rows, overlaid with the delta replayed so far, plus the
published namespace's rows for carried partitions. Results go to
``_recovery.gate_results``; publish reads them back (a Dagster blocking check only
blocks within its own run).
"""

from __future__ import annotations

import json

from recovery.lib.control.plane import SCHEMA, utcnow
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.gates import GateResult, StoredGate
from recovery.lib.gates.store import latest_results
from recovery.lib.identifiers import quote, quote_all, ts_literal
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.repair.plan import RepairPlan
from recovery.lib.repair.replay import committed_seq, fold_delta, latest_delta_sql
from recovery.lib.repair.sql_suites import SqlSuiteRunner
from recovery.lib.repair.suites import BATCH_ROWS, Expectation, Suite, SuiteResult, SuiteRunner, declared_suites
from recovery.lib.repair.tables import GATES, snapshot_table
from recovery.lib.snapshot import str_list
from recovery.lib.write.writer import Writer

BUILTIN = (
    "repair_keys",
    "repair_partitioning",
    "repair_fencing",
    "repair_tombstones",
    "repair_partition_totals",
    "repair_reconciliation",
)
DESCRIPTIONS = {
    "repair_keys": "Keys are non-null and unique across the repair generation.",
    "repair_partitioning": "Each row sits in the partition the transform derives from its source row.",
    "repair_fencing": "No row of a fenced generation (or of the incident's failed generations).",
    "repair_tombstones": "No key whose latest source change (as of the snapshot) is a delete.",
    "repair_partition_totals": "Row counts and amount totals per partition equal the source snapshot plus the "
    "replayed delta.",
    "repair_reconciliation": "Every key equals the reference (snapshot plus replayed delta): no "
    "unexplained difference.",
}


def builtin_suites(spec: DatasetSpec) -> list[Suite]:
    """The row-level suites over :func:`row_frame_sql`'s frame.

    Uniqueness is ``__key_copies`` between 1 and 1: the frame counts each key's rows across the
    whole generation, so a copy outside the scope is caught too. GE's own uniqueness expectation
    would say less (the scope's rows only; on Spark, one batch's) and group every key once more,
    the costliest of the suites' expectations by far."""
    E = Expectation
    keys = [E("expect_column_values_to_not_be_null", {"column": k}) for k in spec.key]
    keys.append(E("expect_column_values_to_be_between", {"column": "__key_copies", "min_value": 1, "max_value": 1}))
    return [
        Suite("repair_keys", tuple(keys)),
        Suite(
            "repair_partitioning",
            (
                E(
                    "expect_column_pair_values_to_be_equal",
                    {"column_A": "__partition", "column_B": "__derived_partition"},
                ),
            ),
        ),
        Suite(
            "repair_fencing", (E("expect_column_values_to_be_in_set", {"column": "__fenced", "value_set": [False]}),)
        ),
        Suite(
            "repair_tombstones",
            (E("expect_column_values_to_be_in_set", {"column": "__tombstoned", "value_set": [False]}),),
        ),
    ]


def partition_suite() -> Suite:
    E = Expectation
    return Suite(
        "repair_partition_totals",
        (
            E("expect_column_pair_values_to_be_equal", {"column_A": "rows", "column_B": "reference_rows"}),
            E("expect_column_pair_values_to_be_equal", {"column_A": "total", "column_B": "reference_total"}),
        ),
    )


def payload_columns(s: Session, spec: DatasetSpec) -> list[str]:
    """The columns the snapshot holds: the transform's output plus the source version."""
    return [c for c, _ in s.columns(snapshot_table(spec))]


def reference_sql(
    s: Session, spec: DatasetSpec, plan: RepairPlan, through_seq: int, writer: Writer, *, overlay: bool = True
) -> str:
    """What the repair generation must hold after replaying the delta up to ``through_seq``
    (``overlay=False``: the window holds no delta entry, so the snapshot stands as it is).

    The snapshot's rows, and the rows carried from the published table (every key the snapshot
    does not rebuild, outside the rebuilt and qualified partitions); then, for the keys the
    captured writes touched, the writes folded over the snapshot row (``fold_delta``: versions
    and each write's own semantics) or, for a carried key, the published rows as they are. It is
    computed from the snapshot and the published table, not from the generation the replay
    wrote into, so a replay whose writes lose or add a row disagrees with it key by key."""
    cols = payload_columns(s, spec)
    sel = lambda alias: ", ".join(f"{alias}.{quote(c)}" for c in cols)  # noqa: E731
    key = quote_all(spec.key)
    cols_sql = quote_all(cols)
    snap = snapshot_table(spec)
    published = namespace_sql(plan.from_namespace)
    outside = f"NOT ({in_partitions(s, spec, plan.rebuild)}) AND NOT ({in_partitions(s, spec, list(plan.qualified))})"
    carried = f"SELECT {cols_sql} FROM {published} WHERE {outside} AND ({key}) NOT IN (SELECT {key} FROM {snap})"
    if isinstance(s, DuckDBSession) and s.fetchone(f"SELECT 1 FROM {published} WHERE {outside} LIMIT 1") is None:
        # every published partition is rebuilt or qualified: nothing is carried, and the NOT IN would hash every
        # snapshot key to exclude them from no row. The callers read the SQL in the transaction this check ran
        # in, so the published rows they see cannot have gained a partition since.
        carried = f"SELECT {cols_sql} FROM {published} WHERE false"
    if not overlay:
        return f"SELECT {sel('x')} FROM {snap} x UNION ALL {carried}"
    fold_delta(
        s,
        writer,
        plan,
        after_seq=plan.low_seq,
        through_seq=through_seq,
        start=snap,
        columns=cols,
        out="__reference_fold",
    )
    gen = quote(spec.target.metadata.generation)
    # a key the snapshot rebuilds ends as the captured writes, folded over its snapshot row, leave it
    # (wherever that is); a carried key a write touched is as the published table holds it now
    return f"""
        SELECT {sel("x")} FROM {snap} x ANTI JOIN __reference_fold USING ({key})
        UNION ALL
        SELECT {sel("f")} FROM __reference_fold f WHERE f.__present AND f.__started
        UNION ALL
        SELECT * FROM ({carried}) ANTI JOIN __reference_fold USING ({key})
        UNION ALL
        SELECT {cols_sql} FROM {namespace_sql(plan.from_namespace)}
        WHERE ({key}) IN (SELECT {key} FROM __reference_fold WHERE NOT __started)
        AND {gen} NOT IN (SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL)
    """


def row_frame_sql(
    s: Session,
    spec: DatasetSpec,
    plan: RepairPlan,
    scope: list[str],
    *,
    payload: bool = True,
    most_of_generation: bool = False,
) -> str:
    """Every row of the scope with the facts the row-level suites check (``payload=False``: the
    key and those facts only, what the built-in suites read).

    A key's copies are counted across the whole generation. For a scope that is a small part of
    it (a wave) only the scope's keys are grouped, found by a semi join; for one that is most of it
    (``most_of_generation``: the candidate's rebuilt partitions) every key is grouped, since the semi
    join would hash nearly every key only to group them again (a key outside the scope joins to no
    row). The source version a key's partition is derived from is its row's where the key has one
    copy, the latest of its copies' otherwise: only the few duplicated keys are grouped."""
    src = spec.source
    meta = spec.target.metadata
    key = quote_all(spec.key)
    part, gen, sv = quote(spec.target.partition), quote(meta.generation), quote(meta.source_version)
    ns = namespace_sql(plan.namespace)
    versions = (
        f"SELECT {key}, {sv} AS {quote(src.version)} FROM c ANTI JOIN copies USING ({key}) "
        f"UNION ALL SELECT {key}, max({sv}) FROM c SEMI JOIN copies USING ({key}) GROUP BY ALL"
    )
    narrowed = "" if most_of_generation else f" SEMI JOIN c USING ({key})"
    source_rows = (
        f"SELECT src.* FROM {src.table_name.sql()} src SEMI JOIN ({versions}) v USING ({key}, {quote(src.version)})"
    )
    derived = (
        f"SELECT {key}, CAST({part} AS VARCHAR) AS __derived_partition "
        f"FROM ({render(spec.transform_sql, source=source_rows)})"
    )
    wm = ts_literal(plan.source_watermark)
    return f"""
        WITH c AS (SELECT * FROM {ns} WHERE {in_partitions(s, spec, scope)}),
        copies AS (SELECT {key}, count(*) AS __key_copies FROM {ns}{narrowed}
                   GROUP BY ALL HAVING count(*) > 1),
        der AS ({derived}),
        tomb AS (SELECT {key}, max({quote(src.version)}) AS __tomb_version FROM {src.table_name.sql()}
                 WHERE {quote(src.op)} IN ({str_list(src.delete_ops)}) AND {quote(src.ingested_at)} <= {wm}
                 AND ({key}) IN (SELECT {key} FROM c) GROUP BY ALL)
        SELECT {"c.*" if payload else ", ".join(f"c.{quote(k)}" for k in spec.key)},
               CAST(c.{part} AS VARCHAR) AS __partition, der.__derived_partition,
               coalesce(copies.__key_copies, 1) AS __key_copies,
               coalesce(tomb.__tomb_version > c.{sv}, false) AS __tombstoned,
               coalesce(c.{gen} IN ({str_list(plan.failed_generations)})
                        OR c.{gen} IN (SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL),
                            false) AS __fenced
        FROM c LEFT JOIN copies USING ({key}) LEFT JOIN der USING ({key}) LEFT JOIN tomb USING ({key})
        {"ORDER BY __partition" if payload else ""}
    """


def _per_partition(s: Session, spec: DatasetSpec, relation: str, scope: list[str]) -> str:
    part = quote(spec.target.partition)
    # each amount to a fixed-point decimal first, so the sum is exact and does not depend on the order the
    # engine adds the rows in (a DOUBLE sum over the same rows in another order differs in its last digits)
    total = (
        f"CAST(sum(CAST({quote(spec.target.amount)} AS DECIMAL(38, 6))) AS VARCHAR)"
        if spec.target.amount
        else "CAST(NULL AS VARCHAR)"
    )
    return (
        f"SELECT CAST({part} AS VARCHAR) AS partition, count(*) AS n, {total} AS t FROM ({relation}) "
        f"WHERE {in_partitions(s, spec, scope)} GROUP BY 1"
    )


def checksum_comparable(s: Session, a_rows: str, r_rows: str, cols: list[str]) -> bool:
    """Whether two relations' rows may be compared by DuckDB's ``hash`` of ``cols``: a DuckDB
    session, and each column of the same type on both sides (names are matched, not positions)."""
    if not isinstance(s, DuckDBSession) or not cols:
        return False
    a_types, r_types = dict(s.relation_columns(a_rows)), dict(s.relation_columns(r_rows))
    return all(c in a_types and a_types[c] == r_types.get(c) for c in cols)


def reconciliation_gate(
    s: Session,
    spec: DatasetSpec,
    plan: RepairPlan,
    scope: list[str],
    reference: str,
    *,
    keys: str | None = None,
    gate: str = "repair_reconciliation",
    by_checksum: bool = True,
) -> GateResult:
    """Key-by-key comparison with the reference; any difference is unexplained. ``keys`` (a
    relation of key columns) narrows both sides to those keys.

    On DuckDB, when both sides give every compared column the same type, each row is compared
    by a checksum of its values (DuckDB's 64-bit ``hash`` of the columns in one order: it hashes
    NULL apart from every value, and 0.0 and -0.0, or two NaNs, alike, as ``IS NOT DISTINCT
    FROM`` compares them) and the join carries the key and that checksum only: the wide rows are
    read once each, not held in the join. Otherwise (Spark,
    whose ``hash`` has 32 bits; or a type that differs, which ``IS NOT DISTINCT FROM`` casts
    and a checksum would not) the columns are compared one by one. ``by_checksum=False``
    forces the column-by-column form."""
    cols = [c for c in payload_columns(s, spec) if c not in spec.key]
    key = quote_all(spec.key)
    ns = namespace_sql(plan.namespace)
    only = f" AND ({key}) IN (SELECT {key} FROM {keys})" if keys else ""
    a_rows = f"SELECT * FROM {ns} WHERE {in_partitions(s, spec, scope)}{only}"
    r_rows = f"SELECT * FROM ({reference}) WHERE {in_partitions(s, spec, scope)}{only}"
    if by_checksum and checksum_comparable(s, a_rows, r_rows, cols):
        values = ", ".join(quote(c) for c in cols)
        a0 = f"SELECT {key}, hash({values}) AS __h FROM ({a_rows})"
        r = f"SELECT {key}, hash({values}) AS __h, true AS __in_ref FROM ({r_rows})"
        same = "a.__h = r.__h"
    else:
        a0, r = a_rows, f"SELECT *, true AS __in_ref FROM ({r_rows})"
        same = " AND ".join(f"a.{quote(c)} IS NOT DISTINCT FROM r.{quote(c)}" for c in cols)
    # a key's copies counted by a grouping of the few duplicated keys joined back, not a window over every
    # row (which partitions and sorts every row)
    s.temp_table(
        "__gate_diff",
        f"""
        WITH a0 AS ({a0}),
             dup AS (SELECT {key}, count(*) AS __n FROM a0 GROUP BY ALL HAVING count(*) > 1),
             a AS (SELECT a0.*, coalesce(dup.__n, 1) AS __n FROM a0 LEFT JOIN dup USING ({key})),
             r AS ({r})
        SELECT {key}, CASE WHEN a.__n IS NULL THEN 'missing' WHEN r.__in_ref IS NULL THEN 'extra'
                           WHEN a.__n > 1 THEN 'duplicate' ELSE 'changed' END AS kind
        FROM a FULL OUTER JOIN r USING ({key})
        WHERE a.__n IS NULL OR r.__in_ref IS NULL OR a.__n > 1 OR NOT ({same})""",
    )
    counts = dict(s.fetchall("SELECT kind, count(DISTINCT (" + key + ")) FROM __gate_diff GROUP BY 1"))
    sample = [list(r) for r in s.fetchall(f"SELECT {key}, kind FROM __gate_diff ORDER BY ALL LIMIT 5")]
    n = sum(counts.values())
    details = (
        (f"{n:,} unexplained differences ({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))}); e.g. {sample}")
        if n
        else f"every key of {len(scope)} partitions equals the reference"
    )
    return GateResult(gate, n == 0, n, details)


def evaluate_gates(
    s: Session,
    writer: Writer,
    plan: RepairPlan,
    *,
    stage: str,
    scope: list[str],
    through_seq: int,
    suite_scope: list[str] | None = None,
    run_id: str | None = None,
    batch_rows: int = BATCH_ROWS,
    whole_generation: bool = False,
) -> list[GateResult]:
    """Run every gate and record the results; the caller owns the transaction.

    The key-by-key reconciliation covers ``scope``; the row-level suites cover
    ``suite_scope`` (default: ``scope``), so a wave validates its own rows while any
    later change to an earlier wave's rows is still caught by the reconciliation.
    ``whole_generation``: ``scope`` is every partition of the generation (the candidate's
    gate), so whether ``suite_scope`` is most of the generation can be told."""
    suite_scope = scope if suite_scope is None else suite_scope
    most_of_generation = whole_generation and 2 * len(suite_scope) >= len(scope)
    spec = writer.spec
    overlaid = through_seq > plan.low_seq and bool(
        s.scalar(f"SELECT count(*) FROM ({latest_delta_sql(writer, plan, plan.low_seq, through_seq)})")
    )
    if overlaid:
        # computed once (it overlays the snapshot with the replayed delta): the key-by-key gate and the
        # partition totals both read it
        s.temp_table(
            "__gate_reference",
            f"SELECT * FROM "
            f"({reference_sql(s, spec, plan, through_seq, writer)}) WHERE {in_partitions(s, spec, scope)}",
        )
        reference = "SELECT * FROM __gate_reference"
    elif set(scope) <= set(plan.rebuild):
        # no delta in the window (a wave's gate, or a candidate nobody wrote around) and only rebuilt
        # partitions: the reference is the fixed snapshot's rows as they are, read in place (an overlay
        # with an empty window, or a copy, would rewrite the same rows)
        reference = f"SELECT * FROM {snapshot_table(spec)} WHERE {in_partitions(s, spec, scope)}"
    else:  # carried partitions too: the snapshot and the published rows as they are, read where they lie
        reference = (
            f"SELECT * FROM ({reference_sql(s, spec, plan, through_seq, writer, overlay=False)}) "
            f"WHERE {in_partitions(s, spec, scope)}"
        )
    results = [reconciliation_gate(s, spec, plan, scope, reference)]
    columns = [c for c, _ in s.columns(namespace_sql(plan.namespace))]
    builtin, declared = builtin_suites(spec), declared_suites(spec, columns)
    totals_sql = (
        "SELECT partition, coalesce(a.n, 0) AS rows, coalesce(r.n, 0) AS reference_rows, a.t AS total, "
        "r.t AS reference_total "
        f"FROM ({_per_partition(s, spec, f'SELECT * FROM {namespace_sql(plan.namespace)}', suite_scope)}) a "
        f"FULL OUTER JOIN ({_per_partition(s, spec, reference, suite_scope)}) r USING (partition) ORDER BY partition"
    )
    if isinstance(s, DuckDBSession):
        suite_results = _suites_in_engine(
            s, spec, plan, suite_scope, builtin, declared, totals_sql, most_of_generation=most_of_generation
        )
    else:  # Spark: bounded pandas batches (aggregates are per batch)
        runner = SuiteRunner(builtin + declared)
        frame = row_frame_sql(s, spec, plan, suite_scope, most_of_generation=most_of_generation)
        runner.run(s.arrow_batches(frame, batch_rows))
        parts = SuiteRunner([partition_suite()])
        parts.validate(s.arrow(totals_sql).to_pandas())
        suite_results = list(runner.results.values()) + list(parts.results.values())
    for r in suite_results:
        results.append(GateResult(r.name, r.passed, r.unexpected, r.describe()))
    if overlaid:
        s.drop_relation("__gate_reference")
    seq = committed_seq(s)
    for g in results:
        s.execute(
            f"INSERT INTO {GATES} VALUES (?, ?, ?, ?, ?, true, ?, ?, ?, ?, ?)",
            [plan.incident_id, plan.generation, stage, g.gate, g.passed, g.observed, g.details, seq, utcnow(), run_id],
        )
    return results


def _suites_in_engine(
    s: DuckDBSession,
    spec: DatasetSpec,
    plan: RepairPlan,
    scope: list[str],
    builtin: list[Suite],
    declared: list[Suite],
    totals_sql: str,
    *,
    most_of_generation: bool = False,
) -> list[SuiteResult]:
    """Every suite computed by DuckDB over the whole scope, inside the caller's transaction.

    The built-in suites read a narrow frame (key, partition, derived partition, copies,
    tombstone, fence) computed once into a temporary table, since each expectation is its
    own query and the frame's joins should not run once per expectation; the declared
    suites read the namespace's rows as they are; the partition totals read their own
    small table. Uniqueness and every aggregate are thus over the whole scope, not per batch."""
    runner = SqlSuiteRunner(s.conn, builtin + declared + [partition_suite()])
    # created in the caller's transaction: a failure rolls them back with it
    frame = row_frame_sql(s, spec, plan, scope, payload=False, most_of_generation=most_of_generation)
    s.temp_table("__gate_rows", frame)
    s.temp_table("__gate_partition_totals", f"{totals_sql}")
    results = runner.validate("SELECT * FROM __gate_rows", builtin)
    if declared:
        ns = namespace_sql(plan.namespace)
        results |= runner.validate(f"SELECT * FROM {ns} WHERE {in_partitions(s, spec, scope)}", declared)
    results |= runner.validate("SELECT * FROM __gate_partition_totals", [partition_suite()])
    s.drop_relation("__gate_rows")
    s.drop_relation("__gate_partition_totals")
    return list(results.values())


def latest_gates(s: Session, incident_id: str, stage: str | None = None) -> dict[str, StoredGate]:
    """The most recent result of each gate of an incident's repair (of one stage, if given)."""
    return latest_results(s, GATES, owner_column="incident_id", owner=incident_id, stage=stage)


def gate_details_json(results: list[GateResult]) -> str:
    return json.dumps([r.__dict__ for r in results])
