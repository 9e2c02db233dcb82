"""Every control-plane table of a fixed shape and its DDL, in one place: the schema a reader of the
``_recovery`` schema looks for. The modules that write a table import its name from here and create it
when they first need it (``CREATE ... IF NOT EXISTS``); tables shaped like a dataset's own rows (its
delta log, a reconciliation's rows) are created from those rows where they are written."""

from __future__ import annotations

from recovery.lib.control_names import SCHEMA

# ---- the control plane's core: clock, generations, fences, namespaces, pointers, writes, timeline

SOURCE_WATERMARKS = f"{SCHEMA}.source_watermarks"
SOURCE_WATERMARKS_DDL = f"""CREATE TABLE IF NOT EXISTS {SOURCE_WATERMARKS} (
        seq BIGINT PRIMARY KEY, dataset VARCHAR, generation VARCHAR, source_watermark TIMESTAMP,
        partitions VARCHAR[], basis VARCHAR)"""
"""The source watermark each write applied (``seq`` is the write's): every change that arrived in the
source at or before ``source_watermark`` is in the write's ``partitions`` (NULL: in the whole dataset);
``basis`` says who said so, as a reader of a convergence check needs it."""

CONTROL_PLANE_DDL = [
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


# ---- a repair: its plan, partitions and waves, gate results, diffs, replays, fingerprints

PLANS = f"{SCHEMA}.repair_plans"
PARTITIONS = f"{SCHEMA}.repair_partitions"
GATES = f"{SCHEMA}.gate_results"
DIFFS = f"{SCHEMA}.repair_diffs"
REPLAYS = f"{SCHEMA}.delta_replays"
FINGERPRINTS = f"{SCHEMA}.repair_fingerprints"

REPAIR_DDL = [
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


# ---- guarded backfills: one row per backfill and its gate results

BACKFILLS = f"{SCHEMA}.backfills"
BACKFILL_GATES = f"{SCHEMA}.backfill_gates"

BACKFILL_DDL = [
    f"""CREATE TABLE IF NOT EXISTS {BACKFILLS} (
        backfill_id VARCHAR PRIMARY KEY, dataset VARCHAR, generation VARCHAR, namespace VARCHAR,
        from_namespace VARCHAR, range_start VARCHAR, range_end VARCHAR, partitions VARCHAR[],
        status VARCHAR,
        -- refused | manifest | building | built | failed | stopped | published | converged
        manifest JSON, config_hash VARCHAR, code_version VARCHAR, source_watermark TIMESTAMP,
        manifest_seq BIGINT, seed_seq BIGINT, published_seq BIGINT, converged_seq BIGINT,
        requested_by VARCHAR, approved_by VARCHAR[], created_at TIMESTAMP, reason VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {BACKFILL_GATES} (
        backfill_id VARCHAR, generation VARCHAR, stage VARCHAR, gate VARCHAR, passed BOOLEAN,
        observed BIGINT, details VARCHAR, evaluated_seq BIGINT, evaluated_at TIMESTAMP, run_id VARCHAR)""",
]


# ---- consumer outputs: what each build read, and each restatement

BUILDS = f"{SCHEMA}.consumer_builds"
RESTATEMENTS = f"{SCHEMA}.restatements"
CONSUMER_OUTPUT_DDL = [
    f"""CREATE TABLE IF NOT EXISTS {BUILDS} (
        namespace VARCHAR, dataset VARCHAR, consumer VARCHAR, seq BIGINT, built_at TIMESTAMP,
        target_namespace VARCHAR, generations VARCHAR[], row_count BIGINT, actor VARCHAR, reason VARCHAR)""",
    f"""CREATE TABLE IF NOT EXISTS {RESTATEMENTS} (
        incident_id VARCHAR, dataset VARCHAR, consumer VARCHAR, kind VARCHAR, owner VARCHAR,
        original_namespace VARCHAR, corrected_namespace VARCHAR, ledger_rows BIGINT, material_rows BIGINT,
        original_total DOUBLE, corrected_total DOUBLE, watermark TIMESTAMP, restated_at TIMESTAMP,
        run_id VARCHAR, seq BIGINT, notified_at TIMESTAMP)""",
]


# ---- Delta and Iceberg tables: their commits as the package read them, the tables, the fences

COMMITS = f"{SCHEMA}.lakehouse_commits"
TABLES = f"{SCHEMA}.lakehouse_tables"
FENCES = f"{SCHEMA}.lakehouse_fences"
LAKEHOUSE_DDL = [
    f"""CREATE TABLE IF NOT EXISTS {COMMITS} (
        dataset VARCHAR, location VARCHAR, version BIGINT, ref VARCHAR, committed_at TIMESTAMP,
        written_at TIMESTAMP, operation VARCHAR, generation VARCHAR, writer VARCHAR, incident_id VARCHAR,
        status VARCHAR, seq BIGINT, files_added INTEGER, files_removed INTEGER, rows_added BIGINT,
        rows_removed BIGINT, partitions VARCHAR[], properties JSON, synced_at TIMESTAMP)""",
    f"""CREATE TABLE IF NOT EXISTS {TABLES} (
        dataset VARCHAR, role VARCHAR, location VARCHAR, format VARCHAR, version BIGINT, synced_at TIMESTAMP)""",
    f"""CREATE TABLE IF NOT EXISTS {FENCES} (
        dataset VARCHAR, incident_id VARCHAR, location VARCHAR, version BIGINT, ref VARCHAR, fenced_at TIMESTAMP,
        generations VARCHAR[], property VARCHAR)""",
]


# ---- alerts to people, each delivered once

NOTIFICATIONS = f"{SCHEMA}.notifications"
NOTIFICATIONS_DDL = f"""CREATE TABLE IF NOT EXISTS {NOTIFICATIONS} (
    dedupe_key VARCHAR PRIMARY KEY, owner VARCHAR, subject VARCHAR, severity VARCHAR,
    channel VARCHAR, incident_id VARCHAR, delivered_at TIMESTAMP)"""


# ---- the rest, each with the phase that writes it

SOURCE_CHECKS = f"{SCHEMA}.source_checks"
"""Catalog checks of a source's change log an earlier process passed (``catalog_checks``)."""
SOURCE_CHECKS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {SOURCE_CHECKS} (source VARCHAR, key VARCHAR[], version VARCHAR, op VARCHAR, "
    "ops VARCHAR[], rows BIGINT, checked_at TIMESTAMP DEFAULT current_timestamp)"
)

EXPECTED_KEPT = f"{SCHEMA}.expected_rows_kept"
"""Which expected rows are kept per dataset, at which watermark (``reconcile.expected_cache``)."""
EXPECTED_KEPT_DDL = (
    f"CREATE TABLE IF NOT EXISTS {EXPECTED_KEPT} (dataset VARCHAR PRIMARY KEY, resolution_key VARCHAR, "
    "watermark TIMESTAMP, source_rows BIGINT, source_hash VARCHAR, kept_at TIMESTAMP)"
)

RESTATEMENT_CHECKS = f"{SCHEMA}.restatement_checks"
RESTATEMENT_CHECKS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {RESTATEMENT_CHECKS} (incident_id VARCHAR, dataset VARCHAR, consumer VARCHAR, "
    "check_name VARCHAR, passed BOOLEAN, observed BIGINT, details VARCHAR, run_id VARCHAR, checked_at TIMESTAMP)"
)

DECISIONS_LEDGER = f"{SCHEMA}.restatement_decisions"
DECISIONS_LEDGER_DDL = f"""CREATE TABLE IF NOT EXISTS {DECISIONS_LEDGER} (
    incident_id VARCHAR, dataset VARCHAR, consumer VARCHAR, decision VARCHAR, material BOOLEAN,
    material_rows BIGINT, remediation VARCHAR, original_total DOUBLE, corrected_total DOUBLE)"""


# ---- per-dataset tables (``dataset_table(kind, dataset)`` names them; ``Session.create_table`` makes them,
# on Spark beside the data they grow with)


RESTATEMENT_LEDGER_COLUMNS = (
    "incident_id VARCHAR, consumer VARCHAR, kind VARCHAR, owner VARCHAR, consumer_key VARCHAR, change VARCHAR, "
    "original_value DOUBLE, corrected_value DOUBLE, difference DOUBLE, material BOOLEAN, decision VARCHAR, "
    "original_namespace VARCHAR, corrected_namespace VARCHAR, notified_at TIMESTAMP"
)

CONSUMER_IMPACT_COLUMNS = (
    "incident_id VARCHAR, consumer VARCHAR, consumer_key VARCHAR, change VARCHAR, "
    "original_value DOUBLE, corrected_value DOUBLE, difference DOUBLE, material BOOLEAN"
)

ASSET_IMPACT_COLUMNS = (
    "incident_id VARCHAR, asset VARCHAR, table_name VARCHAR, kind VARCHAR, owner VARCHAR, partitions VARCHAR[], "
    "rows_reached BIGINT, original_namespace VARCHAR, basis VARCHAR, scope VARCHAR, traced_at TIMESTAMP, run_id VARCHAR"
)

CONVERGENCE_HISTORY_COLUMNS = (
    "check_id BIGINT, checked_at TIMESTAMP, run_id VARCHAR, incident_id VARCHAR, watermark TIMESTAMP, "
    "partition VARCHAR, recent BOOLEAN, repaired BOOLEAN, expected_rows BIGINT, actual_rows BIGINT, missing BIGINT, "
    "extra BIGINT, changed BIGINT, duplicate BIGINT, drift_keys BIGINT, sample_keys VARCHAR[], "
    "watermark_basis VARCHAR, pending_changes BIGINT, pending_oldest TIMESTAMP, pending_overdue BIGINT"
)
"""The columns of a dataset's convergence history; a table of an older version gains the missing ones."""
