"""A read path for BI tools during a recovery: the published generation, outside the warehouse.

DuckDB admits one writer process per file, and while a recovery writes, any other
process opening the warehouse (a BI tool, the ``duckdb`` CLI, even read-only) gets
"Could not set lock". Outside readers therefore read the export beside the warehouse,
``published/<schema.table>/``, refreshed after each publish (and rollback):

- ``<namespace>__<pointer seq>.parquet``: the public view's namespace at that pointer
  move, written once to a temp name and renamed into place, never changed afterwards
  (the last ``KEEP``, the current one included, and any younger than ``GRACE_S`` are kept);
- ``current.duckdb``: a tiny read-only DuckDB catalog with one view named like the
  public table (``transactions``) over the current Parquet file, replaced by an atomic
  ``rename``: ``duckdb -readonly published/analytics.transactions/current.duckdb``
  then ``SELECT ... FROM transactions``. A reader holds the file it opened, so it sees
  one generation whole until it reopens; it never locks the warehouse;
- ``current.json``: the same facts (file, namespace, pointer seq, rows) for scripts.

Parquet files are never replaced in place: DuckDB may open a file more than once per
query, and a file swapped under one path between two opens reads as corrupt.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

import duckdb

from recovery.lib.control.plane import utcnow
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.identifiers import quote, string_literal
from recovery.lib.pointers.managed_views import pointer_seq
from recovery.lib.pointers.namespaces import current_namespace, namespace_sql

CATALOG = "current.duckdb"
MARKER = "current.json"
KEEP = 5
GRACE_S = 600.0


def export_dir(spec: DatasetSpec) -> Path:
    return spec.warehouse.path.parent / "published" / str(spec.target.table_name)


def read_marker(spec: DatasetSpec) -> dict | None:
    try:
        return json.loads((export_dir(spec) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _exported(spec: DatasetSpec, name: str) -> bool:
    d, marker = export_dir(spec), read_marker(spec)
    return bool(marker and marker.get("file") == name and (d / name).exists() and (d / CATALOG).exists())


def export_is_current(s, spec: DatasetSpec) -> bool:
    """Whether the read copy holds the namespace the public view points at now, at its pointer move
    (nothing published: nothing to export, so it is)."""
    ns = current_namespace(s, spec)
    if ns is None:
        return True
    return _exported(spec, f"{ns}__{pointer_seq(s, str(spec.target.table_name))}.parquet")


def refresh_published_export(engine: Engine, spec: DatasetSpec) -> Path | None:
    """Export the namespace the public view points at, unless already exported; returns the
    catalog file outside readers open, or None when nothing is published yet."""
    d = export_dir(spec)
    with engine.session(read_only=True) as s:
        ns = current_namespace(s, spec)
        if ns is None:
            return None
        seq = pointer_seq(s, str(spec.target.table_name))
        name = f"{ns}__{seq}.parquet"
        if _exported(spec, name):
            return d / CATALOG
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            rows = s.export_parquet(f"SELECT * FROM {namespace_sql(ns)}", str(tmp))
            _fsync(tmp)
            os.replace(tmp, d / name)
        finally:
            tmp.unlink(missing_ok=True)
    _replace_catalog(d, spec.target.table_name.name, d / name)
    body = {
        "file": name,
        "catalog": CATALOG,
        "view": spec.target.table_name.name,
        "namespace": ns,
        "pointer_seq": seq,
        "rows": int(rows),
        "exported_at": utcnow().isoformat(),
        "public_name": str(spec.target.table_name),
    }
    _atomic_write(d / MARKER, (json.dumps(body, indent=2) + "\n").encode())
    _prune(d, keep=name)
    return d / CATALOG


def _prune(d: Path, *, keep: str) -> None:
    """Drop exports beyond the newest ``KEEP`` (by pointer seq) that are older than ``GRACE_S``: a
    reader that opened an older catalog a moment ago still finds its file."""

    def seq(p: Path) -> int:
        m = re.search(r"__(\d+)\.parquet$", p.name)
        return int(m.group(1)) if m else -1

    now = time.time()
    for old in sorted((p for p in d.glob("*.parquet") if p.name != keep), key=seq)[: 1 - KEEP]:
        try:
            if now - old.stat().st_mtime > GRACE_S:
                old.unlink()
        except FileNotFoundError:
            pass


def _replace_catalog(d: Path, view: str, parquet: Path) -> None:
    tmp = d / f".{CATALOG}.{os.getpid()}.{secrets.token_hex(4)}"
    con = duckdb.connect(str(tmp))
    try:
        con.execute(
            f"CREATE VIEW {quote(view)} AS SELECT * FROM read_parquet({string_literal(str(parquet.resolve()))})"
        )
        con.execute("CHECKPOINT")
    finally:
        con.close()
    try:
        _fsync(tmp)
        os.replace(tmp, d / CATALOG)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
