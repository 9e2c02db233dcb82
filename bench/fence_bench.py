"""``python -m bench fence [--fences N] [--json FILE]``: how long a fence takes to commit while another
process writes continuously into the same DuckDB file.

The small orders dataset (``recovery_tests/support/repaired_small.py``); N backfill generations are
registered first. Then a writer process (``python -m bench.fence_bench writer``) runs write
transactions back to back through the package's writer (``Writer.write``, ``upsert_keys`` of a
region's rows, with its retries), and this process fences the N generations one after the other,
0.2 s apart, through ``Writer.fence``. Each fence is timed from the call to its return (the
commit). Reports the median and the maximum, and how many writes the writer committed meanwhile
(0 would mean the writer was not busy and the figures say nothing); exit 1 when the writer
committed fewer writes than there were fences, or a fence failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def busy_writer(spec_path: Path, counter: Path, stop: Path) -> None:
    """Write transactions back to back until ``stop`` exists; ``counter`` holds the count so far."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.snapshot import expected_rows_sql
    from recovery.lib.write.writer import Writer

    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="busy-writer")
    writer.register_generation("busy-writer", "ingest")
    rows = expected_rows_sql(spec, None)
    n = 0
    while not stop.exists():
        writer.write(
            "busy-writer",
            f"SELECT * REPLACE (qty + {n % 7} AS qty) FROM ({rows}) WHERE order_no % 3 = {n % 3}",
            mode="upsert_keys",
            note=f"busy write {n}",
        )
        n += 1
        counter.write_text(str(n))


def measure(base: Path, fences: int) -> dict:
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.write.writer import Writer
    from recovery_tests.support.repaired_small import build_damaged

    build_damaged(base / "orders")
    spec_path = base / "orders" / "spec.yaml"
    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="fence-bench")
    generations = [f"bf-bench-{i}" for i in range(fences)]
    for g in generations:
        writer.register_generation(g, "backfill")
    counter, stop = base / "writes", base / "stop"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.fence_bench", "writer", str(spec_path), str(counter), str(stop)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
    )
    seconds: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while not (counter.exists() and int(counter.read_text() or 0) >= 3):  # the writer is in its stride
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the busy writer did not start: {proc.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
            time.sleep(0.05)
        start = int(counter.read_text())
        for g in generations:
            t0 = time.perf_counter()
            writer.fence(g, incident_id="INC-bench", fenced_by="fence-bench", reason="bench")
            seconds.append(time.perf_counter() - t0)
            time.sleep(0.2)
        during = int(counter.read_text()) - start
    finally:
        stop.write_text("stop")
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with writer.engine.session(read_only=True) as s:
        fenced = s.scalar(
            "SELECT count(*) FROM _recovery.generations WHERE generation LIKE 'bf-bench-%' AND fenced_at IS NOT NULL"
        )
    return {
        "fences": len(seconds),
        "fenced": fenced,
        "median_s": round(statistics.median(seconds), 4),
        "max_s": round(max(seconds), 4),
        "seconds": [round(x, 4) for x in seconds],
        "writes_during": during,
        "writer_exit": proc.returncode,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fence")
    ap.add_argument("--fences", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fence-") as tmp:
        figures = measure(Path(tmp), args.fences)
    print(
        f"{figures['fences']} fences against a busy writer ({figures['writes_during']} writes committed meanwhile): "
        f"median {figures['median_s']:.3f} s, max {figures['max_s']:.3f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    ok = figures["fenced"] == args.fences and figures["writes_during"] >= args.fences and figures["writer_exit"] == 0
    if not ok:
        print(f"problem: {figures}")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        busy_writer(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
