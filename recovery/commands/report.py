"""``recovery report --incident FILE --out DIR``: the incident's three reports, for any incident."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.incident.phases import REPORT

    launcher = Launcher.for_file(args.incident)  # validates before launching anything
    incident, spec = launcher.incident, launcher.spec
    out = Path(args.out).resolve() if args.out else incident.reports_dir(spec)
    result = launcher.run(REPORT, out_dir=str(out))
    (mat,) = [e.materialization for e in result.get_asset_materialization_events()]
    console.print(mat.metadata["summary"].value, highlight=False, soft_wrap=True)
    for name in ("timeline", "reconciliation", "recovery"):
        console.print(f"{name}: {out / (name + '.html')}", highlight=False, soft_wrap=True)
    console.print(f"(run {result.run_id[:8]}; Markdown beside each HTML file)", highlight=False)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(
        sub, "report", run, "write an incident's timeline, reconciliation and recovery reports (HTML + Markdown)"
    )
    p.add_argument("--out", help="output folder (default: reports/<incident id> beside the warehouse)")
