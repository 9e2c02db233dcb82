"""Dagster assets downstream of the target, as consumers: what the damage reached, and their rows kept.

A SQL consumer's correct output can be computed here, from its SQL over the expected rows.
A Dagster asset's cannot: the team's own code computes it, and its IO manager stores it in
a table of the warehouse (dagster-duckdb: ``schema.table`` from the asset key, a partition
column named by ``partition_expr``). So the impact records which of the asset's partitions
read damaged target partitions and how many of its rows sit in them, and keeps a copy of
those rows while the damage is still published: that copy is the original outcome the
ledger compares the corrected rows with, key by key, after the restatement re-materialized
the partitions through Dagster. Taken later, after the team's own automation re-ran the
asset on the repaired target, the copy would already be corrected and the ledger empty.

Which partitions an asset has and how the target's map onto them is Dagster's knowledge
(``recovery/defs/asset_consumers.py``); this module receives them as a :class:`PartitionScope`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.consumers.outputs import CONSUMER_SCHEMA, ensure_tables
from recovery.lib.control.plane import SCHEMA, dataset_table, has_dataset_table, next_seq, utcnow
from recovery.lib.control.tables import ASSET_IMPACT_COLUMNS
from recovery.lib.dataset_spec.models import AssetConsumerSpec, DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import TableName, quote, sql_literal, str_list, ts_literal
from recovery.lib.pointers.managed_views import ManagedName, build
from recovery.lib.reconcile.inputs import partition_table, recon_table

CAPTURED_AT_IMPACT = "captured at impact, while the damage was published"
CAPTURED_AT_RESTATEMENT = "captured at restatement, before its re-materialization"


@dataclass(frozen=True)
class PartitionScope:
    """The rows of an asset's table that some of its partitions cover: ``keys`` compared as text
    with the partition column, or, for time partitions, ``windows`` ``[start, end)``; the whole
    table when the asset is unpartitioned (``column`` None)."""

    column: str | None
    keys: tuple[str, ...] = ()
    windows: tuple[tuple[datetime, datetime], ...] = ()

    def predicate(self) -> str:
        if self.column is None:
            return "true"
        col = quote(self.column)
        if self.windows:
            return " OR ".join(f"({col} >= {ts_literal(a)} AND {col} < {ts_literal(b)})" for a, b in self.windows)
        return f"CAST({col} AS VARCHAR) IN ({str_list(list(self.keys))})" if self.keys else "false"

    def to_json(self) -> str:
        return json.dumps(
            {
                "column": self.column,
                "keys": list(self.keys),
                "windows": [[a.isoformat(), b.isoformat()] for a, b in self.windows],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> PartitionScope:
        d = json.loads(text)
        windows = tuple((datetime.fromisoformat(a), datetime.fromisoformat(b)) for a, b in d["windows"])
        return cls(d["column"], tuple(d["keys"]), windows)


class AssetImpact(BaseModel):
    """What the damage reached in one downstream asset, as the impact recorded it."""

    model_config = ConfigDict(frozen=True)
    asset: str
    table: str
    kind: str
    owner: str
    partitions: list[str]  # the asset's partitions that read damaged target partitions ([] unpartitioned)
    rows_reached: int  # rows of its table in them when the impact was assessed
    original_namespace: str | None  # the copy of those rows (None: the table did not exist)
    basis: str
    scope: str  # PartitionScope as JSON

    @property
    def affected(self) -> bool:
        return self.rows_reached > 0 or bool(self.partitions)


def impact_table(spec: DatasetSpec) -> str:
    return dataset_table("asset_impact", spec.dataset)


def _ensure(s: Session, spec: DatasetSpec) -> None:
    ensure_tables(s)
    s.create_table(impact_table(spec), ASSET_IMPACT_COLUMNS)


def damaged_target_partitions(s: Session, spec: DatasetSpec, incident_id: str) -> list[str]:
    """The target partitions the incident's reconciliation found damage in, as text (a damaged
    key's partition on both sides, so a misfiled row counts where it sits and where it belongs;
    and every partition with a finding), in partition order."""
    if not has_dataset_table(s, "recon", spec.dataset):
        return []
    findings = ""
    if has_dataset_table(s, "recon_partitions", spec.dataset):
        findings = (
            f"UNION SELECT partition FROM {partition_table(spec)} WHERE incident_id = ? AND (damaged_keys > 0 "
            f"OR partially_updated OR count_mismatch OR total_mismatch OR written_after_fence > 0) "
        )
    rows = s.fetchall(
        f"SELECT DISTINCT CAST(p AS VARCHAR) FROM (SELECT actual_partition AS p FROM {recon_table(spec)} "
        "WHERE incident_id = ? "
        f"UNION SELECT expected_partition FROM {recon_table(spec)} WHERE incident_id = ? {findings}) "
        "WHERE p IS NOT NULL ORDER BY 1",
        [incident_id] * (3 if findings else 2),
    )
    return [r[0] for r in rows]


def managed(spec: DatasetSpec, c: AssetConsumerSpec) -> ManagedName:
    """Where copies of the asset's rows are kept: ``consumers.<slug>__gNNNN``, registered like every
    consumer namespace but never pointed at (the asset's own table stays the team's)."""
    return ManagedName(TableName(CONSUMER_SCHEMA, c.slug), f"{spec.dataset}:{c.asset}", spec.dataset)


def table_exists(s: Session, c: AssetConsumerSpec) -> bool:
    t = c.table_name
    return s.object_kind(t.schema, t.name) is not None


def rows_in(s: Session, c: AssetConsumerSpec, scope: PartitionScope) -> int:
    if not table_exists(s, c):
        return 0
    return int(s.scalar(f"SELECT count(*) FROM {c.table_name.sql()} WHERE {scope.predicate()}") or 0)


def capture(
    s: Session, spec: DatasetSpec, c: AssetConsumerSpec, scope: PartitionScope, *, actor: str, note: str
) -> str | None:
    """Keep the asset's rows in ``scope`` in a new namespace (status ``retained``); None when its
    table does not exist (never materialized). The caller owns the transaction."""
    if not table_exists(s, c):
        return None
    ensure_tables(s)
    ns = build(
        s,
        managed(spec, c),
        f"SELECT * FROM {c.table_name.sql()} WHERE {scope.predicate()}",
        actor=actor,
        seq=next_seq(s),
        note=note,
    )
    s.execute(f"UPDATE {SCHEMA}.namespaces SET status = 'retained' WHERE namespace = ?", [ns])
    return ns


def trace_asset(
    s: Session,
    spec: DatasetSpec,
    c: AssetConsumerSpec,
    *,
    incident_id: str,
    partitions: list[str],
    scope: PartitionScope,
    run_id: str | None,
) -> AssetImpact:
    """Record what the damage reached in ``c`` and keep its rows there. An earlier copy of the same
    incident is kept as it is (the earliest is the closest to the damage); the caller owns the
    transaction."""
    _ensure(s, spec)
    prior = s.fetchone(
        f"SELECT original_namespace, basis FROM {impact_table(spec)} WHERE incident_id = ? AND asset = ?",
        [incident_id, c.asset],
    )
    if prior is not None and prior[0] is not None:
        original, basis = prior
    else:
        original = capture(
            s, spec, c, scope, actor="impact", note=f"{c.asset}: {CAPTURED_AT_IMPACT} (incident {incident_id})"
        )
        basis = CAPTURED_AT_IMPACT if original else "none: the asset's table did not exist when the impact was assessed"
    rows = rows_in(s, c, scope)
    s.replace_rows(
        impact_table(spec),
        [n for n, _ in s.columns(impact_table(spec))],
        remove=f"incident_id = {sql_literal(incident_id)} AND asset = {sql_literal(c.asset)}",
        insert="SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?",
        params=[
            incident_id,
            c.asset,
            str(c.table_name),
            c.kind,
            c.owner,
            partitions,
            rows,
            original,
            basis,
            scope.to_json(),
            utcnow(),
            run_id,
        ],
    )
    return AssetImpact(
        asset=c.asset,
        table=str(c.table_name),
        kind=c.kind,
        owner=c.owner,
        partitions=partitions,
        rows_reached=rows,
        original_namespace=original,
        basis=basis,
        scope=scope.to_json(),
    )


def asset_impacts(s: Session, spec: DatasetSpec, incident_id: str) -> list[AssetImpact]:
    """Every downstream asset the incident's impact traced, by asset key ([] before any)."""
    if not has_dataset_table(s, "asset_impact", spec.dataset):
        return []
    rows = s.fetchall(
        f"SELECT asset, table_name, kind, owner, partitions, rows_reached, original_namespace, basis, scope "
        f"FROM {impact_table(spec)} WHERE incident_id = ? ORDER BY asset",
        [incident_id],
    )
    fields = list(AssetImpact.model_fields)
    return [AssetImpact(**dict(zip(fields, r))) for r in rows]
