"""The footprint is the default, and it changes no answer: an incident that names its failed
generations is reconciled on their footprint, and the phases that read the reconciliation (impact,
the decision, the repair plan, the published table) give what a whole-table run (``--full``) gives.

Each dataset is recovered twice from the same failed state through the CLI, ``recovery recover``
(the footprint, the default) and ``recovery recover --full``, and the two warehouses are compared
key by key: the worked example (the package's own tables) and the shipments mart another tool
wrote. Neither holds damage outside its backfill's footprint, so the labels must be the same set.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from recovery.lib.consumers.impact import impact_table
from recovery.lib.control.plane import SCHEMA, dataset_table
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.incident.model import parse_incident
from recovery.lib.reconcile.inputs import recon_table
from recovery_tests.support.example_build import copy_dataset
from recovery_tests.support.foreign_warehouse import build_shipments, cli, fresh_copy

pytestmark = pytest.mark.slow


def _recover_both_ways(root: Path, tmp_path: Path, home: Path | None) -> dict[str, Path]:
    """``recover`` on two copies of ``root``: the default scope and ``--full``; their spec paths."""
    specs = {}
    for scope, extra in (("footprint", ()), ("full", ("--full",))):
        dest = tmp_path / scope
        spec_path = copy_dataset(root, dest / "dataset")
        own_home = dest / "home"
        if home is not None:  # the instance that ran the backfill: Dagster knows its runs and partitions
            shutil.copytree(home, own_home, ignore=shutil.ignore_patterns("*.log"))
        r = cli(own_home, "recover", "--incident", str(spec_path.with_name("incident.yaml")), *extra)
        assert r.code == 0, r.out
        specs[scope] = spec_path
    return specs


def _rows(spec_path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(parse_spec(spec_path).warehouse.path), read_only=True)
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


def _columns(spec_path: Path, table: str, *, leave_out: set[str]) -> str:
    """The table's columns that say what was found, not when or by which run."""
    con = duckdb.connect(str(parse_spec(spec_path).warehouse.path), read_only=True)
    try:
        described = con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()
    finally:
        con.close()
    keep = [c for c, t, *_ in described if c not in leave_out and not t.startswith("TIMESTAMP") and "run_id" not in c]
    return ", ".join(f'"{c}"' for c in keep)


def _summary(spec_path: Path) -> dict:
    incident = parse_incident(spec_path.with_name("incident.yaml"))
    return json.loads((incident.reports_dir(incident.load_spec()) / "summary.json").read_text())


def _assert_same_answers(specs: dict[str, Path]) -> None:
    spec: DatasetSpec = parse_spec(specs["full"])
    footprint, full = _summary(specs["footprint"]), _summary(specs["full"])
    assert footprint["scope"] == "footprint" and full["scope"] == "full"
    assert not sum((full.get("drift_outside_footprint") or {}).values())  # else the two could not agree
    assert footprint["damaged_keys"] == full["damaged_keys"] > 0
    assert footprint["labels"] == full["labels"]

    key = ", ".join(f'"{k}"' for k in spec.key)
    labels = f"SELECT {key}, label, differing_columns FROM {recon_table(spec)}"
    assert _rows(specs["footprint"], labels) == _rows(specs["full"], labels)

    impact = impact_table(spec)
    cols = _columns(specs["full"], impact, leave_out={"incident_id"})
    assert _rows(specs["footprint"], f"SELECT {cols} FROM {impact}") == _rows(
        specs["full"], f"SELECT {cols} FROM {impact}"
    )

    plan = (
        f"SELECT partition, wave, action, labels, rows_before, rows_expected, total_expected, rows_after, status "
        f"FROM {SCHEMA}.repair_partitions"
    )
    planned = _rows(specs["full"], plan)
    assert planned and _rows(specs["footprint"], plan) == planned
    status = f"SELECT status FROM {SCHEMA}.repair_plans"
    assert _rows(specs["footprint"], status) == _rows(specs["full"], status) == [("published",)]

    meta = spec.target.metadata
    stamps = {meta.written_at, meta.generation}  # when and by which run; the content must be equal
    public = spec.target.table_name.sql()
    cols = _columns(specs["full"], public, leave_out=stamps)
    published = f"SELECT {cols} FROM {public}"
    assert _rows(specs["footprint"], published) == _rows(specs["full"], published)

    ledger = dataset_table("restatement_ledger", spec.dataset)
    cols = _columns(specs["full"], ledger, leave_out={"incident_id"})
    assert _rows(specs["footprint"], f"SELECT {cols} FROM {ledger}") == _rows(
        specs["full"], f"SELECT {cols} FROM {ledger}"
    )


def test_the_worked_example_recovered_on_its_footprint_gives_the_whole_table_answers(failed_example, tmp_path):
    specs = _recover_both_ways(failed_example.root, tmp_path, failed_example.dagster_home)
    _assert_same_answers(specs)


def test_the_shipments_mart_recovered_on_its_footprint_gives_the_whole_table_answers(shared_dir, tmp_path):
    root = fresh_copy(build_shipments(shared_dir), tmp_path / "built")
    specs = _recover_both_ways(root, tmp_path, None)
    _assert_same_answers(specs)
