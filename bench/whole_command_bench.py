"""The whole command a user types, ``recovery reconcile --incident F``, against the single-query floor.

Everything the user waits for is timed: the interpreter, the imports, the code location, the
Dagster run and its events, the classification, the outputs. Each round copies the dataset and
makes a fresh Dagster instance (untimed), then runs in alternating order: the floor as a person
runs it (a Python process that opens the warehouse with DuckDB and runs the one query of
``bench/floor.py``, written to a file beforehand, its labels to Parquet), the command on the whole
target (``--full``) and the command as a user runs it (the default: the failed generations'
footprint). Medians of the rounds; wall time
and each process's own peak RSS (``wait4``). After every round the labels are checked key by key:
the whole run's against the floor's, the default run's against the floor's on every key it labels
(and the floor's other keys must be the whole run's drift outside the footprint); one
disagreement ends the bench with exit 1.

    python -m bench whole --rows 6000000 20000000 [--rounds 3]   # lineitem, cached in bench/.cache
    python -m bench whole --rows 20000000 --after-contain          # in the runbook's order: contain ran first

A first command on a warehouse scans the whole change log once for duplicate (key, version) pairs
(the spec's check, recorded in the warehouse so later commands skip it); ``--after-contain``
measures reconcile where ``recovery contain`` ran first, as the runbook has it.

The figures and the targets they are held to are in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import lineitem
from bench.reconcile_bench import CACHE, disagreements, footprint_disagreements

MODES = ("floor", "full", "default")


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd``; its wall time and its own peak RSS (``wait4``: that child's rusage alone)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "stdout": stdout}


FLOOR_PROCESS = """
import sys, time, duckdb
path, limit, sql_file, out = sys.argv[1:]
t0 = time.perf_counter()
con = duckdb.connect(path, read_only=True, config={"memory_limit": limit} if limit else {})
con.execute("SET enable_progress_bar = false")
sql = open(sql_file).read()
con.execute(f"COPY ({sql}) TO '{out}' (FORMAT parquet)")
con.close()
print(time.perf_counter() - t0)
"""
"""The floor as a person runs it: Python, DuckDB and the one query (written beforehand, as by hand)."""


def floor_sql_file(spec_path: Path, tmp: Path) -> Path:
    """The floor's query for this dataset (``bench/floor.py``), written once, untimed."""
    from bench.floor import floor_sql
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine

    spec = load_spec(spec_path)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        sql = floor_sql(spec, [lineitem.FAILED], [c for c, _ in s.columns(spec.target.table_name.sql())])
    path = tmp / "floor.sql"
    path.write_text(sql)
    return path


def run_floor(spec_path: Path, sql_file: Path, out: Path) -> dict:
    from recovery.lib.catalog_checks import load_spec

    warehouse = load_spec(spec_path).warehouse
    cmd = [sys.executable, "-c", FLOOR_PROCESS, str(warehouse.path), warehouse.memory_limit or "", str(sql_file)]
    r = timed([*cmd, str(out)], dict(os.environ))
    return {"wall_s": r["wall_s"], "query_s": float(r["stdout"].split()[-1]), "peak_rss_mb": r["peak_rss_mb"]}


def contained(dataset: Path) -> Path:
    """A copy of ``dataset`` after ``recovery contain`` (the runbook's first command), with the Dagster
    instance it ran in: ``<dataset>-contained/{dataset,home}``, made once. The spec's check of the
    change log (its one full scan for duplicate (key, version) pairs) was recorded by it."""
    from recovery.config import PROJECT_ROOT

    base = dataset.with_name(dataset.name + "-contained")
    if (base / "done").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(dataset, base / "dataset", ignore=shutil.ignore_patterns("bench-*", "reports", "evidence"))
    (base / "home").mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", base / "home" / "dagster.yaml")
    cli = str(Path(sys.executable).with_name("recovery"))
    env = {**os.environ, "DAGSTER_HOME": str(base / "home")}
    timed([cli, "contain", "--incident", str(base / "dataset" / "incident.yaml")], env)
    (base / "done").touch()
    return base


def run_command(base: Path, tmp: Path, full: bool) -> dict:
    """``recovery reconcile --incident`` on a fresh copy of ``base`` (``dataset/``, and ``home/``, the
    Dagster instance, when there is one; a fresh instance otherwise)."""
    from recovery.config import PROJECT_ROOT

    work, home, out = tmp / "dataset", tmp / "home", tmp / "out"
    for d in (work, home, out):
        shutil.rmtree(d, ignore_errors=True)
    ignore = shutil.ignore_patterns("bench-*", "reports", "evidence", "dagster_home")
    if (base / "home").is_dir():
        shutil.copytree(base / "dataset", work, ignore=ignore)
        shutil.copytree(base / "home", home, ignore=shutil.ignore_patterns("*.log"))
    else:
        shutil.copytree(base, work, ignore=ignore)
        home.mkdir()
        shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    cli = str(Path(sys.executable).with_name("recovery"))
    cmd = [cli, "reconcile", "--incident", str(work / "incident.yaml"), "--out", str(out)]
    cmd += ["--full"] if full else []
    r = timed(cmd, env)
    summary = json.loads((out / "summary.json").read_text())
    kept = tmp / f"{'full' if full else 'default'}.parquet"
    shutil.copy(out / "reconciliation.parquet", kept)
    return {
        "wall_s": r["wall_s"],
        "peak_rss_mb": r["peak_rss_mb"],
        "damaged_keys": summary["damaged_keys"],
        "drift_outside_footprint": sum((summary.get("drift_outside_footprint") or {}).values()),
        "labels": kept,
    }


def measure(name: str, spec_path: Path, rounds: int, console: Console, after_contain: bool = False) -> dict:
    from recovery.lib.catalog_checks import load_spec

    spec = load_spec(spec_path)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    if after_contain:
        with console.status(f"{name}: recovery contain on a copy (once)"):
            base = contained(spec_path.parent)
    else:
        base = spec_path.parent
    with tempfile.TemporaryDirectory(prefix="bench-whole-", dir=spec_path.parent.parent) as t:
        tmp = Path(t)
        sql_file = floor_sql_file(spec_path, tmp)
        for i in range(rounds):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                with console.status(f"{name}: {mode} ({i + 1}/{rounds})"):
                    if mode == "floor":
                        runs[mode].append(run_floor(spec_path, sql_file, tmp / "floor.parquet"))
                    else:
                        runs[mode].append(run_command(base, tmp, full=mode == "full"))
            bad = disagreements(tmp / "full.parquet", tmp / "floor.parquet", spec.key)
            fp_bad, outside = footprint_disagreements(tmp / "default.parquet", tmp / "floor.parquet", spec.key)
            drift = runs["full"][-1]["drift_outside_footprint"]
            if bad or fp_bad or outside != drift:
                raise SystemExit(
                    f"{name}: labels differ from the floor's: whole run {bad}, default run {fp_bad}; the floor "
                    f"labels {outside:,} keys outside the footprint, the whole run counts {drift:,} as drift"
                )
    med = {m: statistics.median(r["wall_s"] for r in rs) for m, rs in runs.items()}
    peak = {m: max(r["peak_rss_mb"] for r in rs) for m, rs in runs.items()}
    return {
        "dataset": name,
        "after_contain": after_contain,
        "rounds": rounds,
        "floor_s": med["floor"],
        "floor_query_s": statistics.median(r["query_s"] for r in runs["floor"]),
        "full_s": med["full"],
        "default_s": med["default"],
        "full_ratio": med["full"] / med["floor"],
        "default_ratio": med["default"] / med["floor"],
        "peak_mb": peak,
        "damaged_keys": {"full": runs["full"][0]["damaged_keys"], "default": runs["default"][0]["damaged_keys"]},
        "all_rounds": {m: [round(r["wall_s"], 2) for r in rs] for m, rs in runs.items()},
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench whole", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[6_000_000], help="lineitem rows (TPC-H) per size")
    p.add_argument("--rounds", type=int, default=3, help="rounds (alternating order); medians reported")
    p.add_argument("--memory-limit", default="3GB", help="DuckDB memory_limit in the spec")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--after-contain",
        action="store_true",
        help="reconcile in the runbook's order: on a copy where `recovery contain` ran first (its instance too)",
    )
    args = p.parse_args(argv)
    console = Console(width=160)
    rows = []
    for n in args.rows:
        root = CACHE / f"lineitem-{n}-{args.memory_limit}"
        with console.status(f"building lineitem {n:,} (cached in {root})"):
            spec_path = lineitem.build(root, n, memory_limit=args.memory_limit, cache=CACHE)
        row = measure(f"lineitem {n:,} rows", spec_path, args.rounds, console, after_contain=args.after_contain)
        console.print(row, highlight=False)
        rows.append(row)
    t = Table(
        title=f"recovery reconcile --incident F{' after recovery contain' if args.after_contain else ''}, whole "
        f"process, vs the floor as a process: medians of {args.rounds} alternating rounds (memory_limit "
        f"{args.memory_limit}, {os.cpu_count()} cores)"
    )
    for col in ("dataset", "floor s (its query)", "--full s / MB", "ratio", "default s / MB", "ratio to the floor"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r["dataset"],
            f"{r['floor_s']:.1f} ({r['floor_query_s']:.1f})",
            f"{r['full_s']:.1f} / {r['peak_mb']['full']:,.0f}",
            f"{r['full_ratio']:.2f}",
            f"{r['default_s']:.1f} / {r['peak_mb']['default']:,.0f}",
            f"{r['default_ratio']:.2f}",
        )
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0
