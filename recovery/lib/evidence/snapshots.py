"""A bundle's source snapshots: the change log's copy, read through each snapshot's key list.

The source is an append-only change log whose (key, version) pairs are unique (checked at
containment and before every reconciliation), and a snapshot as of a watermark is each key's
latest non-deleted change up to it. A bundle holds the whole change log; each snapshot is kept
as the list of the (key, version) pairs it was resolved to when the bundle was built, which
names exactly its rows in the change log's copy. Written as a second copy of those rows with
their keyed hashes, each snapshot took as long as the change log's own copy (writing the hashes
is a copy's cost); its key list takes a fraction of it. The list is what the package resolved,
checksummed in the manifest like every file, so an audit does not depend on the resolution rule.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import quote, string_literal

CHANGE_LOG = "source/change_log.parquet"


def snapshot_entries(manifest: dict) -> list[dict]:
    """The manifest's file entries that are snapshot key lists, in the bundle's order."""
    return [f for f in manifest["files"] if "snapshot" in f]


def snapshot_rows_sql(bundle: Path | None, entry: dict) -> str:
    """The snapshot's rows: a SELECT over the change log's copy and the key list of ``entry``.
    ``bundle`` None: paths relative to the bundle's folder (the manifest's form, to run from it)."""
    snap = entry["snapshot"]

    def at(rel: str) -> str:
        return string_literal(rel if bundle is None else str(bundle / rel))

    # null-safe: a key part or a version may be NULL ((key, version) is still unique: NULLs group together)
    on = " AND ".join(f"c.{quote(c)} IS NOT DISTINCT FROM k.{quote(c)}" for c in [*snap["key"], snap["version"]])
    return (
        f"SELECT c.* FROM read_parquet({at(snap['rows_of'])}) AS c "
        f"SEMI JOIN read_parquet({at(entry['path'])}) AS k ON {on}"
    )


def choose_snapshot(manifest: dict, as_of: str | None) -> dict:
    """The snapshot entry ``as_of`` names ("now", or a watermark as the manifest writes it); without
    one, the only snapshot of a failed generation's read. Raises ``RecoveryError`` naming the choices."""
    entries = snapshot_entries(manifest)
    if not entries:
        raise RecoveryError(
            f"the bundle lists no snapshot key lists (its format is {manifest.get('format')}): an older bundle "
            f"holds its source snapshots as Parquet files of their own (source/snapshot_*.parquet); read those"
        )
    choices = ", ".join(e["snapshot"]["as_of"] for e in entries)
    if as_of is None:
        read = [e for e in entries if e["snapshot"]["as_of"] != "now"]
        if len(read) == 1:
            return read[0]
        raise RecoveryError(f"the bundle holds snapshots as of {choices}; name one with --as-of")
    for e in entries:
        if e["snapshot"]["as_of"] == as_of:
            return e
    raise RecoveryError(f"the bundle holds no snapshot as of {as_of!r}; it holds: {choices}")


def write_snapshot(bundle: Path, entry: dict, out: Path) -> int:
    """Write the snapshot's rows to the Parquet file ``out`` (outside the bundle); returns how many."""
    con = duckdb.connect()
    try:
        target = string_literal(str(out))
        row = con.execute(f"COPY ({snapshot_rows_sql(bundle, entry)}) TO {target} (FORMAT parquet)").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0
