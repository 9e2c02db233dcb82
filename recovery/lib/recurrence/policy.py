"""The gates a guarded backfill passes before its first write: approval, scope, capacity.

They read only the preview and the dataset's policy (``recurrence:`` in the spec), so a
dry run evaluates them too and writes nothing. ``active_gates`` lists every gate with
the thresholds it applies, for the recovery report's recurrence section.
"""

from __future__ import annotations

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.gates import GateResult
from recovery.lib.recurrence.preview import ScopePreview
from recovery.lib.recurrence.request import BackfillRequest

PRE_WRITE = ("approval", "scope", "capacity")
GATES = (
    "approval",
    "scope",
    "capacity",
    "manifest",
    "fencing",
    "invariants",
    "anomaly",
    "values",
    "profile",
    "rollback_readiness",
)


def required_approvals(spec: DatasetSpec, preview: ScopePreview) -> tuple[int, list[str]]:
    """How many approvals the scope needs, and why (the rules that apply)."""
    kinds = {c.kind for c in preview.consumers}
    need, why = 0, []
    for i, r in enumerate(spec.recurrence_policy.approval.rules):
        applies = (
            (r.rows_over is None or preview.estimated_rows > r.rows_over)
            and (r.partitions_over is None or len(preview.partitions) > r.partitions_over)
            and (not r.consumer_kinds or bool(kinds & set(r.consumer_kinds)))
        )
        if applies and r.required > need:
            need = r.required
            why.append(
                f"rule {i}"
                + (f" (rows > {r.rows_over:,})" if r.rows_over is not None else "")
                + (f" (partitions > {r.partitions_over})" if r.partitions_over is not None else "")
                + (f" (consumers {sorted(kinds & set(r.consumer_kinds))})" if r.consumer_kinds else "")
            )
    return need, why


def approval_gate(spec: DatasetSpec, request: BackfillRequest, preview: ScopePreview) -> GateResult:
    allowed = spec.recurrence_policy.approval.approvers
    need, why = required_approvals(spec, preview)
    valid = [a for a in request.approved_by if not allowed or a in allowed]
    strangers = [a for a in request.approved_by if a not in valid]
    ok = len(valid) >= need
    details = (
        f"{len(valid)} of {need} required approval(s) for {preview.estimated_rows:,} rows over "
        f"{len(preview.partitions)} partitions ({'; '.join(why) or 'no rule applies'}): "
        f"{', '.join(valid) or 'none'}"
    )
    if request.declared:
        share = request.expected_share
        details += f"; declared change: {', '.join(request.expect_change) or 'any column'}" + (
            f" on up to {share:.0%} of keys" if share is not None else ""
        )
    if strangers:
        details += f"; not approvers of {spec.dataset}: {', '.join(strangers)}"
    if not ok:
        details += (
            f". Fix: add approved_by from {', '.join(allowed)}" if allowed else ". Fix: name approvers in approved_by"
        )
    return GateResult("approval", ok, need - len(valid) if not ok else 0, details)


def scope_gate(request: BackfillRequest, preview: ScopePreview) -> GateResult:
    if not preview.partitions:
        return GateResult(
            "scope",
            False,
            0,
            f"the range {request.start}..{request.end} holds no partition of "
            f"{preview.dataset}. Fix: give a range that overlaps the data",
        )
    touched = preview.current_touched
    if touched and not request.allow_current_partitions:
        return GateResult(
            "scope",
            False,
            len(touched),
            f"the range reaches {len(touched)} current partition(s) normal ingestion is writing "
            f"({', '.join(touched)}). Fix: end the range before {touched[0]}, or acknowledge it with "
            f"allow_current_partitions (the fencing gate still refuses to publish over concurrent writes)",
        )
    note = f"; current partitions {', '.join(touched)} acknowledged" if touched else ""
    return GateResult("scope", True, len(touched), preview.summary() + note)


def capacity_gate(spec: DatasetSpec, preview: ScopePreview) -> GateResult:
    cap = spec.recurrence_policy.capacity
    over = []
    if cap.max_rows is not None and preview.estimated_rows > cap.max_rows:
        over.append(f"{preview.estimated_rows:,} rows > max_rows {cap.max_rows:,}")
    if cap.max_bytes is not None and preview.estimated_bytes > cap.max_bytes:
        over.append(f"{preview.estimated_bytes:,} bytes > max_bytes {cap.max_bytes:,}")
    if cap.max_partitions is not None and len(preview.partitions) > cap.max_partitions:
        over.append(f"{len(preview.partitions)} partitions > max_partitions {cap.max_partitions}")
    if preview.estimated_bytes * cap.free_disk_factor > preview.free_disk_bytes:
        over.append(
            f"{preview.estimated_bytes * cap.free_disk_factor:,.0f} bytes needed ({cap.free_disk_factor}x the "
            f"estimate) > {preview.free_disk_bytes:,} free on disk"
        )
    if over:
        return GateResult(
            "capacity",
            False,
            len(over),
            "; ".join(over) + ". Fix: split the range into smaller backfills, or raise recurrence.capacity in the spec",
        )
    return GateResult(
        "capacity",
        True,
        0,
        f"{preview.estimated_rows:,} rows, {preview.estimated_bytes:,} bytes, "
        f"{len(preview.partitions)} partitions within the limits; "
        f"{preview.free_disk_bytes:,} bytes free",
    )


def pre_write_gates(spec: DatasetSpec, request: BackfillRequest, preview: ScopePreview) -> list[GateResult]:
    return [approval_gate(spec, request, preview), scope_gate(request, preview), capacity_gate(spec, preview)]


def active_gates(spec: DatasetSpec) -> list[dict]:
    """Every gate of the dataset's guarded backfills, with what it applies (for the recovery report)."""
    p = spec.recurrence_policy
    rules = "; ".join(
        f"{r.required} approval(s)"
        + (f" when rows > {r.rows_over:,}" if r.rows_over is not None else "")
        + (f" when partitions > {r.partitions_over}" if r.partitions_over is not None else "")
        + (f" when consumers {r.consumer_kinds} read it" if r.consumer_kinds else "")
        for r in p.approval.rules
    )
    cap = p.capacity
    from recovery.lib.recurrence.gates.invariants import builtin_invariants

    invariants = [i.name for i in builtin_invariants()] + [i.name for i in p.invariants] + [s.name for s in spec.suites]
    return [
        {"gate": "approval", "applies": f"{rules}; approvers: {', '.join(p.approval.approvers) or 'anyone named'}"},
        {
            "gate": "scope",
            "applies": f"dry-run preview; the {p.current_partitions} latest partitions ingestion writes "
            f"are current and refused unless acknowledged",
        },
        {
            "gate": "capacity",
            "applies": f"max_rows {cap.max_rows}, max_bytes {cap.max_bytes}, max_partitions "
            f"{cap.max_partitions}, free disk >= {cap.free_disk_factor}x the estimate",
        },
        {
            "gate": "manifest",
            "applies": "inputs, watermark, code version and config hash recorded before the first write",
        },
        {
            "gate": "fencing",
            "applies": "own generation, namespace and token; publish refused if the pointer moved or "
            "ingestion wrote the range since the backfill started",
        },
        {"gate": "invariants", "applies": ", ".join(invariants)},
        {
            "gate": "anomaly",
            "applies": f"rows within {p.anomaly.max_row_change:.0%} and totals within "
            f"{p.anomaly.max_total_change:.0%} of published; within {p.anomaly.history_factor}x "
            f"of the history median",
        },
        {
            "gate": "values",
            "applies": f"key by key: a column may change on at most {p.anomaly.max_changed_share:.0%} of "
            f"the keys unless declared (expect_change); at most "
            f"{p.anomaly.max_missing_keys_share:.0%} keys dropped / {p.anomaly.max_new_keys_share:.0%} "
            f"added; per partition mean and p10/p50/p90 within {p.anomaly.max_mean_shift} std devs, "
            f"null share within {p.anomaly.max_null_share_change:.0%}, distinct count within "
            f"{p.anomaly.max_distinct_change:.0%} of published",
        },
        {
            "gate": "profile",
            "applies": "the published generation's profile (null shares, distinct counts, value sets, "
            "means and p10/p50/p90 within the value gate's tolerances) as a Great Expectations "
            "suite, computed by the warehouse on the candidate's partitions",
        },
        {
            "gate": "rollback_readiness",
            "applies": "the prior generation is complete, and retained until convergence passes",
        },
    ]
