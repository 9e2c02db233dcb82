"""Fixed cost of ``recovery reconcile``: from the command's start to its first classification statement.

Everything before that moment is paid whatever the table's size: the interpreter and the
imports, the code location, the Dagster instance and the run's creation, the spec's checks
against the warehouse. Each round runs the documented command in a fresh process with a
fresh Dagster instance; the command's classification traces a ``mark`` (``RECOVERY_TRACE``)
and the bench reads it. Medians of the rounds; issue #18's target is 3 s.

    python -m bench fixed --from DIR [--rounds 5]   # DIR holds spec.yaml + incident.yaml
    python -m bench fixed --events 200000            # the worked example (built once, cached)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.measure import recovery_cli

TARGET_S = 3.0


def fixed_cost_once(dataset: Path) -> dict:
    """One ``recovery reconcile`` on a copy of ``dataset``: seconds to the first classification statement
    (as the bench's clock sees the launch, and as the kernel's record of the process's start) and in all."""
    from recovery.config import PROJECT_ROOT

    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmp:
        work = Path(tmp) / "dataset"
        shutil.copytree(dataset, work, ignore=shutil.ignore_patterns("evidence", "reports", "out", "dagster_home"))
        home = Path(tmp) / "home"
        if (dataset / "dagster_home").is_dir():  # the instance that ran the backfill: Dagster knows the partitions
            shutil.copytree(dataset / "dagster_home", home, ignore=shutil.ignore_patterns("*.log"))
        else:
            home.mkdir()
            shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
        trace = Path(tmp) / "trace.jsonl"
        env = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_TRACE": str(trace), "RECOVERY_TRACE_MIN_S": "999"}
        launched = time.time()
        recovery_cli("reconcile", "--incident", str(work / "incident.yaml"), "--out", str(Path(tmp) / "out"), env=env)
        total = time.time() - launched
        lines = [json.loads(x) for x in trace.read_text().splitlines()]
        marks = [x for x in lines if x["kind"] == "mark" and x["what"] == "classification starts"]
        if not marks:
            raise RuntimeError("the command traced no classification mark")
        first = marks[0]
        return {"fixed_s": first["at"] - launched, "fixed_s_kernel": first["s"], "total_s": total}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench fixed", description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--from", dest="dataset", type=Path, help="a folder with spec.yaml and incident.yaml")
    where.add_argument("--events", type=int, help="the worked example's size (built once under bench/.cache)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path, help="also write every round's figures to this file")
    args = p.parse_args(argv)
    console = Console()
    if args.events:
        from bench.reconcile_bench import build_example

        dataset = build_example(args.events, console, "3GB").parent
    else:
        dataset = args.dataset.resolve()
    if not (dataset / "incident.yaml").exists():
        console.print(
            f"error: {dataset} holds no incident.yaml; give a dataset folder with spec.yaml and incident.yaml"
        )
        return 2
    fixed_cost_once(dataset)  # warm-up: the file cache and Python's bytecode, as a second run of a command
    runs = [fixed_cost_once(dataset) for _ in range(args.rounds)]
    table = Table(title=f"recovery reconcile on {dataset.name}: fixed cost, medians of {args.rounds} fresh processes")
    for col in ("to the first classification statement", "(kernel's process start)", "whole command", "target"):
        table.add_column(col, justify="right")
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    table.add_row(
        f"{med['fixed_s']:.2f} s", f"{med['fixed_s_kernel']:.2f} s", f"{med['total_s']:.2f} s", f"≤ {TARGET_S:.0f} s"
    )
    console.print(table)
    console.print("rounds: " + ", ".join(f"{r['fixed_s']:.2f}" for r in runs), highlight=False)
    if args.json:
        args.json.write_text(json.dumps({"dataset": str(dataset), "rounds": runs, "median": med}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
