"""``python -m bench fuzz [--cases N] [--kind spec|incident] [--json FILE]``: fuzz spec and
incident files in process (Hypothesis; the property and the mutations of
``recovery_tests/support/input_fuzz.py``) and report, per file kind, the cases run, how they ended,
uncaught exceptions and writes. Exit status 1 unless every kind ran its cases with 0
uncaught exceptions, 0 multi-line errors and 0 writes (``make fuzz``: 10,000 per kind)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from rich.console import Console
from rich.table import Table

from recovery_tests.support.input_fuzz import FuzzTarget, build_fuzz_dataset, mutated_document


def fuzz(kind: str, cases: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{kind}-") as tmp:
        target = FuzzTarget(build_fuzz_dataset(Path(tmp) / "ds"), kind)

        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(mutated_document(target.base()))
        def run(data: bytes) -> None:
            target.validate(data)

        t0 = time.perf_counter()
        hypothesis_seed(seed)(run)()
        return {
            "kind": kind,
            "seconds": round(time.perf_counter() - t0, 1),
            **target.tally.summary(),
            "first_uncaught": target.tally.uncaught[:3],
            "first_writes": target.tally.writes[:3],
        }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fuzz")
    ap.add_argument("--cases", type=int, default=10_000, help="cases per file kind (default 10,000)")
    ap.add_argument("--kind", choices=["spec", "incident"], action="append", help="only this kind (repeatable)")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    console = Console(width=150)
    results = [fuzz(kind, args.cases, args.seed) for kind in (args.kind or ["spec", "incident"])]
    t = Table(title=f"fuzzed spec and incident files ({args.cases:,} cases per kind, seed {args.seed})")
    for col in ("kind", "cases", "valid", "one-line SpecError", "uncaught", "multi-line", "writes", "seconds"):
        t.add_column(col, justify="left" if col == "kind" else "right")
    for r in results:
        errors = sum(n for k, n in r["outcomes"].items() if k.startswith("SpecError"))
        t.add_row(
            r["kind"],
            f"{r['cases']:,}",
            f"{r['outcomes'].get('valid', 0):,}",
            f"{errors:,}",
            str(r["uncaught"]),
            str(r["multi_line_errors"]),
            str(r["writes"]),
            str(r["seconds"]),
        )
    console.print(t)
    for r in results:
        for u in r["first_uncaught"]:
            console.print(f"[red]uncaught ({r['kind']}):[/] {u}", highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    ok = all(
        r["cases"] >= args.cases and not r["uncaught"] and not r["multi_line_errors"] and not r["writes"]
        for r in results
    )
    return 0 if ok else 1
