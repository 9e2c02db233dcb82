"""``recovery demo``: the worked example's incident end to end, as Dagster runs (``make run``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from recovery.config import EXAMPLE_SPEC
from recovery.lib.incident.phases import CONTAIN


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.commands.walkthrough import run_walkthrough
    from recovery.definitions import definitions_for
    from recovery.orchestration import project_instance

    result = run_walkthrough(
        Path(args.spec),
        instance=project_instance(),
        defs=definitions_for(args.spec),
        events=args.events,
        seed=args.seed,
        console=console,
        recover=not args.failure_only,
    )
    if args.failure_only:
        incident = Path(args.spec).with_name("incident.yaml")
        console.rule("the backfill failed; nothing is recovered yet")
        console.print(
            f"warehouse  {result.warehouse}\nincident   {incident}\n"
            f"next       recovery contain --incident {incident}   (or launch {CONTAIN.job} from make ui)",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    console.rule("where things are")
    places: list[tuple[str, object]] = [
        ("warehouse", result.warehouse),
        ("evidence", result.evidence / "manifest.json"),
    ]
    places += [
        (f"{name} report", result.reports / f"{name}.html") for name in ("timeline", "reconciliation", "recovery")
    ]
    places += [(name, result.reports / name) for name in ("reconciliation.parquet", "summary.json")]
    places.append(("Dagster UI", "make ui, then http://127.0.0.1:3000/runs"))
    for name, where in places:
        console.print(f"{name:<24} {where}", highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the worked example's incident end to end through Dagster (make run)")
    p.add_argument("--spec", default=str(EXAMPLE_SPEC), help="dataset spec of the worked example")
    p.add_argument("--events", type=int, default=200_000, help="source change events to generate (default 200k)")
    p.add_argument("--seed", type=int, default=42, help="random seed of the generator")
    p.add_argument(
        "--failure-only",
        action="store_true",
        help="stop once the backfill has failed, to work through the incident by hand (CLI or UI)",
    )
    p.set_defaults(fn=run)
