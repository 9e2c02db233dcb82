"""``recovery verify --incident FILE``: launch ``verify_convergence``; exit 1 when any check fails.

Exit status: 0 when the recent and the repaired partitions equal the source, 1 when
a convergence check fails (so it can gate a shell pipeline or a cron job), 2 when
the input is invalid (nothing run).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.errors import SpecError
    from recovery.lib.phases import VERIFY

    if args.recent < 1:
        raise SpecError(
            "--recent", f"{args.recent} is not a positive number", "give how many recent partitions to check, e.g. 3"
        )
    launcher = Launcher.for_file(args.incident)
    incident = launcher.incident
    result = launcher.run(VERIFY, recent_partitions=args.recent)
    checks = result.get_asset_check_evaluations()
    t = Table(title=f"{incident.incident_id}: convergence (run {result.run_id[:8]})")
    for col in ("check", "result", "partitions", "drifting", "detail"):
        t.add_column(col)
    for c in sorted(checks, key=lambda c: c.check_name):
        md = {k: v.value for k, v in c.metadata.items()}
        t.add_row(
            c.check_name,
            "[green]passed[/]" if c.passed else "[red]FAILED[/]",
            str(md.get("partitions_checked", "")),
            str(md.get("partitions_drifting", "")),
            c.description or "",
        )
    console.print(t)
    failed = [c.check_name for c in checks if not c.passed]
    if failed:
        console.print(f"[red]not converged:[/] {', '.join(failed)}", highlight=False)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(
        sub, "verify", run, "verify that ingestion and late arrivals converge after a repair (exit 1 on drift)"
    )
    p.add_argument(
        "--recent", type=int, default=3, help="how many of the partitions ingestion wrote last to check (default 3)"
    )
