"""Classify each key of the damaged target against the expected rows, in SQL.

Expected rows E are the spec's transform over the source as of the snapshot
watermark; T is what the public name exposes now. One label per key, first match
wins (ARCHITECTURE.md "Damage vocabulary"). Timing facts come from the control
plane: the failed generations' start (registered, or inferred from their first
write), the delta log (what the target held before the backfill started, and
whether a concurrent generation had written a newer version before the failed
write clobbered it), and the source's ``ingested_at``.

Keys that differ from E without matching any rule are labelled ``unexplained``:
that is the signal that stops a repair from expanding.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import datetime

from recovery.lib.control.plane import SCHEMA, dataset_table_name, delta_table, has_dataset_table
from recovery.lib.control.write_registry import generations_sql
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.sql_files import joins_nothing
from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.errors import SpecError
from recovery.lib.identifiers import quote, quote_all, string_literal
from recovery.lib.lakehouse.history import history_facts
from recovery.lib.reconcile.expected_cache import drop_staged, keep_expected, keepable, stage_kept
from recovery.lib.reconcile.footprint import (
    drift_outside_sql,
    footprint_keys_sql,
    is_wide,
    resolve_footprint,
    stage_candidates,
    stage_footprint,
)
from recovery.lib.reconcile.inputs import ReconcileInputs, partition_table, recon_table, side
from recovery.lib.reconcile.partitions import expected_partition_rows_sql, partition_findings_sql
from recovery.lib.snapshot import (
    expected_from_index_sql,
    latest_index_sql,
    latest_versions_sql,
    str_list,
    ts_literal,
)
from recovery.lib.trace import mark


def _failed_start(s: Session, spec: DatasetSpec, gens: list) -> datetime | None:
    """When the failed generations started: registered (control plane or the team's registry),
    else inferred from their first write (the write log, else the target's written-at column)."""
    registered = s.scalar(
        f"SELECT min(started_at) FROM ({generations_sql(s, spec)}) WHERE generation IN ({str_list(gens)})"
    )
    if registered is not None:
        return registered
    meta = spec.target.metadata
    first = [
        f"SELECT min({quote(meta.written_at)}) AS w FROM {spec.target.table_name.sql()} "
        f"WHERE {quote(meta.generation)} IN ({str_list(gens)})"
    ]
    if has_dataset_table(s, "delta", spec.dataset):
        first.append(
            f"SELECT min({quote(meta.written_at)}) FROM {delta_table(spec.dataset)} "
            f"WHERE {quote(meta.generation)} IN ({str_list(gens)})"
        )
    return s.scalar(f"SELECT min(w) FROM ({' UNION ALL '.join(first)})")


def _log_covers(s: Session, spec: DatasetSpec, start: datetime | None) -> bool:
    """Whether the package's write log saw the target before the failed generation started
    (false for a target adopted after the damage: its log begins at the adoption)."""
    if start is None or not has_dataset_table(s, "delta", spec.dataset):
        return False
    return bool(
        s.scalar(
            f"SELECT count(*) > 0 FROM (SELECT 1 FROM {delta_table(spec.dataset)} "
            f"WHERE {quote(spec.target.metadata.written_at)} <= {ts_literal(start)} LIMIT 1)"
        )
    )


def stage(s: Session, inputs: ReconcileInputs) -> dict:
    """Build the temp relations the classification reads. Returns the resolved facts.

    Each big relation is read once or twice: the change log folded to each key's latest
    change (key, version, op, arrival: a narrow aggregate that gives presence in the
    source, tombstones and arrival times), E from the source's rows at those versions,
    and the target with each key's number of copies. What the target held before the
    failed generation started, and which concurrent writes it clobbered, come from
    the package's write log where it covers that time, else from the generations'
    registry (inference, stated as such in ``facts['basis']``); the log or registry
    is only probed for the few keys that need it (absent keys; keys holding an older version).
    """
    mark("classification starts")  # a command's fixed cost ends here (``python -m bench fixed``)
    spec = inputs.spec
    src, meta = spec.source, spec.target.metadata
    gens = str_list(list(inputs.failed_generations))
    watermark = inputs.watermark or s.scalar(f"SELECT max({quote(src.ingested_at)}) FROM {src.table_name.sql()}")
    start = _failed_start(s, spec, list(inputs.failed_generations))
    key = quote_all(spec.key)
    gen, sv, wat = quote(meta.generation), quote(meta.source_version), quote(meta.written_at)
    delta = delta_table(spec.dataset)
    fp = resolve_footprint(s, inputs)
    if inputs.full is False and fp is None:
        raise SpecError(
            "partitions",
            "the failed generations wrote nothing and the incident gives no partition range, "
            "so there is no footprint to reconcile",
            "give the incident's partitions, or reconcile the whole table",
        )
    footprint = fp if not inputs.full else None  # None asks for the footprint where there is one
    # the default run over a footprint that is most of the table: classified whole, narrowed after (``reconcile``)
    wide = footprint is not None and inputs.full is None and is_wide(s, inputs, footprint)
    if wide:
        footprint = None
    if footprint:  # only the footprint's candidate keys are resolved to their latest version
        stage_candidates(s, inputs, footprint, watermark)
    whole = not footprint and keepable(s, watermark)
    reused = whole and inputs.reuse_kept and stage_kept(s, spec, watermark, "__e")
    streamed = False  # E is a view resolved by the diff alone, not a table or kept rows
    if not reused:
        # each key's latest change, narrow (key, version, op, arrival); E joins the source back at those versions
        s.temp_table("__latest", f"{latest_index_sql(spec, watermark, keys='__fp_cand' if footprint else None)}")
        expected = expected_from_index_sql(spec, "__latest", watermark)
        if isinstance(s, DuckDBSession):  # a view of kept rows from an earlier run in this session
            drop_staged(s, "__e")
        if whole and inputs.persist and spec.downstream and isinstance(s, DuckDBSession):
            # impact assessment reads E next: kept for it (and the phases after it) as the reconciliation
            # resolves it (a little more than a temp table, and impact's own resolution saved)
            s.temp_view("__e", f"{keep_expected(s, spec, watermark, expected)}")
        elif footprint:  # narrowed to the footprint's keys below
            s.temp_table("__e", f"{expected}")
        else:
            # read once, by the diff, which resolves it in its own pipeline; the partitions' expected
            # counts and totals come from the diff and the target (``expected_partition_rows_sql``).
            # Materializing E would write every expected row only for the diff to read it back.
            s.temp_view("__e", f"{expected}")
            streamed = True
    # the target with each row's number of copies (the few duplicated keys are folded to one
    # row after the diff, on the small set of differing rows)
    target = spec.target.table_name.sql()
    if footprint:  # E and T of the footprint's keys only (every target row of each, copies outside the range too)
        stage_footprint(s, inputs, footprint)
        s.temp_table("__e", f"SELECT * FROM __e SEMI JOIN __fp USING ({key})")
        s.temp_table("__tfp", f"SELECT * FROM {target} SEMI JOIN __fp USING ({key})")
        target = "__tfp"
    s.temp_table("__dups", f"SELECT {key}, count(*) AS __n FROM {target} GROUP BY ALL HAVING count(*) > 1")
    s.temp_view("__t1", f"SELECT x.*, coalesce(d.__n, 1) AS __n FROM {target} x LEFT JOIN __dups d USING ({key})")
    columns = [c for c, _ in s.columns("__e")]
    # E's joins build on its narrow index, the diff on E; a streamed E whose transform joins something
    # of its own is left to DuckDB's planning (the setting would hold for the transform's joins too)
    ours = not streamed or joins_nothing(spec.transform_sql, "source")
    with s.joins_as_written() if ours else nullcontext():
        s.temp_table("__diff", f"{diff_sql(inputs, columns)}")
    if reused:  # E came kept: each key's latest change (op, arrival) is read for the keys that differ only
        s.temp_table("__diff_keys", f"SELECT DISTINCT {key} FROM __diff")
        s.temp_table("__latest", f"{latest_index_sql(spec, watermark, keys='__diff_keys')}")
    s.temp_table("__tomb", f"SELECT {key} FROM __latest WHERE {quote(src.op)} IN ({str_list(src.delete_ops)})")
    s.temp_table("__absent", f"SELECT {key} FROM __diff WHERE __n IS NULL")
    s.temp_table(
        "__older",
        f"SELECT {key}, {side('t', meta.source_version)} AS __tsv, "
        f"{side('t', meta.written_at)} AS __twat FROM __diff "
        f"WHERE {side('t', meta.source_version)} < {side('e', meta.source_version)} "
        f"AND {side('t', meta.generation)} IN ({gens})",
    )
    s.temp_table(
        "__arrived", f"SELECT {key}, {quote(src.ingested_at)} AS __at FROM __latest SEMI JOIN __older USING ({key})"
    )
    covers = _log_covers(s, spec, start)
    registry = None if covers else _registry_basis(s, inputs, start, watermark)
    if covers:
        assert start is not None  # the log covers nothing without a start
        basis = {"absent": "write_log", "older": "write_log", "registry_rows": []}
        s.temp_table(
            "__held",
            f"SELECT {key}, CAST(NULL AS VARCHAR) AS __by FROM ("
            f"SELECT {key}, _delta_op, row_number() OVER (PARTITION BY {key} ORDER BY _delta_seq DESC, "
            "_delta_op DESC) AS rn "
            f"FROM {delta} SEMI JOIN __absent USING ({key}) WHERE {wat} <= {ts_literal(start)}) "
            f"WHERE rn = 1 AND _delta_op = 'upsert'",
        )
        s.temp_table(
            "__concurrent",
            f"WITH d AS (SELECT * FROM {delta} SEMI JOIN __older USING ({key}) WHERE _delta_op = 'upsert'), "
            f"clobber AS (SELECT {key}, max(_delta_seq) AS __seq FROM d WHERE {gen} IN ({gens}) GROUP BY ALL) "
            f"SELECT {', '.join(f'd.{quote(k)}' for k in spec.key)}, min(d.{gen}) AS __by "
            f"FROM d JOIN clobber c USING ({key}) "
            f"JOIN __older o USING ({key}) WHERE d.{gen} NOT IN ({gens}) AND d.{sv} > o.__tsv "
            "AND d._delta_seq < c.__seq GROUP BY ALL",
        )
    elif registry is None:
        basis = {"absent": "none", "older": "none", "registry_rows": []}
        for name in ("__held", "__concurrent"):
            s.temp_table(name, f"SELECT {key}, CAST(NULL AS VARCHAR) AS __by FROM __diff WHERE false")
    else:
        basis = registry
    # out_of_order from the failed generations' own write log where it holds their writes
    # (an adopted foreign table's log starts at adoption), else from the metadata columns
    has_delta = has_dataset_table(s, "delta", spec.dataset)
    logged = has_delta and s.scalar(f"SELECT count(*) FROM (SELECT 1 FROM {delta} WHERE {gen} IN ({gens}) LIMIT 1)")
    ooo_basis = "write_log" if logged else "metadata"
    reordered = reordered_from_write_log_sql(inputs) if logged else reordered_from_metadata_sql(inputs)
    s.temp_table("__reordered", f"{reordered}")
    basis = {**basis, "out_of_order": ooo_basis}
    return {
        "history": history_facts(s, spec),  # a lakehouse target: its write log is the table's own history
        "watermark": watermark,
        "failed_start": start,
        "columns": columns,
        "basis": basis,
        "out_of_order_basis": ooo_basis,
        "footprint": fp,
        "wide_footprint": wide,
        "expected_streamed": streamed,
    }


def _registry_basis(
    s: Session, inputs: ReconcileInputs, start: datetime | None, watermark: datetime | None
) -> dict | None:
    """Infer what the write log would have said from the generations' registry: the target held,
    when the failed generation started, the source as of the last run that had committed by
    then; a concurrent run wrote a newer version before the failed write when it read past that
    version's arrival and committed before the failed row's written-at. Assumes each registered
    run applied every change up to its watermark (what an incremental load does). None when
    the registry cannot say (no start, or no run with a watermark)."""
    spec = inputs.spec
    src = spec.source
    gens = str_list(list(inputs.failed_generations))
    if start is None:
        return None
    known = generations_sql(s, spec)
    others = (
        f"SELECT generation, source_watermark, coalesce(ended_at, started_at) AS committed, basis FROM ({known}) "
        f"WHERE generation NOT IN ({gens}) AND source_watermark IS NOT NULL"
    )
    held = s.fetchone(
        f"SELECT generation, source_watermark, basis FROM ({others}) WHERE committed <= {ts_literal(start)} "
        f"ORDER BY source_watermark DESC, committed DESC LIMIT 1"
    )
    if held is None:
        return None
    key = quote_all(spec.key)
    held_gen, held_wm, where = held
    s.temp_table(
        "__held",
        f"SELECT {key}, CAST(? AS VARCHAR) AS __by FROM __absent "
        f"SEMI JOIN ({latest_versions_sql(spec, held_wm, include_deleted=False, keys='__absent')}) USING ({key})",
        [held_gen],
    )
    s.temp_table(
        "__first_after",
        f"SELECT {key}, min(x.{quote(src.ingested_at)}) AS __a "
        f"FROM {src.table_name.sql()} x JOIN __older o USING ({key}) "
        f"WHERE x.{quote(src.version)} > o.__tsv AND x.{quote(src.ingested_at)} > {ts_literal(start)} "
        + (f"AND x.{quote(src.ingested_at)} <= {ts_literal(watermark)} " if watermark else "")
        + "GROUP BY ALL",
    )
    s.temp_table(
        "__concurrent",
        f"SELECT {', '.join(f'f.{quote(k)}' for k in spec.key)}, "
        f"arg_min(g.generation, g.committed) AS __by FROM __first_after f JOIN __older o USING ({key}) "
        f"JOIN ({others}) g ON g.source_watermark >= f.__a AND g.committed <= o.__twat GROUP BY ALL",
    )
    used = [
        r[0]
        for r in s.fetchall(
            "SELECT DISTINCT __by FROM (SELECT __by FROM __held UNION ALL SELECT __by FROM __concurrent) "
            "WHERE __by IS NOT NULL ORDER BY 1 LIMIT 50"
        )
    ]
    return {"absent": where, "older": where, "registry_rows": used, "held_as_of": str(held_wm), "held_by": held_gen}


def reordered_from_write_log_sql(inputs: ReconcileInputs) -> str:
    """Keys whose single target row a failed generation wrote after it had already applied a
    newer change of the key: an upsert of a higher source version, or the key's tombstone
    (a ``delete_keys`` write; a partition replace's removals are not source changes).

    The write log orders the generation's own writes (``_delta_seq``), so a retry or a
    parallel run of the failed generation that lands version n after version m > n shows
    here, and is told apart from ``stale`` (the generation never wrote the newer version).
    """
    spec = inputs.spec
    meta = spec.target.metadata
    gens = str_list(list(inputs.failed_generations))
    key = quote_all(spec.key)
    gen, sv = quote(meta.generation), quote(meta.source_version)
    return (
        f"WITH cand AS (SELECT {key}, {side('t', meta.source_version)} AS __tsv FROM __diff "
        f"WHERE __n = 1 AND {side('t', meta.generation)} IN ({gens})), "
        f"w AS (SELECT d.* FROM {delta_table(spec.dataset)} d SEMI JOIN cand USING ({key}) WHERE d.{gen} IN ({gens}) "
        f"AND (d._delta_op = 'upsert' OR d._delta_seq IN (SELECT seq FROM {SCHEMA}.writes "
        f"WHERE mode = 'delete_keys' AND dataset = '{spec.dataset}' AND generation IN ({gens})))), "
        f"held AS (SELECT {key}, max(w._delta_seq) AS __seq FROM w JOIN cand USING ({key}) "
        f"WHERE w._delta_op = 'upsert' AND w.{sv} = cand.__tsv GROUP BY ALL) "
        f"SELECT DISTINCT {', '.join(f'w.{quote(k)}' for k in spec.key)} FROM w JOIN cand USING ({key}) JOIN held "
        f"USING ({key}) "
        f"WHERE w.{sv} > cand.__tsv AND w._delta_seq < held.__seq"
    )


def reordered_from_metadata_sql(inputs: ReconcileInputs) -> str:
    """Without a write log: keys whose failed-generation row holds version n although the same
    write (same generation and ``written_at``, from the metadata columns) wrote other keys'
    versions that arrived after the key's newer version m: that write had read m, so writing n
    applied the key's changes out of order. A write whose whole read predates m is ``stale``.
    """
    spec = inputs.spec
    src, meta = spec.source, spec.target.metadata
    gens = str_list(list(inputs.failed_generations))
    key = quote_all(spec.key)
    gen, sv, wat = quote(meta.generation), quote(meta.source_version), quote(meta.written_at)
    ver, at = quote(src.version), quote(src.ingested_at)
    source = src.table_name.sql()
    on = " AND ".join(f"x.{quote(k)} = e.{quote(k)}" for k in spec.key)
    return (
        f"WITH rows AS (SELECT {key}, {gen} AS __g, {wat} AS __w, {sv} AS __sv FROM {spec.target.table_name.sql()} "
        f"WHERE {gen} IN ({gens})), "
        f"seen AS (SELECT x.__g, x.__w, max(e.{at}) AS __read FROM rows x JOIN {source} e ON {on} AND e.{ver} = x.__sv "
        f"GROUP BY ALL), "
        f"cand AS (SELECT {key}, {side('t', meta.generation)} AS __g, {side('t', meta.written_at)} AS __w, "
        f"{side('t', meta.source_version)} AS __tsv FROM __diff "
        f"WHERE __n = 1 AND {side('t', meta.generation)} IN ({gens}) AND {side('t', meta.source_version)} < "
        f"{side('e', meta.source_version)}) "
        f"SELECT DISTINCT {', '.join(f'x.{quote(k)}' for k in spec.key)} FROM cand x JOIN seen USING (__g, __w) "
        f"JOIN {source} e ON {on} AND e.{ver} > x.__tsv WHERE e.{at} <= seen.__read"
    )


def diff_sql(inputs: ReconcileInputs, columns: list[str]) -> str:
    """The one big join: keys of T and E whose rows differ in any way (the diff floor's work)."""
    spec = inputs.spec
    meta = spec.target.metadata
    key = quote_all(spec.key)
    values = [c for c in columns if c not in spec.key]
    t_only = [meta.generation, meta.written_at]
    same = " AND ".join(f"t.{quote(c)} IS NOT DISTINCT FROM e.{quote(c)}" for c in values)
    picks = ", ".join(
        [f"t.{quote(c)} AS {side('t', c)}" for c in values + t_only]
        + [f"e.{quote(c)} AS {side('e', c)}" for c in values]
    )
    return (
        f"SELECT {key}, t.__n, e.{quote(meta.source_version)} IS NOT NULL AS __in_e, {picks} "
        f"FROM __t1 t FULL OUTER JOIN __e e USING ({key}) "
        f"WHERE t.__n IS NULL OR e.{quote(meta.source_version)} IS NULL OR t.__n > 1 OR NOT ({same})"
    )


def classification_sql(
    inputs: ReconcileInputs, start: datetime | None, columns: list[str], basis: dict | None = None
) -> str:
    """One row per differing key of ``__diff``, with its label and evidence."""
    spec = inputs.spec
    meta, part = spec.target.metadata, spec.target.partition
    gens = str_list(list(inputs.failed_generations))
    key = quote_all(spec.key)
    payload = [c for c in columns if c not in spec.key and c != meta.source_version]
    no_part = [c for c in payload if c != part]
    T, E = (lambda c: side("t", c)), (lambda c: side("e", c))  # noqa: E731
    same = lambda cols: " AND ".join([f"{T(c)} IS NOT DISTINCT FROM {E(c)}" for c in cols] or ["true"])  # noqa: E731
    differing = ", ".join(f"CASE WHEN {T(c)} IS DISTINCT FROM {E(c)} THEN '{c}' END" for c in payload)
    sv = meta.source_version
    after_start = f"a.__at > {ts_literal(start)}" if start else "false"
    select = f"""
    SELECT {key},
           {T(part)} AS actual_partition, {E(part)} AS expected_partition,
           {T(meta.generation)} AS generation, {T(sv)} AS actual_version, {E(sv)} AS expected_version,
           coalesce(__n, 0) AS rows_in_target,
           CASE
             WHEN __n > 1 THEN 'duplicate'
             WHEN ro.__reordered THEN 'out_of_order'
             WHEN __n IS NOT NULL AND NOT __in_e AND tomb.__tomb THEN 'resurrected'
             WHEN __n IS NOT NULL AND NOT __in_e THEN 'unexpected'
             WHEN __n IS NULL THEN CASE WHEN h.__held THEN 'deleted' ELSE 'missing' END
             WHEN {same(no_part)} AND {T(part)} IS DISTINCT FROM {E(part)} THEN 'mispartitioned'
             WHEN {T(sv)} < {E(sv)} AND {T(meta.generation)} IN ({gens}) AND {after_start} AND c.__concurrent
                 THEN 'overwritten'
             WHEN {T(sv)} < {E(sv)} AND {T(meta.generation)} IN ({gens}) THEN 'stale'
             WHEN {T(sv)} = {E(sv)} AND NOT ({same(payload)}) THEN 'incorrectly_transformed'
             ELSE 'unexplained'
           END AS label,
           list_filter([{differing}], lambda x: x IS NOT NULL) AS differing_columns,
           coalesce(h.__by, c.__by) AS evidence_generation
    FROM __diff
    LEFT JOIN (SELECT {key}, true AS __tomb FROM __tomb) tomb USING ({key})
    LEFT JOIN (SELECT {key}, true AS __held, __by FROM __held) h USING ({key})
    LEFT JOIN (SELECT {key}, true AS __concurrent, __by FROM __concurrent) c USING ({key})
    LEFT JOIN (SELECT {key}, true AS __reordered FROM __reordered) ro USING ({key})
    LEFT JOIN __arrived a USING ({key})
    """
    # a duplicated key has one __diff row per copy: keep one, without sorting the single-row keys
    b = basis or {}
    lit = string_literal
    labelled = (
        f"{select} WHERE coalesce(__n, 1) = 1 UNION ALL "
        f"SELECT * FROM ({select} WHERE __n > 1) QUALIFY row_number() OVER (PARTITION BY {key} "
        "ORDER BY actual_version, generation) = 1"
    )
    # what each label rests on: the rows themselves, or (deleted/missing, overwritten/stale) the
    # package's write log or an inference from the generations' registry
    return (
        "SELECT * EXCLUDE (evidence_generation), CASE WHEN label IN ('deleted', 'missing') "
        f"THEN {lit(b.get('absent', 'write_log'))} "
        f"WHEN label IN ('overwritten', 'stale') THEN {lit(b.get('older', 'write_log'))} "
        f"WHEN label = 'out_of_order' THEN {lit(b.get('out_of_order', 'write_log'))} ELSE 'rows' END AS basis, "
        f"CASE WHEN label IN ('deleted', 'overwritten') THEN evidence_generation END AS evidence_generation "
        f"FROM ({labelled})"
    )


def reconcile(s: Session, inputs: ReconcileInputs) -> dict:
    """Classify keys and partitions into the control plane; the caller owns the transaction."""
    spec = inputs.spec
    facts = stage(s, inputs)
    columns = [c for c, _ in s.columns("__e")]
    table, ptable = recon_table(spec, inputs.persist), partition_table(spec, inputs.persist)
    classified = classification_sql(inputs, facts["failed_start"], columns, facts["basis"])
    fp = facts["footprint"]
    if facts["wide_footprint"]:  # the footprint's keys of a whole-table classification: the footprint run's labels
        s.temp_table("__recon_whole", classified)
        keys = footprint_keys_sql(s, inputs, fp, "__recon_whole")
        s.temp_table("__recon", f"SELECT * FROM __recon_whole SEMI JOIN ({keys}) USING ({quote_all(spec.key)})")
    else:
        s.temp_table("__recon", f"{classified}")
    if inputs.persist:
        _drop_if_reshaped(s, dataset_table_name("recon", spec.dataset), "__recon")
    _write_results(s, table, "__recon", inputs)
    if inputs.full and fp is not None:  # damage a whole-table run finds outside the footprint: drift
        facts["drift_outside_footprint"] = dict(s.fetchall(drift_outside_sql(s, inputs, fp)))
    within = fp if not inputs.full else None
    facts["scope"] = "footprint" if within is not None else "full"
    expected = f"({expected_partition_rows_sql(spec)})" if facts["expected_streamed"] else "__e"
    s.temp_table("__partitions", f"{partition_findings_sql(inputs, facts['failed_start'], within, expected=expected)}")
    _write_results(s, ptable, "__partitions", inputs)
    return facts


def _write_results(s: Session, table: str, staged: str, inputs: ReconcileInputs) -> None:
    """The incident's rows of ``table`` replaced by ``staged``'s, the incident id first. Persisted: a
    results table created on first use, other incidents' rows kept; else the session's own temp table."""
    if not inputs.persist:  # other incidents reconciled in this session keep their rows
        fresh = f"SELECT CAST(? AS VARCHAR) AS incident_id, * FROM {staged}"
        if not s.has_temp(table.strip('"')):
            s.temp_table(table, fresh, [inputs.incident_id])
        else:
            s.temp_table(
                table,
                f"SELECT * FROM {table} WHERE incident_id <> ? UNION ALL BY NAME {fresh}",
                [inputs.incident_id, inputs.incident_id],
            )
        return
    s.materialize(table, f"SELECT CAST(NULL AS VARCHAR) AS incident_id, * FROM {staged} LIMIT 0", keep_existing=True)
    s.replace_rows(
        table,
        [c for c, _ in s.columns(table)],
        remove=f"incident_id = {string_literal(inputs.incident_id)}",
        insert=f"SELECT ?, * FROM {staged}",
        params=[inputs.incident_id],
    )


def _drop_if_reshaped(s: Session, name: str, fresh: str) -> None:
    """A results table written by an older version of the package (other columns) is replaced."""
    if s.object_kind(SCHEMA, name) is None:
        return
    table = f'{SCHEMA}."{name}"'
    if [c for c, _ in s.columns(table)][1:] != [c for c, _ in s.columns(fresh)]:
        s.drop_relation(table)
