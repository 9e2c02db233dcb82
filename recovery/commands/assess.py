"""``recovery assess --incident FILE``: reconcile, trace the impact downstream and decide rollback or repair.

Runs the ``assess_incident`` job (the reconciliation, impact and decision assets
in one run, as the UI's materialize button does), after containment: its
reconciliation is the one the repair plans from.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from recovery.commands import incident_verb
from recovery.commands.reconcile import print_summary


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.defs.asset_consumers import resolve
    from recovery.launch import Launcher
    from recovery.lib.incident.phases import ASSESS

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    launcher.definitions  # noqa: B018 - built first: the asset graph the downstream assets are found in
    resolve(None, spec, str(incident.spec))  # a downstream asset the spec names wrongly: refused before any write
    result = launcher.run(ASSESS, full=True) if args.full else launcher.run(ASSESS)
    out = incident.reports_dir(spec)
    print_summary(
        console,
        json.loads((out / "summary.json").read_text()),
        f"{incident.incident_id}: damage per label (assess run {result.run_id[:8]})",
    )
    impact = result.asset_materializations_for_node("incident__impact")[0].metadata
    decision = result.asset_materializations_for_node("incident__decision")[0].metadata
    console.print(
        f"consumers affected: {impact['consumers_affected'].value}, material rows: {impact['material_rows'].value:,}",
        highlight=False,
    )
    console.print(impact["impact"].value, highlight=False, soft_wrap=True)
    if impact.get("downstream_assets_reached") is not None and impact["downstream_assets_reached"].value:
        console.print(str(impact["downstream_assets"].value), highlight=False, soft_wrap=True)
    not_traced = impact["downstream_assets_not_traced"].value if "downstream_assets_not_traced" in impact else []
    for u in not_traced if isinstance(not_traced, list) else []:
        console.print(
            f"asset {u['asset']} is downstream of {spec.target.table} but {u['problem']}: {u['fix']}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"decision: [bold]{decision['choice'].value}[/]", highlight=False)
    console.print(decision["reasons"].value, highlight=False, soft_wrap=True)
    next_verb = "publish" if decision["choice"].value == "rollback" else "repair"
    console.print(f"next: recovery {next_verb} --incident {args.incident}", highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(sub, "assess", run, "reconcile, trace the impact on every consumer and decide rollback or repair")
    p.add_argument(
        "--full",
        action="store_true",
        help="reconcile the whole target, not only the failed generations' footprint (the damage outside it "
        "is reported as drift)",
    )
