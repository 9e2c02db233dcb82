"""``recovery publish --incident FILE``: gate the candidate and publish it by one pointer move
(or roll back, when the decision chose rollback)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb
from recovery.lib.incident.phases import PUBLISH


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.defs.repair.lakehouse import publish_onto_table
    from recovery.launch import Launcher
    from recovery.launch.repair import decision, publish_or_roll_back
    from recovery.lib.engine import open_engine
    from recovery.lib.repair.diffs import label_diffs

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    plan, chosen = decision(launcher)
    if plan is None and not chosen.is_rollback:
        launcher.require(PUBLISH)  # names the verb to run first
    done, result, plan, finished = publish_or_roll_back(launcher)
    if done == "rolled_back":
        assert result is not None  # the rollback run
        console.print(f"rolled back {spec.target.table} to {chosen.rollback_to} (run {result.run_id[:8]})")
        return 0
    if done == "finished":  # the commit happened; a publish stopped after it left these undone
        assert plan is not None
        console.print(
            f"{incident.incident_id}: published earlier ({spec.target.table} -> {plan.namespace}); finished what "
            f"that publish left undone: {', '.join(finished)}",
            highlight=False,
            soft_wrap=True,
        )
        if spec.target.lakehouse is not None:
            console.print(publish_onto_table(spec, incident.incident_id).line())
        return 0
    if done == "already_published":
        assert plan is not None  # published from this plan
        console.print(
            f"{incident.incident_id}: already published ({spec.target.table} -> {plan.namespace}); nothing to do"
        )
        if spec.target.lakehouse is not None:  # a publish stopped between the pointer and the table's commit
            console.print(publish_onto_table(spec, incident.incident_id).line())
        return 0
    assert result is not None  # the publish run
    meta = result.asset_materializations_for_node("repair__publication")[0].metadata
    console.print(
        f"[bold]published[/] {spec.target.table} -> {meta['published_namespace'].value} "
        f"(was {meta['previous_namespace'].value}, kept; run {result.run_id[:8]})",
        highlight=False,
    )
    if "lakehouse" in meta:
        console.print(meta["lakehouse"].value, highlight=False, soft_wrap=True)
    engine = open_engine(spec.warehouse)
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
    incident_verb(sub, "publish", run, "gate the repair candidate and publish it atomically (or roll back if decided)")
