"""The runbook's Done list, item by item, at the top of each report.

Each report opens with the Done items it is responsible for (the runbook's three
Done sentences), one row each: ``verified`` (checked from a record this run of the
recovery left, named in the evidence column), ``qualified`` (what was recorded
falls short, e.g. the source or a log is missing: the row says why and what would
verify it; nothing is invented), or ``not verifiable`` (the phase that would show
it has not run; the row names the command that would). A row is built only from
the report's own context (the control-plane records its sections read) and, for
the evidence bundle, a re-check of its checksums made while the report is built.
"""

from __future__ import annotations

from pathlib import Path

from recovery.lib.control_plane import SCHEMA, dataset_table_name, delta_table, has_dataset_table
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote
from recovery.lib.incident import Incident
from recovery.lib.reports.tables import NOT_RUN, exists, rows_as_dicts
from recovery.lib.snapshot import str_list
from recovery.lib.spec import DatasetSpec

VERIFIED, QUALIFIED, NOT_VERIFIABLE = "verified", "qualified", "not verifiable"
STATUSES = (VERIFIED, QUALIFIED, NOT_VERIFIABLE)
BASIS = {"write_log": "write log", "metadata": "metadata columns"}

TIMELINE_ITEMS = (
    "authority",
    "inputs",
    "code",
    "ranges",
    "runs",
    "retries",
    "writes",
    "propagation",
    "containment",
    "decisions",
    "evidence",
)
RECONCILIATION_ITEMS = (
    "keys",
    "partitions",
    "versions",
    "missing",
    "duplicate",
    "overwritten",
    "deleted",
    "concurrent",
    "downstream",
    "decision impact",
)
RECOVERY_ITEMS = (
    "isolated repair",
    "idempotency",
    "concurrent-write preservation",
    "canaries",
    "downstream correction",
    "current-ingestion validation",
    "tested backfill gates",
)


def row(item: str, status: str, evidence: str, why: str = "") -> dict:
    """One Done item; ``why`` says, where not verified, why and what would verify it."""
    assert status in STATUSES, status
    return {"item": item, "status": status, "evidence": evidence, "why": why}


def _events(tl: dict | None, kind: str) -> list[dict]:
    return [e for e in (tl or {}).get("events", []) if e["kind"] == kind]


def _first(events: list[dict]) -> str:
    e = events[0]
    where = e.get("source") or ""
    run = f", run {e['run_id']}" if e.get("run_id") else ""
    return f"{e['summary']} ({where}{run})"


def with_checklist(markdown: str, rows: list[dict]) -> str:
    """``markdown`` with the Done checklist right after its first (title) line."""
    title, _, rest = markdown.partition("\n")
    table = ["", "| Done item | status | evidence | why not verified |", "| --- | --- | --- | --- |"]
    table += [f"| {r['item']} | {r['status']} | {_md(r['evidence'])} | {_md(r['why'])} |" for r in rows]
    return "\n".join([title, *table, rest])


def _md(text: str) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")


# ---- facts the checklists read beyond the reports' sections --------------------------------------


def consumer_builds_from_damage(s: Session, spec: DatasetSpec, incident: Incident) -> dict:
    """Consumer outputs built while the target exposed the failed generations' rows (propagation)."""
    if not exists(s, "consumer_builds"):
        return {"status": NOT_RUN, "builds": []}
    gens = f"[{str_list(list(incident.failed_generations))}]"
    builds = rows_as_dicts(
        s,
        f"SELECT consumer, namespace, seq, built_at FROM {SCHEMA}.consumer_builds "
        f"WHERE dataset = ? AND list_has_any(generations, CAST({gens} AS VARCHAR[])) ORDER BY seq",
        [spec.dataset],
    )
    return {"status": "ok", "builds": builds}


def write_log_holds(s: Session, spec: DatasetSpec, incident: Incident) -> bool:
    """Whether the dataset's write log holds the failed generations' writes."""
    if not has_dataset_table(s, "delta", spec.dataset):
        return False
    gen = quote(spec.target.metadata.generation)
    return bool(
        s.scalar(
            f"SELECT count(*) FROM (SELECT 1 FROM {delta_table(spec.dataset)} "
            f"WHERE {gen} IN ({str_list(list(incident.failed_generations))}) LIMIT 1)"
        )
    )


def recorded_manifest(s: Session, incident: Incident) -> str | None:
    """The manifest checksum the timeline recorded when the incident's bundle was built."""
    if not exists(s, "timeline"):
        return None
    return s.scalar(
        f"SELECT details->>'manifest_sha256' FROM {SCHEMA}.timeline WHERE kind = 'evidence_preserved' "
        f"AND incident_id = ? ORDER BY event_id DESC LIMIT 1",
        [incident.incident_id],
    )


# ---- the incident timeline ---------------------------------------------------------------------


def timeline_checklist(tl: dict | None, *, propagation: dict, evidence: dict) -> list[dict]:
    """``tl``: the timeline report's context; ``propagation``: consumer builds that read the failed
    generations; ``evidence``: the bundle re-check (see :func:`evidence_check`)."""
    rows = []
    if tl is None:
        fix = "render the timeline (recovery timeline / recovery report) against the project's Dagster instance"
        return [row(i, NOT_VERIFIABLE, "no timeline was built", fix) for i in TIMELINE_ITEMS]
    approvals = _events(tl, "approval")
    named = [e for e in approvals if e.get("actor")]
    if named:
        rows.append(row("authority", VERIFIED, "; ".join(f"{e['summary']} ({e['source']})" for e in named[:3])))
    else:
        rows.append(
            row(
                "authority",
                QUALIFIED,
                _first(approvals) if approvals else "no approval recorded",
                "no approver is named: add approved_by to the incident file (and the backfill's approved_by tag)",
            )
        )
    for item, kind, fix in (
        (
            "inputs",
            "input_snapshot",
            "register the generation with its source watermark, or preserve evidence so the read is inferred",
        ),
        (
            "code",
            "code",
            "register the generation with its code version (Writer.register_generation(code_version=...))",
        ),
        ("ranges", "ranges", "name the intended range in the incident file (intended_range)"),
    ):
        found = _events(tl, kind)
        unknown = [e for e in found if any(w in e["summary"] for w in ("None", "unknown", "no watermark"))]
        if found and not unknown:
            rows.append(row(item, VERIFIED, _first(found) + (f" and {len(found) - 1} more" if len(found) > 1 else "")))
        elif found:
            rows.append(row(item, QUALIFIED, _first(unknown), f"recorded without its value: {fix}"))
        elif item == "ranges" and _events(tl, "writes"):
            rows.append(
                row(
                    item,
                    QUALIFIED,
                    f"no requested or intended range recorded; the partitions the failed "
                    f"generations wrote are on the timeline's {len(_events(tl, 'writes'))} write events",
                    f"the writes show what was touched, not what was asked for: {fix}, or launch backfills "
                    f"through Dagster so the requested range is recorded",
                )
            )
        else:
            rows.append(row(item, NOT_VERIFIABLE, "no such event on the timeline", fix))
    runs = _events(tl, "runs")
    run_ids = sorted({e["run_id"] for e in runs if e.get("run_id")})
    if run_ids:
        rows.append(
            row(
                "runs",
                VERIFIED,
                f"{len(run_ids)} Dagster runs from the instance's event log: "
                + ", ".join(r[:8] for r in run_ids[:6])
                + (" ..." if len(run_ids) > 6 else ""),
            )
        )
    elif runs or _events(tl, "writes"):
        rows.append(
            row(
                "runs",
                QUALIFIED,
                _first(runs)
                if runs
                else f"no orchestrator run recorded; the failed generations' "
                f"{len(_events(tl, 'writes'))} writes are recorded without a run id",
                "the failed generations were not run by the orchestrator whose history was read (their writes "
                "carry no run id): launch backfills through Dagster, or add the other scheduler's run log to the evidence",
            )
        )
    else:
        rows.append(
            row("runs", NOT_VERIFIABLE, "no run events", "build the timeline against the project's Dagster instance")
        )
    retries = _events(tl, "retries")
    if retries:
        rows.append(row("retries", VERIFIED, f"{len(retries)} retry events: " + _first(retries)))
    elif run_ids:
        rows.append(row("retries", VERIFIED, f"the event logs of {len(run_ids)} runs hold no retry: none happened"))
    else:
        rows.append(
            row(
                "retries",
                QUALIFIED if _events(tl, "writes") else NOT_VERIFIABLE,
                "no run history of the failed generations",
                "retries show in an orchestrator's run log only; without one, repeated writes in _recovery.writes are the only trace",
            )
        )
    writes = _events(tl, "writes")
    if writes:
        seqs = [e["seq"] for e in writes if e.get("seq") is not None]
        rows.append(
            row(
                "writes",
                VERIFIED,
                f"{len(writes)} writes from _recovery.writes"
                + (f", commit seq {min(seqs)}..{max(seqs)}" if seqs else ""),
            )
        )
    else:
        rows.append(
            row(
                "writes",
                QUALIFIED,
                "no write of the failed generations is recorded",
                "the target was written outside the generation-aware writer: its rows' metadata columns are the only record",
            )
        )
    if propagation.get("status") == NOT_RUN:
        rows.append(
            row(
                "propagation",
                NOT_VERIFIABLE,
                "no consumer build is recorded (_recovery.consumer_builds)",
                "materialize consumers through the package (refresh_consumers) so each build records what it read",
            )
        )
    elif propagation["builds"]:
        rows.append(
            row(
                "propagation",
                VERIFIED,
                f"{len(propagation['builds'])} consumer outputs built from the failed "
                f"generations' rows: "
                + ", ".join(f"{b['consumer']} ({b['namespace']}, seq {b['seq']})" for b in propagation["builds"][:5]),
            )
        )
    else:
        rows.append(
            row(
                "propagation",
                VERIFIED,
                "_recovery.consumer_builds: no consumer output was built while the target "
                "exposed the failed generations' rows (the damage reached no consumer build)",
            )
        )
    containment = _events(tl, "containment")
    fences = [e for e in containment if "fenced" in e["summary"]]
    if fences:
        rows.append(row("containment", VERIFIED, "; ".join(f"{e['summary']} (seq {e.get('seq')})" for e in fences[:3])))
    else:
        rows.append(
            row(
                "containment",
                NOT_VERIFIABLE,
                _first(containment) if containment else "no fence recorded",
                "run recovery contain --incident FILE",
            )
        )
    decisions = _events(tl, "decisions")
    if decisions:
        rows.append(row("decisions", VERIFIED, _first(decisions[-1:])))
    else:
        rows.append(
            row("decisions", NOT_VERIFIABLE, "no decision recorded", "run recovery reconcile / assess_incident")
        )
    rows.append(evidence_row(evidence))
    return rows


def evidence_check(bundle: Path, recorded_sha256: str | None) -> dict:
    """Re-check the bundle's checksums now (what the evidence row states)."""
    from recovery.lib.evidence.manifest import MANIFEST, sha256_file, verify_bundle

    if not (bundle / MANIFEST).is_file():
        return {"status": NOT_RUN, "bundle": str(bundle)}
    result = verify_bundle(bundle, recorded_manifest_sha256=recorded_sha256)
    return {
        "status": "ok" if result.ok else "failed",
        "bundle": str(bundle),
        "files": result.files_checked,
        "manifest_sha256": sha256_file(bundle / MANIFEST),
        "recorded": recorded_sha256,
        "problems": [str(p) for p in result.problems],
    }


def evidence_row(ev: dict) -> dict:
    if ev["status"] == NOT_RUN:
        return row(
            "evidence", NOT_VERIFIABLE, f"no bundle at {ev['bundle']}", "run recovery evidence build --incident FILE"
        )
    what = f"{ev['bundle']}/manifest.json sha256 {ev['manifest_sha256'][:16]}…, {ev['files']} files re-checked now"
    if ev["status"] != "ok":
        return row("evidence", QUALIFIED, what, "the bundle changed: " + "; ".join(ev["problems"][:3]))
    if not ev["recorded"]:
        return row(
            "evidence",
            QUALIFIED,
            what,
            "the control plane holds no checksum of this manifest: rebuild the "
            "bundle with recovery evidence build so its checksum is recorded on the timeline",
        )
    return row("evidence", VERIFIED, what + "; manifest matches the checksum recorded on the timeline")


# ---- the reconciliation ------------------------------------------------------------------------


def reconciliation_checklist(ctx: dict, *, write_log: bool, out_of_order_basis: str | None) -> list[dict]:
    scope, labels, parts, impact, decisions = (
        ctx["scope"],
        ctx["labels"],
        ctx["partitions"],
        ctx["impact"],
        ctx["decisions"],
    )
    fix = "run recovery reconcile --incident FILE"
    if labels["status"] == NOT_RUN or scope["status"] == NOT_RUN:
        rows = [
            row(i, NOT_VERIFIABLE, "no reconciliation recorded for this incident", fix)
            for i in RECONCILIATION_ITEMS[:8]
        ]
    else:
        counts = {r["label"]: r["keys"] for r in labels["rows"]}
        table = f"{SCHEMA}.{dataset_table_name('recon', ctx['dataset'])}"
        unexplained = labels["unexplained"]
        rows = [
            row(
                "keys",
                QUALIFIED if unexplained else VERIFIED,
                f"{table}: {labels['total']:,} damaged keys, one label each; {scope['source_keys']:,} source keys compared",
                f"{unexplained:,} keys match no rule (unexplained): inspect them before repairing"
                if unexplained
                else "",
            ),
            row(
                "partitions",
                VERIFIED,
                f"{SCHEMA}.{dataset_table_name('recon_partitions', ctx['dataset'])}: {scope['partitions']:,} partitions "
                f"compared, {len(parts.get('damaged', [])):,} damaged",
            ),
            row(
                "versions",
                VERIFIED,
                f"{scope['source_events']:,} source changes up to version {scope['max_version']}, "
                f"as of {scope['watermark']}; each label's keys by version relation (older, expected, absent)",
            ),
        ]
        for label in ("missing", "duplicate"):
            rows.append(row(label, VERIFIED, f"{counts.get(label, 0):,} keys labelled {label} in {table}"))
        if write_log:
            over = counts.get("overwritten", 0)
            rows.append(
                row(
                    "overwritten",
                    VERIFIED,
                    f"{over:,} keys overwritten: a concurrent generation's newer write "
                    f"clobbered by the failed one, from the write log",
                )
            )
            rows.append(
                row(
                    "deleted",
                    VERIFIED,
                    f"{counts.get('deleted', 0):,} keys deleted (held before the failed "
                    f"generation started, per the write log)",
                )
            )
            rows.append(
                row(
                    "concurrent",
                    VERIFIED,
                    f"{over:,} concurrent writes lost, {counts.get('out_of_order', 0):,} "
                    f"keys applied out of order (from the {BASIS.get(out_of_order_basis or 'write_log')}), "
                    f"{parts.get('findings', {}).get('written_after_fence', 0)} partitions written after the fence",
                )
            )
        else:
            why = (
                "the target keeps no write log of the failed generations (a foreign table): what it held before the "
                "backfill and concurrent writes cannot be told from its rows; preserve the target's versions "
                "(time travel, snapshots) to verify"
            )
            rows.append(
                row(
                    "overwritten",
                    QUALIFIED,
                    f"{counts.get('overwritten', 0):,} keys; older versions are reported as stale",
                    why,
                )
            )
            rows.append(
                row(
                    "deleted", QUALIFIED, f"{counts.get('deleted', 0):,} keys; absent keys are reported as missing", why
                )
            )
            rows.append(
                row(
                    "concurrent",
                    QUALIFIED,
                    f"{counts.get('out_of_order', 0):,} keys out of order, read from the metadata columns",
                    why,
                )
            )
    if impact["status"] == NOT_RUN:
        rows.append(
            row(
                "downstream",
                NOT_VERIFIABLE,
                "no impact assessment recorded",
                "run assess_incident (recovery reconcile)",
            )
        )
    else:
        rows.append(
            row(
                "downstream",
                VERIFIED,
                f"{SCHEMA}.{dataset_table_name('impact', ctx['dataset'])}: {impact['affected']} of "
                f"{len(impact['rows'])} consumers affected, {impact['material_rows']:,} material rows",
            )
        )
    per = decisions.get("per_consumer", [])
    if impact["status"] == NOT_RUN:
        rows.append(row("decision impact", NOT_VERIFIABLE, "no impact assessment recorded", "run assess_incident"))
    elif not per:
        rows.append(
            row(
                "decision impact",
                QUALIFIED,
                "consumer decision kinds only (statement re-issue, ...)",
                "the spec declares no decisions per consumer: list them under downstream[].decisions",
            )
        )
    else:
        crossed = sum(1 for d in per if d["material"])
        rows.append(
            row(
                "decision impact",
                VERIFIED,
                f"{len(per)} declared decisions fed by the consumers, {crossed} "
                f"crossed materiality (impact rows per consumer)",
            )
        )
    return rows


# ---- the recovery and recurrence report --------------------------------------------------------


def recovery_checklist(ctx: dict) -> list[dict]:
    sec = {x["id"]: x for x in ctx["sections"]}
    rows = []
    rep = sec["isolated_repair"]
    if rep["status"] == NOT_RUN:
        rows.append(
            row("isolated repair", NOT_VERIFIABLE, "no repair plan recorded", "run recovery repair --incident FILE")
        )
    else:
        facts = dict(rep["facts"])
        pub = rep.get("published")
        isolated = facts.get("namespace") and facts.get("namespace") != facts.get("from_namespace")
        evidence = (
            f"generation {facts.get('generation')} built {facts.get('namespace')} from the source as of "
            f"{facts.get('source_watermark')}, apart from {facts.get('from_namespace')}"
            + (f"; published by one pointer move at seq {pub['seq']}" if pub else "")
        )
        rows.append(
            row(
                "isolated repair",
                VERIFIED if isolated and pub else QUALIFIED,
                evidence,
                "" if isolated and pub else "not published yet: run recovery publish --incident FILE",
            )
        )
    idem = sec["idempotency"]
    if idem["status"] == NOT_RUN:
        rows.append(
            row(
                "idempotency",
                NOT_VERIFIABLE,
                "no idempotency gate recorded (_recovery.gate_results)",
                "run recovery repair --incident FILE: its rerun gate proves a second pass changes nothing",
            )
        )
    else:
        gates = idem.get("gates", [])
        rows.append(
            row(
                "idempotency",
                VERIFIED if idem["status"] in ("passed", "recorded") else QUALIFIED,
                f"{len(gates)} idempotency gates ({', '.join(sorted({g['gate'] for g in gates})[:3])}), "
                f"{len(idem.get('noop_replays', []))} replays that found nothing left",
                "" if idem["status"] in ("passed", "recorded") else "an idempotency gate failed",
            )
        )
    cw = sec["concurrent_writes"]
    if cw["status"] == NOT_RUN:
        rows.append(
            row(
                "concurrent-write preservation",
                NOT_VERIFIABLE,
                "no delta replay recorded",
                "run recovery publish: it replays writes made during the repair",
            )
        )
    else:
        t = cw["totals"]
        rows.append(
            row(
                "concurrent-write preservation",
                VERIFIED,
                f"_recovery.delta_replays: {t['upserted']:,} upserts and {t['deleted']:,} deletes made during the "
                f"repair replayed into the repair generation ({len(cw['replays'])} replays)",
            )
        )
    waves = sec["waves"]
    if waves["status"] == NOT_RUN:
        rows.append(row("canaries", NOT_VERIFIABLE, "no repair wave recorded", "run recovery repair --through canary"))
    else:
        canary = [w for w in waves["waves"] if w["wave"] == 0]
        canary_gates = [g for g in waves.get("gates", []) if g["stage"] == "canary"]
        ok = canary and canary_gates and all(g["passed"] for g in canary_gates if g["blocking"])
        rows.append(
            row(
                "canaries",
                VERIFIED if ok else QUALIFIED,
                f"canary of {canary[0]['partitions'] if canary else 0} partitions, {len(canary_gates)} gates at "
                f"stage canary"
                + (f", run {canary_gates[0]['run_id']}" if canary_gates and canary_gates[0].get("run_id") else ""),
                "" if ok else "the canary's blocking gates did not all pass (or none is recorded)",
            )
        )
    dc = sec["downstream_corrections"]
    if dc["status"] == NOT_RUN:
        rows.append(
            row(
                "downstream correction",
                NOT_VERIFIABLE,
                "no restatement recorded",
                "run recovery restate --incident FILE",
            )
        )
    else:
        computed = dc.get("computed_originals", [])
        rows.append(
            row(
                "downstream correction",
                VERIFIED,
                f"{len(dc['consumers'])} consumers restated, {dc['rows_restated']:,} ledger rows, {dc['material']:,} "
                f"material"
                + (
                    f"; originals of {', '.join(computed)} computed from the preserved damaged generation"
                    if computed
                    else ""
                ),
            )
        )
    cv = sec["convergence"]
    if cv["status"] == NOT_RUN:
        rows.append(
            row(
                "current-ingestion validation",
                NOT_VERIFIABLE,
                "no convergence check recorded",
                "run recovery verify --incident FILE",
            )
        )
    else:
        latest = cv["latest"]
        rows.append(
            row(
                "current-ingestion validation",
                VERIFIED if cv["status"] == "converged" else QUALIFIED,
                f"check {latest['check_id']} (run {latest.get('run_id') or '—'}): {latest['partitions']} partitions "
                f"({latest['recent']} recent, {latest['repaired']} repaired), {latest['drift_keys'] or 0} drift keys, "
                f"{latest.get('pending_changes') or 0} changes pending after the watermark",
                ""
                if cv["status"] == "converged"
                else f"ingestion is behind: {latest['pending_overdue']} changes pending past convergence.max_lag; "
                f"run ingestion, then recovery verify"
                if cv["status"] == "behind"
                else "drift: ingestion has not converged; re-run recovery verify",
            )
        )
    rg = sec["recurrence_gates"]
    tested = rg.get("tested", 0)
    if tested:
        rows.append(
            row(
                "tested backfill gates",
                VERIFIED,
                f"{rg['total']} gates in force; {tested} gate evaluations of "
                f"guarded backfills recorded in _recovery.backfill_gates",
            )
        )
    else:
        rows.append(
            row(
                "tested backfill gates",
                QUALIFIED,
                f"{rg['total']} gates in force from the spec's recurrence policy",
                "no guarded backfill has been evaluated against them yet: run recovery backfill plan to test them",
            )
        )
    return rows
