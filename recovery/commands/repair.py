"""``recovery repair --incident FILE``: plan the repair, then the canary and each wave as Dagster runs.

Needs the incident's reconciliation (``recovery reconcile`` or the assess_incident
job). Stops at the first wave whose gates fail, with the reason; the public view
is untouched until ``recovery publish``.
"""

from __future__ import annotations

import argparse
import getpass

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.launch.repair import run_repair
    from recovery.lib.incident.phases import PLAN
    from recovery.lib.repair.plan import wave_name

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    launcher.require(PLAN)
    canary = [p.strip() for p in args.canary.split(",") if p.strip()] if args.canary else None
    if args.resume:
        _resume(spec, incident, args.resume, console)

    def on_wave(w, plan) -> None:
        failed = [g for g, r in w.gates.items() if not r.passed]
        state = (
            "[green]gates passed[/]"
            if w.gates and not failed
            else f"[red]FAILED {', '.join(failed) or 'run failed'}[/]"
        )
        console.print(
            f"  {wave_name(w.wave):>8}: {w.partitions:>3} partitions  run {w.run_id[:8] or '-':8}  {state}",
            highlight=False,
        )

    console.print(f"[bold]repair[/] {incident.incident_id}: plan, canary, then waves of {args.wave_size}")
    out = run_repair(
        launcher,
        canary=canary,
        canary_max=args.canary_max,
        wave_size=args.wave_size,
        through=args.through,
        on_wave=on_wave,
    )
    plan = out.plan
    t = Table(title=f"repair generation {plan.generation} in {plan.namespace} (plan run {out.plan_run_id[:8]})")
    for c in ("partitions", "count"):
        t.add_column(c, justify="right" if c == "count" else "left")
    t.add_row("rebuilt", f"{len(plan.built):,} of {len(plan.rebuild):,}")
    t.add_row("qualified (kept)", f"{len(plan.qualified):,}")
    t.add_row("status", plan.status)
    console.print(t)
    for p, why in plan.qualified.items():
        console.print(f"  qualified {p}: {why}", highlight=False)
    if out.stopped:
        console.print(f"[red]expansion stopped:[/] {out.stopped}", highlight=False, soft_wrap=True)
        return 1
    if plan.next_wave() is None:
        console.print(f"every wave built and gated; publish with: recovery publish --incident {args.incident}")
    return 0


def _resume(spec, incident, note: str, console: Console) -> None:
    from recovery.lib.engine import open_engine
    from recovery.lib.repair.build import resume
    from recovery.lib.repair.plan import load_plan
    from recovery.lib.write.writer import Writer

    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        plan = load_plan(s, incident.incident_id)
    if plan is not None and plan.status == "stopped":
        resume(Writer(engine, spec), plan, actor=getpass.getuser(), note=note)
        console.print(f"resumed the stopped repair: {note}")


def register(sub: argparse._SubParsersAction) -> None:
    p = incident_verb(
        sub, "repair", run, "rebuild the damaged partitions in a new generation: plan, canary, then gated waves"
    )
    p.add_argument("--canary", help="comma-separated canary partitions (default: chosen to cover every damage label)")
    p.add_argument("--canary-max", type=int, default=5, help="at most this many automatically chosen canary partitions")
    p.add_argument("--wave-size", type=int, default=30, help="partitions per wave after the canary")
    p.add_argument(
        "--through", choices=["canary", "all"], default="all", help="stop after the canary, or build every wave"
    )
    p.add_argument("--resume", metavar="NOTE", help="resume a stopped repair, recording why it is safe to go on")
