"""Control-plane tables of guarded backfills: one row per backfill (its manifest and status) and its gate results."""

from __future__ import annotations

from recovery.lib.control.plane import SCHEMA, ensure_control_plane
from recovery.lib.engine.base import Session

BACKFILLS = f"{SCHEMA}.backfills"
GATES = f"{SCHEMA}.backfill_gates"

DDL = [
    f"""CREATE TABLE IF NOT EXISTS {BACKFILLS} (
        backfill_id VARCHAR PRIMARY KEY, dataset VARCHAR, generation VARCHAR, namespace VARCHAR,
        from_namespace VARCHAR, range_start VARCHAR, range_end VARCHAR, partitions VARCHAR[],
        status VARCHAR,
        -- refused | manifest | building | built | failed | stopped | published | converged
        manifest JSON, config_hash VARCHAR, code_version VARCHAR, source_watermark TIMESTAMP,
        manifest_seq BIGINT, seed_seq BIGINT, published_seq BIGINT, converged_seq BIGINT,
        requested_by VARCHAR, approved_by VARCHAR[], created_at TIMESTAMP, reason VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {GATES} (
        backfill_id VARCHAR, generation VARCHAR, stage VARCHAR, gate VARCHAR, passed BOOLEAN,
        observed BIGINT, details VARCHAR, evaluated_seq BIGINT, evaluated_at TIMESTAMP, run_id VARCHAR)""",
]


def ensure_backfill_tables(s: Session) -> None:
    ensure_control_plane(s)
    for stmt in DDL:
        s.execute(stmt)


def tables_exist(s: Session) -> bool:
    return s.object_kind(SCHEMA, "backfills") is not None
