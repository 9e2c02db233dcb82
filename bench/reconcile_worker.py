"""One measured step of the reconciliation benchmark, in its own process.

``recon``: the package's reconciliation (classification, partition findings, summary).
``floor``: a bare FULL OUTER JOIN diff of the same two relations (expected rows vs the
target) with DuckDB, the floor any in-engine diff has to pay.
"""

from __future__ import annotations

import sys
import time

from bench.measure import report


def main(mode: str, spec_path: str) -> None:
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.identifiers import quote
    from recovery.lib.reconcile.run import run_reconciliation
    from recovery.lib.snapshot import expected_rows_sql

    spec = load_spec(spec_path)
    t0 = time.perf_counter()
    if mode == "recon":
        summary, _ = run_reconciliation(spec, ["backfill-0042"], incident_id="BENCH")
        result = {"mode": mode, "damaged_keys": summary.damaged_keys, "labels": summary.labels}
    else:
        key = ", ".join(quote(k) for k in spec.key)
        engine = open_engine(spec.warehouse)
        with engine.session() as s:
            cols = [c for c, _ in s.columns(spec.target.table_name.sql()) if c not in (spec.target.metadata.generation, spec.target.metadata.written_at)]
            differs = " OR ".join(f"e.{quote(c)} IS DISTINCT FROM t.{quote(c)}" for c in cols if c not in spec.key)
            n = s.scalar(
                f"SELECT count(*) FROM ({expected_rows_sql(spec, None)}) e FULL OUTER JOIN {spec.target.table_name.sql()} t "
                f"USING ({key}) WHERE e.{quote(spec.key[0])} IS NULL OR t.{quote(spec.key[0])} IS NULL OR {differs}"
            )
        result = {"mode": mode, "differing_rows": n}
    result["wall_s"] = time.perf_counter() - t0
    report(result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
