"""The end-to-end benchmark runs in a small configuration, so it keeps working: ``python -m bench
recover --from DIR`` recovers a dataset this package did not ship (the small orders dataset,
composite key, string partitions), every phase through Dagster, and reports per-phase figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from recovery.lib.snapshot import expected_rows_sql
from recovery_tests.support.repaired_small import build_damaged
from recovery_tests.support.rows import present

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["contain", "evidence", "assess", "repair", "publish", "restate", "verify", "reports"]


def _bench(*args: str) -> subprocess.CompletedProcess:
    """``python -m bench ARGS`` from the repo root, as the README gives it; it must exit 0."""
    proc = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_recover_bench_runs_every_phase_on_a_small_dataset_and_reports_figures(tmp_path):
    damaged = build_damaged(tmp_path / "orders")
    figures = tmp_path / "figures.json"
    proc = _bench("recover", "--from", str(tmp_path / "orders"), "--wave-size", "5", "--json", str(figures))
    (result,) = json.loads(figures.read_text())
    assert [p["phase"] for p in result["phases"]] == PHASES
    assert all(
        p["seconds"] > 0 and 0 <= p["engine_seconds"] <= p["seconds"] and p["peak_rss_mb"] > 0 for p in result["phases"]
    )
    assert len(next(p for p in result["phases"] if p["phase"] == "repair")["run_ids"]) >= 3  # plan, canary, waves
    assert result["reports"] == ["reconciliation.html", "recovery.html", "timeline.html"]
    assert "s end to end" in proc.stdout and "engine share" in proc.stdout
    # the bench worked on a copy: the original is still damaged
    con = duckdb.connect(str(damaged.spec.warehouse.path), read_only=True)
    try:
        still_damaged = present(
            con.execute(
                f"SELECT count(*) FROM (SELECT * EXCLUDE (gen_id, landed_at) FROM mart.orders "
                f"EXCEPT ALL ({expected_rows_sql(damaged.spec, None)}))"
            ).fetchone()
        )[0]
    finally:
        con.close()
    assert still_damaged > 0


def test_fixed_cost_bench_times_a_reconcile_to_its_first_classification_statement(tmp_path):
    build_damaged(tmp_path / "orders")
    figures = tmp_path / "fixed.json"
    proc = _bench("fixed", "--from", str(tmp_path / "orders"), "--rounds", "1", "--json", str(figures))
    (run,) = json.loads(figures.read_text())["rounds"]
    # the mark lies inside the command: after its start, before its end, on both clocks
    assert 0 < run["fixed_s"] < run["total_s"] and 0 < run["fixed_s_kernel"] < run["total_s"]
    assert "fixed cost" in proc.stdout


def test_fence_bench_fences_against_a_busy_writer_process_and_reports_its_figures(tmp_path):
    """``python -m bench fence``: a writer process commits back to back while this one fences;
    every fence lands and is timed (no timing asserted: the machine is shared)."""
    figures = tmp_path / "fence.json"
    proc = _bench("fence", "--fences", "4", "--json", str(figures))
    result = json.loads(figures.read_text())
    assert result["fences"] == result["fenced"] == 4
    assert len(result["seconds"]) == 4 and all(s > 0 for s in result["seconds"])
    assert result["median_s"] <= result["max_s"] == max(result["seconds"])
    assert result["writes_during"] >= 4 and result["writer_exit"] == 0  # the writer was busy all along
    assert "fences against a busy writer" in proc.stdout and "median" in proc.stdout


def test_gates_bench_validates_each_gate_in_the_format_asked_and_refuses_a_failing_frame(capsys, monkeypatch):
    """``python -m bench gates``: the figure is per gate of the result format asked for; a gate that does
    not pass on its own frame is an error, not a timing."""
    from bench import gate_suites_bench
    from recovery.lib.repair import sql_suites

    monkeypatch.setattr(sql_suites, "RESULT_FORMAT", sql_suites.RESULT_FORMAT)  # the bench sets it; restored after
    assert gate_suites_bench.main(["--rounds", "2", "--result-format", "SUMMARY"]) == 0
    assert "2 gates, result format SUMMARY: median" in capsys.readouterr().out
    monkeypatch.setattr(
        gate_suites_bench,
        "TOTALS_SUITE",
        gate_suites_bench.Suite(
            "partition_totals",
            (gate_suites_bench.E("expect_column_pair_values_to_be_equal", {"column_A": "rows", "column_B": "total"}),),
        ),
    )
    assert gate_suites_bench.main(["--rounds", "1"]) == 1
    assert "a gate failed on the bench's own frame" in capsys.readouterr().out
