"""The fixed source snapshot and the expected rows built from it.

The source is an append-only change log. "The source as of watermark W" is the
latest version of each key among changes ingested at or before W; a key whose
latest change is a tombstone is absent. The expected target rows are the spec's
transform over that snapshot, stamped with the source version they came from.
Everything here returns SQL for the engine to run; no rows pass through Python.
"""

from __future__ import annotations

from datetime import datetime

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.identifiers import quote, quote_all, str_list, ts_literal


def latest_versions_sql(
    spec: DatasetSpec, watermark: datetime | None, *, include_deleted: bool, keys: str | None = None
) -> str:
    """Latest change per key as of ``watermark`` (all keys, or only those of the relation ``keys``;
    tombstones included if asked).

    Most keys of a change log have one change, and that change is their latest. So the keys with
    more than one are found by a narrow aggregate (key, max version), and the change log is read
    once more, joined to that much smaller relation: a key it does not hold keeps its one row, a
    key it holds keeps the row at its highest version. A ``row_number()`` window over the whole
    rows would sort every row, and spill under a memory limit; where every key has changed this is
    no slower than the window. Exact because (key, version) identifies one change (``catalog_checks``);
    the join is null-safe, so rows with a NULL key resolve to one, as a window's NULL partition would."""
    s = spec.source
    key = quote_all(s.key)
    ver = quote(s.version)
    only = f" SEMI JOIN {keys} USING ({key})" if keys else ""
    arrived = f"{quote(s.ingested_at)} <= {ts_literal(watermark)}" if watermark else ""
    several = (
        f"SELECT {key}, max({ver}) AS __latest FROM {s.table_name.sql()}{only}"
        f"{f' WHERE {arrived}' if arrived else ''} GROUP BY ALL HAVING count(*) > 1"
    )
    on = " AND ".join(f"src.{quote(k)} IS NOT DISTINCT FROM __several.{quote(k)}" for k in s.key)
    where = [f"(__several.__latest IS NULL OR src.{ver} = __several.__latest)"]
    if arrived:
        where.append(f"src.{arrived}")
    if not include_deleted:
        where.append(f"src.{quote(s.op)} NOT IN ({str_list(s.delete_ops)})")
    return (
        f"SELECT src.* FROM {s.table_name.sql()} AS src{only} LEFT JOIN ({several}) AS __several ON {on} "
        f"WHERE {' AND '.join(where)}"
    )


def latest_index_sql(spec: DatasetSpec, watermark: datetime | None, keys: str | None = None) -> str:
    """Each key's latest change as of ``watermark``, narrow: the key, its version, op and arrival.

    For a caller that keeps the latest changes as a table (the reconciliation reads op and
    arrival again): an aggregate over four columns, not whole rows, is materialized (less time and
    memory, with ``expected_from_index_sql``). As one statement, unmaterialized, it is no faster than
    ``expected_rows_sql``, so the other phases keep that. Exact because
    (key, version) identifies one change (``catalog_checks``)."""
    s = spec.source
    key = quote_all(s.key)
    ver = quote(s.version)
    where = f" WHERE {quote(s.ingested_at)} <= {ts_literal(watermark)}" if watermark else ""
    only = f" SEMI JOIN {keys} USING ({key})" if keys else ""
    return (
        f"SELECT {key}, max({ver}) AS {ver}, arg_max({quote(s.op)}, {ver}) AS {quote(s.op)}, "
        f"arg_max({quote(s.ingested_at)}, {ver}) AS {quote(s.ingested_at)} "
        f"FROM {s.table_name.sql()}{only}{where} GROUP BY ALL"
    )


def expected_from_index_sql(spec: DatasetSpec, index: str, watermark: datetime | None) -> str:
    """Expected rows (as ``expected_rows_sql``) of the live keys of ``index``, a relation of
    ``latest_index_sql``: the source's rows at those versions, through the transform, stamped
    with the version from the index (one join back on the narrow index, not on whole rows)."""
    s = spec.source
    meta = spec.target.metadata
    key_cols = [*s.key, s.version]
    on = " AND ".join(f"src.{quote(c)} = i.{quote(c)}" for c in key_cols)
    where = f" WHERE src.{quote(s.ingested_at)} <= {ts_literal(watermark)}" if watermark else ""
    live = f"SELECT {quote_all(key_cols)} FROM {index} WHERE {quote(s.op)} NOT IN ({str_list(s.delete_ops)})"
    rows = f"SELECT src.* FROM {s.table_name.sql()} AS src JOIN ({live}) AS i ON {on}{where}"
    key_join = " AND ".join(f"t.{quote(k)} = i.{quote(k)}" for k in spec.key)
    return (
        f"SELECT t.*, i.{quote(s.version)} AS {quote(meta.source_version)} "
        f"FROM ({render(spec.transform_sql, source=rows)}) AS t JOIN {index} AS i ON {key_join}"
    )


def source_snapshot_sql(spec: DatasetSpec, watermark: datetime | None) -> str:
    """Latest non-deleted version of each key as of ``watermark`` (None: everything there now)."""
    return latest_versions_sql(spec, watermark, include_deleted=False)


def transform_sql(spec: DatasetSpec, source_relation: str) -> str:
    """The spec's transform applied to any relation shaped like the source."""
    return render(spec.transform_sql, source=source_relation)


def expected_rows_sql(spec: DatasetSpec, watermark: datetime | None, source_relation: str | None = None) -> str:
    """Transform output over the snapshot, plus the source version of each row.

    The transform returns key, partition and payload; the package adds the source
    version by joining back to the snapshot on the key (the metadata contract).
    """
    snap = source_relation or source_snapshot_sql(spec, watermark)
    meta = spec.target.metadata
    key_join = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in spec.key)
    return (
        f"SELECT t.*, s.{quote(spec.source.version)} AS {quote(meta.source_version)} "
        f"FROM ({render(spec.transform_sql, source=snap)}) AS t "
        f"JOIN ({snap}) AS s ON {key_join}"
    )
