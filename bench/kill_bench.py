"""``python -m bench kill [--points N] [--phase P ...] [--json FILE]``: the kill -9 matrix with N
(default 20) random kill points per phase (``recovery_tests/kill_matrix.py``). Reports, per
phase, the kills, what each left (old / new / between) and every problem; exit 1 on any."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def main(argv: list[str]) -> int:
    from recovery_tests.kill_matrix import PHASES, run_matrix

    ap = argparse.ArgumentParser(prog="python -m bench kill")
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--phase", action="append", choices=PHASES)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill-") as tmp:
        results = run_matrix(Path(tmp), args.points, phases=args.phase, seed=args.seed)
    t = Table(title=f"kill -9 matrix: {args.points} random points per phase ({time.monotonic() - t0:,.0f} s)")
    for col in ("phase", "trials", "killed mid-run", "left old", "left new", "left between", "problems"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    figures, problems = {}, []
    for phase, trials in results.items():
        killed = [x for x in trials if x.killed]
        row = {
            "trials": len(trials),
            "killed": len(killed),
            "old": sum(x.left == "old" for x in killed),
            "new": sum(x.left == "new" for x in killed),
            "between": sum(x.left == "between" for x in killed),
            "problems": sum(len(x.problems) for x in trials),
        }
        figures[phase] = row
        problems += [f"{phase} after {x.delay_s:.3f}s: {p}" for x in trials for p in x.problems]
        t.add_row(phase, *(str(row[k]) for k in ("trials", "killed", "old", "new", "between", "problems")))
    console = Console(width=150)
    console.print(t)
    for p in problems[:20]:
        console.print(f"[red]problem:[/] {p}", highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 1 if problems else 0
