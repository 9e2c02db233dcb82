"""``recovery reconcile --incident FILE --out DIR [--full | --footprint]``: classify every damaged key.

By default the failed generations' footprint (their keys and partitions), or the whole target when
they have none; ``--full`` the whole target, counting the damage outside the footprint as drift."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.incident.phases import RECONCILE

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    out = Path(args.out).resolve() if args.out else incident.reports_dir(spec)
    result = launcher.run(RECONCILE, out_dir=str(out), full=bool(args.full), footprint=bool(args.footprint))
    summary = json.loads((out / "summary.json").read_text())
    print_summary(
        console, summary, f"{incident.incident_id}: damage per label (reconciliation run {result.run_id[:8]})"
    )
    console.print(f"wrote {out / 'reconciliation.parquet'} and {out / 'summary.json'}", highlight=False, soft_wrap=True)
    return 0


def print_summary(console: Console, summary: dict, title: str) -> None:
    t = Table(title=title)
    t.add_column("label")
    t.add_column("keys", justify="right")
    t.add_column("rests on")
    basis = summary.get("basis") or {}
    history = summary.get("history")
    log_name = "the package's write log"
    if history:
        first, last = history["versions"] or ("?", "?")
        log_name = f"the {history['format']} history of {history['table']} (versions {first}-{last})"
    rests = {
        "deleted": basis.get("absent"),
        "missing": basis.get("absent"),
        "overwritten": basis.get("older"),
        "stale": basis.get("older"),
    }
    for label, n in summary["labels"].items():
        t.add_row(
            label,
            f"{n:,}",
            (rests.get(label) or "the rows")
            .replace("write_log", log_name)
            .replace("none", "nothing: no write log or registry"),
        )
    console.print(t)
    console.print(f"partition findings: {summary['partition_findings']}", highlight=False)
    rng = summary.get("footprint_range") or ["?", "?"]
    if summary.get("scope") == "footprint":
        console.print(
            f"footprint only: the failed generations' keys and partitions {rng[0]} .. {rng[1]} "
            "(run with --full for the whole table)",
            highlight=False,
            soft_wrap=True,
        )
    elif summary.get("drift_outside_footprint"):
        drift = summary["drift_outside_footprint"]
        console.print(
            f"[yellow]drift outside the backfill's footprint[/] (partitions {rng[0]} .. {rng[1]} and the keys it "
            f"wrote): {sum(drift.values()):,} keys ({', '.join(f'{k} {v:,}' for k, v in drift.items())}), "
            "counted in the labels above but not the backfill's damage",
            highlight=False,
            soft_wrap=True,
        )
    if not summary.get("contained", True):
        console.print(
            "[yellow]the target is not fenced yet[/]: this was a read-only look (nothing written to the "
            "warehouse); run `recovery contain` next",
            highlight=False,
            soft_wrap=True,
        )
    for c in (history or {}).get("kept_out_of_repair", []):
        console.print(
            f"[yellow]{history['table']} version {c['version']}[/] ({c['operation']}, generation "  # type: ignore[index]
            f"{c['generation'] or 'unknown'}) committed after the fence by "
            f"{'a fenced generation' if c['status'] == 'fenced' else 'a writer outside the package'}: kept out of the "
            f"repair (partitions {', '.join(c['partitions']) or 'none'})",
            highlight=False,
            soft_wrap=True,
        )
    if basis.get("registry_rows"):
        console.print(
            f"inferred from registry runs: {', '.join(basis['registry_rows'][:10])}"
            + (f" (held as of {basis['held_as_of']}, {basis['held_by']})" if basis.get("held_by") else ""),
            highlight=False,
            soft_wrap=True,
        )


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(
        sub, "reconcile", run, "classify every damaged key of an incident (source-to-output reconciliation)"
    )
    p.add_argument("--out", help="output folder (default: reports/<incident id> beside the warehouse)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--full",
        action="store_true",
        help="reconcile the whole target; damage outside the failed generations' footprint is reported as drift",
    )
    scope.add_argument(
        "--footprint",
        action="store_true",
        help="reconcile only the failed generations' footprint (the default where there is one: the "
        "keys they wrote and the keys held or expected in their partition range, cost proportional to the damage) "
        "and refuse when there is none",
    )
