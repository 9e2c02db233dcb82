"""Convergence verification after a recovery, with late changes pending: ``verify_convergence`` timed.

The failed worked example at ``--events`` is built (cached under ``bench/.cache``) and
recovered once by ``recovery recover`` in a fresh process (cached too). For each
``--late`` count, a copy of the recovered warehouse receives that many late changes
(a new version of live keys, arrived ten minutes ago: pending, within the default lag)
and ``verify_convergence`` runs ``--repeat`` times on it, in this process; the median
wall time and what the check found are reported. ``--late 0`` is the check with
nothing pending, so the difference is what telling pending changes from drift costs.

    python -m bench convergence --events 1000000 --late 0 1000 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.measure import recovery_cli
from bench.reconcile_bench import CACHE
from bench.reconcile_bench import build_example as build


def recovered(events: int, console: Console, memory_limit: str) -> Path:
    """The worked example at ``events``, recovered end to end once (cached); returns its folder."""
    from recovery.config import PROJECT_ROOT

    built = build(events, console, memory_limit).parent
    root = CACHE / f"recovered-{events}"
    if not (root / "recovered.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(built, root, ignore=shutil.ignore_patterns("dagster_home", "evidence", "reports", "built.json"))
        home = root / "dagster_home"
        home.mkdir()
        shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
        env = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_SPEC": str(root / "spec.yaml")}
        t0 = time.perf_counter()
        recovery_cli("recover", "--incident", str(root / "incident.yaml"), env=env, cwd=PROJECT_ROOT)
        (root / "recovered.json").write_text(json.dumps({"events": events, "recover_s": time.perf_counter() - t0}))
    return root


def land_late_changes(spec, n: int) -> None:
    """``n`` live keys get a new version (same payload) that arrived ten minutes ago, in one statement."""
    from recovery.lib.control.plane import utcnow
    from recovery.lib.engine import open_engine
    from recovery.lib.identifiers import quote, quote_all
    from recovery.lib.snapshot import latest_versions_sql

    if not n:
        return
    src = spec.source
    with open_engine(spec.warehouse).transaction() as s:
        s.execute(
            f"INSERT INTO {src.table_name.sql()} SELECT * REPLACE ({quote(src.version)} + 1 AS {quote(src.version)}, "
            f"CAST(? AS TIMESTAMP) AS {quote(src.ingested_at)}) "
            f"FROM ({latest_versions_sql(spec, None, include_deleted=False)}) ORDER BY hash({quote_all(src.key)}) "
            f"LIMIT {int(n)}",
            [utcnow() - timedelta(minutes=10)],
        )


def measure(root: Path, late: int, repeat: int) -> dict:
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.convergence import verify_convergence
    from recovery.lib.engine import open_engine

    with tempfile.TemporaryDirectory(prefix="bench-convergence-") as tmp:
        work = Path(tmp) / "dataset"
        shutil.copytree(root, work, ignore=shutil.ignore_patterns("dagster_home", "evidence", "reports"))
        spec = load_spec(work / "spec.yaml")
        land_late_changes(spec, late)
        engine = open_engine(spec.warehouse)
        seconds, result = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = verify_convergence(engine, spec)
            seconds.append(time.perf_counter() - t0)
        assert result is not None
        return {
            "late": late,
            "median_s": statistics.median(seconds),
            "runs_s": [round(x, 2) for x in seconds],
            "partitions": len(result.partitions),
            "pending_changes": result.pending_changes,
            "pending_partitions": sum(1 for p in result.partitions if p.pending_changes),
            "drift_keys": sum(p.drift_keys for p in result.partitions),
            "converged": result.converged,
        }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench convergence")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--late", type=int, nargs="+", default=[0, 1_000, 100_000])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit of the built example")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    console = Console(width=150) if not Console().is_terminal else Console()
    root = recovered(args.events, console, args.memory_limit)
    rows = [measure(root, n, args.repeat) for n in args.late]
    t = Table(title=f"verify_convergence after recovery, {args.events:,} source events (median of {args.repeat})")
    for col in ("late changes", "verify s", "runs s", "partitions", "pending", "pending partitions", "drift keys"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            f"{r['late']:,}",
            f"{r['median_s']:.2f}",
            " ".join(f"{x:.2f}" for x in r["runs_s"]),
            f"{r['partitions']:,}",
            f"{r['pending_changes']:,}",
            f"{r['pending_partitions']:,}",
            f"{r['drift_keys']:,}",
        )
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    bad = [r for r in rows if r["drift_keys"] or r["pending_changes"] != r["late"]]
    return 1 if bad else 0
