"""``python -m bench kill [--points N] [--phase P ...] [--json FILE]``: the kill -9 matrix with N
(default 20) random kill points per phase (``recovery_tests/support/kill_matrix.py``). Reports, per
phase, the kills, what each left (old / new / between) and every problem; exit 1 on any.
``--at-commit``: instead, one kill at every fault point of the commits of every phase (contain,
evidence, assess, plan, canary, wave, verify, publish, restate: ``COMMIT_POINTS``,
``run_commit_kills``), one row per point."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def main(argv: list[str]) -> int:
    from recovery_tests.support.kill_matrix import PHASES, run_matrix

    ap = argparse.ArgumentParser(prog="python -m bench kill")
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--phase", action="append", choices=PHASES)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--at-commit", action="store_true", help="kill once at each commit fault point instead")
    args = ap.parse_args(argv)
    if args.at_commit:
        return _at_commit(args.json)
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


def _at_commit(json_path: str | None) -> int:
    from recovery_tests.support.kill_matrix import build_templates, run_commit_kills

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill-commit-") as tmp:
        results = run_commit_kills(Path(tmp), build_templates(Path(tmp) / "templates"))
    t = Table(title=f"kill -9 at each commit fault point ({time.monotonic() - t0:,.0f} s)")
    for col in ("phase", "point", "left", "problems"):
        t.add_column(col)
    rows, problems = [], []
    for phase, kills in results.items():
        for k in kills:
            rows.append({"phase": phase, "point": k.point, "left": k.left, "problems": len(k.problems)})
            problems += [f"{k.point}: {p}" for p in k.problems]
            t.add_row(phase, k.point, k.left, str(len(k.problems)))
    console = Console(width=150)
    console.print(t)
    for p in problems[:20]:
        console.print(f"[red]problem:[/] {p}", highlight=False)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=2))
    return 1 if problems else 0
