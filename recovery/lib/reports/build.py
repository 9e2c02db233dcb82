"""Build the three reports of an incident from one read-only session, and write them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from recovery.lib.control.plane import utcnow
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.incident.model import Incident
from recovery.lib.reports import done
from recovery.lib.reports.reconciliation import reconciliation_context
from recovery.lib.reports.recovery import recovery_context
from recovery.lib.reports.render import render, write_text
from recovery.lib.reports.tables import NOT_RUN
from recovery.lib.reports.timeline import timeline_context
from recovery.lib.timeline import Timeline, render_markdown

REPORT_NAMES = ("timeline", "reconciliation", "recovery")
TITLES = {"timeline": "Incident timeline", "reconciliation": "Reconciliation", "recovery": "Recovery and recurrence"}


@dataclass(frozen=True)
class IncidentReports:
    incident_id: str
    html: dict[str, str]
    markdown: dict[str, str]
    contexts: dict[str, dict] = field(repr=False)

    def summary(self) -> list[str]:
        """A one-screen summary: the figures a person checks first."""
        rec = self.contexts["reconciliation"]
        lines = [f"incident {self.incident_id}"]
        labels = rec["labels"]
        if labels["status"] == NOT_RUN:
            lines.append("reconciliation: not run yet")
        else:
            lines.append(
                f"damaged keys: {labels['total']:,} ("
                + ", ".join(f"{r['label']} {r['keys']:,}" for r in labels["rows"])
                + ")"
            )
            parts = rec["partitions"]
            lines.append(
                f"partitions: {len(parts['damaged']):,} damaged of {parts['compared']:,} compared ("
                + ", ".join(f"{k} {v}" for k, v in parts["findings"].items() if v)
                + ")"
            )
        impact = rec["impact"]
        if impact["status"] != NOT_RUN:
            lines.append(
                f"consumers: {impact['affected']} affected; material rows: "
                + ", ".join(f"{c['consumer']} {c['material_rows']:,}" for c in impact["rows"])
            )
        if rec["decisions"]["recorded"]:
            lines.append(f"decision: {rec['decisions']['recorded']['choice']}")
        recovery = self.contexts["recovery"]
        lines.append("recovery sections not run yet: " + (", ".join(recovery["pending"]) or "none"))
        return lines


def _summary_json(path: Path | None, incident_id: str) -> dict | None:
    """The reconciliation's ``summary.json`` (its watermark and failed start are not in the control plane)."""
    if path is None or not path.exists():
        return None
    doc = json.loads(path.read_text())
    return doc if doc.get("incident_id") == incident_id else None


def build_reports(
    incident: Incident,
    spec: DatasetSpec,
    engine: Engine,
    timeline: Timeline | None,
    *,
    summary_json: Path | None = None,
) -> IncidentReports:
    """Read everything in one read-only session, then render (no writes anywhere)."""
    with engine.session(read_only=True) as s:
        recon = reconciliation_context(s, spec, incident)
        recovery = recovery_context(s, spec, incident)
        propagation = done.consumer_builds_from_damage(s, spec, incident)
        write_log, recorded_sha = done.write_log_holds(s, spec, incident), done.recorded_manifest(s, incident)
    recon["summary"] = _summary_json(summary_json, incident.incident_id)
    tl = timeline_context(timeline) if timeline is not None else None
    common = {"generated_at": utcnow(), "titles": TITLES, "incident_id": incident.incident_id, "dataset": spec.dataset}
    evidence = done.evidence_check(incident.evidence_dir(spec), recorded_sha)
    basis = (recon["summary"] or {}).get("out_of_order_basis") or ("write_log" if write_log else "metadata")
    checklists = {
        "timeline": done.timeline_checklist(tl, propagation=propagation, evidence=evidence),
        "reconciliation": done.reconciliation_checklist(recon, write_log=write_log, out_of_order_basis=basis),
        "recovery": done.recovery_checklist(recovery),
    }
    contexts = {
        "timeline": {"timeline": tl, **common, "done": checklists["timeline"]},
        "reconciliation": {**recon, **common, "done": checklists["reconciliation"]},
        "recovery": {**recovery, **common, "done": checklists["recovery"]},
    }
    html = {name: render(f"{name}.html.j2", report=name, **ctx) for name, ctx in contexts.items()}
    markdown = {
        "timeline": done.with_checklist(
            render_markdown(timeline)
            if timeline is not None
            else f"# Incident timeline: {incident.incident_id}\n\n{NOT_RUN}\n",
            checklists["timeline"],
        ),
        "reconciliation": render("reconciliation.md.j2", **contexts["reconciliation"]),
        "recovery": render("recovery.md.j2", **contexts["recovery"]),
    }
    return IncidentReports(incident.incident_id, html, markdown, contexts)


def write_reports(reports: IncidentReports, out_dir: Path) -> dict[str, Path]:
    """``<name>.html`` and ``<name>.md`` for each report; returns the HTML paths by name."""
    paths = {}
    for name in REPORT_NAMES:
        paths[name] = write_text(out_dir / f"{name}.html", reports.html[name])
        write_text(out_dir / f"{name}.md", reports.markdown[name])
    return paths
