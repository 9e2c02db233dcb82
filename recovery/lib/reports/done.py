"""The runbook's Done list, item by item, at the top of each report.

Each report opens with the Done items it is responsible for (the runbook's three
Done sentences), one row each: ``verified`` (its check ran over a non-empty set and
passed, measured from a record this run of the recovery left, named in the evidence
column), ``not verified`` (its check ran over an empty set, or failed: the row gives
the count and the reason), ``qualified`` (what can be recorded falls short by nature,
e.g. a target with no write log or a backfill run outside Dagster: the row says why
and what would verify it; nothing is invented), or ``not verifiable`` (the phase that
would show it has not run; the row names the command that would). A row is built
only from the report's own context (the control-plane records its sections read)
and, for the evidence bundle, a re-check of its checksums made while the report is
built. A record that exists is not a check that passed: a restatement with an empty
ledger where the impact found material rows, or an idempotency section with no gate,
is not verified.
"""

from __future__ import annotations

from pathlib import Path

from recovery.lib.consumers.assets import asset_impacts
from recovery.lib.control.plane import SCHEMA, dataset_table, dataset_table_name, delta_table, has_dataset_table
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote
from recovery.lib.incident.model import Incident
from recovery.lib.incident.phases import ASSESS
from recovery.lib.reports.tables import NOT_RUN, exists, rows_as_dicts
from recovery.lib.snapshot import str_list

VERIFIED, NOT_VERIFIED, QUALIFIED, NOT_VERIFIABLE = "verified", "not verified", "qualified", "not verifiable"
STATUSES = (VERIFIED, NOT_VERIFIED, QUALIFIED, NOT_VERIFIABLE)
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
    """Consumer outputs built while the target exposed the failed generations' rows (propagation),
    how many builds were recorded at all, and the downstream Dagster assets the impact found reached."""
    assets = [
        {"asset": a.asset, "partitions": len(a.partitions), "rows": a.rows_reached}
        for a in asset_impacts(s, spec, incident.incident_id)
        if a.rows_reached
    ]
    table = dataset_table("asset_impact", spec.dataset)
    if not exists(s, "consumer_builds"):
        return {
            "status": NOT_RUN if not assets else "ok",
            "builds": [],
            "total": 0,
            "assets": assets,
            "asset_table": table,
        }
    gens = f"[{str_list(list(incident.failed_generations))}]"
    builds = rows_as_dicts(
        s,
        f"SELECT consumer, namespace, seq, built_at FROM {SCHEMA}.consumer_builds "
        f"WHERE dataset = ? AND list_has_any(generations, CAST({gens} AS VARCHAR[])) ORDER BY seq",
        [spec.dataset],
    )
    total = int(s.scalar(f"SELECT count(*) FROM {SCHEMA}.consumer_builds WHERE dataset = ?", [spec.dataset]) or 0)
    return {"status": "ok", "builds": builds, "total": total, "assets": assets, "asset_table": table}


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
                "carry no run id): launch backfills through Dagster, "
                "or add the other scheduler's run log to the evidence",
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
                "retries show in an orchestrator's run log only; without one, "
                "repeated writes in _recovery.writes are the only trace",
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
                "the target was written outside the generation-aware writer: its rows' metadata columns are "
                "the only record",
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
    elif propagation["builds"] or propagation.get("assets"):
        builds, assets = propagation["builds"], propagation.get("assets", [])
        rows.append(
            row(
                "propagation",
                VERIFIED,
                "; ".join(
                    ([f"{len(builds)} consumer outputs built from the failed generations' rows: "
                      + ", ".join(f"{b['consumer']} ({b['namespace']}, seq {b['seq']})" for b in builds[:5])]
                     if builds else [])
                    + ([f"{len(assets)} downstream Dagster assets reached ({propagation['asset_table']}): "
                        + ", ".join(
                            f"{a['asset']} ({a['partitions']} partitions, {a['rows']:,} rows)" for a in assets[:5]
                        )]
                       if assets else [])
                ),
            )
        )  # fmt: skip
    elif propagation.get("total", 0):
        rows.append(
            row(
                "propagation",
                VERIFIED,
                f"_recovery.consumer_builds: none of the {propagation['total']:,} consumer builds recorded read "
                f"the failed generations' rows, and no downstream asset was reached (the damage reached no consumer)",
            )
        )
    else:
        rows.append(
            row(
                "propagation",
                NOT_VERIFIED,
                "_recovery.consumer_builds: 0 consumer builds recorded, and no downstream asset traced",
                "nothing was compared: with no consumer build on record, that none read the damage is not shown; "
                "materialize consumers through the package, or run recovery assess to trace the downstream assets",
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
        rows.append(row("decisions", NOT_VERIFIABLE, "no decision recorded", f"run recovery reconcile / {ASSESS.job}"))
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
        return row("evidence", NOT_VERIFIED, what, "the bundle changed: " + "; ".join(ev["problems"][:3]))
    if not ev["files"]:
        return row("evidence", NOT_VERIFIED, what, "the manifest lists 0 files: nothing was preserved to re-check")
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


def _rests_on(ctx: dict, labels: tuple[str, ...], write_log: bool) -> str:
    """What the given labels' keys rest on: the basis recorded key by key (``write_log``,
    ``registry <table>``, ``none``); without a labelled key, the summary's, else the write log's presence."""
    recorded = sorted({b for label in labels for b in str(ctx.get("basis", {}).get(label, "")).split("; ") if b})
    if recorded:
        return "; ".join(recorded)
    side = "older" if "overwritten" in labels else "absent"
    summary = ((ctx.get("summary") or {}).get("basis") or {}).get(side)
    return summary or ("write_log" if write_log else "none")


def _history_rows(ctx: dict, counts: dict, *, write_log: bool, out_of_order_basis: str | None) -> list[dict]:
    """overwritten, deleted, concurrent: from the write log, or inferred from the run registry, as the
    reconciliation recorded it key by key; only without either are older versions stale and absent keys missing."""
    table = f"{SCHEMA}.{dataset_table_name('recon', ctx['dataset'])}"
    parts = ctx["partitions"]
    over, deleted = counts.get("overwritten", 0), counts.get("deleted", 0)
    older, absent = (
        _rests_on(ctx, ("overwritten", "stale"), write_log),
        _rests_on(ctx, ("deleted", "missing"), write_log),
    )

    def said(basis: str) -> str:
        if basis == "write_log":
            return "from the write log"
        return f"inferred from {basis} (each registered run taken to have applied every change up to its watermark)"

    none_why = (
        "the target keeps no write log of the failed generations and the spec names no run registry: what it "
        "held before the backfill and which writes were concurrent cannot be told from its rows; add the "
        "registry section (or preserve the target's versions) to verify"
    )
    rows = []
    if older == "none":
        rows.append(
            row(
                "overwritten",
                QUALIFIED,
                f"{over:,} keys labelled overwritten in {table}: an older version is labelled stale "
                f"({counts.get('stale', 0):,} keys), since nothing tells a clobbered concurrent write from "
                "a stale read",
                none_why,
            )
        )
    else:
        rows.append(
            row(
                "overwritten",
                VERIFIED,
                f"{over:,} keys labelled overwritten in {table} (a concurrent generation's newer write clobbered by "
                f"the failed one), {counts.get('stale', 0):,} stale, {said(older)}",
            )
        )
    if absent == "none":
        rows.append(
            row(
                "deleted",
                QUALIFIED,
                f"{deleted:,} keys labelled deleted in {table}: an absent key is labelled missing "
                f"({counts.get('missing', 0):,} keys), since nothing tells what the target held before the backfill",
                none_why,
            )
        )
    else:
        rows.append(
            row(
                "deleted",
                VERIFIED,
                f"{deleted:,} keys labelled deleted in {table} (held before the failed generation started), "
                f"{counts.get('missing', 0):,} missing, {said(absent)}",
            )
        )
    concurrent = (
        f"{over:,} concurrent writes lost, {counts.get('out_of_order', 0):,} keys applied out of order (from the "
        f"{BASIS.get(out_of_order_basis or 'write_log', out_of_order_basis)}), "
        f"{parts.get('findings', {}).get('written_after_fence', 0)} partitions written after the fence"
    )
    if older == "none":
        rows.append(row("concurrent", QUALIFIED, concurrent + ", read from the metadata columns", none_why))
    else:
        rows.append(row("concurrent", VERIFIED, concurrent + f"; concurrent writes {said(older)}"))
    return rows


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
        compared = int(scope.get("source_keys") or 0) + int(scope.get("actual_rows") or 0)
        empty = "nothing was compared: the source and the target hold no rows"
        rows = [
            row(
                "keys",
                NOT_VERIFIED if unexplained or not scope["source_keys"] else VERIFIED,
                f"{table}: {labels['total']:,} damaged keys, one label each; {scope['source_keys']:,} source "
                "keys compared",
                f"{unexplained:,} keys match no rule (unexplained): inspect them before repairing"
                if unexplained
                else ("" if scope["source_keys"] else "0 source keys compared: the source holds no key"),
            ),
            row(
                "partitions",
                VERIFIED if scope["partitions"] else NOT_VERIFIED,
                f"{SCHEMA}.{dataset_table_name('recon_partitions', ctx['dataset'])}: "
                f"{scope['partitions']:,} partitions "
                f"compared, {len(parts.get('damaged', [])):,} damaged",
                "" if scope["partitions"] else "0 partitions compared",
            ),
            row(
                "versions",
                VERIFIED if scope["source_events"] else NOT_VERIFIED,
                f"{scope['source_events']:,} source changes up to version {scope['max_version']}, "
                f"as of {scope['watermark']}; each label's keys by version relation (older, expected, absent)",
                "" if scope["source_events"] else "0 source changes read",
            ),
        ]
        for label in ("missing", "duplicate"):
            rows.append(
                row(
                    label,
                    VERIFIED if compared else NOT_VERIFIED,
                    f"{counts.get(label, 0):,} keys labelled {label} in {table}, of {compared:,} source keys and "
                    f"target rows compared",
                    "" if compared else empty,
                )
            )
        rows += _history_rows(ctx, counts, write_log=write_log, out_of_order_basis=out_of_order_basis)
    if impact["status"] == NOT_RUN:
        rows.append(
            row(
                "downstream",
                NOT_VERIFIABLE,
                "no impact assessment recorded",
                f"run {ASSESS.job} (recovery reconcile)",
            )
        )
    else:
        assets = ctx.get("assets", [])
        reached = [a for a in assets if a["rows_reached"] or a["partitions"]]
        assessed = len(impact["rows"]) + len(assets)
        rows.append(
            row(
                "downstream",
                VERIFIED if assessed else NOT_VERIFIED,
                f"{SCHEMA}.{dataset_table_name('impact', ctx['dataset'])}: {impact['affected']} of "
                f"{len(impact['rows'])} consumers affected, {impact['material_rows']:,} material rows"
                + (
                    f"; {len(reached)} of {len(assets)} downstream Dagster assets reached: "
                    + ", ".join(
                        f"{a['asset']} ({len(a['partitions'])} partitions, {a['rows_reached']:,} rows)"
                        for a in reached[:5]
                    )
                    if assets
                    else ""
                ),
                ""
                if assessed
                else "0 consumers assessed: the spec declares no consumer (downstream, downstream_assets) and no "
                "Dagster asset was found downstream of the target, so no downstream output was compared",
            )
        )
    per = decisions.get("per_consumer", [])
    if impact["status"] == NOT_RUN:
        rows.append(row("decision impact", NOT_VERIFIABLE, "no impact assessment recorded", f"run {ASSESS.job}"))
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
        rebuilt = sum(n for action, n in rep.get("actions", {}).items() if not str(action).startswith("keep"))
        evidence = (
            f"generation {facts.get('generation')} built {facts.get('namespace')} from the source as of "
            f"{facts.get('source_watermark')}, apart from {facts.get('from_namespace')}; {rebuilt:,} partitions rebuilt"
            + (f"; published by one pointer move at seq {pub['seq']}" if pub else "")
        )
        why = (
            "the repair wrote into the namespace it repairs"
            if not isolated
            else "0 partitions rebuilt: the repair changed nothing to isolate"
            if not rebuilt
            else "not published yet: run recovery publish --incident FILE"
            if not pub
            else ""
        )
        rows.append(row("isolated repair", NOT_VERIFIED if why else VERIFIED, evidence, why))
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
        failed = [g for g in gates if not g["passed"]]
        evidence = (
            f"{len(gates)} idempotency gates"
            + (f" ({', '.join(sorted({g['gate'] for g in gates})[:3])})" if gates else "")
            + f", {len(failed)} failed; {len(idem.get('noop_replays', []))} replays that found nothing left"
        )
        why = (
            f"{len(failed)} of {len(gates)} idempotency gates failed: a second pass changed something"
            if failed
            else "0 idempotency gates ran: a replay that found nothing left is not a second pass of the repair, "
            "so that re-running changes nothing was not measured"
            if not gates
            else ""
        )
        rows.append(row("idempotency", NOT_VERIFIED if why else VERIFIED, evidence, why))
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
        gate = cw.get("gate")
        captured = sum(t.get(k) or 0 for k in ("upserted", "deleted", "skipped_older"))
        evidence = (
            f"_recovery.delta_replays: {t['upserted']:,} upserts and {t['deleted']:,} deletes made during the "
            f"repair replayed into the repair generation ({len(cw['replays'])} replays)"
            + (f"; publish gate repair_concurrent_writes: {gate['details']}" if gate else "")
        )
        why = (
            "the key-by-key publish gate (repair_concurrent_writes) did not run: run recovery publish --incident FILE"
            if gate is None
            else f"the publish gate repair_concurrent_writes failed on {gate['observed']:,} keys"
            if not gate["passed"]
            else "no write landed during the repair, so no concurrent write could be checked"
            if not captured
            else ""
        )
        rows.append(row("concurrent-write preservation", NOT_VERIFIED if why else VERIFIED, evidence, why))
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
                VERIFIED if ok else NOT_VERIFIED,
                f"canary of {canary[0]['partitions'] if canary else 0} partitions, {len(canary_gates)} gates at "
                f"stage canary"
                + (f", run {canary_gates[0]['run_id']}" if canary_gates and canary_gates[0].get("run_id") else ""),
                ""
                if ok
                else f"{sum(not g['passed'] for g in canary_gates if g['blocking'])} of {len(canary_gates)} blocking "
                f"gates at stage canary failed"
                if canary_gates
                else "0 gates recorded at stage canary: the canary was not gated",
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
        rows.append(downstream_correction_row(dc))
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
        why = (
            "0 partitions checked: nothing was compared with the source"
            if not latest["partitions"]
            else ""
            if cv["status"] == "converged"
            else f"ingestion is behind: {latest['pending_overdue']} changes pending past convergence.max_lag; "
            f"run ingestion, then recovery verify"
            if cv["status"] == "behind"
            else f"drift: {latest['drift_keys'] or 0} keys in {latest.get('drifting_partitions', 0)} partitions differ "
            f"from the source; ingestion has not converged; re-run recovery verify"
        )
        rows.append(
            row(
                "current-ingestion validation",
                NOT_VERIFIED if why else VERIFIED,
                f"check {latest['check_id']} (run {latest.get('run_id') or '—'}): {latest['partitions']} partitions "
                f"({latest['recent']} recent, {latest['repaired']} repaired), {latest['drift_keys'] or 0} drift keys, "
                f"{latest.get('pending_changes') or 0} changes pending after the watermark",
                why,
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
                NOT_VERIFIED,
                f"{rg['total']} gates in force from the spec's recurrence policy; 0 gate evaluations recorded",
                "no guarded backfill has been evaluated against them yet: run recovery backfill plan to test them",
            )
        )
    return rows


def downstream_correction_row(dc: dict) -> dict:
    """Verified only when consumers were restated, every restatement check passed, every consumer in
    which the impact found material rows has ledger rows, and every downstream asset the damage
    reached was restated."""
    restated = {c["consumer"]: c for c in dc["consumers"]}
    checks = dc.get("checks", [])
    failed = [c for c in checks if not c["passed"]]
    unchecked = sorted(set(restated) - {c["consumer"] for c in checks})
    material = {k: v for k, v in dc.get("impact_material", {}).items() if v}
    not_restated = sorted(set(material) - set(restated)) + sorted(set(dc.get("assets_reached", [])) - set(restated))
    empty = sorted(k for k in material if k in restated and not restated[k]["rows_restated"])
    computed = dc.get("computed_originals", [])
    evidence = (
        f"{len(restated)} consumers restated, {dc['rows_restated']:,} ledger rows, {dc['material']:,} material; "
        f"{len(checks) - len(failed)} of {len(checks)} restatement checks passed"
        + (f"; originals of {', '.join(computed)} computed from the preserved damaged generation" if computed else "")
    )
    reasons = (
        (["0 consumers restated"] if not restated else [])
        + [f"check failed: {c['details']}" for c in failed[:3]]
        + ([f"no restatement check recorded for {', '.join(unchecked[:5])}"] if unchecked else [])
        + (
            [f"the impact found material rows in {', '.join(not_restated[:5])}, which were not restated"]
            if not_restated
            else []
        )
        + [f"{k}: 0 ledger rows while the impact found {material[k]:,} material rows" for k in empty[:3]]
    )
    if reasons:
        return row("downstream correction", NOT_VERIFIED, evidence, "; ".join(reasons) + "; run recovery restate again")
    return row("downstream correction", VERIFIED, evidence)
