"""The control plane: the warehouse's own record of generations, fences and pointers.

It lives in schema ``_recovery`` of the *same* database as the data, because the
fence must be checked in the same transaction as the write it guards (a fence in
another file could not be, and DuckDB cannot write two attached files in one
transaction). The ``clock`` row is a commit-order sequence: every write
transaction increments it, so two writers conflict on it and the sequence orders
commits exactly as they happened (a watermark taken from values allocated at
insert time would miss a slow transaction's rows).
"""

from __future__ import annotations

from datetime import UTC, datetime

from recovery.lib.control_names import (  # noqa: F401 - the control plane's names, re-exported
    PER_DATASET_TABLES,
    SCHEMA,
    dataset_table,
    dataset_table_name,
    is_dataset_table_name,
)
from recovery.lib.engine.base import Session

SOURCE_WATERMARKS = f"{SCHEMA}.source_watermarks"
SOURCE_WATERMARKS_DDL = f"""CREATE TABLE IF NOT EXISTS {SOURCE_WATERMARKS} (
        seq BIGINT PRIMARY KEY, dataset VARCHAR, generation VARCHAR, source_watermark TIMESTAMP,
        partitions VARCHAR[], basis VARCHAR)"""
"""The source watermark each write applied (``seq`` is the write's): every change that arrived in the
source at or before ``source_watermark`` is in the write's ``partitions`` (NULL: in the whole dataset);
``basis`` says who said so, as a reader of a convergence check needs it."""

DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.clock (id INTEGER PRIMARY KEY, seq BIGINT NOT NULL)",
    f"INSERT INTO {SCHEMA}.clock SELECT 1, 0 WHERE NOT EXISTS (SELECT 1 FROM {SCHEMA}.clock)",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.generations (
        generation VARCHAR PRIMARY KEY,
        dataset VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,            -- ingest | backfill | repair | adopted | unknown
        status VARCHAR NOT NULL,          -- running | complete | failed | fenced | published
        namespace VARCHAR,                -- physical table it writes; NULL follows the public pointer
        started_at TIMESTAMP,
        ended_at TIMESTAMP,
        source_watermark TIMESTAMP,
        code_version VARCHAR,
        config_hash VARCHAR,
        parent VARCHAR,
        token BIGINT NOT NULL,
        fenced_at TIMESTAMP,
        writes BIGINT NOT NULL,
        last_write_seq BIGINT,
        registered_seq BIGINT,
        inferred BOOLEAN NOT NULL,
        run_id VARCHAR,
        backfill_id VARCHAR,
        note VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.fences (
        generation VARCHAR, dataset VARCHAR, incident_id VARCHAR, token BIGINT,
        fenced_at TIMESTAMP, fenced_by VARCHAR, reason VARCHAR, seq BIGINT)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.fence_attempts (
        generation VARCHAR, dataset VARCHAR, attempted_at TIMESTAMP, action VARCHAR,
        run_id VARCHAR, detail VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.namespaces (
        namespace VARCHAR PRIMARY KEY, dataset VARCHAR, public_name VARCHAR,
        created_seq BIGINT, created_at TIMESTAMP, created_by VARCHAR, status VARCHAR, note VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.pointers (
        public_name VARCHAR PRIMARY KEY, dataset VARCHAR, namespace VARCHAR, seq BIGINT, updated_at TIMESTAMP)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.pointer_history (
        public_name VARCHAR, dataset VARCHAR, from_namespace VARCHAR, to_namespace VARCHAR,
        seq BIGINT, moved_at TIMESTAMP, actor VARCHAR, reason VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.writes (
        seq BIGINT PRIMARY KEY, dataset VARCHAR, generation VARCHAR, namespace VARCHAR, mode VARCHAR,
        partitions VARCHAR[], rows_inserted BIGINT, rows_deleted BIGINT, written_at TIMESTAMP,
        committed_at TIMESTAMP, run_id VARCHAR, note VARCHAR)""",
    SOURCE_WATERMARKS_DDL,
    f"CREATE SEQUENCE IF NOT EXISTS {SCHEMA}.timeline_seq",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.timeline (
        event_id BIGINT, incident_id VARCHAR, dataset VARCHAR, event_at TIMESTAMP, kind VARCHAR,
        actor VARCHAR, summary VARCHAR, details JSON, run_id VARCHAR)""",
]


def utcnow() -> datetime:
    """Naive UTC now: every timestamp in the control plane is naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def ensure_control_plane(session: Session) -> None:
    """Create the control-plane schema; idempotent."""
    for stmt in DDL:
        session.execute(stmt)


def control_plane_exists(session: Session) -> bool:
    return session.object_kind(SCHEMA, "clock") is not None


def next_seq(session: Session) -> int:
    """Take the next commit sequence number; conflicts with any concurrent writer."""
    return int(session.scalar(f"UPDATE {SCHEMA}.clock SET seq = seq + 1 WHERE id = 1 RETURNING seq"))


def has_dataset_table(session: Session, kind: str, dataset: str) -> bool:
    return session.object_kind(SCHEMA, dataset_table_name(kind, dataset)) is not None


def delta_table(dataset: str) -> str:
    """Qualified name of a dataset's append-only delta log."""
    return dataset_table("delta", dataset)


def record_event(
    session: Session,
    *,
    kind: str,
    summary: str,
    dataset: str | None = None,
    incident_id: str | None = None,
    actor: str | None = None,
    details: str | None = None,
    run_id: str | None = None,
    at: datetime | None = None,
) -> None:
    """Append one event to the incident timeline."""
    session.execute(
        f"INSERT INTO {SCHEMA}.timeline VALUES (nextval('{SCHEMA}.timeline_seq'), ?, ?, ?, ?, ?, ?, ?, ?)",
        [incident_id, dataset, at or utcnow(), kind, actor, summary, details, run_id],
    )
