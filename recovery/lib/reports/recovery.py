"""The recovery and recurrence report: one section per proof the runbook asks for.

Each section is a function ``(session, spec, incident) -> dict`` reading the
control-plane tables of the phase it reports on, and only when they exist: a
section whose phase has not run yet says so (``status: "not run yet"``) instead
of failing, so the report can be rendered at any point of an incident and grows
as the phases land.

Tables read (``_recovery.*``): ``repair_plans``, ``repair_partitions``,
``gate_results``, ``repair_diffs``, ``delta_replays`` (the repair);
``pointer_history`` (publish); ``"restatement_ledger__<dataset>"`` (downstream
corrections); ``"convergence__<dataset>"`` (convergence checks over time); and
``recurrence_gates`` (the guarded launcher's gates, not built yet: the section
shows that table's rows as recorded, whatever their columns, until it gets a
dedicated summary).
"""

from __future__ import annotations

from recovery.lib.consumers.assets import asset_impacts
from recovery.lib.consumers.impact import impact_summary
from recovery.lib.control.plane import SCHEMA, dataset_table_name
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.incident.model import Incident
from recovery.lib.reports import plots
from recovery.lib.reports.tables import NOT_RUN, exists, qualified, rows_as_dicts
from recovery.lib.restatement.checks import recorded_checks

PLANS, PARTITIONS, GATES, DIFFS, REPLAYS = (
    "repair_plans",
    "repair_partitions",
    "gate_results",
    "repair_diffs",
    "delta_replays",
)
RECURRENCE = "recurrence_gates"  # issue 7: the gates in force per dataset (name to confirm when it lands)


def ledger_name(spec: DatasetSpec) -> str:
    return dataset_table_name("restatement_ledger", spec.dataset)


def convergence_name(spec: DatasetSpec) -> str:
    return dataset_table_name("convergence", spec.dataset)


def _not_run(table: str) -> dict:
    return {"status": NOT_RUN, "source": f"{SCHEMA}.{table}"}


def _plan(s: Session, incident: Incident) -> dict | None:
    if not exists(s, PLANS):
        return None
    rows = rows_as_dicts(s, f"SELECT * FROM {qualified(PLANS)} WHERE incident_id = ?", [incident.incident_id])
    return rows[0] if rows else None


def isolated_repair(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """The repair generation: its own namespace, built from a fixed source snapshot, the public name untouched
    until publish."""
    plan = _plan(s, incident)
    if plan is None:
        return _not_run(PLANS)
    actions = {}
    if exists(s, PARTITIONS):
        actions = dict(
            s.fetchall(
                f"SELECT action, count(*) FROM {qualified(PARTITIONS)} WHERE incident_id = ? GROUP BY 1 ORDER BY 1",
                [incident.incident_id],
            )
        )
    published = None
    if exists(s, "pointer_history") and plan.get("namespace"):
        published = s.fetchone(
            f"SELECT from_namespace, to_namespace, seq, moved_at, actor FROM {SCHEMA}.pointer_history "
            f"WHERE public_name = ? AND to_namespace = ? ORDER BY seq DESC LIMIT 1",
            [str(spec.target.table_name), plan["namespace"]],
        )
    facts = [
        (k, plan.get(k))
        for k in (
            "generation",
            "namespace",
            "from_namespace",
            "source_watermark",
            "low_seq",
            "high_seq",
            "published_seq",
            "status",
            "stopped_reason",
        )
        if k in plan
    ]
    kept = []
    if exists(s, PARTITIONS):
        kept = rows_as_dicts(
            s,
            f"SELECT partition, qualified_reason FROM {qualified(PARTITIONS)} WHERE incident_id = ? "
            f"AND qualified_reason IS NOT NULL ORDER BY partition",
            [incident.incident_id],
        )
    return {
        "status": plan.get("status") or "recorded",
        "facts": facts,
        "actions": actions,
        "qualified": kept,
        "published": None if published is None else dict(zip(("from", "to", "seq", "at", "actor"), published)),
    }


def idempotency(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Re-running a phase with the same inputs changed nothing: the gates that prove it."""
    if not exists(s, GATES):
        return _not_run(GATES)
    rows = rows_as_dicts(
        s,
        f"SELECT stage, gate, passed, observed, details, evaluated_at, run_id FROM {qualified(GATES)} "
        f"WHERE incident_id = ? AND (gate ILIKE '%idempot%' OR gate ILIKE '%rerun%' OR stage ILIKE '%rerun%') "
        f"ORDER BY evaluated_seq, gate",
        [incident.incident_id],
    )
    replays = []
    if exists(s, REPLAYS):
        replays = rows_as_dicts(
            s,
            f"SELECT stage, after_seq, through_seq, upserted, deleted, skipped_older FROM {qualified(REPLAYS)} "
            f"WHERE incident_id = ? AND upserted = 0 AND deleted = 0 ORDER BY replayed_at",
            [incident.incident_id],
        )
    if not rows and not replays:
        return {"status": NOT_RUN, "source": f"{SCHEMA}.{GATES} (idempotency gates)"}
    status = ("passed" if all(r["passed"] for r in rows) else "failed") if rows else "recorded"
    return {"status": status, "gates": rows, "noop_replays": replays}


def concurrent_writes(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Writes normal ingestion made during the repair, replayed from the delta log (none lost)."""
    if not exists(s, REPLAYS):
        return _not_run(REPLAYS)
    rows = rows_as_dicts(
        s,
        f"SELECT stage, after_seq, through_seq, upserted, deleted, skipped_older, replayed_at, run_id "
        f"FROM {qualified(REPLAYS)} WHERE incident_id = ? ORDER BY replayed_at",
        [incident.incident_id],
    )
    if not rows:
        return _not_run(REPLAYS)
    totals = {k: sum(r[k] or 0 for r in rows) for k in ("upserted", "deleted", "skipped_older")}
    gate = None
    if exists(s, GATES):
        found = rows_as_dicts(
            s,
            f"SELECT gate, passed, observed, details, evaluated_at, run_id FROM {qualified(GATES)} "
            "WHERE incident_id = ? AND gate = 'repair_concurrent_writes' ORDER BY evaluated_seq DESC, "
            "evaluated_at DESC LIMIT 1",
            [incident.incident_id],
        )
        gate = found[0] if found else None
    return {"status": "recorded", "replays": rows, "totals": totals, "gate": gate}


def waves(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Canary (wave 0), then waves: partitions per wave and each wave's gate results."""
    if not exists(s, PARTITIONS):
        return _not_run(PARTITIONS)
    per_wave = rows_as_dicts(
        s,
        f"SELECT wave, count(*) AS partitions, "
        "string_agg(DISTINCT status, ', ' ORDER BY status) AS statuses, min(partition) AS first, "
        "max(partition) AS last "
        f"FROM {qualified(PARTITIONS)} WHERE incident_id = ? AND wave IS NOT NULL GROUP BY wave ORDER BY wave",
        [incident.incident_id],
    )
    if not per_wave:
        return _not_run(PARTITIONS)
    gates = []
    if exists(s, GATES):
        gates = rows_as_dicts(
            s,
            f"SELECT stage, gate, passed, blocking, observed, details, run_id FROM {qualified(GATES)} "
            f"WHERE incident_id = ? ORDER BY evaluated_seq, stage, gate",
            [incident.incident_id],
        )
    failed = [g for g in gates if not g["passed"] and g["blocking"]]
    return {
        "status": "blocked" if failed else "recorded",
        "waves": per_wave,
        "gates": gates,
        "blocking_failures": len(failed),
    }


def totals(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Rows and totals per partition before the repair, expected from the snapshot, and after."""
    if not exists(s, PARTITIONS):
        return _not_run(PARTITIONS)
    rows = rows_as_dicts(
        s,
        f"SELECT partition, rows_before, rows_expected, rows_after, total_before, total_expected, total_after "
        f"FROM {qualified(PARTITIONS)} WHERE incident_id = ? ORDER BY partition",
        [incident.incident_id],
    )
    if not rows:
        return _not_run(PARTITIONS)
    parts = [r["partition"] for r in rows]
    plot = plots.totals_before_after(
        parts, {k: [r[f"total_{k}"] for r in rows] for k in ("before", "expected", "after")}
    )
    sums = {k: sum(r[k] or 0 for r in rows) for k in ("rows_before", "rows_expected", "rows_after")}
    still_off = [r for r in rows if r["rows_after"] is not None and r["rows_after"] != r["rows_expected"]]
    diffs = []
    if exists(s, DIFFS):
        diffs = rows_as_dicts(
            s,
            f"SELECT label, sum(keys_before) AS keys_before, sum(keys_after) AS keys_after FROM {qualified(DIFFS)} "
            f"WHERE incident_id = ? GROUP BY label ORDER BY label",
            [incident.incident_id],
        )
    return {
        "status": "recorded",
        "rows": rows,
        "plot": plot,
        "sums": sums,
        "still_off": len(still_off),
        "diffs": diffs,
        "amount": spec.target.amount,
    }


def downstream_corrections(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Per consumer, from the restatement phase's record (``restatements``) and its ledger: rows
    restated, material ones, the output's original vs corrected total, where the original came
    from, owner notified. A consumer restated with nothing to change says so; the section is
    "not run" only when neither table holds anything for the incident."""
    from recovery.lib.consumers.outputs import RESTATEMENTS, original_basis

    name = ledger_name(spec)
    ledger: dict[str, dict] = {}
    if exists(s, name):
        ledger = {
            r["consumer"]: r
            for r in rows_as_dicts(
                s,
                f"SELECT consumer, any_value(kind) AS kind, any_value(owner) AS owner, count(*) AS rows_restated, "
                f"count(*) FILTER (WHERE material) AS material, CAST(sum(original_value) AS DOUBLE) AS original_total, "
                f"CAST(sum(corrected_value) AS DOUBLE) AS corrected_total, any_value(decision) AS decision, "
                f"max(notified_at) AS notified_at FROM {qualified(name)} WHERE incident_id = ? GROUP BY consumer "
                "ORDER BY consumer",
                [incident.incident_id],
            )
        }
    restated: dict[str, dict] = {}
    if exists(s, "restatements"):
        restated = {
            r["consumer"]: r
            for r in rows_as_dicts(
                s,
                f"SELECT consumer, kind, owner, original_namespace, corrected_namespace, ledger_rows, material_rows, "
                f"original_total, corrected_total, watermark, restated_at, run_id, notified_at FROM {RESTATEMENTS} "
                f"WHERE incident_id = ? AND dataset = ? ORDER BY consumer",
                [incident.incident_id, spec.dataset],
            )
        }
    if not ledger and not restated:
        return _not_run(f"restatements, {SCHEMA}.{name}")
    rows = []
    for consumer in sorted(set(ledger) | set(restated)):
        led, rec = ledger.get(consumer, {}), restated.get(consumer)
        row = {
            "consumer": consumer,
            "kind": (rec or led).get("kind"),
            "owner": (rec or led).get("owner"),
            "rows_restated": led.get("rows_restated", 0),
            "material": led.get("material", 0),
            "original_total": led.get("original_total"),
            "corrected_total": led.get("corrected_total"),
            "decision": led.get("decision"),
            "notified_at": led.get("notified_at"),
            "basis": "restatement ledger",
            "run_id": None,
            "outcome": "values restated" if led else "restated: no published value changed",
        }
        if rec:
            row.update(
                original_total=rec["original_total"],
                corrected_total=rec["corrected_total"],
                run_id=rec["run_id"],
                notified_at=led.get("notified_at") or rec["notified_at"],
                basis=original_basis(s, rec["original_namespace"]),
                original_namespace=rec["original_namespace"],
                corrected_namespace=rec["corrected_namespace"],
            )
        rows.append(row)
    decisions = []
    if exists(s, "restatement_decisions"):  # recorded by the restatement, per declared decision
        decisions = [
            d | {"ledger": f"{SCHEMA}.restatement_decisions"}
            for d in rows_as_dicts(
                s,
                f"SELECT consumer, decision, remediation, original_total, corrected_total, material_rows AS material "
                f"FROM {SCHEMA}.restatement_decisions WHERE incident_id = ? AND dataset = ? ORDER BY consumer, "
                "decision",
                [incident.incident_id, spec.dataset],
            )
        ]
    impact_material = (
        {i.consumer: i.material_rows for i in impact_summary(s, spec, incident_id=incident.incident_id)}
        if exists(s, dataset_table_name("impact", spec.dataset))
        else {}
    )
    return {
        "status": "recorded",
        "consumers": rows,
        "checks": [c.model_dump() for c in recorded_checks(s, spec.dataset, incident.incident_id)],
        "impact_material": impact_material,
        "assets_reached": [a.asset for a in asset_impacts(s, spec, incident.incident_id) if a.affected],
        "decisions": decisions,
        "material": sum(r["material"] for r in rows),
        "rows_restated": sum(r["rows_restated"] for r in rows),
        "computed_originals": [r["consumer"] for r in rows if str(r["basis"]).startswith("original computed")],
        "unnotified": [r["consumer"] for r in rows if r["material"] and not r["notified_at"]],
    }


def convergence(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Convergence checks over time (the incident's and the dataset's scheduled ones): drift per check."""
    name = convergence_name(spec)
    if not exists(s, name):
        return _not_run(name)
    # pending changes and the watermark per partition: recorded by checks since issue #41 (NULL before)
    have = {c for c, _ in s.columns(qualified(name))}
    pending = (
        "coalesce(sum(pending_changes), 0) AS pending_changes, coalesce(sum(pending_overdue), 0) AS pending_overdue, "
        "min(watermark) AS watermark"
        if {"pending_changes", "pending_overdue"} <= have
        else "0 AS pending_changes, 0 AS pending_overdue, min(watermark) AS watermark"
    )
    checks = rows_as_dicts(
        s,
        f"SELECT check_id, max(checked_at) AS checked_at, any_value(run_id) AS run_id, count(*) AS partitions, "
        f"count(*) FILTER (WHERE recent) AS recent, count(*) FILTER (WHERE repaired) AS repaired, "
        f"count(*) FILTER (WHERE drift_keys > 0) AS drifting_partitions, sum(drift_keys) AS drift_keys, {pending} "
        f"FROM {qualified(name)} WHERE incident_id = ? OR incident_id IS NULL GROUP BY check_id ORDER BY check_id DESC "
        "LIMIT 30",
        [incident.incident_id],
    )
    if not checks:
        return _not_run(name)
    latest = checks[0]
    drifting = rows_as_dicts(
        s,
        "SELECT partition, expected_rows, actual_rows, missing, extra, changed, duplicate, drift_keys "
        f"FROM {qualified(name)} "
        f"WHERE check_id = ? AND drift_keys > 0 ORDER BY partition",
        [latest["check_id"]],
    )
    return {
        "status": "drift" if latest["drift_keys"] else "behind" if latest["pending_overdue"] else "converged",
        "checks": checks,
        "latest": latest,
        "drifting": drifting,
    }


def recurrence_gates(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """The gates every future backfill of the dataset passes (the guarded launcher's policy, from the spec),
    with how often each stopped a guarded backfill so far."""
    from recovery.lib.recurrence.policy import active_gates

    gates = active_gates(spec)
    stops: dict[str, int] = {}
    tested = 0
    if exists(s, "backfill_gates"):
        stops = dict(
            s.fetchall(f"SELECT gate, count(*) FILTER (WHERE NOT passed) FROM {SCHEMA}.backfill_gates GROUP BY 1")
        )
        tested = int(s.scalar(f"SELECT count(*) FROM {SCHEMA}.backfill_gates") or 0)
    rows = [
        {"gate": g["gate"], "applies": g["applies"], "guarded backfills stopped": stops.get(g["gate"], 0)}
        for g in gates
    ]
    return {
        "status": "in force",
        "columns": ["gate", "applies", "guarded backfills stopped"],
        "rows": rows,
        "total": len(rows),
        "tested": tested,
        "source": "spec recurrence policy; _recovery.backfill_gates",
    }


SECTIONS = (
    ("isolated_repair", "Isolated repair", isolated_repair),
    ("idempotency", "Idempotency", idempotency),
    ("concurrent_writes", "Concurrent writes preserved", concurrent_writes),
    ("waves", "Canary and waves, with their gate results", waves),
    ("totals", "Before and after, per partition", totals),
    ("downstream_corrections", "Downstream corrections", downstream_corrections),
    ("convergence", "Convergence", convergence),
    ("recurrence_gates", "Recurrence gates in force", recurrence_gates),
)


def recovery_context(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    sections = [{"id": sid, "title": title, **fn(s, spec, incident)} for sid, title, fn in SECTIONS]
    return {
        "incident_id": incident.incident_id,
        "dataset": spec.dataset,
        "target": spec.target.table,
        "failed_generations": list(incident.failed_generations),
        "sections": sections,
        "pending": [x["title"] for x in sections if x["status"] == NOT_RUN],
    }
