"""``python -m bench gates [--result-format BASIC] [--rounds 30]``: one gate's Great Expectations
validations, as ``evaluate_gates`` runs them, over a small frame in one DuckDB connection: the built-in
row suites (not null, copies between 1 and 1, in set twice) and the partition totals (two column pairs).

What it isolates is GE's own cost per validation (metric graph, result formatting), which a recovery
pays at every wave and candidate gate whatever the data's size; ``farm-bench --vs`` compares result
formats as two processes."""

from __future__ import annotations

import argparse
import statistics
import time

import duckdb

from recovery.lib.repair import sql_suites
from recovery.lib.repair.gates import partition_suite
from recovery.lib.repair.suites import Expectation, Suite

E = Expectation
ROW_SUITES = [
    Suite(
        "repair_keys",
        (
            E("expect_column_values_to_not_be_null", {"column": "k"}),
            E("expect_column_values_to_be_between", {"column": "__key_copies", "min_value": 1, "max_value": 1}),
        ),
    ),
    Suite("repair_fencing", (E("expect_column_values_to_be_in_set", {"column": "__fenced", "value_set": [False]}),)),
    Suite(
        "repair_tombstones",
        (E("expect_column_values_to_be_in_set", {"column": "__tombstoned", "value_set": [False]}),),
    ),
]
TOTALS_SUITE = partition_suite()  # the gate's own suite, so the bench follows it when it changes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gates", description=__doc__)
    parser.add_argument("--result-format", default=sql_suites.RESULT_FORMAT, help="GE result format (default: ours)")
    parser.add_argument("--rounds", type=int, default=30, help="gates to validate (3 more first, not counted)")
    args = parser.parse_args(argv)
    sql_suites.RESULT_FORMAT = args.result_format
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE frame AS SELECT range % 1000 AS k, 1 AS __key_copies, false AS __fenced, "
        "false AS __tombstoned FROM range(5000)"
    )
    con.execute(
        "CREATE TABLE totals AS SELECT 'p' || range AS part, 10 AS rows, 10 AS reference_rows, "
        "5.0 AS total, 5.0 AS reference_total FROM range(20)"
    )
    seconds = []
    for i in range(args.rounds + 3):
        t0 = time.perf_counter()
        runner = sql_suites.SqlSuiteRunner(con, [*ROW_SUITES, TOTALS_SUITE])
        results = runner.validate("SELECT * FROM frame", ROW_SUITES) | runner.validate(
            "SELECT * FROM totals", [TOTALS_SUITE]
        )
        if not all(r.passed for r in results.values()):
            print("a gate failed on the bench's own frame:", [r.describe() for r in results.values()])
            return 1
        if i >= 3:
            seconds.append(time.perf_counter() - t0)
    print(
        f"{args.rounds} gates, result format {args.result_format}: median {statistics.median(seconds) * 1e3:.0f} ms "
        f"per gate (min {min(seconds) * 1e3:.0f}, max {max(seconds) * 1e3:.0f})"
    )
    return 0
