"""``python -m bench share [--swaps N] [--reads N] [--json FILE]``: one DuckDB file, many users.

1. Publish fairness: N pointer swaps (each one write transaction, opened like publish)
   alone, then while 2 processes poll the public view through this package's read-only
   sessions; reports total and worst transaction. Exit 1 when the worst swap with readers
   exceeds 5x the worst alone (floor 50 ms: below that the machine's scheduling noise).
2. Outside readers: swaps with the published export refreshed each time, while 2
   outside readers (no connection to the warehouse) open ``current.duckdb`` for each
   read, until at least --reads reads: errors and mixed results (exit 1 unless 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console

from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.engine.duckdb_engine import fetch_row
from recovery.lib.pointers.namespaces import move_pointer
from recovery.lib.pointers.published_export import export_dir, refresh_published_export


def _poll(spec_path: str, stop: str, out: str) -> None:
    spec = parse_spec(spec_path)
    engine = open_engine(spec.warehouse)
    reads, errors = 0, []
    while not Path(stop).exists():
        try:
            with engine.session(read_only=True) as s:
                s.scalar(f"SELECT count(*) FROM {spec.target.table_name.sql()}")
            reads += 1
        except Exception as err:  # noqa: BLE001 - every error is an observation
            errors.append(repr(err)[:200])
        time.sleep(0.01)
    Path(out).write_text(json.dumps({"reads": reads, "errors": errors}))


def _swaps(spec, writer, ns: dict, n: int, *, export: bool = False) -> list[float]:
    took = []
    for i in range(n):
        t0 = time.perf_counter()
        with writer.engine.transaction() as s:
            move_pointer(s, spec, ns["g-b" if i % 2 == 0 else "g-a"], actor="bench", reason="swap")
        took.append(time.perf_counter() - t0)
        if export:
            refresh_published_export(writer.engine, spec)
    return took


def main(argv: list[str]) -> int:
    from recovery_tests.support.published_export import read_export, two_generations

    ap = argparse.ArgumentParser(prog="python -m bench share")
    ap.add_argument("--swaps", type=int, default=200)
    ap.add_argument("--reads", type=int, default=10_000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    console = Console(width=150)
    with tempfile.TemporaryDirectory(prefix="share-") as tmp:
        spec, w, ns = two_generations(Path(tmp) / "orders")
        solo = _swaps(spec, w, ns, args.swaps)
        stop, outs = Path(tmp) / "stop", [Path(tmp) / f"poll{i}.json" for i in range(2)]
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_poll, args=(str(spec.spec_path), str(stop), str(o))) for o in outs]
        for p in procs:
            p.start()
        time.sleep(3)  # let both readers poll before the swaps start
        shared = _swaps(spec, w, ns, args.swaps)
        stop.touch()
        for p in procs:
            p.join(60)
        polled = [json.loads(o.read_text()) for o in outs]

        refresh_published_export(w.engine, spec)
        path = str(export_dir(spec) / "current.duckdb")
        import duckdb

        con = duckdb.connect(path, read_only=True)
        rows = fetch_row(con, f"SELECT count(*) FROM {spec.target.table_name.name}")[0]
        con.close()
        out = {"stop": threading.Event(), "reads": 0, "mixed": 0, "errors": [], "rows": rows}
        readers = [threading.Thread(target=read_export, args=(path, out)) for _ in range(2)]
        for t in readers:
            t.start()
        export_swaps = 0
        while out["reads"] < args.reads:
            _swaps(spec, w, ns, 2, export=True)
            export_swaps += 2
        out["stop"].set()
        for t in readers:
            t.join(60)
    fig = {
        "swaps": args.swaps,
        "solo_total_s": round(sum(solo), 2),
        "solo_worst_s": round(max(solo), 4),
        "with_2_readers_total_s": round(sum(shared), 2),
        "with_2_readers_worst_s": round(max(shared), 4),
        "polling_reads": sum(p["reads"] for p in polled),
        "polling_errors": sum(len(p["errors"]) for p in polled),
        "export_reads": out["reads"],
        "export_swaps": export_swaps,
        "export_errors": len(out["errors"]),
        "export_mixed": out["mixed"],
    }
    fig["worst_ratio"] = round(fig["with_2_readers_worst_s"] / max(fig["solo_worst_s"], 0.05), 2)
    for k, v in fig.items():
        console.print(f"{k:>24}: {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2))
    ok = (
        fig["worst_ratio"] <= 5
        and fig["polling_errors"] == 0
        and fig["export_errors"] == 0
        and fig["export_mixed"] == 0
    )
    return 0 if ok else 1
