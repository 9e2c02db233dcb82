"""End to end: ``recovery recover`` on the worked example at several sizes, timed per phase.

For each size the failed example is built once (real Dagster backfill; cached under
``bench/.cache``), copied, and recovered by ``recovery recover --incident ...`` in a
fresh process with its own Dagster instance: every phase (contain, evidence,
reconcile+impact+decide, repair in canary and waves with their gates, publish,
restate, verify, reports) as Dagster runs. The command reports wall time, peak
memory and the share spent inside DuckDB per phase; DuckDB runs under
``--memory-limit`` and spills past it.

    python -m bench recover --events 1000000 10000000
    python -m bench recover --from DIR      # any dataset folder holding spec.yaml + incident.yaml (tests use this)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from bench.measure import recovery_cli, use_spark
from bench.reconcile_bench import build_example as build


def summarize_trace(path: Path, top: int = 12) -> dict:
    """Seconds per kind (engine statements, Great Expectations batches) and per phase (the steps
    between two of recover's phase marks), and the slowest steps."""
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    per_kind: dict[str, float] = {}
    per_phase: dict[str, float] = {}
    phase = "before the first phase"
    for x in lines:
        if x["kind"] == "mark":
            if x["what"].startswith("phase "):
                phase = x["what"].split()[1]
            continue
        per_kind[x["kind"]] = per_kind.get(x["kind"], 0.0) + x["s"]
        per_phase[phase] = per_phase.get(phase, 0.0) + x["s"]
    return {
        "seconds_per_kind": {k: round(v, 1) for k, v in per_kind.items()},
        "seconds_per_phase": {k: round(v, 1) for k, v in per_phase.items()},
        "slowest": sorted((x for x in lines if x["kind"] != "mark"), key=lambda x: -x["s"])[:top],
    }


def recover_once(
    dataset: Path,
    console: Console,
    *,
    memory_limit: str | None,
    wave_size: int,
    trace: bool = False,
    engine: str = "duckdb",
    keep_trace: Path | None = None,
    full: bool = False,
) -> dict:
    """Copy ``dataset`` (a folder with spec.yaml, incident.yaml and the warehouse) and run
    ``recovery recover`` on it in a fresh process; returns its figures (with ``trace``, also
    where the engine and Great Expectations spent it: steps over 0.5 s)."""
    from recovery.config import PROJECT_ROOT

    with tempfile.TemporaryDirectory(prefix="bench-recover-") as tmp:
        work = Path(tmp) / "dataset"
        shutil.copytree(
            dataset, work, ignore=shutil.ignore_patterns("dagster_home", "evidence", "reports", "built.json")
        )
        if memory_limit:
            doc = yaml.safe_load((work / "spec.yaml").read_text())
            doc["warehouse"]["memory_limit"] = memory_limit
            (work / "spec.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        import_s = None
        if engine == "spark":  # the same warehouse, its data plane moved to Spark's layout first
            use_spark(work / "spec.yaml")
            t0 = time.perf_counter()
            recovery_cli("spark-import", "--spec", str(work / "spec.yaml"), env=dict(os.environ), cwd=PROJECT_ROOT)
            import_s = time.perf_counter() - t0
        home = Path(tmp) / "dagster_home"
        home.mkdir()
        shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
        figures = Path(tmp) / "figures.json"
        trace_file = Path(tmp) / "trace.jsonl"
        env = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_SPEC": str(work / "spec.yaml")}
        if trace:
            env["RECOVERY_TRACE"] = str(trace_file)
        t0 = time.perf_counter()
        proc = recovery_cli(
            "recover",
            "--incident",
            str(work / "incident.yaml"),
            "--figures",
            str(figures),
            "--wave-size",
            str(wave_size),
            *(["--full"] if full else []),
            env=env,
            cwd=PROJECT_ROOT,
        )
        wall = time.perf_counter() - t0
        phases = json.loads(figures.read_text())
        incident_id = yaml.safe_load((work / "incident.yaml").read_text())["incident_id"]
        reports = sorted(p.name for p in (work / "reports" / incident_id).glob("*.html"))
        out = {
            "wall_s": wall,
            "engine": engine,
            "import_s": import_s,
            "phases": phases,
            "reports": reports,
            "stdout": proc.stdout,
        }
        if trace:
            out["trace"] = summarize_trace(trace_file)
            if keep_trace and trace_file.exists():
                shutil.copy(trace_file, keep_trace)
        return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench recover")
    p.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--from", dest="dataset", type=Path, help="recover this built example folder instead of building")
    p.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit")
    p.add_argument("--wave-size", type=int, default=30)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--trace", action="store_true", help="also report the slowest engine statements and GE batches")
    p.add_argument("--keep-trace", type=Path, help="with --trace: copy the whole trace (JSON lines) here")
    p.add_argument(
        "--engine",
        choices=["duckdb", "spark"],
        default="duckdb",
        help="recover on this engine (spark: local[2]; the JVM's memory is not in peak RSS)",
    )
    p.add_argument("--full", action="store_true", help="recover --full: reconcile the whole target, not the footprint")
    args = p.parse_args(argv)
    console = Console(width=150) if not Console().is_terminal else Console()
    datasets = (
        [(None, args.dataset)]
        if args.dataset
        else [(n, build(n, console, args.memory_limit).parent) for n in args.events]
    )
    results = []
    for events, dataset in datasets:
        label = f"{events:,} events" if events else str(dataset)
        console.rule(f"recovery of {label}")
        with console.status(f"recovery recover on {label}"):
            r = recover_once(
                dataset,
                console,
                memory_limit=args.memory_limit,
                wave_size=args.wave_size,
                trace=args.trace,
                engine=args.engine,
                keep_trace=args.keep_trace,
                full=args.full,
            )
        moved = f"; spark-import {r['import_s']:.1f} s before" if r["import_s"] is not None else ""
        t = Table(title=f"{label} on {args.engine}: {r['wall_s']:.1f} s end to end (process start to exit){moved}")
        for col in ("phase", "wall s", "engine s", "engine share", "peak RSS MB", "Dagster runs"):
            t.add_column(col, justify="left" if col == "phase" else "right")
        for ph in r["phases"]:
            t.add_row(
                ph["phase"],
                f"{ph['seconds']:.1f}",
                f"{ph['engine_seconds']:.1f}",
                f"{ph['engine_seconds'] / max(ph['seconds'], 1e-9):.0%}",
                f"{ph['peak_rss_mb']:,.0f}",
                str(len(ph["run_ids"])),
            )
        console.print(t)
        if "trace" in r:
            console.print(f"traced seconds per kind: {r['trace']['seconds_per_kind']}")
            console.print(f"traced seconds per phase: {r['trace']['seconds_per_phase']}")
            for x in r["trace"]["slowest"]:
                console.print(f"  {x['s']:7.1f} s  {x['kind']:<18} {x['what'][:110]}", highlight=False)
        results.append({"events": events, "dataset": str(dataset), **{k: v for k, v in r.items() if k != "stdout"}})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0
