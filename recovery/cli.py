"""The ``recovery`` command: validates its input, then launches the Dagster jobs the UI launches.

Each verb lives in ``recovery/commands/<verb>.py`` with a ``register(subparsers)``
function; this module only assembles them and turns expected errors into one
clear line and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings

from rich.console import Console

import recovery.commands
from recovery.lib.errors import RecoveryError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recovery", description="Recover from a failed data backfill with Dagster.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for mod in sorted(pkgutil.iter_modules(recovery.commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"recovery.commands.{mod.name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=r"(?i).*(beta|preview|supersession)")
    console = Console()
    if not console.is_terminal:  # piped or in CI: wide enough for the tables to stay readable
        console = Console(width=150)
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args, console) or 0)
    except RecoveryError as err:
        console.print(f"[red]error:[/] {err}", highlight=False, soft_wrap=True)  # one line, however long
        return 2


if __name__ == "__main__":
    sys.exit(main())
