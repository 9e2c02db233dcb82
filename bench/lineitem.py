"""The reconcile bench's dataset: a TPC-H ``lineitem`` table (tpchgen-cli) damaged by a failed backfill.

``lineitem`` becomes a source change log (one upsert per line, later updates, tombstones
and late lines), a spec (key ``l_orderkey, l_linenumber``; partition ``ship_month``, a
DATE), and a target written only through the package's writer: daily incremental
loads, then a history backfill ``bf-lineitem`` over 8 of the ~84 months that goes
wrong while ingestion keeps running:

- it reads a snapshot four days old (``stale``; ``overwritten`` where a concurrent load
  had already written the newer version before its partition write clobbered it);
- it takes each key's latest *upsert*, ignoring tombstones (``resurrected``);
- month 2 drops tax from ``net_amount`` for some lines (``incorrectly_transformed``);
- month 3 drops some lines (``deleted``) and month 4 appends some twice (``duplicate``);
- month 6 re-applies the earlier version of updated lines after the latest (``out_of_order``);
- month 7 unions test lines that never were in the source (``unexpected``);
- month 8 files some lines in the next month (``mispartitioned``);
- lines first reported after it started are wiped by its later partition writes (``missing``).

Which label each key gets is what the package says; the bench's single-query floor
(``bench/floor.py``) must say the same for every key.

    python -m bench.lineitem --rows 20000 --out /tmp/li   # build one (the bench builds its own, cached)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from recovery.lib.write.writer import WriteMode

LINEITEM_SF1 = 6_001_215  # lineitem rows at scale factor 1
DATASET = "lineitem"
FAILED = "bf-lineitem"
INCIDENT = "INC-LINEITEM"
SOURCE = "raw.lineitem_changes"
TARGET = "mart.lineitem"
MONTHS = [f"1995-{m:02d}-01" for m in range(1, 9)]  # the backfill's range: 8 of the ~84 months
T0 = datetime(2025, 1, 1)
BF_START = datetime(2025, 1, 15)
BF_SNAPSHOT = datetime(2025, 1, 11)  # the outdated snapshot the backfill read
# a cached dataset of another build is rebuilt. 2: the concurrent halving of l_discount stays DECIMAL(15, 2)
# (DuckDB divides a DECIMAL into a DOUBLE, which made the column DOUBLE, and a transform that rounds a
# DOUBLE rounds half-cent ties one way on DuckDB and the other on Spark: 13,720 keys of 6M differed)
BUILD = 2

TRANSFORM = """\
-- one row per live line item: net amount with discount and tax, filed by ship month
SELECT
    l_orderkey,
    l_linenumber,
    CAST(date_trunc('month', l_shipdate) AS DATE) AS ship_month,
    l_partkey,
    l_suppkey,
    l_quantity,
    l_extendedprice,
    l_discount,
    l_tax,
    CAST(round(l_extendedprice * (1 - l_discount) * (1 + l_tax), 2) AS DECIMAL(15, 2)) AS net_amount,
    l_returnflag,
    l_linestatus,
    l_shipdate,
    l_shipmode
FROM {{ source }}
"""


def spec_doc(memory_limit: str | None) -> dict:
    wh = {"engine": "duckdb", "path": "warehouse.duckdb"}
    if memory_limit:
        wh["memory_limit"] = memory_limit
    return {
        "dataset": DATASET,
        "warehouse": wh,
        "source": {
            "table": SOURCE,
            "key": ["l_orderkey", "l_linenumber"],
            "version": "version",
            "op": "op",
            "ingested_at": "ingested_at",
        },
        "target": {"table": TARGET, "partition": "ship_month", "transform": "lineitem.sql", "amount": "net_amount"},
    }


def generate_lineitem(rows: int, cache: Path) -> Path:
    """A lineitem Parquet file with at least ``rows`` rows (tpchgen-cli; cached per scale factor)."""
    sf = max(0.01, math.ceil(rows / LINEITEM_SF1 * 100 * 1.001) / 100)
    out = cache / f"tpch-sf{sf:g}"
    path = out / "lineitem.parquet"
    if not path.exists():
        exe = Path(sys.executable).with_name("tpchgen-cli")
        if not exe.exists():
            raise SystemExit("tpchgen-cli is not installed: pip install -c constraints.txt -e '.[bench]'")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [str(exe), "parquet", "-s", f"{sf:g}", "--tables", "lineitem", "-o", str(out)],
            check=True,
            capture_output=True,
        )
    return path


def source_sql(parquet: Path, rows: int) -> str:
    """The change log: every line's insert, then updates, tombstones and late lines (deterministic buckets)."""
    p = str(parquet).replace("'", "''")
    at = lambda ts: f"TIMESTAMP '{ts.isoformat(sep=' ')}'"  # noqa: E731
    return f"""
    WITH base AS (SELECT *, (l_orderkey * 31 + l_linenumber) % 1000 AS b FROM read_parquet('{p}') LIMIT {int(rows)}),
    v1 AS (SELECT * EXCLUDE (b), 1 AS version, 'upsert' AS op,
                  {at(T0)} + to_seconds((b * 7919) % (9 * 86400)) AS ingested_at FROM base),
    early AS (SELECT * EXCLUDE (b) REPLACE (l_quantity + 1 AS l_quantity), 2 AS version, 'upsert' AS op,
                     {at(T0 + timedelta(days=9, hours=12))} + to_seconds(b) AS ingested_at FROM base WHERE b % 100 < 5),
    tomb AS (SELECT * EXCLUDE (b), 2 AS version, 'delete' AS op,
                    {at(T0 + timedelta(days=9, hours=18))} + to_seconds(b) AS ingested_at FROM base
                        WHERE b % 100 IN (5, 6)),
    prior AS (SELECT * EXCLUDE (b) REPLACE (CAST(l_extendedprice * 1.01 AS DECIMAL(15, 2)) AS l_extendedprice),
        2 AS version,
                     'upsert' AS op, {at(T0 + timedelta(days=11, hours=9))} + to_seconds(b) AS ingested_at
              FROM base WHERE b % 100 BETWEEN 7 AND 11),
    concurrent AS (SELECT * EXCLUDE (b) REPLACE (CAST(l_discount / 2 AS DECIMAL(15, 2)) AS l_discount), 2 AS version,
        'upsert' AS op,
                          {at(BF_START + timedelta(hours=1))} + to_seconds(b) AS ingested_at FROM base
                              WHERE b % 100 BETWEEN 12 AND 15),
    late AS (SELECT * EXCLUDE (b) REPLACE (l_linenumber + 10 AS l_linenumber), 1 AS version, 'upsert' AS op,
                    {at(BF_START + timedelta(hours=1, minutes=30))} + to_seconds(b) AS ingested_at FROM base
                        WHERE b % 100 = 99)
    SELECT * FROM v1 UNION ALL SELECT * FROM early UNION ALL SELECT * FROM tomb UNION ALL SELECT * FROM prior
    UNION ALL SELECT * FROM concurrent UNION ALL SELECT * FROM late
    """


def _backfill_rows(spec, month: str, i: int) -> list[tuple[WriteMode, str]]:
    """The failed backfill's writes for its ``i``-th month, as (mode, rows SQL)."""
    from recovery.lib.snapshot import expected_rows_sql, ts_literal

    def snap(rank: int) -> str:
        return (
            f"SELECT * EXCLUDE (__rn) FROM (SELECT *, row_number() OVER (PARTITION BY l_orderkey, l_linenumber "
            f"ORDER BY version DESC) AS __rn FROM {SOURCE} WHERE op = 'upsert' AND ingested_at <= "
            f"{ts_literal(BF_SNAPSHOT)}) WHERE __rn = {rank}"
        )

    bucket = "(l_orderkey * 31 + l_linenumber) % 1000 % 100"
    rows = f"SELECT * FROM ({expected_rows_sql(spec, None, source_relation=snap(1))}) WHERE ship_month = DATE '{month}'"
    if i == 1:
        rows = (
            f"SELECT * REPLACE (CASE WHEN {bucket} BETWEEN 20 AND 39 "
            "THEN CAST(round(l_extendedprice * (1 - l_discount), 2) "
            f"AS DECIMAL(15, 2)) ELSE net_amount END AS net_amount) FROM ({rows})"
        )
    if i == 2:
        rows = f"SELECT * FROM ({rows}) WHERE {bucket} NOT BETWEEN 40 AND 42"
    if i == 7:
        rows = (
            f"SELECT * REPLACE (CASE WHEN {bucket} BETWEEN 45 AND 47 THEN CAST(ship_month + INTERVAL 1 MONTH AS DATE) "
            f"ELSE ship_month END AS ship_month) FROM ({rows})"
        )
    if i == 6:
        rows = (
            f"SELECT * FROM ({rows}) UNION ALL SELECT * REPLACE (-l_orderkey AS l_orderkey) FROM ({rows}) "
            f"WHERE {bucket} = 50 AND l_linenumber = 1"
        )
    writes: list[tuple[WriteMode, str]] = [("replace_partitions", rows)]
    if i == 3:
        writes.append(("append", f"SELECT * FROM ({rows}) WHERE {bucket} IN (43, 44)"))
    if i == 5:
        earlier = expected_rows_sql(spec, None, source_relation=snap(2))
        writes.append(("upsert_keys", f"SELECT * FROM ({earlier}) WHERE ship_month = DATE '{month}'"))
    return writes


def build(root: Path, rows: int, *, memory_limit: str | None = "3GB", cache: Path | None = None) -> Path:
    """Build the damaged lineitem warehouse in ``root`` (cached: a built root is reused); returns its spec path."""
    import duckdb

    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.write.ingest import apply_changes
    from recovery.lib.write.writer import Writer

    spec_path = root / "spec.yaml"
    built = root / "built.json"
    if built.exists() and json.loads(built.read_text()).get("build") == BUILD:
        return spec_path
    t0 = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    parquet = generate_lineitem(rows, cache or root)
    con = duckdb.connect(str(root / "warehouse.duckdb"))
    try:
        if memory_limit:
            con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute("CREATE SCHEMA raw; CREATE SCHEMA mart")
        con.execute(f"CREATE TABLE {SOURCE} AS SELECT * FROM ({source_sql(parquet, rows)}) ORDER BY ingested_at")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    (root / "lineitem.sql").write_text(TRANSFORM)
    spec_path.write_text(yaml.safe_dump(spec_doc(memory_limit), sort_keys=False))
    (root / "incident.yaml").write_text(
        yaml.safe_dump(
            {
                "incident_id": INCIDENT,
                "spec": "spec.yaml",
                "failed_generations": [FAILED],
                "partitions": {"start": MONTHS[0], "end": MONTHS[-1]},
                "requested_by": "bench",
                "approved_by": ["bench"],
            },
            sort_keys=False,
        )
    )
    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="bench")
    writer.ensure()
    day = timedelta(days=1)

    def ingest(n: int, until: datetime) -> None:
        writer.register_generation(f"ingest-{n}", "ingest", started_at=until)
        apply_changes(writer, f"ingest-{n}", until=until, at=until + timedelta(minutes=5))
        writer.set_status(f"ingest-{n}", "succeeded", ended_at=until + timedelta(minutes=5))

    for n, until in enumerate([T0 + 10 * day, T0 + 11 * day, T0 + 12 * day, T0 + 13 * day], start=1):
        ingest(n, until)
    writer.register_generation(
        FAILED, "backfill", started_at=BF_START, source_watermark=BF_SNAPSHOT, note="history backfill"
    )
    for i, month in enumerate(MONTHS):
        at = BF_START + timedelta(minutes=30 * (i + 1))
        if i == 4:  # the incremental load that runs meanwhile: the concurrent updates and the late lines
            ingest(5, BF_START + timedelta(hours=2))
        for mode, sql in _backfill_rows(spec, month, i):
            writer.write(
                FAILED,
                sql,
                mode=mode,
                at=at,
                partitions=[month] if mode == "replace_partitions" else None,
                note=f"{month} {mode}",
                allow_duplicate_keys=True,
            )  # the faulty backfill's damage
    writer.set_status(FAILED, "failed", ended_at=BF_START + timedelta(hours=5))
    with open_engine(spec.warehouse).session() as s:
        s.execute("CHECKPOINT")
    (root / "built.json").write_text(
        json.dumps({"rows": rows, "build": BUILD, "build_s": round(time.perf_counter() - t0, 1)})
    )
    return spec_path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.lineitem")
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--memory-limit", default="3GB")
    a = ap.parse_args()
    print(build(a.out, a.rows, memory_limit=a.memory_limit))
