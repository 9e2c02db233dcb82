"""Control-plane tables of a repair: the plan, its partitions and waves, gate results, diffs."""

from __future__ import annotations

from recovery.lib.control.plane import SCHEMA, dataset_table
from recovery.lib.engine.base import Session
from recovery.lib.spec.models import DatasetSpec

PLANS = f"{SCHEMA}.repair_plans"
PARTITIONS = f"{SCHEMA}.repair_partitions"
GATES = f"{SCHEMA}.gate_results"
DIFFS = f"{SCHEMA}.repair_diffs"
REPLAYS = f"{SCHEMA}.delta_replays"
FINGERPRINTS = f"{SCHEMA}.repair_fingerprints"

DDL = [
    f"""CREATE TABLE IF NOT EXISTS {PLANS} (
        incident_id VARCHAR PRIMARY KEY, dataset VARCHAR, generation VARCHAR, namespace VARCHAR,
        from_namespace VARCHAR, failed_generations VARCHAR[], low_seq BIGINT, source_watermark TIMESTAMP,
        stamped_at TIMESTAMP, high_seq BIGINT, published_seq BIGINT, status VARCHAR, created_at TIMESTAMP,
        canary_max INTEGER, wave_size INTEGER, stopped_reason VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {PARTITIONS} (
        incident_id VARCHAR, partition VARCHAR, wave INTEGER, action VARCHAR, qualified_reason VARCHAR,
        labels VARCHAR[], rows_before BIGINT, total_before DOUBLE, rows_expected BIGINT, total_expected DOUBLE,
        rows_after BIGINT, total_after DOUBLE, built_seq BIGINT, built_run_id VARCHAR, status VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {GATES} (
        incident_id VARCHAR, generation VARCHAR, stage VARCHAR, gate VARCHAR, passed BOOLEAN, blocking BOOLEAN,
        observed BIGINT, details VARCHAR, evaluated_seq BIGINT, evaluated_at TIMESTAMP, run_id VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {DIFFS} (
        incident_id VARCHAR, partition VARCHAR, label VARCHAR, keys_before BIGINT, keys_after BIGINT)""",
    f"""CREATE TABLE IF NOT EXISTS {REPLAYS} (
        incident_id VARCHAR, stage VARCHAR, after_seq BIGINT, through_seq BIGINT, upserted BIGINT, deleted BIGINT,
        skipped_older BIGINT, replayed_at TIMESTAMP, run_id VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {FINGERPRINTS} (
        incident_id VARCHAR, partition VARCHAR, rows BIGINT, fingerprint HUGEINT, gated_seq BIGINT, stage VARCHAR)""",
]


def ensure_repair_tables(s: Session) -> None:
    for stmt in DDL:
        s.execute(stmt)


def snapshot_table(spec: DatasetSpec) -> str:
    """The fixed source snapshot's expected rows for the repair of ``spec``'s dataset."""
    return dataset_table("repair_snapshot", spec.dataset)
