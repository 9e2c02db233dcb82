"""``recovery timeline --incident FILE``: rebuild the incident timeline and print where it was written."""

from __future__ import annotations

import argparse

from rich.console import Console


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.definitions import defs
    from recovery.lib.incident import check_incident, parse_incident
    from recovery.orchestration import project_instance, run_job

    incident = parse_incident(args.incident)
    spec = check_incident(incident)
    result = run_job(defs(), "render_incident_timeline", project_instance(), run_config={
        "ops": {"incident__timeline": {"config": {"incident_file": str(incident.incident_path)}}}})
    path = incident.reports_dir(spec) / "timeline.md"
    console.print(f"timeline of {incident.incident_id}: {path} (run {result.run_id[:8]})", highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("timeline", help="rebuild an incident's timeline from the control plane and Dagster's event log")
    p.add_argument("--incident", required=True, help="incident YAML file")
    p.set_defaults(fn=run)
