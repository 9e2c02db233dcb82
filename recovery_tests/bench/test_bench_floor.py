"""The reconcile bench's floor (one hand-written query) labels every key as the package does.

The benchmark compares the package with that floor and fails when they disagree; this is
the same check in miniature (20k TPC-H lineitem rows, every damage kind the bench's failed
backfill makes), so a change to the classification that the floor does not follow, or the
reverse, fails here first. No time is measured.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench import lineitem
from bench.floor import floor_sql
from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.reconcile.classify import recon_table
from recovery.lib.reconcile.labels import DAMAGE_LABELS
from recovery.lib.reconcile.run import run_reconciliation

pytestmark = pytest.mark.skipif(
    not Path(sys.executable).with_name("tpchgen-cli").exists(), reason="tpchgen-cli (the bench extra) is not installed"
)


def test_floor_assigns_the_package_labels_key_by_key(tmp_path):
    spec_path = lineitem.build(tmp_path / "li", 20_000, memory_limit="1GB", cache=tmp_path)
    spec = load_spec(spec_path)
    summary, _ = run_reconciliation(spec, [lineitem.FAILED], incident_id="T")
    # every damage kind the bench's backfill makes is there, so the floor is checked on each
    assert set(summary.labels) == set(DAMAGE_LABELS)
    key = ", ".join(spec.key)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        floor = floor_sql(spec, [lineitem.FAILED], [c for c, _ in s.columns(spec.target.table_name.sql())])
        differ = s.fetchall(
            f"SELECT p.label, f.label, count(*) FROM (SELECT {key}, label FROM {recon_table(spec)} "
            "WHERE incident_id = 'T') p "
            f"FULL OUTER JOIN ({floor}) f USING ({key}) WHERE p.label IS DISTINCT FROM f.label GROUP BY ALL"
        )
        assert s.scalar(f"SELECT count(*) FROM ({floor})") == summary.damaged_keys
    assert differ == []
    shutil.rmtree(tmp_path / "li")


def test_bench_fails_naming_the_labels_when_the_floor_disagrees(tmp_path):
    import duckdb

    from bench.reconcile_bench import disagreements

    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * FROM (VALUES (1, 1, 'stale'), (1, 2, 'deleted'), (2, 1, 'duplicate')) v(a, b, label)) "
        f"TO '{tmp_path / 'p.parquet'}' (FORMAT parquet)"
    )
    con.execute(
        f"COPY (SELECT * FROM (VALUES (1, 1, 'overwritten'), (2, 1, 'duplicate'), (3, 1, 'missing')) v(a, b, label)) "
        f"TO '{tmp_path / 'f.parquet'}' (FORMAT parquet)"
    )
    con.close()
    assert sorted(disagreements(tmp_path / "p.parquet", tmp_path / "f.parquet", ["a", "b"])) == [
        ("-", "missing", 1),
        ("deleted", "-", 1),
        ("stale", "overwritten", 1),
    ]


def test_the_whole_command_bench_checks_both_runs_against_the_floor_key_by_key(tmp_path):
    """``python -m bench whole`` in miniature: the floor as its own process, ``recovery reconcile`` whole and
    by default after ``recovery contain``, labels compared every round. No time is asserted."""
    from rich.console import Console

    from bench.whole_command_bench import measure

    spec_path = lineitem.build(tmp_path / "li", 20_000, memory_limit="1GB", cache=tmp_path)
    row = measure("lineitem 20k", spec_path, 1, Console(quiet=True), after_contain=True)
    assert row["damaged_keys"]["full"] == row["damaged_keys"]["default"] > 0
    assert set(row["all_rounds"]) == {"floor", "full", "default"}
    assert all(row["peak_mb"][m] > 0 for m in ("floor", "full", "default"))
    assert (tmp_path / "li-contained" / "done").exists()  # reconciled where `recovery contain` ran first
