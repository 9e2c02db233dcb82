"""Reconciliation of a Delta Lake table vs the same incident on a DuckDB file (``python -m bench lakehouse``).

The DuckDB incident is the reconcile bench's lineitem dataset (``bench/lineitem.py``: a
failed backfill over 8 months while ingestion keeps running). Its Delta twin is written
from it, write by write: the change log as one Delta table, and the target as one Delta
commit per write of the package's write log, each overwriting the partitions the write
touched with their rows after it (the first commit an append), the write's generation
and time in the commit's properties. The spec is the same but for ``lakehouse:`` (and a
warehouse file of its own), so the package reads the incident from the Delta history
alone.

Before timing, the Delta spec is synced once (``recovery.lib.lakehouse.history``: every
commit's net rows into the write log); that time is reported apart, and the synced copy of
the target is checked against the DuckDB target (row count and content checksum), or the
bench exits 1. Then ``--repeat`` rounds in alternating order, each step in a fresh
process (``bench.reconcile_worker recon``): the package's reconciliation on each spec, with
their labels compared key by key after every round (exit 1 on any difference).

    python -m bench lakehouse --rows 6000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import duckdb
import yaml
from rich.console import Console

from bench import lineitem
from bench.measure import in_subprocess
from bench.reconcile_bench import CACHE, disagreements, median

BUILD = 1


def build_delta(duck_spec: Path, root: Path, console: Console) -> tuple[Path, dict]:
    """The Delta twin of a built lineitem incident (cached beside it); returns its spec and build facts."""
    from deltalake import CommitProperties, write_deltalake

    done = root / "built.json"
    source_built = json.loads((duck_spec.parent / "built.json").read_text())
    if (
        done.exists()
        and json.loads(done.read_text()).get("from") == source_built
        and json.loads(done.read_text()).get("build") == BUILD
    ):
        return root / "spec.yaml", json.loads(done.read_text())
    shutil.rmtree(root, ignore_errors=True)
    (root / "lake").mkdir(parents=True)
    t0 = time.perf_counter()
    duck = duck_spec.parent / "warehouse.duckdb"
    work = duckdb.connect()
    work.execute("SET memory_limit = '3GB'")
    work.execute(f"ATTACH '{duck}' AS src (READ_ONLY)")
    reader = work.sql(f"SELECT * FROM src.{lineitem.SOURCE}").to_arrow_reader(1_000_000)
    write_deltalake(str(root / "lake" / "lineitem_changes"), reader)
    cols = [r[0] for r in work.execute(f"DESCRIBE src.{lineitem.TARGET}").fetchall()]
    work.execute(f"CREATE TABLE cur AS SELECT * FROM src.{lineitem.TARGET} LIMIT 0")
    key = "l_orderkey, l_linenumber"
    log = 'src._recovery."delta__lineitem"'
    writes = work.execute(
        "SELECT seq, generation, mode, written_at FROM src._recovery.writes WHERE dataset = 'lineitem' ORDER BY seq"
    ).fetchall()
    commits = 0
    for seq, gen, mode, at in writes:
        ups = f"SELECT {', '.join(cols)} FROM {log} WHERE _delta_seq = {seq} AND _delta_op = 'upsert'"
        work.execute(f"CREATE OR REPLACE TEMP TABLE ups AS {ups}")
        if mode == "replace_partitions":  # the replaced month is the note's first word (bench/lineitem.py)
            gone = (
                "CAST(ship_month AS VARCHAR) = (SELECT split_part(note, ' ', 1) FROM src._recovery.writes "
                f"WHERE seq = {seq})"
            )
        elif mode == "upsert_keys":
            gone = f"({key}) IN (SELECT ({key}) FROM ups)"
        elif mode == "delete_keys":
            gone = f"({key}) IN (SELECT ({key}) FROM {log} WHERE _delta_seq = {seq} AND _delta_op = 'delete')"
        else:
            gone = "false"
        touched = [
            r[0]
            for r in work.execute(
                f"SELECT DISTINCT CAST(ship_month AS VARCHAR) FROM (SELECT ship_month FROM cur WHERE {gone} "
                f"UNION ALL SELECT ship_month FROM ups)"
            ).fetchall()
        ]
        work.execute(f"DELETE FROM cur WHERE {gone}")
        work.execute("INSERT INTO cur SELECT * FROM ups")
        if not touched:
            continue
        listed = ", ".join(f"'{p}'" for p in touched)
        data = work.sql(f"SELECT * FROM cur WHERE CAST(ship_month AS VARCHAR) IN ({listed})").to_arrow_table()
        props = CommitProperties(custom_metadata={"generation": gen, "written_at": at.isoformat()})
        lake = str(root / "lake" / "lineitem")
        if commits == 0:
            write_deltalake(lake, data, mode="append", partition_by=["ship_month"], commit_properties=props)
        else:
            write_deltalake(
                lake,
                data,
                mode="overwrite",
                predicate=f"ship_month IN ({', '.join(f'DATE {p!r}' for p in touched)})",
                partition_by=["ship_month"],
                commit_properties=props,
            )
        commits += 1
    work.close()
    doc = yaml.safe_load(duck_spec.read_text())
    doc["warehouse"]["path"] = "recovery.duckdb"
    doc["source"]["lakehouse"] = {"format": "delta", "path": "lake/lineitem_changes"}
    doc["target"]["lakehouse"] = {
        "format": "delta",
        "path": "lake/lineitem",
        "generation_property": "generation",
        "written_at_property": "written_at",
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    for name in ("lineitem.sql", "incident.yaml"):
        shutil.copy(duck_spec.parent / name, root / name)
    facts = {"from": source_built, "build": BUILD, "commits": commits, "build_s": round(time.perf_counter() - t0, 1)}
    done.write_text(json.dumps(facts))
    return root / "spec.yaml", facts


def first_sync(spec_path: Path) -> dict:
    """Sync the Delta spec once (timed), then take its copy under management as the DuckDB incident's target
    is (so both reconciliations record their results the same way)."""
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.lakehouse.history import sync
    from recovery.lib.pointers.adoption import adopt

    spec = parse_spec(spec_path)
    engine = open_engine(spec.warehouse)
    t0 = time.perf_counter()
    sync(engine, spec)
    sync_s = round(time.perf_counter() - t0, 1)
    adopt(engine, spec, actor="bench")  # the write log's rows follow the adopted namespace in its commit
    return {"sync_s": sync_s}


def checksum(spec_path: Path) -> tuple:
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery.lib.engine.duckdb_engine import fetch_row

    spec = parse_spec(spec_path)
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    try:
        cols = [r[0] for r in con.execute(f"DESCRIBE {spec.target.table}").fetchall()]
        return fetch_row(con, f"SELECT count(*), sum(hash({', '.join(cols)})) FROM {spec.target.table}")
    finally:
        con.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench lakehouse")
    p.add_argument("--rows", type=int, default=6_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--memory-limit", default="3GB")
    p.add_argument("--cache", type=Path, default=CACHE)
    args = p.parse_args(argv)
    console = Console(width=160)
    root = args.cache / f"lineitem-{args.rows}-{args.memory_limit}"
    with console.status(f"building lineitem {args.rows:,} (cached in {root})"):
        duck_spec = lineitem.build(root, args.rows, memory_limit=args.memory_limit, cache=args.cache)
    with console.status("writing its Delta twin"):
        delta_spec, built = build_delta(duck_spec, root.with_name(root.name + "-delta"), console)
    console.print(f"Delta twin: {built['commits']} commits, written in {built['build_s']} s", highlight=False)
    synced = first_sync(delta_spec)
    same = checksum(delta_spec) == checksum(duck_spec)
    console.print(
        f"first sync of the Delta history: {synced['sync_s']} s; synced target equals the DuckDB target: {same}",
        highlight=False,
    )
    if not same:
        return 1
    runs: dict[str, list[dict]] = {"duckdb": [], "delta": []}
    for i in range(args.repeat):
        for step in ("duckdb", "delta") if i % 2 == 0 else ("delta", "duckdb"):
            spec = duck_spec if step == "duckdb" else delta_spec
            out = spec.parent / "bench-runs" / f"{step}.parquet"
            out.parent.mkdir(exist_ok=True)
            runs[step].append(in_subprocess("bench.reconcile_worker", "recon", str(spec), lineitem.FAILED, str(out)))
        bad = disagreements(
            duck_spec.parent / "bench-runs" / "duckdb.parquet",
            delta_spec.parent / "bench-runs" / "delta.parquet",
            ["l_orderkey", "l_linenumber"],
        )
        if bad:
            console.print(f"[red]labels differ[/]: {bad}", highlight=False)
            return 1
    med = {k: median(v) for k, v in runs.items()}
    row = {
        "rows": args.rows,
        "damaged_keys": med["duckdb"]["damaged_keys"],
        "duckdb_s": med["duckdb"]["wall_s"],
        "duckdb_peak_mb": med["duckdb"]["peak_rss_mb"],
        "delta_s": med["delta"]["wall_s"],
        "delta_peak_mb": med["delta"]["peak_rss_mb"],
        "ratio": med["delta"]["wall_s"] / med["duckdb"]["wall_s"],
        "first_sync_s": synced["sync_s"],
        "delta_commits": built["commits"],
        "labels": "identical",
        "all_rounds": {k: [r["wall_s"] for r in v] for k, v in runs.items()},
    }
    console.print(row, highlight=False)
    return 0
