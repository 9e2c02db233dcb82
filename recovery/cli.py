"""The ``recovery`` command: validates its input, then launches the Dagster jobs the UI launches."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from recovery.config import EXAMPLE_SPEC
from recovery.lib.errors import RecoveryError


def _demo(args: argparse.Namespace, console: Console) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recovery", description="Recover from a failed data backfill with Dagster.")
    sub = p.add_subparsers(dest="verb", required=True)
    demo = sub.add_parser("demo", help="build the worked example and run its failed backfill through Dagster")
    demo.add_argument("--spec", default=str(EXAMPLE_SPEC), help="dataset spec of the worked example")
    demo.add_argument("--events", type=int, default=200_000, help="source change events to generate (default 200k)")
    demo.add_argument("--seed", type=int, default=42, help="random seed of the generator")
    demo.set_defaults(fn=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    console = Console()
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args, console)
    except RecoveryError as err:
        console.print(f"[red]error:[/] {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
