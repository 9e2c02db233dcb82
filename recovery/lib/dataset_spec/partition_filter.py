"""Selecting partitions given as text, with a predicate in the partition column's own type.

Plans, gates, scopes and the control plane carry partitions as text (``CAST(p AS VARCHAR)``
of whatever type the column has), so that one code path serves DATE, integer, text and
timestamp partitions alike. Filtering a table by ``CAST(col AS VARCHAR) IN (...)`` casts
every row and hides the predicate from the engine's zone maps, which a scan by
``col IN (CAST('2024-01-01' AS DATE), ...)`` uses to skip the row groups of other partitions;
a repair wave's gates scan the generation and its snapshot about ten times.

Both select the same rows: a partition's text is the engine's own rendering of a value, and
casting that text back to the column's type gives the value again. A text that names no value
of the type (cannot be cast) matches no row, as it matched none before, and is left out of the
list rather than cast to NULL. When the column's type cannot be read (no such relation yet) the
predicate falls back to the text comparison.
"""

from __future__ import annotations

import weakref

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, sql_literal, str_list

_TYPES: weakref.WeakKeyDictionary[Session, dict[str, str | None]] = weakref.WeakKeyDictionary()


def partition_type(s: Session, spec: DatasetSpec) -> str | None:
    """The target's partition column type as the engine names it (read once per session)."""
    table = spec.target.table_name.sql()
    known = _TYPES.setdefault(s, {})
    if known.get(table) is None:  # not there yet (created later in this session): looked up again
        known[table] = dict(s.columns(table)).get(spec.target.partition)
    return known[table]


def in_partitions(s: Session, spec: DatasetSpec, partitions: list[str]) -> str:
    """The partition column in one of ``partitions`` (their text)."""
    if not partitions:
        return "false"
    col = quote(spec.target.partition)
    typ = partition_type(s, spec)
    if typ is None:
        return f"CAST({col} AS VARCHAR) IN ({str_list(partitions)})"
    if typ.upper() in ("VARCHAR", "STRING", "TEXT"):
        return f"{col} IN ({str_list(partitions)})"
    # a text no value of the type renders as is left out here (not cast to NULL in the list: under a
    # NOT, ``x IN (.., NULL)`` is NULL for every other row, not false)
    castable = s.fetchall(
        f"SELECT p FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS p) WHERE TRY_CAST(p AS {typ}) IS NOT NULL ORDER BY p",
        [list(partitions)],
    )
    if not castable:
        return "false"
    return f"{col} IN ({', '.join(f'CAST({sql_literal(p)} AS {typ})' for (p,) in castable)})"
