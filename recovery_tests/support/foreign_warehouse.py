"""The second dataset: a shipments mart another tool wrote (``sample_data/shipments``).

Its generator imports nothing from ``recovery``; it is loaded here by path, built
once per test session under a file lock, and copied by each test that changes it.
The CLI is driven in process through ``recovery.cli.main``, exactly the commands a
new user types, against a Dagster instance of the test's own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd
from filelock import FileLock
from rich.console import Console

from recovery.config import PROJECT_ROOT
from recovery_tests.support.example_build import env
from recovery_tests.support.rows import present

SHIPMENTS_DIR = PROJECT_ROOT / "sample_data" / "shipments"
KEY = ["carrier_code", "tracking_no"]


def generator():
    spec = present(
        importlib.util.spec_from_file_location("shipments_build_warehouse", SHIPMENTS_DIR / "build_warehouse.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    present(spec.loader).exec_module(module)
    return module


def build_shipments(shared: Path) -> Path:
    """The built dataset folder (spec, incident, SQL, warehouse.duckdb, truth/), built once per session."""
    root = shared / "shipments"
    with FileLock(str(shared / "shipments.lock")):
        if not (root / "truth" / "labels.parquet").exists():
            generator().build(root, shipments=3000)
    return root


def fresh_copy(built: Path, dest: Path) -> Path:
    shutil.copytree(built, dest, ignore=shutil.ignore_patterns("evidence", "reports", "*.lock"))
    return dest


@dataclass
class CliResult:
    code: int
    out: str


def cli(home: Path, *argv: str) -> CliResult:
    """Run ``recovery ARGV`` in process (what a user types), with the test's own Dagster instance."""
    import recovery.cli

    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False)
    with env(DAGSTER_HOME=str(home), RECOVERY_LOG_DIR=str(home / "logs")):
        code = recovery.cli.main(list(argv), console=console)
    return CliResult(code, buf.getvalue())


def labels_vs_truth(parquet: Path, root: Path) -> pd.DataFrame:
    """Keys whose label differs from the independently computed truth (empty when exact)."""
    got = pd.read_parquet(parquet)[KEY + ["label"]]
    truth = pd.read_parquet(root / "truth" / "labels.parquet")
    m = got.merge(truth, on=KEY, how="outer", suffixes=("_got", "_truth"))
    return m[m["label_got"].fillna("") != m["label_truth"].fillna("")]


def published_vs_truth(root: Path) -> int:
    """Rows of the public name that differ from the truth's expected rows, both ways."""
    con = duckdb.connect(str(root / "warehouse.duckdb"), read_only=True)
    try:
        pub = con.execute(
            "SELECT carrier_code, tracking_no, ship_month, weight_kg, CAST(cost_usd AS DOUBLE) AS cost_usd, "
            "service, src_rev FROM mart.shipments"
        ).df()
    finally:
        con.close()
    exp = pd.read_parquet(root / "truth" / "expected.parquet")
    cols = list(exp.columns)
    diff = pub[cols].merge(exp, how="outer", indicator=True)
    return int((diff["_merge"] != "both").sum())


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
