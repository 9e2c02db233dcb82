"""The published export's tests and bench: the small dataset in two generations, and an outside reader."""

from __future__ import annotations

import duckdb

from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.writer import Writer
from recovery_tests.support.rows import present
from recovery_tests.support.small_dataset import build_small_dataset


def two_generations(root):
    """The small dataset published as g-a, plus g-b (every qty + 1000) in its own namespace."""
    spec = load_spec(build_small_dataset(root))
    w = Writer(open_engine(spec.warehouse), spec)
    w.ensure()
    namespaces = {}
    for gen, bump in (("g-a", 0), ("g-b", 1000)):
        namespaces[gen] = w.register_generation(gen, "repair", own_namespace=True)
        w.write(gen, f"SELECT * REPLACE (qty + {bump} AS qty) FROM ({expected_rows_sql(spec, None)})", mode="append")
    return spec, w, namespaces


def read_export(path: str, out: dict) -> None:
    """An outside reader (a BI tool): opens the export's catalog read-only for every read."""
    while not out["stop"].is_set():
        try:
            con = duckdb.connect(path, read_only=True)
            try:
                gens, rows, low = present(
                    con.execute("SELECT count(DISTINCT gen_id), count(*), min(qty) FROM orders").fetchone()
                )
            finally:
                con.close()
            out["reads"] += 1
            if gens != 1 or rows != out["rows"] or not (low < 1000 or low > 1000):
                out["mixed"] += 1
        except Exception as err:  # noqa: BLE001 - every error is an observation
            out["errors"].append(repr(err)[:200])
