"""Reconciliation vs the single-query floor vs peers, in one run.

Datasets: a TPC-H ``lineitem`` table (tpchgen-cli) of each ``--rows`` size turned into a
change log and damaged by a failed backfill (``bench/lineitem.py``), plus the package's
own worked example (``--example-events``). For each, ``--repeat`` rounds in alternating
order, every step in a fresh process: the package's reconciliation, the hand-written
single-query classifier (``bench/floor.py``) and, where installed (the ``bench`` extra),
the peers on the diff part: reladiff's joindiff and datacompy. Wall time and peak RSS
of each step, medians.

The floor must be exact: after every round the package's and the floor's labels are
compared key by key in DuckDB; one disagreement prints the disagreeing labels and the
bench exits 1.

    python -m bench reconcile --rows 6000000 20000000
    python -m bench reconcile --rows 2000000 --example-events --peers --footprint   # + the footprint case

``--footprint`` adds the package's footprint reconciliation (``recovery reconcile --footprint``: the
failed backfill's keys and its 8 of ~84 months, widened to the month it misfiled into) timed against
the same whole-table floor; its labels must be the floor's on every key it labels, and the floor's
other keys exactly the whole run's drift outside the footprint. Target: footprint / floor <= 0.35.

``--spark`` adds, for each lineitem size, the package's reconciliation on the Spark engine (local[2]) over a
copy of the dataset whose data plane ``recovery spark-import`` moved into Parquet (made once, beside the
dataset: ``<root>-spark``). Its labels must be the DuckDB package's key by key, or the bench exits 1 (after
the table); the table gives spark / duckdb. The JVM is a child of the step's process: its peak RSS is
reported apart.

    python -m bench reconcile --rows 6000000 --example-events --peers --spark
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import duckdb
import yaml
from rich.console import Console
from rich.table import Table

from bench import lineitem
from bench.measure import in_subprocess, recovery_cli, use_spark

CACHE = Path(__file__).resolve().parent / ".cache"
EXAMPLE_FAILED = "backfill-0042"


def build_example(events: int, console: Console, memory_limit: str) -> Path:
    """The failed worked example at ``events`` events (real Dagster backfill; cached); returns its spec path."""
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
            result = build_failed_backfill(
                spec_path, instance=instance, defs=defs(), events=events, console=console, truth=False
            )
        (root / "built.json").write_text(
            json.dumps({"events": events, "build_s": time.perf_counter() - t0, "counts": result.counts})
        )
    return spec_path


def spark_dataset(spec_path: Path, memory_limit: str) -> tuple[Path, float]:
    """The dataset's folder copied once to ``<root>-spark``, its warehouse on the Spark engine (local[2])
    and its data plane spark-imported; returns the copy's spec path and how long the import took. The
    copy is redone when the dataset was rebuilt since. Local mode runs the tasks in the driver: its heap
    gets DuckDB's memory_limit, so neither engine has more memory to work in."""
    from recovery.config import PROJECT_ROOT

    root = spec_path.parent.with_name(spec_path.parent.name + "-spark")
    built = json.loads((spec_path.parent / "built.json").read_text())
    done = root / "imported.json"
    if done.exists() and json.loads(done.read_text())["built"] == built:
        return root / spec_path.name, json.loads(done.read_text())["import_s"]
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(
        spec_path.parent, root, ignore=shutil.ignore_patterns("bench-runs", "built.json", "*.turnstile", "*.wal")
    )
    heap = memory_limit.lower().removesuffix("b").removesuffix("i")  # 3GB -> 3g
    use_spark(root / spec_path.name, {"spark.driver.memory": heap} if heap[-1:] in ("k", "m", "g", "t") else None)
    t0 = time.perf_counter()
    recovery_cli("spark-import", "--spec", str(root / spec_path.name), env=dict(os.environ), cwd=PROJECT_ROOT)
    import_s = time.perf_counter() - t0
    done.write_text(json.dumps({"built": built, "import_s": import_s}))
    return root / spec_path.name, import_s


def disagreements(recon: Path, floor: Path, key: list[str]) -> list[tuple[str, str, int]]:
    """(package label, floor label, keys) for every pair that differs; '-' where a side has no label."""
    using = ", ".join(f'"{k}"' for k in key)
    con = duckdb.connect()
    try:
        return con.execute(
            f"SELECT coalesce(p.label, '-'), coalesce(f.label, '-'), count(*) FROM read_parquet('{recon}') p "
            f"FULL OUTER JOIN read_parquet('{floor}') f USING ({using}) WHERE p.label IS DISTINCT FROM f.label "
            f"GROUP BY ALL ORDER BY 3 DESC"
        ).fetchall()
    finally:
        con.close()


def footprint_disagreements(footprint: Path, floor: Path, key: list[str]) -> tuple[list[tuple[str, str, int]], int]:
    """(footprint label, floor label, keys) for every footprint key the floor labels otherwise (or not at
    all), and how many keys the floor labels outside the footprint (the whole run's drift)."""
    using = ", ".join(f'"{k}"' for k in key)
    con = duckdb.connect()
    try:
        bad = con.execute(
            f"SELECT p.label, coalesce(f.label, '-'), count(*) FROM read_parquet('{footprint}') p "
            f"LEFT JOIN read_parquet('{floor}') f USING ({using}) WHERE p.label IS DISTINCT FROM f.label "
            f"GROUP BY ALL ORDER BY 3 DESC"
        ).fetchall()
        outside = con.execute(
            f"SELECT count(*) FROM read_parquet('{floor}') f ANTI JOIN read_parquet('{footprint}') p USING ({using})"
        ).fetchone()
        return bad, int(outside[0]) if outside else 0
    finally:
        con.close()


class FloorDisagrees(Exception):
    pass


def median(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def measure(
    name: str,
    spec_path: Path,
    failed: str,
    peers: list[str],
    repeat: int,
    work: Path,
    console: Console,
    footprint: bool = False,
    spark_spec: Path | None = None,
) -> dict:
    """``repeat`` rounds of every step, alternating the order; the floor checked against the package each round.
    ``footprint``: also the package's footprint reconciliation, whose labels must be the floor's on every
    footprint key, the floor's other keys being exactly the whole run's drift outside the footprint.
    ``spark_spec``: also the package's reconciliation on that Spark copy (step ``spark``), whose labels
    must be the DuckDB run's key by key. A floor that disagrees stops the bench at once (every ratio is
    to it); Spark's disagreements (the last round's, in the row) end it with exit 1 after the table, as
    the time of a run whose labels are wrong in places still says what Spark costs."""
    from bench.reconcile_worker import prepare_peers
    from recovery.lib.catalog_checks import load_spec

    spec = load_spec(spec_path)
    if peers:
        prepare_peers(spec)
    steps = ["recon", "floor", *(["footprint"] if footprint else []), *(["spark"] if spark_spec else []), *peers]
    runs: dict[str, list[dict]] = {s: [] for s in steps}
    spark_bad: list[tuple[str, str, int]] = []
    work.mkdir(parents=True, exist_ok=True)
    for i in range(repeat):
        for step in steps if i % 2 == 0 else steps[::-1]:
            with console.status(f"{name}: {step} ({i + 1}/{repeat})"):
                out = work / f"{step}.parquet"
                mode, path = ("recon", spark_spec) if step == "spark" else (step, spec_path)
                runs[step].append(in_subprocess("bench.reconcile_worker", mode, str(path), failed, str(out)))
        for other in ["floor", *(["spark"] if spark_spec else [])]:
            bad = disagreements(work / "recon.parquet", work / f"{other}.parquet", spec.key)
            for p, f, n in bad:
                console.print(
                    f"[red]{other} disagrees[/] on {n:,} keys of {name}: package {p!r}, {other} {f!r}",
                    highlight=False,
                )
            if bad and other == "floor":
                raise FloorDisagrees(
                    f"{name}: " + ", ".join(f"package {p} vs floor {f} ({n:,} keys)" for p, f, n in bad)
                )
            if other == "spark":
                spark_bad = bad
        if footprint:
            bad, outside = footprint_disagreements(work / "footprint.parquet", work / "floor.parquet", spec.key)
            drift = runs["recon"][-1]["drift_outside_footprint"]
            if bad or outside != drift:
                for p, f, n in bad:
                    console.print(
                        f"[red]footprint disagrees[/] on {n:,} keys of {name}: footprint {p!r}, floor {f!r}",
                        highlight=False,
                    )
                raise FloorDisagrees(
                    f"{name} footprint: {bad}; the floor labels {outside:,} keys outside the footprint, "
                    f"the whole run counts {drift:,} as drift"
                )
    med = {s: median(r) for s, r in runs.items()}
    row = {
        "dataset": name,
        "damaged_keys": med["recon"]["damaged_keys"],
        "labels": med["recon"]["labels"],
        "labels_exact": True,
        "rounds": repeat,
    }
    for s, m in med.items():
        row[f"{s}_s"], row[f"{s}_peak_mb"] = m["wall_s"], m["peak_rss_mb"]
        if "differing_keys" in m:
            row[f"{s}_differing_keys"] = m["differing_keys"]
    row["ratio"] = row["recon_s"] / row["floor_s"]
    if footprint:
        row["footprint_ratio"] = row["footprint_s"] / row["floor_s"]
        row["footprint_keys"] = med["footprint"]["damaged_keys"]
        row["footprint_range"] = med["footprint"]["footprint_range"]
        row["drift_outside_footprint"] = med["recon"]["drift_outside_footprint"]
    if spark_spec:
        row["spark_ratio"] = row["spark_s"] / row["recon_s"]
        row["spark_jvm_peak_mb"] = med["spark"]["jvm_peak_rss_mb"]
        row["spark_process_s"] = med["spark"]["wall_s_outer"]  # + interpreter, spec check and the JVM's start
        row["spark_labels_exact"] = not spark_bad
        row["spark_disagreements"] = [{"package": p, "spark": f, "keys": n} for p, f, n in spark_bad]
    console.print(row, highlight=False)
    return row


def installed_peers(wanted: list[str], console: Console) -> list[str]:
    out = []
    for p in wanted:
        if importlib.util.find_spec(p) is None:
            console.print(
                f"{p} is not installed (pip install -c constraints.txt -e '.[bench]'): left out", highlight=False
            )
        else:
            out.append(p)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench reconcile")
    p.add_argument(
        "--rows", type=int, nargs="*", default=[6_000_000, 20_000_000], help="lineitem rows (TPC-H) per size"
    )
    p.add_argument(
        "--example-events", type=int, nargs="*", default=[200_000], help="worked-example sizes (events); none: skip"
    )
    p.add_argument("--memory-limit", default="3GB", help="DuckDB memory_limit in every spec")
    p.add_argument("--repeat", type=int, default=3, help="rounds per dataset (alternating order); medians reported")
    p.add_argument("--peers", nargs="*", default=["reladiff", "datacompy"], help="peers on the diff part")
    p.add_argument(
        "--datacompy-max-rows",
        type=int,
        default=6_000_000,
        help="datacompy holds both tables in pandas: left out above this many rows",
    )
    p.add_argument("--cache", type=Path, default=CACHE, help="built datasets (reused) and TPC-H files")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--footprint",
        action="store_true",
        help="also time the package's footprint reconciliation (the backfill's ~10%% of the partitions) "
        "against the whole-table floor (lineitem only)",
    )
    p.add_argument(
        "--spark",
        action="store_true",
        help="also time the package's reconciliation on the Spark engine (local[2]; lineitem only), "
        "its labels checked against DuckDB's",
    )
    args = p.parse_args(argv)
    console = Console()
    if not console.is_terminal:  # piped: wide enough for the table
        console = Console(width=170)
    peers = installed_peers(args.peers, console)
    rows: list[dict] = []
    datasets = [(f"lineitem {n:,}", n, "lineitem") for n in args.rows] + [
        (f"example {n:,} events", n, "example") for n in args.example_events
    ]
    try:
        for name, n, kind in datasets:
            console.rule(name)
            spark_spec = None
            if kind == "lineitem":
                root = args.cache / f"lineitem-{n}-{args.memory_limit}"
                with console.status(f"building {name} (cached in {root})"):
                    spec_path = lineitem.build(root, n, memory_limit=args.memory_limit, cache=args.cache)
                failed = lineitem.FAILED
                if args.spark:
                    with console.status(f"{name}: spark-import (cached in {root}-spark)"):
                        spark_spec, import_s = spark_dataset(spec_path, args.memory_limit)
            else:
                spec_path, failed = build_example(n, console, args.memory_limit), EXAMPLE_FAILED
            use = [x for x in peers if not (x == "datacompy" and n > args.datacompy_max_rows)]
            row = measure(
                name,
                spec_path,
                failed,
                use,
                args.repeat,
                spec_path.parent / "bench-runs",
                console,
                footprint=args.footprint and kind == "lineitem",
                spark_spec=spark_spec,
            )
            row["rows"] = n
            if spark_spec:
                row["spark_import_s"] = import_s
            rows.append(row)
    except FloorDisagrees as err:
        console.print(f"[red]the floor's labels differ from the package's[/]: {err}", highlight=False)
        return 1
    print_table(console, rows, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    wrong = [r["dataset"] for r in rows if not r.get("spark_labels_exact", True)]
    if wrong:
        console.print(f"[red]Spark's labels differ from DuckDB's[/] on {', '.join(wrong)} (above)", highlight=False)
    return 1 if wrong else 0


def print_table(console: Console, rows: list[dict], args) -> None:
    t = Table(
        title=f"Reconciliation vs the single-query floor vs peers: medians of {args.repeat} alternating rounds, "
        f"fresh processes (DuckDB memory_limit {args.memory_limit}, {os.cpu_count()} cores)",
        caption="MB: the step's process's peak RSS. Spark's JVM is a child process, not in it: JVM MB is its own "
        "peak RSS (driver heap = memory_limit). spark / duckdb: spark s / package s. Every s starts after the spec's "
        "check against the warehouse, which on Spark starts the JVM: its start is not in spark s (spark_process_s is)."
        if any("spark_s" in r for r in rows)
        else None,
    )
    for col in (
        "dataset",
        "damaged keys",
        "package s / MB",
        "floor s / MB",
        "ratio",
        "labels",
        "footprint s / MB",
        "footprint ratio",
        "spark s / MB / JVM MB",
        "spark / duckdb",
        "reladiff s / MB",
        "datacompy s / MB",
    ):
        t.add_column(col, justify="right")
    fig = lambda r, s: f"{r[s + '_s']:.1f} / {r[s + '_peak_mb']:,.0f}" if f"{s}_s" in r else "-"  # noqa: E731
    for r in rows:
        t.add_row(
            r["dataset"],
            f"{r['damaged_keys']:,}",
            fig(r, "recon"),
            fig(r, "floor"),
            f"{r['ratio']:.2f}",
            ("exact" if r["labels_exact"] else "DIFFER")
            + (
                ""
                if r.get("spark_labels_exact", True)
                else f"; spark: {sum(d['keys'] for d in r['spark_disagreements']):,} DIFFER"
            ),
            fig(r, "footprint"),
            f"{r['footprint_ratio']:.2f}" if "footprint_ratio" in r else "-",
            f"{fig(r, 'spark')} / {r['spark_jvm_peak_mb']:,.0f}" if "spark_s" in r else "-",
            f"{r['spark_ratio']:.2f}" if "spark_ratio" in r else "-",
            fig(r, "reladiff"),
            fig(r, "datacompy"),
        )
    console.print(t)
