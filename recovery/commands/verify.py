"""``recovery verify --incident FILE``: launch ``verify_convergence``; exit 1 when any check fails.

Prints the checks, then per partition the three figures apart: drift, the changes pending
after the watermark (count and the age of the oldest), and the watermark with where it
comes from. Exit status: 0 when every check that had partitions to look at passed (and at
least one had), 1 when a convergence check fails or nothing could be verified (so it can
gate a shell pipeline or a cron job), 2 when the input is invalid (nothing run).
"""

from __future__ import annotations

import argparse
from datetime import datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recovery.commands import incident_verb

SHOWN = 30


def run(args: argparse.Namespace, console: Console) -> int:
    import dagster as dg

    from recovery.launch import Launcher
    from recovery.lib.convergence.verify import load_partitions
    from recovery.lib.dataset_spec.durations import format_duration
    from recovery.lib.engine import open_engine
    from recovery.lib.errors import SpecError
    from recovery.lib.incident.phases import VERIFY

    if args.recent < 1:
        raise SpecError(
            "--recent", f"{args.recent} is not a positive number", "give how many recent partitions to check, e.g. 3"
        )
    launcher = Launcher.for_file(args.incident)
    incident = launcher.incident
    result = launcher.run(VERIFY, recent_partitions=args.recent)
    checks = sorted(result.get_asset_check_evaluations(), key=lambda c: c.check_name)
    t = Table(title=f"{incident.incident_id}: convergence (run {result.run_id[:8]})")
    for col in ("check", "result", "partitions", "drifting", "pending changes", "oldest pending"):
        t.add_column(col)
    verified, failed, lines = [], [], []
    for c in checks:
        md = {k: v.value for k, v in c.metadata.items()}
        if c.passed:
            verified.append(c.check_name)
            status = "[green]passed[/]"
        elif c.severity == dg.AssetCheckSeverity.WARN:
            status = "[yellow]not verified[/]"
        else:
            failed.append(c.check_name)
            status = "[red]FAILED[/]"
        t.add_row(
            c.check_name,
            status,
            str(md.get("partitions_checked", "")),
            str(md.get("partitions_drifting", "")),
            str(md.get("pending_changes", "")),
            str(md.get("oldest_pending_age", "")),
        )
        lines.append(f"{c.check_name} ({status}): {escape((c.description or '').removeprefix('not verified: '))}")
    console.print(t)
    for line in lines:  # the sentences, unwrapped by a table: what failed, and the three figures
        console.print(line, highlight=False)
    check_id = next((c.metadata["check_id"].value for c in checks if "check_id" in c.metadata), None)
    if check_id is not None:
        with open_engine(launcher.spec.warehouse).session(read_only=True) as s:
            parts = load_partitions(s, launcher.spec, int(str(check_id)))
        p = Table(
            title="per partition: drift, changes pending after the watermark, the watermark and where it comes from"
        )
        for col in ("partition", "scope", "drift keys", "pending changes", "oldest pending", "watermark", "from"):
            p.add_column(col)
        at = datetime.fromisoformat(str(checks[0].metadata["checked_at"].value))
        worst = sorted(parts, key=lambda x: (not x.drifts, not x.behind, not x.pending_changes, x.partition))
        for x in worst[:SHOWN]:
            scope = ", ".join(n for n in ("recent", "repaired", "late") if getattr(x, n))
            age = format_duration(at - x.pending_oldest) if x.pending_oldest else ""
            t_drift = f"[red]{x.drift_keys:,}[/]" if x.drifts else "0"
            t_pending = f"[red]{x.pending_changes:,} (overdue)[/]" if x.behind else f"{x.pending_changes:,}"
            p.add_row(x.partition, scope, t_drift, t_pending, age, str(x.watermark or ""), x.watermark_basis)
        console.print(p)
        if len(parts) > SHOWN:
            console.print(f"... and {len(parts) - SHOWN} more partitions, all equal to the source with nothing pending")
    if failed:
        console.print(f"[red]not converged:[/] {', '.join(failed)}", highlight=False)
        return 1
    if not verified:
        console.print("[yellow]not verified:[/] no check had a partition to look at", highlight=False)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(
        sub, "verify", run, "verify that ingestion and late arrivals converge after a repair (exit 1 on drift)"
    )
    p.add_argument(
        "--recent", type=int, default=3, help="how many of the partitions ingestion wrote last to check (default 3)"
    )
