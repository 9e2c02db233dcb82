"""The shipments mart as a lakehouse table: a Delta Lake or Apache Iceberg history of commits.

This stands in for a team whose tables live in a lakehouse. It imports nothing from
``recovery``; it takes the carrier change log, the team's transform and the faulty
backfill from ``build_warehouse.py`` beside it, and writes:

- ``lake/shipment_events``: the change log (one table, one commit);
- ``lake/shipments``: the mart, written by the team's own loads as one commit each (a
  load every 30 days until June 30, daily until July 4, then every six hours), every commit overwriting the
  partitions it changed and carrying the load's id, time and job in its commit
  properties (Delta commit info, Iceberg snapshot summary); the rows carry them too;
- the failed backfill ``bf-0007`` as separate commits, one per partition it wrote, plus a
  retry of 2013-01 an hour after its first write that re-applies the previous revision of
  every 29th tracking number it had just written at its latest (``out_of_order``).

No run registry is written: the table's own history is the only record of the writes.
The ground truth comes from the simulation's own history, into ``truth/``.

    python build_lakehouse.py OUT_DIR --format delta|iceberg
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("shipments_build_warehouse", HERE / "build_warehouse.py")
base = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = base  # its dataclasses resolve their annotations through sys.modules
_spec.loader.exec_module(base)

KEY, BACKFILL = base.KEY, base.BACKFILL
SCHEDULE = [(datetime(2013, 6, 30), timedelta(days=30)), (datetime(2013, 7, 4), timedelta(days=1))]
"""Until each date, a load every so often; after the last, every ``LOAD_EVERY`` (six hours)."""
RETRY_AT = base.BACKFILL_START + timedelta(hours=1)
RETRY_MONTH, RETRY_EVERY = "2013-01", 29
SCHEMA = pa.schema(
    [
        ("carrier_code", pa.string()),
        ("tracking_no", pa.int64()),
        ("ship_month", pa.string()),
        ("weight_kg", pa.float64()),
        ("cost_usd", pa.decimal128(12, 2)),
        ("service", pa.string()),
        ("load_id", pa.string()),
        ("src_rev", pa.int32()),
        ("loaded_at", pa.timestamp("us")),
    ]
)
EVENTS_SCHEMA = pa.schema(
    [
        ("carrier_code", pa.string()),
        ("tracking_no", pa.int64()),
        ("rev", pa.int32()),
        ("change", pa.string()),
        ("shipped_on", pa.date32()),
        ("weight_g", pa.int32()),
        ("cost_cents", pa.int64()),
        ("service", pa.string()),
        ("arrived_at", pa.timestamp("us")),
    ]
)


@dataclass
class TrackedMart(base.Mart):
    """The mart, remembering which partitions changed since the last commit."""

    touched: set = field(default_factory=set)

    def put(self, key, row: dict, load_id: str, at: datetime, *, replace: bool = True) -> None:
        self.touched |= {r["ship_month"] for r in self.rows.get(key, [])} | {row["ship_month"]}
        super().put(key, row, load_id, at, replace=replace)

    def drop(self, key, load_id: str, at: datetime) -> None:
        self.touched |= {r["ship_month"] for r in self.rows.get(key, [])}
        super().drop(key, load_id, at)

    def partitions(self, months: set) -> pa.Table:
        rows = [r for rs in self.rows.values() for r in rs if r["ship_month"] in months]
        df = pd.DataFrame(rows, columns=[f.name for f in SCHEMA])
        df["cost_usd"] = df["cost_usd"].map(lambda v: None if pd.isna(v) else base_decimal(v))
        return pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False)


def base_decimal(v):
    from decimal import ROUND_HALF_EVEN, Decimal

    return Decimal(str(round(float(v), 2))).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)


class DeltaWriter:
    def __init__(self, root: Path):
        self.lake = root / "lake"

    def events(self, ev: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(str(self.lake / "shipment_events"), ev)

    def commit(self, data: pa.Table, months: set, props: dict) -> None:
        from deltalake import CommitProperties, write_deltalake

        path = str(self.lake / "shipments")
        listed = ", ".join(f"'{m}'" for m in sorted(months))
        first = not (self.lake / "shipments" / "_delta_log").exists()
        write_deltalake(
            path,
            data,
            mode="append" if first else "overwrite",
            predicate=None if first else f"ship_month IN ({listed})",
            partition_by=["ship_month"],
            commit_properties=CommitProperties(custom_metadata=props),
        )


class IcebergWriter:
    def __init__(self, root: Path):
        from pyiceberg.catalog.sql import SqlCatalog

        (root / "lake" / "warehouse").mkdir(parents=True, exist_ok=True)
        self.catalog = SqlCatalog(
            "lake", uri=f"sqlite:///{root / 'lake' / 'catalog.db'}", warehouse=(root / "lake" / "warehouse").as_uri()
        )
        for ns in ("raw", "mart"):
            self.catalog.create_namespace_if_not_exists(ns)
        self.table = None

    def events(self, ev: pa.Table) -> None:
        self.catalog.create_table("raw.shipment_events", schema=EVENTS_SCHEMA).append(ev)

    def commit(self, data: pa.Table, months: set, props: dict) -> None:
        from pyiceberg.expressions import In

        if self.table is None:
            self.table = self.catalog.create_table("mart.shipments", schema=SCHEMA)
            with self.table.update_spec() as spec:
                spec.add_identity("ship_month")
            self.table.append(data, snapshot_properties=props)
            return
        self.table.overwrite(data, overwrite_filter=In("ship_month", sorted(months)), snapshot_properties=props)


def retry(mart: TrackedMart, ev: pd.DataFrame, at: datetime) -> None:
    """The backfill's retry of 2013-01: the previous revision of keys it had just written at revision >= 2."""
    snap = base.latest(ev[ev["change"] != "D"], base.BACKFILL_SNAPSHOT)
    done = snap[(snap["rev"] >= 2) & (snap["tracking_no"] % RETRY_EVERY == 0)]
    prev = ev.merge(done[KEY + ["rev"]].assign(rev=done["rev"] - 1), on=KEY + ["rev"])
    rows = base.transform(prev)
    rows = rows[rows["ship_month"] == RETRY_MONTH]
    for key, row in zip(rows[KEY].itertuples(index=False, name=None), rows.to_dict("records"), strict=True):
        if key in mart.rows:
            mart.put(key, row, BACKFILL, at)


def simulate(ev: pd.DataFrame, writer) -> tuple[TrackedMart, dict]:
    mart = TrackedMart()
    held_at_start = None

    def commit(load_id: str, at: datetime, job: str) -> None:
        if mart.touched:
            writer.commit(
                mart.partitions(mart.touched),
                mart.touched,
                {"load_id": load_id, "loaded_at": at.isoformat(), "job": job},
            )
            mart.touched = set()

    writes = sorted((base.BACKFILL_START + timedelta(hours=h), m) for m, h in base.BACKFILL_WRITES.items())
    writes.append((RETRY_AT, "retry"))
    writes.sort()
    t, n = base.START, 0
    while t < base.END:
        until, step = next(((u, st) for u, st in SCHEDULE if t < u), (base.END, base.LOAD_EVERY))
        nxt = min(t + step, until)
        while writes and writes[0][0] < nxt:
            at, month = writes.pop(0)
            if held_at_start is None:
                held_at_start = set(mart.rows)
            if month == "retry":
                retry(mart, ev, at)
            else:
                base.backfill_partition(mart, ev, month, at)
            commit(BACKFILL, at, "backfill")
        n += 1
        load_id = f"inc-{n:05d}"
        base.incremental_load(mart, ev, load_id, t, nxt, nxt + base.LOAD_TAKES)
        commit(load_id, nxt + base.LOAD_TAKES, "incremental")
        t = nxt
    return mart, {"held_at_start": held_at_start}


def truth(ev: pd.DataFrame, mart: TrackedMart, facts: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``build_warehouse.truth``'s labels, with ``out_of_order`` (second in the vocabulary's order): the
    key's one row was written by the backfill after the backfill had already written a newer revision."""
    expected, labels = base.truth(ev, mart, facts)
    reordered = set()
    for key, rows in mart.rows.items():
        if len(rows) != 1 or rows[0]["load_id"] != BACKFILL:
            continue
        t = rows[0]
        if any(
            g == BACKFILL and a == "put" and v is not None and v > t["src_rev"] and at < t["loaded_at"]
            for k, g, v, at, a in mart.log
            if k == key
        ):
            reordered.add(key)
    keys = set(zip(labels["carrier_code"], labels["tracking_no"], strict=True))
    extra = [{"carrier_code": k[0], "tracking_no": k[1], "label": "out_of_order"} for k in reordered - keys]
    labels["label"] = [
        "out_of_order" if (c, t) in reordered and lab != "duplicate" else lab
        for c, t, lab in zip(labels["carrier_code"], labels["tracking_no"], labels["label"], strict=True)
    ]
    return expected, pd.concat([labels, pd.DataFrame(extra, columns=labels.columns)], ignore_index=True)


def build(out: Path, *, fmt: str = "delta", shipments: int = 3000, seed: int = 7) -> Path:
    """Write ``OUT/lake/`` (the tables), ``OUT/spec.yaml`` and ``incident.yaml``, ``OUT/truth/``."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "lake", ignore_errors=True)
    for name in ("transforms", "downstream"):
        shutil.copytree(HERE / name, out / name, dirs_exist_ok=True)
    ev = base.events(shipments, seed)
    writer = DeltaWriter(out) if fmt == "delta" else IcebergWriter(out)
    events = ev.assign(shipped_on=pd.to_datetime(ev["shipped_on"]).dt.date)
    writer.events(pa.Table.from_pandas(events, schema=EVENTS_SCHEMA, preserve_index=False))
    mart, facts = simulate(ev, writer)
    expected, labels = truth(ev, mart, facts)
    (out / "truth").mkdir(exist_ok=True)
    expected.to_parquet(out / "truth" / "expected.parquet", index=False)
    labels.to_parquet(out / "truth" / "labels.parquet", index=False)
    if fmt == "delta":
        where = {
            "source": "{format: delta, path: lake/shipment_events}",
            "target": "format: delta, path: lake/shipments",
        }
    else:
        cat = "catalog: {name: lake, uri: 'sqlite:///lake/catalog.db', warehouse: lake/warehouse}"
        where = {
            "source": f"{{format: iceberg, {cat}, identifier: raw.shipment_events}}",
            "target": f"format: iceberg, {cat}, identifier: mart.shipments",
        }
    (out / "spec.yaml").write_text(SPEC.format(fmt=fmt, **where))
    (out / "incident.yaml").write_text(INCIDENT)
    return out / "spec.yaml"


SPEC = """\
# The shipments mart kept as a {fmt} table, its change log beside it. recovery.duckdb is the
# package's own working file (control plane, write log, repair generations).
dataset: shipments
warehouse: {{engine: duckdb, path: recovery.duckdb}}
source:
  table: raw.shipment_events
  lakehouse: {source}
  key: [carrier_code, tracking_no]
  version: rev
  op: change
  upsert_ops: [I, U]
  delete_ops: [D]
  ingested_at: arrived_at
target:
  table: mart.shipments
  lakehouse: {{{target}, generation_property: load_id, written_at_property: loaded_at, kind_property: job}}
  partition: ship_month
  transform: transforms/shipments.sql
  metadata: {{generation: load_id, source_version: src_rev, written_at: loaded_at}}
  amount: cost_usd
downstream:
  - name: carrier_monthly_cost
    kind: report
    owner: logistics-finance
    sql: downstream/carrier_monthly_cost.sql
    key: [carrier_code, ship_month]
    materiality: {{column: cost_usd, abs: 1}}
"""

INCIDENT = """\
incident_id: INC-SHIP-7
spec: spec.yaml
failed_generations: [bf-0007]
partitions: {start: '2013-01', end: '2013-04'}
requested_by: logistics-data-oncall
approved_by: [data-platform-lead]
"""


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--format", choices=["delta", "iceberg"], default="delta")
    p.add_argument("--shipments", type=int, default=3000)
    args = p.parse_args()
    spec = build(Path(args.out), fmt=args.format, shipments=args.shipments)
    labels = pd.read_parquet(Path(args.out) / "truth" / "labels.parquet")
    print(f"wrote {spec}; damage by label: {labels['label'].value_counts().to_dict()}")
