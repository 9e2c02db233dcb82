"""``recovery recover --incident FILE``: every phase in order, timed (contain → reports).

Prints each phase's wall time, peak memory and the share spent inside the engine;
``--figures FILE`` writes them as JSON (the end-to-end benchmark reads it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.launch.recover import run_recovery

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    done = run_recovery(
        incident,
        spec,
        instance=launcher.instance,
        defs=launcher.definitions,
        console=console,
        wave_size=args.wave_size,
        full=args.full,
    )
    t = Table(title=f"{incident.incident_id}: time and memory per phase")
    for col in ("phase", "wall s", "engine s", "engine share", "peak RSS MB", "runs"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    total = sum(p.seconds for p in done.phases)
    for p in done.phases:
        t.add_row(
            p.phase,
            f"{p.seconds:.1f}",
            f"{p.engine_seconds:.1f}",
            f"{p.engine_seconds / max(p.seconds, 1e-9):.0%}",
            f"{p.peak_rss_mb:,.0f}",
            str(len(p.run_ids)),
        )
    engine = sum(p.engine_seconds for p in done.phases)
    t.add_row(
        "total",
        f"{total:.1f}",
        f"{engine:.1f}",
        f"{engine / max(total, 1e-9):.0%}",
        f"{max(p.peak_rss_mb for p in done.phases):,.0f}",
        str(sum(len(p.run_ids) for p in done.phases)),
    )
    console.print(t)
    if args.figures:
        Path(args.figures).write_text(json.dumps([p.__dict__ for p in done.phases], indent=2))
    console.print(f"reports: {incident.reports_dir(spec)}/{{timeline,reconciliation,recovery}}.html", highlight=False)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(
        sub, "recover", run, "run every phase of the recovery in order (contain … reports), timed per phase"
    )
    p.add_argument("--wave-size", type=int, default=30, help="partitions per repair wave after the canary")
    p.add_argument("--figures", help="write per-phase time and memory as JSON to this file")
    p.add_argument(
        "--full",
        action="store_true",
        help="reconcile the whole target, not only the failed generations' footprint (the damage outside it "
        "is reported as drift)",
    )
