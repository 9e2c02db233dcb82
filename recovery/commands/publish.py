"""``recovery publish --incident FILE``: gate the candidate and publish it by one pointer move
(or roll back, when the decision chose rollback)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.incident import check_incident, parse_incident

    path = Path(args.incident).resolve()
    incident = parse_incident(path)
    spec = check_incident(incident)
    os.environ["RECOVERY_SPEC"] = str(incident.spec)
    from recovery.definitions import defs
    from recovery.defs.repair.runs import incident_ops_config, run_publish
    from recovery.lib.decision import decide
    from recovery.lib.engine import open_engine
    from recovery.lib.repair.diffs import label_diffs
    from recovery.lib.repair.plan import load_plan
    from recovery.orchestration import project_instance, run_job

    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        plan = load_plan(s, incident.incident_id)
        decision = decide(s, spec, incident.failed_generations)
    if plan is None and decision.is_rollback:
        result = run_job(defs(), "rollback_incident", project_instance(),
                         run_config=incident_ops_config(str(path), "roll_back"))
        console.print(f"rolled back {spec.target.table} to {decision.rollback_to} (run {result.run_id[:8]})")
        return 0
    if plan is not None and plan.status == "published":
        console.print(f"{incident.incident_id}: already published ({spec.target.table} -> {plan.namespace}); nothing to do")
        return 0
    result = run_publish(defs(), project_instance(), str(path))
    meta = result.asset_materializations_for_node("repair__publication")[0].metadata
    console.print(f"[bold]published[/] {spec.target.table} -> {meta['published_namespace'].value} "
                  f"(was {meta['previous_namespace'].value}, kept; run {result.run_id[:8]})", highlight=False)
    with engine.session(read_only=True) as s:
        diffs = label_diffs(s, incident.incident_id)
    t = Table(title="keys per damage label, before and after the repair")
    for c in ("label", "before", "after"):
        t.add_column(c, justify="left" if c == "label" else "right")
    for label, (b, a) in diffs.items():
        t.add_row(label, f"{b:,}", f"{a:,}")
    console.print(t)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("publish", help="gate the repair candidate and publish it atomically (or roll back if decided)")
    p.add_argument("--incident", required=True, help="incident YAML file")
    p.set_defaults(fn=run)
