"""One measured step of the reconciliation benchmark, in its own process.

``recon``: the package's reconciliation (classification, partition findings, summary),
then (untimed) its labels per key to ``OUT`` (Parquet). On a Spark spec (the bench's ``--spark``) the
same (the JVM starts untimed, in the spec's check against the warehouse); then the JVM is stopped and its
peak RSS reported (``jvm_peak_rss_mb``).
``footprint``: the package's footprint reconciliation (the failed generation's keys and the keys held or
expected in its partition range, ``incident.yaml``'s beside the spec), its labels per key to ``OUT``.
``floor``: the single hand-written query of ``bench/floor.py``, its labels per key to ``OUT``.
``reladiff`` / ``datacompy``: peers on the diff part only (expected rows vs the target's
rows, payload and source version): reladiff's joindiff inside DuckDB, datacompy over
pandas frames read from DuckDB. They find the differing keys; they do not label them.

    python -m bench.reconcile_worker MODE SPEC GENERATIONS(comma-separated) [OUT]
"""

from __future__ import annotations

import sys
import time

from bench.measure import report

PEER_SCHEMA = "bench"


def _literal(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def _out_path(out: str | None, mode: str) -> str:
    """The output Parquet file a mode writes its keys to; the modes that write one need it."""
    if out is None:
        raise SystemExit(f"mode {mode!r} writes its keys to a Parquet file: give its path as the fourth argument")
    return out


def _out_literal(out: str | None, mode: str) -> str:
    """:func:`_out_path` as a SQL literal."""
    return _literal(_out_path(out, mode))


def payload_columns(s, spec) -> list[str]:
    meta = spec.target.metadata
    return [c for c, _ in s.columns(spec.target.table_name.sql()) if c not in (meta.generation, meta.written_at)]


def prepare_peers(spec) -> None:
    """Views the peers diff (reladiff reads tables by name from one database): ``bench.expected``
    (the spec's transform over the source's latest versions) and ``bench.actual`` (the target)."""
    from recovery.lib.engine import open_engine
    from recovery.lib.identifiers import quote
    from recovery.lib.snapshot import expected_rows_sql

    with open_engine(spec.warehouse).session() as s:
        cols = ", ".join(quote(c) for c in payload_columns(s, spec))
        s.execute(f"CREATE SCHEMA IF NOT EXISTS {PEER_SCHEMA}")
        s.execute(
            f"CREATE OR REPLACE VIEW {PEER_SCHEMA}.expected AS SELECT {cols} FROM ({expected_rows_sql(spec, None)})"
        )
        s.execute(f"CREATE OR REPLACE VIEW {PEER_SCHEMA}.actual AS SELECT {cols} FROM {spec.target.table_name.sql()}")


def incident_range(spec_path: str) -> tuple | None:
    """The backfill's partition range from ``incident.yaml`` beside the spec (the lineitem bench writes one)."""
    from pathlib import Path

    import yaml

    path = Path(spec_path).with_name("incident.yaml")
    if not path.exists():
        return None
    rng = (yaml.safe_load(path.read_text()) or {}).get("partitions")
    return (rng["start"], rng["end"]) if rng else None


def stop_jvm(engine) -> float:
    """Stop the Spark JVM this process started and return its peak RSS (MB). It is a child process, so
    the worker's own peak RSS leaves it out; once reaped, the kernel reports it as the largest child's
    peak (``RUSAGE_CHILDREN``: the JVM, or its brief launcher, are its only children)."""
    import resource

    from pyspark import SparkContext

    engine.spark().stop()
    gateway = SparkContext._gateway
    if gateway is None:
        raise RuntimeError("no Spark gateway in this process: the JVM was not started here")
    proc = gateway.proc
    proc.stdin.close()  # the JVM's gateway exits when its stdin closes
    proc.wait(timeout=120)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main(mode: str, spec_path: str, gens: str, out: str | None = None) -> None:
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.identifiers import quote_all

    spec = load_spec(spec_path)
    failed = gens.split(",")
    key = quote_all(spec.key)
    t0 = time.perf_counter()
    if mode == "recon":
        from recovery.lib.reconcile.classify import recon_table
        from recovery.lib.reconcile.run import run_reconciliation

        rng = incident_range(spec_path)
        summary, _ = run_reconciliation(spec, failed, incident_id="BENCH", partitions=rng)
        result = {
            "damaged_keys": summary.damaged_keys,
            "labels": summary.labels,
            "drift_outside_footprint": sum((summary.drift_outside_footprint or {}).values()),
        }
        wall = time.perf_counter() - t0
        engine = open_engine(spec.warehouse)
        with engine.session(read_only=True) as s:  # on Spark too: its session writes the rows as Arrow to Parquet
            table = recon_table(spec, summary.contained)
            s.export_parquet(f"SELECT {key}, label FROM {table} WHERE incident_id = 'BENCH'", _out_path(out, mode))
        if spec.warehouse.engine == "spark":
            result["jvm_peak_rss_mb"] = stop_jvm(engine)
    elif mode == "footprint":
        from recovery.lib.reconcile.classify import recon_table
        from recovery.lib.reconcile.run import run_reconciliation

        summary, _ = run_reconciliation(
            spec, failed, incident_id="BENCH-FP", full=False, partitions=incident_range(spec_path)
        )
        result = {
            "damaged_keys": summary.damaged_keys,
            "labels": summary.labels,
            "footprint_range": summary.footprint_range,
        }
        wall = time.perf_counter() - t0
        with open_engine(spec.warehouse).session(read_only=True) as s:
            table = recon_table(spec, summary.contained)
            s.export_parquet(f"SELECT {key}, label FROM {table} WHERE incident_id = 'BENCH-FP'", _out_path(out, mode))
    elif mode == "floor":
        from bench.floor import floor_sql

        with open_engine(spec.warehouse).session(read_only=True) as s:
            sql = floor_sql(spec, failed, [c for c, _ in s.columns(spec.target.table_name.sql())])
            target = _out_literal(out, mode)
            s.export_parquet(sql, _out_path(out, mode))
            wall = time.perf_counter() - t0
            result = {"damaged_keys": s.scalar(f"SELECT count(*) FROM read_parquet({target})")}
    elif mode == "reladiff":
        import reladiff

        with open_engine(spec.warehouse).session(read_only=True) as s:
            extra = tuple(c for c in payload_columns(s, spec) if c not in spec.key)
        db = {"driver": "duckdb", "filepath": str(spec.warehouse.path)}
        tables = [
            reladiff.connect_to_table(db, (PEER_SCHEMA, name), spec.key, extra_columns=extra)
            for name in ("expected", "actual")
        ]
        diff = reladiff.diff_tables(*tables, algorithm=reladiff.Algorithm.JOINDIFF, validate_unique_key=False)
        keys = {tuple(row[: len(spec.key)]) for _, row in diff}
        wall = time.perf_counter() - t0
        result = {"differing_keys": len(keys)}
    elif mode == "datacompy":
        import datacompy

        from recovery.lib.engine.duckdb_engine import duckdb_connection

        with open_engine(spec.warehouse).session(read_only=True) as s:
            expected = duckdb_connection(s).execute(f"SELECT * FROM {PEER_SCHEMA}.expected").df()
            actual = duckdb_connection(s).execute(f"SELECT * FROM {PEER_SCHEMA}.actual").df()
        cmp = datacompy.Compare(expected, actual, join_columns=spec.key)
        n = len(cmp.df1_unq_rows) + len(cmp.df2_unq_rows.drop_duplicates(subset=spec.key)) + len(cmp.all_mismatch())
        wall = time.perf_counter() - t0
        result = {"differing_keys": n}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    report({"mode": mode, **result, "wall_s": wall})


if __name__ == "__main__":
    main(*sys.argv[1:])
