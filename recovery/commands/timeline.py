"""``recovery timeline --incident FILE``: rebuild the incident timeline and print where it was written."""

from __future__ import annotations

import argparse

from rich.console import Console

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.incident.phases import TIMELINE

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    result = launcher.run(TIMELINE)
    path = incident.reports_dir(spec) / "timeline.md"
    console.print(
        f"timeline of {incident.incident_id}: {path} (run {result.run_id[:8]})", highlight=False, soft_wrap=True
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    incident_verb(sub, "timeline", run, "rebuild an incident's timeline from the control plane and Dagster's event log")
