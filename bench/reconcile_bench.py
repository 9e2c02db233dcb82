"""Reconciliation of the worked example at several sizes vs the bare FULL OUTER JOIN floor.

For each size: build the failed example (real Dagster backfill; cached under
``bench/.cache``), then, each in a fresh process, run the package's reconciliation
and the bare diff, and print wall time, peak memory and their ratio. DuckDB runs
under ``--memory-limit`` and spills past it; no step loads the table into pandas.

    python -m bench reconcile --events 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from bench.measure import in_subprocess

CACHE = Path(__file__).resolve().parent / ".cache"


def build(events: int, console: Console, memory_limit: str) -> Path:
    """The failed example at ``events`` events (cached); returns the spec path of a bench copy."""
    import dagster as dg

    from recovery.config import EXAMPLE_OUTPUTS, EXAMPLE_SPEC, PROJECT_ROOT

    root = CACHE / f"example-{events}"
    spec_path = root / "spec.yaml"
    if not (root / "built.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(EXAMPLE_SPEC.parent, root, ignore=shutil.ignore_patterns(*EXAMPLE_OUTPUTS))
        doc = yaml.safe_load(spec_path.read_text())
        doc["warehouse"]["memory_limit"] = memory_limit
        spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        home = root / "dagster_home"
        home.mkdir()
        shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
        os.environ.update(DAGSTER_HOME=str(home), RECOVERY_SPEC=str(spec_path))
        from recovery.definitions import defs
        from recovery.example.demo import build_failed_backfill

        t0 = time.perf_counter()
        with dg.DagsterInstance.get() as instance:
            result = build_failed_backfill(spec_path, instance=instance, defs=defs(), events=events, console=console, truth=False)
        (root / "built.json").write_text(json.dumps({"events": events, "build_s": time.perf_counter() - t0, "counts": result.counts}))
    return spec_path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench reconcile")
    p.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--memory-limit", default="2GB", help="DuckDB memory_limit for every step")
    p.add_argument("--repeat", type=int, default=3, help="measure each step this many times; report the median")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    console = Console()
    rows = []
    for events in args.events:
        console.rule(f"{events:,} events")
        spec_path = build(events, console, args.memory_limit)
        recons, floors = [], []
        for i in range(args.repeat):  # alternate, so both see the same machine conditions
            with console.status(f"reconciliation at {events:,} events ({i + 1}/{args.repeat})"):
                recons.append(in_subprocess("bench.reconcile_worker", "recon", str(spec_path)))
            with console.status(f"bare FULL OUTER JOIN diff at {events:,} events ({i + 1}/{args.repeat})"):
                floors.append(in_subprocess("bench.reconcile_worker", "floor", str(spec_path)))
        recon = sorted(recons, key=lambda r: r["wall_s"])[len(recons) // 2]
        floor = sorted(floors, key=lambda r: r["wall_s"])[len(floors) // 2]
        rows.append({"events": events, "recon_s": recon["wall_s"], "recon_peak_mb": recon["peak_rss_mb"],
                     "floor_s": floor["wall_s"], "floor_peak_mb": floor["peak_rss_mb"],
                     "ratio": recon["wall_s"] / floor["wall_s"], "damaged_keys": recon["damaged_keys"]})
        console.print(rows[-1])
    t = Table(title=f"Reconciliation vs bare FULL OUTER JOIN, median of {args.repeat} (DuckDB memory_limit {args.memory_limit}, {os.cpu_count()} cores)")
    for col in ("events", "damaged keys", "recon s", "recon peak MB", "diff floor s", "ratio"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['events']:,}", f"{r['damaged_keys']:,}", f"{r['recon_s']:.1f}", f"{r['recon_peak_mb']:.0f}",
                  f"{r['floor_s']:.1f}", f"{r['ratio']:.2f}")
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0
