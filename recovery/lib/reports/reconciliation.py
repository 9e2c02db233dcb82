"""The reconciliation report: keys, partitions and versions compared; damage per label and
partition; consumer impact with materiality; the decisions the damage affects.

Every figure is read from the control plane the reconciliation and impact phases
wrote (``_recovery."recon__<dataset>"``, ``"recon_partitions__<dataset>"``,
``"impact__<dataset>"``, the timeline's decision event), so the report states what
the recovery acts on, not a recomputation.
"""

from __future__ import annotations

from recovery.lib.consumers.assets import asset_impacts
from recovery.lib.consumers.impact import DECISIONS, impact_summary
from recovery.lib.control.plane import SCHEMA, dataset_table_name
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.incident.model import Incident
from recovery.lib.reconcile.labels import LABELS
from recovery.lib.reports import plots
from recovery.lib.reports.tables import NOT_RUN, exists, qualified
from recovery.lib.snapshot import str_list

FINDINGS = ("partially_updated", "count_mismatch", "total_mismatch", "written_after_fence")

VERSION_RELATIONS = (
    "older version than expected",
    "expected version",
    "newer version than expected",
    "absent from the target",
    "no expected row",
)


def scope(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Keys, partitions and source versions the reconciliation compared."""
    ptable = dataset_table_name("recon_partitions", spec.dataset)
    if not exists(s, ptable):
        return {"status": NOT_RUN}
    row = s.fetchone(
        f"SELECT count(*), sum(expected_rows), sum(actual_rows), CAST(sum(expected_total) AS DOUBLE), "
        "CAST(sum(actual_total) AS DOUBLE), count(*) FILTER (WHERE damaged_keys > 0 OR partially_updated "
        "OR count_mismatch "
        "OR total_mismatch OR written_after_fence > 0), CAST(min(partition) AS VARCHAR), "
        "CAST(max(partition) AS VARCHAR) "
        f"FROM {qualified(ptable)} WHERE incident_id = ?",
        [incident.incident_id],
    )
    if not row or not row[0]:
        return {"status": NOT_RUN}
    src = spec.source
    versions = s.fetchrow(
        f"SELECT count(*), count(DISTINCT ({quote_all(spec.key)})), max({quote(src.version)}), "
        f"max({quote(src.ingested_at)}), "
        f"count(*) FILTER (WHERE {quote(src.op)} IN ({str_list(src.delete_ops)})) FROM {src.table_name.sql()}"
    )
    return {
        "status": "ok",
        "partitions": row[0],
        "expected_rows": int(row[1] or 0),
        "actual_rows": int(row[2] or 0),
        "expected_total": row[3] if spec.target.amount else None,
        "actual_total": row[4] if spec.target.amount else None,
        "damaged_partitions": row[5],
        "first_partition": row[6],
        "last_partition": row[7],
        "source_events": versions[0],
        "source_keys": versions[1],
        "max_version": versions[2],
        "watermark": versions[3],
        "tombstones": versions[4],
        "failed_generations": list(incident.failed_generations),
        "amount": spec.target.amount,
    }


def labels(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Damaged keys per label, with the source-version relation of each label's keys."""
    table = dataset_table_name("recon", spec.dataset)
    if not exists(s, table):
        return {"status": NOT_RUN}
    rel = (
        f"CASE WHEN actual_version IS NULL THEN '{VERSION_RELATIONS[3]}' WHEN expected_version IS NULL "
        f"THEN '{VERSION_RELATIONS[4]}' "
        f"WHEN actual_version < expected_version THEN '{VERSION_RELATIONS[0]}' WHEN actual_version = expected_version "
        f"THEN '{VERSION_RELATIONS[1]}' ELSE '{VERSION_RELATIONS[2]}' END"
    )
    rows = s.fetchall(
        f"SELECT label, {rel} AS relation, count(*), count(DISTINCT coalesce(CAST(actual_partition AS VARCHAR), "
        f"CAST(expected_partition AS VARCHAR))) FROM {qualified(table)} WHERE incident_id = ? GROUP BY ALL",
        [incident.incident_id],
    )
    counts: dict[str, int] = {}
    relations: dict[str, dict[str, int]] = {}
    for label, relation, n, _ in rows:
        counts[label] = counts.get(label, 0) + n
        relations.setdefault(label, {})[relation] = n
    partitions = dict(
        s.fetchall(
            "SELECT label, count(DISTINCT coalesce(CAST(actual_partition AS VARCHAR), "
            "CAST(expected_partition AS VARCHAR))) "
            f"FROM {qualified(table)} WHERE incident_id = ? GROUP BY 1",
            [incident.incident_id],
        )
    )
    ordered = [label for label in LABELS if label in counts]
    used = [r for r in VERSION_RELATIONS if any(r in relations[label] for label in ordered)]
    return {
        "status": "ok" if ordered else "no damage found",
        "total": sum(counts.values()),
        "rows": [
            {
                "label": label,
                "keys": counts[label],
                "partitions": partitions.get(label, 0),
                "relations": [relations[label].get(r, 0) for r in used],
            }
            for label in ordered
        ],
        "relations": used,
        "unexplained": counts.get("unexplained", 0),
    }


def partitions(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Per damaged partition: rows and totals vs expected, findings, keys per label; and the heatmap."""
    ptable, table = dataset_table_name("recon_partitions", spec.dataset), dataset_table_name("recon", spec.dataset)
    if not exists(s, ptable) or not exists(s, table):
        return {"status": NOT_RUN}
    rows = s.fetchall(
        "SELECT CAST(partition AS VARCHAR), expected_rows, actual_rows, CAST(expected_total AS DOUBLE), "
        "CAST(actual_total AS DOUBLE), "
        "damaged_keys, partially_updated, count_mismatch, total_mismatch, written_after_fence "
        f"FROM {qualified(ptable)} "
        f"WHERE incident_id = ? ORDER BY 1",
        [incident.incident_id],
    )
    cells = s.fetchall(
        "SELECT CAST(coalesce(actual_partition, expected_partition) AS VARCHAR), label, count(*) "
        f"FROM {qualified(table)} "
        f"WHERE incident_id = ? GROUP BY ALL",
        [incident.incident_id],
    )
    counts = {(p, label): n for p, label, n in cells}
    label_order = [label for label in LABELS if any(label == lab for _, lab in counts)]
    damaged, findings = [], {f: 0 for f in FINDINGS}
    for r in rows:
        found = [f for f, flag in zip(FINDINGS, r[6:10]) if flag]
        for f in found:
            findings[f] += 1
        if r[5] or found:
            damaged.append(
                {
                    "partition": r[0],
                    "expected_rows": r[1],
                    "actual_rows": r[2],
                    "expected_total": r[3],
                    "actual_total": r[4],
                    "damaged_keys": r[5],
                    "findings": found,
                    "labels": {label: counts.get((r[0], label), 0) for label in label_order},
                }
            )
    # keys whose partition is outside the compared partitions (e.g. mispartitioned far away) still get a row
    heat_parts = sorted({p for p, _ in counts} | {d["partition"] for d in damaged}, key=lambda p: (p is None, p or ""))
    heat_parts = [p for p in heat_parts if p is not None]
    return {
        "status": "ok",
        "compared": len(rows),
        "damaged": damaged,
        "findings": findings,
        "labels": label_order,
        "heatmap": plots.damage_heatmap(heat_parts, label_order, counts),
        "heatmap_partitions": len(heat_parts),
        "amount": spec.target.amount,
    }


def consumers(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Per consumer: differing rows, material rows against its threshold, magnitude, the decision affected."""
    if not exists(s, dataset_table_name("impact", spec.dataset)):
        return {"status": NOT_RUN}
    by_name = {c.name: c for c in spec.downstream}
    out = []
    for i in impact_summary(s, spec, incident_id=incident.incident_id):
        m = by_name[i.consumer].materiality
        rules = (
            []
            if m is None
            else ([f"|Δ {m.column}| ≥ {m.abs:g}"] if m.abs is not None else [])
            + ([f"|Δ {m.column}| ≥ {m.rel:.0%} of the original"] if m.rel is not None else [])
        )
        threshold = " or ".join(rules) or "none declared"
        out.append(
            {
                "consumer": i.consumer,
                "kind": i.kind,
                "owner": i.owner,
                "rows_changed": i.rows_changed,
                "rows_missing": i.rows_missing,
                "rows_extra": i.rows_extra,
                "rows_differing": i.rows_changed + i.rows_missing + i.rows_extra,
                "material_rows": i.material_rows,
                "magnitude": i.magnitude,
                "threshold": threshold,
                "decision": i.decision,
                "affected": i.affected,
            }
        )
    return {
        "status": "ok",
        "rows": out,
        "affected": sum(c["affected"] for c in out),
        "material_rows": sum(c["material_rows"] for c in out),
        "bars": plots.impact_bars(out),
    }


def decisions(s: Session, spec: DatasetSpec, incident: Incident, impact: dict) -> dict:
    """The rollback-or-repair decision recorded for the incident, and the consumer decisions the damage reaches."""
    recorded = None
    if exists(s, "timeline"):
        row = s.fetchone(
            f"SELECT event_at, actor, summary, run_id FROM {SCHEMA}.timeline WHERE incident_id = ? "
            "AND kind = 'decision' "
            f"ORDER BY event_id DESC LIMIT 1",
            [incident.incident_id],
        )
        if row:
            choice, _, reasons = row[2].partition(": ")
            recorded = {
                "at": row[0],
                "actor": row[1],
                "choice": choice,
                "reasons": [r for r in reasons.split("; ") if r],
                "run_id": row[3],
            }
    affected = [
        {"consumer": c["consumer"], "owner": c["owner"], "decision": c["decision"], "material_rows": c["material_rows"]}
        for c in impact.get("rows", [])
        if c["material_rows"]
    ]
    # the decisions each consumer's output fed, as the spec declares them: crossed materiality when
    # the consumer has material rows; the remediation is the one declared for it
    by_name = {c.name: c for c in spec.downstream}
    per_consumer = [
        {
            "consumer": c["consumer"],
            "decision": d.name,
            "remediation": d.remediation,
            "material_rows": c["material_rows"],
            "material": c["material_rows"] > 0,
        }
        for c in impact.get("rows", [])
        for d in by_name[c["consumer"]].decisions
    ]
    return {"recorded": recorded, "affected": affected, "vocabulary": DECISIONS, "per_consumer": per_consumer}


def basis(s: Session, spec: DatasetSpec, incident: Incident) -> dict[str, str]:
    """What each label's keys rest on (``rows``, ``write_log``, ``registry <table>``, ``none``), per
    label with keys: the reconciliation records it key by key."""
    table = dataset_table_name("recon", spec.dataset)
    if not exists(s, table) or "basis" not in {c for c, _ in s.columns(qualified(table))}:
        return {}
    rows = s.fetchall(
        f"SELECT label, string_agg(DISTINCT basis, '; ' ORDER BY basis) FROM {qualified(table)} "
        f"WHERE incident_id = ? GROUP BY 1",
        [incident.incident_id],
    )
    return {label: b for label, b in rows}


def reconciliation_context(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    impact = consumers(s, spec, incident)
    return {
        "basis": basis(s, spec, incident),
        "assets": [a.model_dump() for a in asset_impacts(s, spec, incident.incident_id)],
        "incident_id": incident.incident_id,
        "dataset": spec.dataset,
        "target": spec.target.table,
        "scope": scope(s, spec, incident),
        "labels": labels(s, spec, incident),
        "partitions": partitions(s, spec, incident),
        "impact": impact,
        "decisions": decisions(s, spec, incident, impact),
    }
