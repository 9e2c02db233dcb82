"""Meaning checks of a spec against the warehouse, through a read-only session.

Run before anything writes: a spec that names a missing table or column, a key
that is not unique per version, or a transform that does not produce the key and
partition fails here with the field and the fix, and the warehouse is untouched.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from pathlib import Path

import duckdb

from recovery.lib.control.tables import SOURCE_CHECKS, SOURCE_CHECKS_DDL
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.engine import open_engine
from recovery.lib.errors import SpecError
from recovery.lib.identifiers import is_plain_identifier, quote, quote_all
from recovery.lib.lakehouse.history import has_lakehouse, sync
from recovery.lib.retry import retrying
from recovery.lib.snapshot import expected_rows_sql, source_snapshot_sql, str_list, transform_sql

_SCANNED_SOURCES: set[tuple] = set()
"""Change logs whose (key, version) uniqueness and ops this process has verified, by size."""
_RECORDED_SOURCES: set[tuple] = set()
"""Of those, the ones this process found or put in the control plane's record."""
_CHECKED = SOURCE_CHECKS.split(".", 1)[1]
"""Control-plane table of the same facts, kept by a phase that writes (``remember_source_checks``),
so a later process does not scan the change log again for checks an earlier one passed."""


_SHAPES_CHECKED: ContextVar[set[str] | None] = ContextVar("recovery_shapes_checked", default=None)
"""Within ``checked_once``: the spec shapes already checked against the warehouse."""


@contextmanager
def checked_once(memo: set[str]) -> Iterator[None]:
    """Within this block, check each spec's SQL shapes against the warehouse once (``memo`` keeps them).

    A command or ``recover`` launches several runs, and every run's ops load the spec again: on
    Spark each shape check (the transform's and each consumer's columns) is a round of query
    analysis, which every run of a recovery would repeat. The change-log and source-column checks
    still run every time: ingestion goes on while a recovery runs."""
    token = _SHAPES_CHECKED.set(memo)
    try:
        yield
    finally:
        _SHAPES_CHECKED.reset(token)


def _shape_fingerprint(spec: DatasetSpec, source_columns: dict) -> str:
    parts = [
        spec.model_dump_json(),
        str(spec.spec_path),
        spec.transform_sql,
        repr(sorted(spec.downstream_sql.items())),
        repr(sorted(source_columns.items())),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _check_row(scanned: tuple) -> list:
    _path, table, key, version, op, ops, rows = scanned
    return [table, list(key), version, op, list(ops), rows]


def _checked_before(s, scanned: tuple) -> bool:
    from recovery.lib.control.plane import SCHEMA

    if s.object_kind(SCHEMA, _CHECKED) is None:
        return False
    return bool(
        s.scalar(
            f"SELECT count(*) FROM {SOURCE_CHECKS} WHERE source = ? AND key = ? AND version = ? "
            f"AND op = ? AND ops = ? AND rows = ?",
            _check_row(scanned),
        )
    )


def remember_source_checks(s, spec: DatasetSpec) -> None:
    """Record, in a writing transaction, the change-log checks this process passed for ``spec``'s
    warehouse (the log is append-only: the same row count means the same rows)."""

    mine = _unrecorded(spec)
    if not mine:
        return
    s.execute(SOURCE_CHECKS_DDL)
    for c in mine:
        if not _checked_before(s, c):
            s.execute(
                f"INSERT INTO {SOURCE_CHECKS} (source, key, version, op, ops, rows) VALUES (?, ?, ?, ?, ?, ?)",
                _check_row(c),
            )
    # marked recorded once the caller's transaction commits; a rollback only costs a scan in the next process
    _RECORDED_SOURCES.update(mine)


def _unrecorded(spec: DatasetSpec) -> list[tuple]:
    return [c for c in _SCANNED_SOURCES - _RECORDED_SOURCES if c[0] == str(spec.warehouse.path)]


def record_source_checks(engine, spec: DatasetSpec) -> None:
    """``remember_source_checks`` in a transaction of its own, for a phase whose writes go through
    other code (containment's fences): only when this process scanned a change log the record lacks,
    so the runbook's first command is the one that pays the scan."""
    if not _unrecorded(spec):
        return

    def txn() -> None:
        with engine.transaction() as s:
            remember_source_checks(s, spec)

    retrying(txn)


def check_against_warehouse(spec: DatasetSpec) -> None:
    src = str(spec.spec_path) if spec.spec_path else None

    def fail(field: str, problem: str, fix: str) -> None:
        raise SpecError(field, problem, fix, source=src)

    if spec.warehouse.engine == "duckdb" and not spec.warehouse.path.exists():
        fail(
            "warehouse.path",
            f"{spec.warehouse.path} does not exist",
            "point it at the warehouse file, relative to the spec",
        )
    if spec.warehouse.engine == "duckdb" and not spec.warehouse.path.is_file() and not spec.warehouse.path.is_dir():
        # a FIFO or device would block or be read by DuckDB's open; a directory gets DuckDB's own message below
        fail(
            "warehouse.path",
            f"{spec.warehouse.path} is not a regular file",
            "point it at the warehouse file, relative to the spec",
        )
    try:
        engine = open_engine(spec.warehouse)
    except NotImplementedError as e:
        fail("warehouse.engine", str(e).removeprefix("warehouse.engine "), "use engine: duckdb")
    with ExitStack() as stack:
        try:
            s = stack.enter_context(engine.session(read_only=True))
        except duckdb.Error as e:  # not a database file, a directory, or a setting DuckDB rejects
            field = (
                "warehouse.path"
                if isinstance(e, duckdb.IOException)
                else ("warehouse.memory_limit" if "memory" in str(e).lower() else "warehouse")
            )
            fail(
                field,
                f"DuckDB cannot open {spec.warehouse.path.name}: {str(e).splitlines()[0]}",
                "point warehouse.path at a DuckDB database file and give settings DuckDB accepts (e.g. "
                "memory_limit: 4GB)",
            )
        s_table = spec.source.table_name
        cols = dict(s.columns(s_table.sql()))
        if not cols:
            fail(
                "source.table",
                f"table {s_table} does not exist in {spec.warehouse.path.name}",
                "name an existing schema.table",
            )
        n: str | None  # a column name; the optional fields below may name none
        for field, names in [
            ("source.key", spec.source.key),
            ("source.version", [spec.source.version]),
            ("source.op", [spec.source.op]),
            ("source.ingested_at", [spec.source.ingested_at]),
            ("source.sensitive", spec.source.sensitive),
        ]:
            for n in names:
                if n not in cols:
                    fail(
                        field,
                        f"column {n!r} is not in {s_table} (columns: {', '.join(cols)})",
                        "name an existing column",
                    )
        ops = spec.source.upsert_ops + spec.source.delete_ops
        # the two full scans of the change log, once per process and source size: the log is
        # append-only, so the same row count means the same rows (each phase's run loads the spec,
        # and a full scan grows with the log)
        scanned = (
            str(spec.warehouse.path),
            str(s_table),
            tuple(spec.key),
            spec.source.version,
            spec.source.op,
            tuple(ops),
            s.scalar(f"SELECT count(*) FROM {s_table.sql()}"),
        )
        if scanned not in _SCANNED_SOURCES and _checked_before(s, scanned):
            _SCANNED_SOURCES.add(scanned)
            _RECORDED_SOURCES.add(scanned)
        if scanned not in _SCANNED_SOURCES:
            dup = s.fetchone(
                f"SELECT {quote_all(spec.key)}, {quote(spec.source.version)}, count(*) AS n FROM {s_table.sql()} "
                f"GROUP BY ALL HAVING count(*) > 1 LIMIT 1"
            )
            if dup:
                fail(
                    "source.key",
                    f"key {spec.key} + version is not unique in {s_table}: {dup[:-1]} occurs {dup[-1]} times",
                    "add the missing key columns so that (key, version) identifies one change",
                )
            # one scan for both: an op outside the lists, and changes without a version (a key's latest
            # change is its highest version, so a NULL one could never be resolved)
            op, version = quote(spec.source.op), quote(spec.source.version)
            bad = s.fetchone(
                f"SELECT count(*) FILTER (WHERE CAST({op} AS VARCHAR) NOT IN ({str_list(ops)})), "
                f"min({op}) FILTER (WHERE CAST({op} AS VARCHAR) NOT IN ({str_list(ops)})), "
                f"count(*) FILTER (WHERE {version} IS NULL) FROM {s_table.sql()}"
            )
            if bad and bad[0]:
                fail(
                    "source.op",
                    f"value {bad[1]!r} is neither an upsert nor a delete op {ops}",
                    "list it under source.upsert_ops or source.delete_ops",
                )
            if bad and bad[2]:
                fail(
                    "source.version",
                    f"{bad[2]:,} changes in {s_table} have no version (NULL)",
                    "give every change a version (the key's latest change is its highest version)",
                )
            _SCANNED_SOURCES.add(scanned)
        memo, fingerprint = _SHAPES_CHECKED.get(), _shape_fingerprint(spec, cols)
        if memo is not None and fingerprint in memo:
            return
        _check_shapes(spec, s, cols, fail)
        if memo is not None:
            memo.add(fingerprint)


def _check_shapes(spec: DatasetSpec, s, cols: dict, fail) -> None:
    """The transform's and the consumers' output columns, by query analysis (nothing is scanned)."""
    n: str | None  # a column name; the optional fields below may name none
    try:
        out = dict(s.relation_columns(expected_rows_sql(spec, None)))
    except duckdb.Error as e:
        fail(
            "target.transform",
            f"does not run over the source: {str(e).splitlines()[0]}",
            "fix the SQL; it reads {{ source }} shaped like the source table",
        )
    for field, n in [("source.key", k) for k in spec.key] + [("target.partition", spec.target.partition)]:
        if n not in out:
            fail(
                field,
                f"column {n!r} is not produced by the transform {spec.target.transform.name}",
                "select it in the transform",
            )
    for field, n in [("target.amount", spec.target.amount), ("target.event_time", spec.target.event_time)] + [
        ("target.sensitive", c) for c in spec.target.sensitive
    ]:
        if n is not None and n not in out:
            fail(
                field,
                f"column {n!r} is not produced by the transform",
                "name a column the transform returns, or remove the field",
            )
    if spec.target.amount is not None and not is_numeric_type(out[spec.target.amount]):
        fail(
            "target.amount",
            f"column {spec.target.amount!r} is {out[spec.target.amount]}, not a number: totals sum it",
            "name a numeric column of the transform (e.g. a DECIMAL or DOUBLE amount), cast it to one in the "
            "transform, or remove the field",
        )
    if spec.source.sensitive or spec.target.sensitive:
        # evidence hashes what lineage derives from a sensitive column; refuse what no hash can
        # cover (before the name checks below, whose messages would quote a pivoted value)
        from recovery.lib.dataset_spec.sensitive_lineage import follow_sensitive

        target_cols = {**out, **{m: "VARCHAR" for m in spec.target.metadata.columns}}
        for x in follow_sensitive(spec, cols, target_cols).exposures:
            fail(
                x.field,
                f"exposes sensitive column {x.column}: {x.why}",
                x.fix,
            )
    produced = dict(s.relation_columns(transform_sql(spec, source_snapshot_sql(spec, None))))
    _plain_outputs("target.transform", spec.target.transform.name, produced, fail)
    clash = set(spec.target.metadata.columns) & set(produced)
    if clash:
        fail(
            "target.metadata",
            f"transform already returns {sorted(clash)}",
            "rename the metadata columns or the transform's columns",
        )
    if spec.registry is not None:
        _check_registry(s, spec, fail)
    relation = expected_rows_sql(spec, None)
    for i, d in enumerate(spec.downstream):
        try:
            dcols = dict(s.relation_columns(render(spec.downstream_sql[d.name], target=relation)))
        except duckdb.Error as e:
            fail(
                f"downstream[{i}].sql",
                f"does not run over the target: {str(e).splitlines()[0]}",
                "fix the SQL; it reads {{ target }} shaped like the target",
            )
        _plain_outputs(f"downstream[{i}].sql", d.sql.name, dcols, fail)
        for k in d.key:
            if k not in dcols:
                fail(
                    f"downstream[{i}].key",
                    f"column {k!r} is not produced by {d.sql.name}",
                    "name columns the consumer's SQL returns",
                )
        if d.materiality and d.materiality.column not in dcols:
            fail(
                f"downstream[{i}].materiality.column",
                f"column {d.materiality.column!r} is not produced by {d.sql.name}",
                "name a numeric column of the consumer",
            )


_NUMERIC_TYPES = re.compile(
    r"U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|DOUBLE|REAL|(DECIMAL|NUMERIC)(\(\d+,\s*\d+\))?", re.IGNORECASE
)


def is_numeric_type(sql_type: str) -> bool:
    """Whether a column of this (DuckDB) type can be summed as an amount."""
    return _NUMERIC_TYPES.fullmatch(sql_type.strip()) is not None


def _check_registry(s, spec: DatasetSpec, fail) -> None:
    reg = spec.registry
    assert reg is not None  # called only for a spec with a registry section
    cols = dict(s.columns(reg.table_name.sql()))
    if not cols:
        fail(
            "registry.table",
            f"table {reg.table} does not exist in {spec.warehouse.path.name}",
            "name the schema.table where your runs are recorded, or remove the registry section",
        )
    for field in ("generation", "kind", "started_at", "ended_at", "source_watermark", "backfill_id"):
        name = getattr(reg, field)
        if name is not None and name not in cols:
            fail(
                f"registry.{field}",
                f"column {name!r} is not in {reg.table} (columns: {', '.join(cols)})",
                "name an existing column, or remove the field",
            )
    for field in ("started_at", "ended_at", "source_watermark"):
        name = getattr(reg, field)
        if name is not None and not cols[name].upper().startswith(("TIMESTAMP", "DATE")):
            fail(
                f"registry.{field}",
                f"column {name!r} is {cols[name]}, not a timestamp",
                "name a TIMESTAMP column (UTC)",
            )


def load_spec(path: str | Path, *, check_warehouse: bool = True) -> DatasetSpec:
    """Parse a spec and, unless told not to, check it against the warehouse catalog (read-only)."""
    spec = parse_spec(path)
    if check_warehouse:
        if has_lakehouse(spec):  # the warehouse file catches up with the tables' commit logs first
            sync(open_engine(spec.warehouse), spec)
        check_against_warehouse(spec)
    return spec


def _plain_outputs(field: str, file: str, columns: dict, fail) -> None:
    """Every output column must be a plain identifier: assess, evidence and restatement name
    them in SQL (quoted), and a name like ``top sku`` or ``sum(qty)`` would fail there, mid-recovery."""
    for name in columns:
        if not is_plain_identifier(name):
            fail(
                field,
                f"{file} returns a column named {name!r}, not a plain identifier",
                "alias it with a plain name (letters, digits, underscores), e.g. AS top_sku",
            )
