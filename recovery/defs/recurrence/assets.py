"""The guarded backfill in Dagster: a dry-run job, and backfill → blocking gates → publication.

- ``preview_backfill`` (job): the whole backfill rehearsed on a scratch copy of the
  warehouse: scope, every gate, which keys and columns would change (metadata and an
  HTML preview); the warehouse is unchanged.
- ``recurrence/backfill``: refuses (no write) without approvals, past capacity or
  over current partitions; otherwise records the manifest, then builds the range in
  the backfill's own generation.
- ``backfill_gates``: every gate as a blocking asset check on ``recurrence/backfill``
  (approval, scope, capacity, manifest, fencing, invariants, anomaly, rollback
  readiness); a failed gate stops the backfill and blocks publication.
- ``recurrence/publication``: the atomic pointer move, after confirming every gate
  from the control plane (a blocking check only blocks within its own run).
"""

import dagster as dg

from recovery.defs.recurrence.config import BackfillConfig, resolve_request
from recovery.defs.resources import WarehouseResource
from recovery.lib.errors import GateRefusedError, RecoveryError
from recovery.lib.recurrence.gates.value_preview import refusal_line, refusal_lines, write_preview
from recovery.lib.recurrence.launch import build_backfill, preflight, start_backfill
from recovery.lib.recurrence.policy import GATES
from recovery.lib.recurrence.publish import gate_backfill, publish_backfill, stop_backfill
from recovery.lib.recurrence.recompute import resolve_recompute
from recovery.lib.recurrence.record import latest_gates
from recovery.lib.recurrence.rehearsal import rehearse, value_report_of
from recovery.lib.recurrence.tables import GATES as GATE_TABLE
from recovery.lib.recurrence.tables import tables_exist
from recovery.refusal import refuse

BACKFILL_KEY = dg.AssetKey(["recurrence", "backfill"])
PUBLICATION_KEY = dg.AssetKey(["recurrence", "publication"])
DESCRIPTIONS = {
    "approval": "Named approvers recorded; as many as the spec's policy requires for the scope's size and consumers.",
    "scope": "Dry-run scope preview; a range reaching the partitions ingestion writes is refused unless acknowledged.",
    "capacity": "Estimated rows, bytes and partitions within the spec's limits and the free disk.",
    "manifest": "Inputs with their watermark, code version and config hash recorded before the first write.",
    "fencing": "Own generation, namespace and token; the pointer has not moved and no write landed in the range since.",
    "invariants": "The spec's SQL invariants and GE suites, plus key/version/tombstone invariants, "
    "on every backfilled partition.",
    "anomaly": "Per-partition rows and totals within the thresholds of the published generation and of history.",
    "values": "Key by key and column by column vs published: undeclared columns barely change; per-partition mean, "
    "quantiles, null share and distinct count hold.",
    "profile": "The published generation's profile as a Great Expectations suite, "
    "run by the warehouse on the candidate "
    "(GE's SQL datasource): null shares, distinct counts, value sets, means, quantiles.",
    "rollback_readiness": "The prior generation is complete and retained until convergence verification passes.",
}


def _preview_md(pf) -> str:
    p = pf.preview
    rows = ["| gate | passed | details |", "| --- | --- | --- |"]
    rows += [f"| {g.gate} | {'yes' if g.passed else '**no**'} | {g.details[:300]} |" for g in pf.gates]
    return "\n".join(rows) + f"\n\n{p.summary()}"


def _metadata(pf) -> dict:
    p = pf.preview
    return {
        "partitions": len(p.partitions),
        "range": f"{p.range_start}..{p.range_end}",
        "published_rows": p.published_rows,
        "expected_rows": p.expected_rows,
        "keys": p.keys,
        "estimated_bytes": p.estimated_bytes,
        "estimated_seconds": round(p.estimated_seconds, 2),
        "current_partitions_touched": ", ".join(p.current_touched) or "none",
        "consumers": ", ".join(c.name for c in p.consumers) or "none",
        "gates": dg.MetadataValue.md(_preview_md(pf)),
    }


def _fail(err: Exception) -> dg.Failure:
    return dg.Failure(description=str(err), allow_retries=False)


@dg.op(
    description="Dry run: the whole guarded backfill rehearsed on a scratch copy of the warehouse (scope, every "
    "gate, the keys and columns that would change); the warehouse itself is unchanged."
)
def preview_backfill_scope(
    context: dg.OpExecutionContext, config: BackfillConfig, warehouse: WarehouseResource
) -> dg.Output[dict]:
    writer = warehouse.writer("preview_backfill")
    try:
        request = resolve_request(config)
        pf = preflight(writer, request)
        rehearsal = rehearse(writer, request)
    except RecoveryError as err:
        raise _fail(err) from err
    gates = rehearsal.outcome.gates
    verdict = (
        "would publish: every gate passes"
        if rehearsal.would_publish
        else f"would refuse: {', '.join(g for g, r in gates.items() if not r.passed)}"
    )
    path = write_preview(writer.spec, request.id, "plan", verdict, gates, rehearsal.report, rehearsal.note)
    lines = refusal_lines(gates, rehearsal.report, path)
    if (
        not rehearsal.would_publish and not lines
    ):  # e.g. the recompute raised: no gate said no, the backfill did not finish
        o = rehearsal.outcome
        lines = [f"backfill would end {o.status}: {o.reason or 'see the preview'}; preview: {path}"]
    summary = {
        "passed": rehearsal.would_publish,
        "preview": pf.preview.model_dump(mode="json"),
        "preview_path": str(path),
        "gates": [{"gate": g.gate, "passed": g.passed, "details": g.details} for g in gates.values()],
        "refusals": lines,
        "note": rehearsal.note,
        "changes": _changes(rehearsal.report),
    }
    return dg.Output(
        summary,
        metadata={
            **_metadata(pf),
            "would_publish": rehearsal.would_publish,
            **_value_metadata(rehearsal.report, path, lines),
        },
    )


def _changes(report) -> list[dict]:
    if report is None:
        return []
    return [
        {
            "column": c.column,
            "changed": c.changed,
            "keys": c.matched,
            "share": c.share,
            "allowed": c.allowed,
            "declared": c.declared,
            "refused": c.refused,
            "worst_partition": c.worst_partition,
            "samples": [list(x) for x in c.samples],
        }
        for c in report.changes
    ]


def _profile_metadata(outcome) -> dict:
    """Each expectation of the profile suite with its result, and the columns that failed (for the UI)."""
    if outcome is None or outcome.result is None:
        return {"baseline": outcome.baseline if outcome else "none"}
    rows = ["| expectation | result | observed |", "| --- | --- | --- |"]
    rows += [
        f"| {label} | {'passed' if ok else '**failed**'} | {observed} |"
        for label, ok, observed in outcome.result.checked
    ]
    failing = sorted({label.split("(")[1].rstrip(")") for label in outcome.result.failures if "(" in label})
    return {
        "baseline": outcome.baseline,
        "expectations": dg.MetadataValue.md("\n".join(rows)),
        "failing_columns": ", ".join(failing) or "none",
    }


def _value_metadata(report, path, lines: list[str]) -> dict:
    """The value comparison as metadata: which columns change, how much, a sample, and the preview file."""
    meta: dict = {"preview": dg.MetadataValue.path(str(path))} if path else {}
    if lines:
        meta["refusals"] = dg.MetadataValue.md("\n".join(f"- {x}" for x in lines))
    if report is None:
        return meta
    rows = [
        "| column | keys changed | share | allowed | declared | e.g. (key: before -> after) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows += [
        f"| {c.column} | {c.changed:,} | {c.share:.1%} | {c.allowed:.0%} | {'yes' if c.declared else 'no'} | "
        f"{'; '.join(f'{k}: {b} -> {a}' for k, _, b, a in c.samples[:2])} |"
        for c in report.changes
    ]
    meta["changed_columns"] = ", ".join(report.changed_columns) or "none"
    meta["value_changes"] = dg.MetadataValue.md("\n".join(rows))
    return meta


@dg.job(
    executor_def=dg.in_process_executor,
    description="Dry run of a guarded backfill: partitions, keys, rows, bytes, run time, current partitions, "
    "consumers and the pre-write gates. Writes nothing.",
)
def preview_backfill():
    preview_backfill_scope()


@dg.asset(
    key=BACKFILL_KEY,
    group_name="recurrence",
    kinds={"duckdb"},
    description="A guarded backfill's new generation: refused without approvals or capacity, manifest recorded "
    "before the first write, built in its own namespace.",
)
def guarded_backfill_generation(
    context: dg.AssetExecutionContext, config: BackfillConfig, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    writer = warehouse.writer("guarded_backfill")
    try:
        request = resolve_request(config)
        pf = preflight(writer, request)
        rec = start_backfill(writer, pf, run_id=context.run.run_id)
        if rec.status == "refused":
            raise RecoveryError(f"backfill {rec.backfill_id} refused before any write: {rec.reason}")
        if rec.status == "building":
            rec = build_backfill(writer, rec, resolve_recompute(request.recompute), run_id=context.run.run_id)
        if rec.status == "stopped":
            raise GateRefusedError(
                f"backfill {rec.backfill_id} refused while recomputing: {rec.reason}; nothing was "
                f"published, the candidate {rec.namespace} is kept for inspection"
            )
    except RecoveryError as err:
        raise _fail(err) from err
    return dg.MaterializeResult(
        metadata={
            **_metadata(pf),
            "backfill_id": rec.backfill_id,
            "generation": rec.generation,
            "namespace": rec.namespace or "",
            "status": rec.status,
            "dagster/row_count": int(rec.manifest.get("build", {}).get("rows_written", 0)),
        }
    )


def _backfill_of_run(warehouse: WarehouseResource, run_id: str) -> str | None:
    with warehouse.engine().session(read_only=True) as s:
        if not tables_exist(s):
            return None
        return s.scalar(f"SELECT max(backfill_id) FROM {GATE_TABLE} WHERE run_id = ? AND stage = 'preflight'", [run_id])


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name=g, asset=BACKFILL_KEY, blocking=True, description=DESCRIPTIONS[g]) for g in GATES],
    name="backfill_gates",
    description="Every recurrence gate of the backfill this run built; a failure stops it.",
)
def backfill_gates(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource):
    backfill_id = _backfill_of_run(warehouse, context.run.run_id)
    if backfill_id is None:
        raise dg.Failure(description="this run started no guarded backfill; nothing to gate", allow_retries=False)
    writer = warehouse.writer("backfill_gates")
    outcomes: dict = {}
    gate_backfill(writer, backfill_id, run_id=context.run.run_id, outcomes=outcomes)
    with writer.engine.session(read_only=True) as s:
        gates = latest_gates(s, backfill_id)
    failed = [g for g in GATES if g not in gates or not gates[g].passed]
    report = path = None
    lines: dict[str, str] = {}
    if failed:
        stop_backfill(
            writer,
            backfill_id,
            "; ".join(f"gate {g} failed: {gates[g].details if g in gates else 'not evaluated'}" for g in failed),
            run_id=context.run.run_id,
        )
        report = value_report_of(writer, backfill_id)
        path = write_preview(
            writer.spec,
            backfill_id,
            "run",
            f"refused: {', '.join(failed)}; nothing was published, the candidate is kept for inspection",
            gates,
            report,
        )
        lines = {
            g: refusal_line(gates[g], report, path) if g in gates else f"gate {g} refused: not evaluated"
            for g in failed
        }
    for g in GATES:
        r = gates.get(g)
        yield dg.AssetCheckResult(
            asset_key=BACKFILL_KEY,
            check_name=g,
            passed=bool(r and r.passed),
            severity=dg.AssetCheckSeverity.ERROR,
            description=lines.get(g),
            metadata={
                "backfill_id": backfill_id,
                "observed": r.observed if r else 0,
                "details": (r.details if r else "not evaluated")[:2000],
                **(_value_metadata(report, path, []) if g == "values" and failed else {}),
                **(_profile_metadata(outcomes.get("profile")) if g == "profile" else {}),
            },
        )
    if failed:  # the run's failure message is the decision, not an exception class
        refuse(" | ".join(lines.values()))


@dg.asset(
    key=PUBLICATION_KEY,
    deps=[BACKFILL_KEY],
    group_name="recurrence",
    kinds={"duckdb"},
    description="Atomic publish of the guarded backfill: every gate confirmed, then one pointer move.",
)
def guarded_backfill_publication(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    backfill_id = _backfill_of_run(warehouse, context.run.run_id)
    if backfill_id is None:
        raise dg.Failure(description="this run started no guarded backfill; nothing to publish", allow_retries=False)
    result = publish_backfill(warehouse.writer("guarded_backfill_publication"), backfill_id, run_id=context.run.run_id)
    if not result["published"]:
        refuse(f"publish refused: {result['reason']}")
    return dg.MaterializeResult(
        metadata={
            "backfill_id": backfill_id,
            "published_namespace": result["namespace"],
            "previous_namespace": result.get("from_namespace") or "",
            "already_published": result["already"],
            "pointer_seq": result["seq"] or 0,
        }
    )


guarded_backfill = dg.define_asset_job(
    "guarded_backfill",
    selection=dg.AssetSelection.assets(BACKFILL_KEY, PUBLICATION_KEY),
    executor_def=dg.in_process_executor,
    description="Run a backfill through every recurrence gate; publish by one pointer move only if all pass.",
)


@dg.definitions
def recurrence_definitions() -> dg.Definitions:
    return dg.Definitions(
        assets=[guarded_backfill_generation, guarded_backfill_publication],
        asset_checks=[backfill_gates],
        jobs=[preview_backfill, guarded_backfill],
    )
