"""Incremental ingestion: apply the source changes in a watermark window through the writer.

Normal ingestion is change-data-capture: the keys whose latest version as of
``until`` arrived in ``(since, until]`` are upserted with it, and those whose latest
change is a tombstone are deleted (a late, older version of a key changes nothing).
Both writes are idempotent, so a crashed run is simply re-run. The second write records ``until`` as the
source watermark it applied (in the write log, in its own transaction) and the ingest generation's
``source_watermark`` advances to it; the next run starts there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.retry import retrying
from recovery.lib.snapshot import expected_rows_sql, latest_versions_sql, str_list, ts_literal
from recovery.lib.write.writer import Writer


@dataclass(frozen=True)
class IngestResult:
    generation: str
    since: datetime | None
    until: datetime
    upserted: int
    deleted: int
    write_seqs: tuple[int, ...]


def ingestion_watermark(writer: Writer) -> datetime | None:
    """How far normal ingestion of this dataset has applied the source."""
    with writer.engine.session() as s:
        return s.scalar(
            f"SELECT max(source_watermark) FROM {SCHEMA}.generations WHERE dataset = ? AND kind = 'ingest' "
            "AND fenced_at IS NULL",
            [writer.spec.dataset],
        )


def apply_changes(
    writer: Writer,
    generation: str,
    *,
    until: datetime,
    since: datetime | None = None,
    at: datetime | None = None,
    run_id: str | None = None,
) -> IngestResult:
    """Apply the changes ingested in ``(since, until]`` (``since`` defaults to the watermark)."""
    spec = writer.spec
    src = spec.source
    if since is None:
        since = ingestion_watermark(writer)
    # a key's state changed in (since, until] exactly when its latest version as of ``until`` arrived
    # in the window (a late, older version changes nothing): one pass, no join against the keys
    # that changed (whose hash table grows with every changed key)
    latest = f"SELECT * FROM ({latest_versions_sql(spec, until, include_deleted=True)})" + (
        f" WHERE {quote(src.ingested_at)} > {ts_literal(since)}" if since else ""
    )
    key = quote_all(spec.key)
    upserts = f"SELECT * FROM ({latest}) WHERE {quote(src.op)} NOT IN ({str_list(src.delete_ops)})"
    deletes = (
        f"SELECT {key}, {quote(src.version)} AS {quote(spec.target.metadata.source_version)} "
        f"FROM ({latest}) WHERE {quote(src.op)} IN ({str_list(src.delete_ops)})"
    )
    up = writer.write(
        generation,
        expected_rows_sql(spec, None, source_relation=upserts),
        mode="upsert_keys",
        at=at,
        run_id=run_id,
        note="ingest upserts",
    )
    faults.checkpoint("ingest:upserted")  # the upserts committed, the tombstones and the watermark not yet
    # the watermark is recorded with the second write, in its transaction: once both landed, every
    # change up to ``until`` is applied; after a crash between them, the window is still pending
    de = writer.write(
        generation,
        deletes,
        mode="delete_keys",
        at=at,
        run_id=run_id,
        note="ingest tombstones",
        source_watermark=until,
        watermark_basis="incremental ingestion through the writer",
    )
    faults.checkpoint("ingest:tombstoned")  # the tombstones and the write log's watermark, not the generation's

    def advance() -> None:
        with writer.engine.transaction() as s:
            s.execute(
                f"UPDATE {SCHEMA}.generations SET source_watermark = greatest(coalesce(source_watermark, ?), ?) "
                f"WHERE generation = ? AND fenced_at IS NULL",
                [until, until, generation],
            )

    retrying(advance)
    faults.checkpoint("ingest:advanced")
    return IngestResult(generation, since, until, up.rows_inserted, de.rows_deleted, (up.seq, de.seq))
