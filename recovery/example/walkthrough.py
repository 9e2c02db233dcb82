"""``make run``: the worked example's incident, from the failure to the assessment.

Each step is the Dagster job a person would launch from the UI, run against the
project's instance: the failed backfill (demo), ``contain_backfill``,
``preserve_evidence``, ``assess_incident`` (reconciliation, impact, decision) and
``render_incident_timeline``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from rich.console import Console

from recovery.defs.containment.jobs import CONTAIN_JOB, contain_run_config
from recovery.defs.reconciliation.partitions import reconciliation_tags
from recovery.example.demo import build_failed_backfill, print_damage
from recovery.lib.engine import open_engine
from recovery.lib.evidence import read_manifest
from recovery.lib.impact import impact_summary
from recovery.lib.incident import check_incident, parse_incident
from recovery.orchestration import run_job


@dataclass(frozen=True)
class Walkthrough:
    warehouse: Path
    evidence: Path
    reports: Path
    run_ids: dict[str, str]


def incident_config(incident_file: str, *assets: str) -> dict:
    return {"ops": {a: {"config": {"incident_file": incident_file}} for a in assets}}


def run_walkthrough(spec_path: Path, *, instance: dg.DagsterInstance, defs: dg.Definitions, events: int, seed: int,
                    console: Console) -> Walkthrough:
    result = build_failed_backfill(spec_path, instance=instance, defs=defs, events=events, seed=seed, console=console)
    incident = parse_incident(spec_path.with_name("incident.yaml"))
    spec = check_incident(incident)
    path = str(incident.incident_path)
    runs = {}

    contained = run_job(defs, CONTAIN_JOB, instance, run_config=contain_run_config(path))
    runs["contain"] = contained.run_id
    console.print(f"[bold]contain[/] incident {incident.incident_id} (run {contained.run_id[:8]}):")
    for line in contained.output_for_node("stop_dagster_work").lines():
        console.print(f"      {line}", highlight=False, soft_wrap=True)

    evidence = run_job(defs, "preserve_evidence", instance, run_config=incident_config(path, "incident__evidence_bundle"))
    runs["evidence"] = evidence.run_id
    bundle = incident.evidence_dir(spec)
    manifest = read_manifest(bundle)
    console.print(f"[bold]evidence[/] bundle {bundle} ({len(manifest['files'])} files with sha256; run {evidence.run_id[:8]})",
                  highlight=False, soft_wrap=True)

    assets = ("incident__reconciliation", "incident__impact", "incident__decision")
    assessed = run_job(defs, "assess_incident", instance, tags=reconciliation_tags(instance, spec),
                       run_config=incident_config(path, *assets))
    runs["assess"] = assessed.run_id
    decision = assessed.asset_materializations_for_node("incident__decision")[0].metadata
    console.print(f"[bold]assess[/] reconciliation, impact and decision (run {assessed.run_id[:8]}): "
                  f"decision {decision['choice'].value}")

    timeline = run_job(defs, "render_incident_timeline", instance, run_config=incident_config(path, "incident__timeline"))
    runs["timeline"] = timeline.run_id

    reports = incident.reports_dir(spec)
    summary = json.loads((reports / "summary.json").read_text())
    with open_engine(spec.warehouse).session(read_only=True) as s:
        impacts = impact_summary(s, spec, incident_id=incident.incident_id)
    print_damage(console, summary, impacts)
    return Walkthrough(result.warehouse, bundle, reports, runs)
