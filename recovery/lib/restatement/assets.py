"""Restating a Dagster asset consumer: its original rows before, its corrected rows after, the ledger.

The Dagster step (``recovery/defs/restatement/``) launches the asset's materialization for
the affected partitions, so the team's own code computes the correction. Around those runs
this module records, each in its own transaction: before, which original the ledger
compares with (the copy the impact kept while the damage was published, else one taken
now, and the report says which); after, a copy of the corrected rows in a kept namespace
(the team's table may be rewritten any time later), the ledger, the decisions, the
restatement record and the check (``checks.asset_check``). A re-run keeps the first
original (also one it captured itself before a kill, never the re-materialized rows) and
reuses the corrected copy while the table still holds exactly its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recovery.lib import faults
from recovery.lib.consumers.assets import (
    CAPTURED_AT_RESTATEMENT,
    PartitionScope,
    asset_impacts,
    capture,
    managed,
    table_exists,
)
from recovery.lib.consumers.outputs import RESTATEMENTS, ensure_tables
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import AssetConsumerSpec, DatasetSpec
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.identifiers import TableName, quote_all
from recovery.lib.restatement.checks import MaterializationRun, asset_check, record_checks
from recovery.lib.restatement.record import ConsumerRestatement, mismatched_rows, record_restatement
from recovery.lib.retry import retrying


@dataclass(frozen=True)
class AssetOriginal:
    """What the restatement of one asset starts from: its original rows and the partitions to redo."""

    namespace: str | None  # None: the asset's table did not exist, nobody saw a value
    basis: str
    partitions: list[str]
    scope: PartitionScope


def check_columns(s: Session, c: AssetConsumerSpec, field: str) -> None:
    """The columns the ledger keys and filters by exist in the asset's table (when it exists)."""
    if not table_exists(s, c):
        return
    have = {n for n, _ in s.columns(c.table_name.sql())}
    wanted = [(f"{field}.key", k) for k in c.key]
    if c.partition:
        wanted.append((f"{field}.partition", c.partition))
    if c.materiality:
        wanted.append((f"{field}.materiality.column", c.materiality.column))
    for where, col in wanted:
        if col not in have:
            raise SpecError(
                where,
                f"{c.table_name} (asset {c.asset}) has no column {col!r} (it has {', '.join(sorted(have))})",
                "name a column of the table the asset's IO manager writes",
            )


def _parts(t: TableName) -> tuple[str, str]:
    return t.schema, t.name


def original_for(
    engine: Engine,
    spec: DatasetSpec,
    c: AssetConsumerSpec,
    *,
    incident_id: str,
    partitions: list[str],
    scope: PartitionScope,
    field: str,
) -> AssetOriginal:
    """The original to compare with: kept by an earlier restatement of the incident, else by the
    impact (with the partitions it traced), else one an earlier run captured here (committed before it was
    killed or its runs failed: the table may hold re-materialized rows since), else a copy of the rows in
    ``scope`` taken now."""

    def txn() -> AssetOriginal:
        with engine.transaction() as s:
            check_columns(s, c, field)
            traced = {i.asset: i for i in asset_impacts(s, spec, incident_id)}.get(c.asset)
            if traced is not None:
                partitions_, scope_ = traced.partitions, PartitionScope.from_json(traced.scope)
            else:
                partitions_, scope_ = partitions, scope
            ensure_tables(s)
            prior = s.fetchone(
                f"SELECT original_namespace FROM {RESTATEMENTS} WHERE incident_id = ? AND dataset = ? AND consumer = ?",
                [incident_id, spec.dataset, c.asset],
            )
            if prior is not None and prior[0] is not None:
                basis = traced.basis if traced else CAPTURED_AT_RESTATEMENT
                return AssetOriginal(prior[0], basis, partitions_, scope_)
            if traced is not None and traced.original_namespace is not None:
                return AssetOriginal(traced.original_namespace, traced.basis, partitions_, scope_)
            note = f"{c.asset}: {CAPTURED_AT_RESTATEMENT} ({incident_id})"
            # a capture committed by an earlier run the restatement record never followed (killed after it, or
            # its runs failed): that copy is the original, the table may hold re-materialized rows since
            kept = s.fetchone(
                f"SELECT namespace FROM {SCHEMA}.namespaces WHERE dataset = ? AND note = ? AND status = 'retained' "
                "ORDER BY created_seq LIMIT 1",
                [managed(spec, c).label, note],
            )
            if kept is not None and s.object_kind(*_parts(TableName.parse(kept[0]))) is not None:
                return AssetOriginal(kept[0], CAPTURED_AT_RESTATEMENT, partitions_, scope_)
            ns = capture(s, spec, c, scope_, actor="restatement", note=note)
            basis = (
                CAPTURED_AT_RESTATEMENT if ns else "none: the asset's table did not exist before its re-materialization"
            )
            faults.checkpoint("asset_original:captured")  # the copy taken, not committed
            return AssetOriginal(ns, basis, partitions_, scope_)

    original = retrying(txn)
    faults.checkpoint("asset_original:committed")
    return original


def record_restated(
    engine: Engine,
    spec: DatasetSpec,
    c: AssetConsumerSpec,
    *,
    incident_id: str,
    original: AssetOriginal,
    runs: Sequence[MaterializationRun],
    actor: str,
    run_id: str | None,
) -> ConsumerRestatement:
    """After the runs: keep the corrected rows, write the ledger and the record, make the check."""

    def txn() -> ConsumerRestatement:
        with engine.transaction() as s:
            if not table_exists(s, c):
                raise RecoveryError(
                    f"{c.table_name} does not exist after asset {c.asset} was materialized. Fix: name the table its "
                    f"IO manager writes (downstream_assets[].table, or the asset's schema metadata)"
                )
            prior = s.fetchone(
                f"SELECT corrected_namespace FROM {RESTATEMENTS} WHERE incident_id = ? AND dataset = ? "
                "AND consumer = ?",
                [incident_id, spec.dataset, c.asset],
            )
            now = f"SELECT * FROM {c.table_name.sql()} WHERE {original.scope.predicate()}"
            reused = bool(
                prior and prior[0] and mismatched_rows(s, f"SELECT * FROM {TableName.parse(prior[0]).sql()}", now) == 0
            )
            corrected = (
                prior[0]
                if reused and prior
                else capture(
                    s,
                    spec,
                    c,
                    original.scope,
                    actor=actor,
                    note=f"{c.asset}: re-materialized for incident {incident_id} "
                    f"(runs {', '.join(r.run_id[:8] for r in runs[:5])})",
                )
            )
            assert corrected is not None  # the table exists
            result = record_restatement(
                s,
                spec,
                c,
                incident_id=incident_id,
                original=original.namespace,
                corrected=corrected,
                reused=reused,
                actor=actor,
                run_id=run_id,
                basis=original.basis,
            )
            duplicates = int(
                s.scalar(
                    f"SELECT count(*) FROM (SELECT 1 FROM {TableName.parse(corrected).sql()} "
                    f"GROUP BY {quote_all(c.key)} HAVING count(*) > 1)"
                )
                or 0
            )
            check = asset_check(
                c.asset,
                runs,
                partitions=len(original.partitions) or 1,
                duplicate_keys=duplicates,
                ledger_rows=result.ledger_rows,
            )
            record_checks(s, spec.dataset, incident_id, [check], run_id=run_id)
            faults.checkpoint("asset_restate:checked")  # everything written, not committed
            return result.model_copy(update={"check": check})

    restated = retrying(txn)
    faults.checkpoint("asset_restate:committed")
    return restated
