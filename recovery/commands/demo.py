"""``recovery demo``: build the worked example and run its failed backfill through Dagster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from recovery.config import EXAMPLE_SPEC


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.definitions import defs
    from recovery.defs.reconciliation.partitions import reconciliation_tags
    from recovery.example.demo import build_failed_backfill, print_damage
    from recovery.lib.engine import open_engine
    from recovery.lib.impact import impact_summary
    from recovery.lib.incident import check_incident, parse_incident
    from recovery.orchestration import project_instance, run_job

    instance = project_instance()
    definitions = defs()
    result = build_failed_backfill(Path(args.spec), instance=instance, defs=definitions, events=args.events, seed=args.seed, console=console)
    incident = parse_incident(Path(args.spec).with_name("incident.yaml"))
    spec = check_incident(incident)
    config = {"incident_file": str(incident.incident_path)}
    run = run_job(definitions, "assess_incident", instance, tags=reconciliation_tags(instance, spec), run_config={"ops": {
        "incident__reconciliation": {"config": config}, "incident__impact": {"config": config}, "incident__decision": {"config": config}}})
    console.print(f"[bold]6/6[/] incident {incident.incident_id} assessed: reconciliation, impact and decision (run {run.run_id[:8]})")
    reports = incident.reports_dir(spec)
    summary = json.loads((reports / "summary.json").read_text())
    with open_engine(spec.warehouse).session(read_only=True) as s:
        impacts = impact_summary(s, spec, incident_id=incident.incident_id)
    print_damage(console, summary, impacts)
    console.print(f"warehouse: {result.warehouse}")
    console.print(f"reconciliation: {reports / 'reconciliation.parquet'}  summary: {reports / 'summary.json'}")
    console.print("Open the runs in the Dagster UI: make ui, then http://127.0.0.1:3000/runs")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build the worked example and run its failed backfill through Dagster")
    p.add_argument("--spec", default=str(EXAMPLE_SPEC), help="dataset spec of the worked example")
    p.add_argument("--events", type=int, default=200_000, help="source change events to generate (default 200k)")
    p.add_argument("--seed", type=int, default=42, help="random seed of the generator")
    p.set_defaults(fn=run)
