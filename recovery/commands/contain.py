"""``recovery contain --incident FILE``: launch ``contain_backfill`` for an incident file.

The incident is validated here first (the same checks the job runs), so a bad file
gets its one clear message before any Dagster run is created; then the job runs in
this process against the project's Dagster instance, so it shows in the UI like a
launchpad run. The incident names its spec, so the code location is loaded for
that dataset (``RECOVERY_SPEC``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.incident import check_incident, parse_incident

    path = Path(args.incident).resolve()
    incident = parse_incident(path)
    check_incident(incident)
    os.environ["RECOVERY_SPEC"] = str(incident.spec)

    from recovery.defs.containment.jobs import CONTAIN_JOB, contain_run_config
    from recovery.definitions import defs
    from recovery.orchestration import project_instance, run_job

    result = run_job(defs(), CONTAIN_JOB, project_instance(), run_config=contain_run_config(str(path)))
    report = result.output_for_node("stop_dagster_work")
    console.print(f"[bold]incident {incident.incident_id}[/] contained by run {result.run_id}", highlight=False, soft_wrap=True)
    for line in report.lines():
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("contain", help="fence an incident's failed generations and cancel the backfill that wrote them")
    p.add_argument("--incident", required=True, help="incident YAML (see sample_data/transactions/incident.yaml)")
    p.set_defaults(fn=run)
