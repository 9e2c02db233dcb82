"""``recovery reconcile --incident FILE --out DIR``: classify every damaged key."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.incident import check_incident, parse_incident

    incident = parse_incident(args.incident)
    spec = check_incident(incident)  # validate before launching anything
    os.environ["RECOVERY_SPEC"] = str(incident.spec)  # the code location serves the incident's dataset
    out = Path(args.out).resolve() if args.out else incident.reports_dir(spec)
    from recovery.definitions import defs
    from recovery.defs.reconciliation.partitions import reconciliation_tags
    from recovery.orchestration import project_instance, run_job

    instance = project_instance()
    result = run_job(defs(), "reconcile_incident", instance, tags=reconciliation_tags(instance, spec), run_config={
        "ops": {"incident__reconciliation": {"config": {"incident_file": str(incident.incident_path), "out_dir": str(out)}}}})
    summary = json.loads((out / "summary.json").read_text())
    t = Table(title=f"{incident.incident_id}: damage per label (reconciliation run {result.run_id[:8]})")
    t.add_column("label")
    t.add_column("keys", justify="right")
    for label, n in summary["labels"].items():
        t.add_row(label, f"{n:,}")
    console.print(t)
    console.print(f"partition findings: {summary['partition_findings']}")
    console.print(f"wrote {out / 'reconciliation.parquet'} and {out / 'summary.json'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reconcile", help="classify every damaged key of an incident (source-to-output reconciliation)")
    p.add_argument("--incident", required=True, help="incident YAML file")
    p.add_argument("--out", help="output folder (default: reports/<incident id> beside the warehouse)")
    p.set_defaults(fn=run)
