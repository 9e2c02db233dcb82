"""``recovery contain --incident FILE``: launch ``contain_backfill`` for an incident file.

The incident is validated here first (the same checks the job runs), so a bad file
gets its one clear message before any Dagster run is created; then the job runs in
this process against the project's Dagster instance, so it shows in the UI like a
launchpad run. On a target another tool wrote, containment first takes it under
management (``recovery.lib.pointers.adoption``).
"""

from __future__ import annotations

import argparse

from rich.console import Console

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.incident.phases import CONTAIN

    launcher = Launcher.for_file(args.incident)
    result = launcher.run(CONTAIN)
    adoption = result.output_for_node("adopt_target")
    report = result.output_for_node("stop_dagster_work")
    console.print(
        f"[bold]incident {launcher.incident.incident_id}[/] contained by run {result.run_id}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(adoption.line(launcher.spec), highlight=False, soft_wrap=True)
    for line in report.lines():
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    incident_verb(
        sub,
        "contain",
        run,
        "fence an incident's failed generations and cancel the backfill that wrote them",
        incident_help="incident YAML (see sample_data/transactions/incident.yaml)",
    )
