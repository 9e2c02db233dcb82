"""``recovery demo``: build the worked example and run its failed backfill through Dagster."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from recovery.config import EXAMPLE_SPEC


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.definitions import defs
    from recovery.example.demo import build_failed_backfill, print_damage
    from recovery.lib.spec import parse_spec
    from recovery.orchestration import project_instance

    instance = project_instance()
    result = build_failed_backfill(Path(args.spec), instance=instance, defs=defs(), events=args.events, seed=args.seed, console=console)
    print_damage(console, result, parse_spec(args.spec))
    console.print(f"warehouse: {result.warehouse}")
    console.print("Open the runs in the Dagster UI: make ui, then http://127.0.0.1:3000/runs")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build the worked example and run its failed backfill through Dagster")
    p.add_argument("--spec", default=str(EXAMPLE_SPEC), help="dataset spec of the worked example")
    p.add_argument("--events", type=int, default=200_000, help="source change events to generate (default 200k)")
    p.add_argument("--seed", type=int, default=42, help="random seed of the generator")
    p.set_defaults(fn=run)
