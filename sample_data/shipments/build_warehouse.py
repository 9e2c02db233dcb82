"""A warehouse this package never wrote: a shipments mart loaded by plain pandas/SQL jobs.

This script stands in for a team's own pipeline. It imports nothing from
``recovery``: it simulates six months of a carrier change log (inserts, updates,
tombstones, late arrivals), an incremental load every six hours that stamps its
rows with its own load id, source revision and load time and records each run
in the team's own run registry (``ops.load_runs``), and then a history backfill
(``bf-0007``) that goes wrong while the incremental loads keep running:

- it reads a source snapshot two days old (stale rows, lost concurrent writes);
- it keeps rows whose latest change is a tombstone (resurrected);
- 2013-02 stores cost in cents instead of dollars (incorrectly transformed)
  and drops every 37th tracking number (deleted);
- 2013-03 inserts every 41st tracking number twice (duplicate) and files every
  53rd in the next month (mispartitioned);
- it writes five test shipments of carrier ``TST`` (unexpected);
- it dies half way through 2013-04 (a partially updated partition).

The ground truth is computed here, from the simulation's own history (which
rows the target held when the backfill started, which load wrote which version
when), not from anything the package computes, and written as Parquet files
under ``truth/`` for the tests. Run: ``python build_warehouse.py OUT_DIR``.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
KEY = ["carrier_code", "tracking_no"]
CARRIERS = ["DHL", "UPS", "FDX", "USP"]
SERVICES = ["ground", "express", "overnight"]
START = datetime(2013, 1, 1)
END = datetime(2013, 7, 8)                     # the last incremental load's watermark: every event ingested
BACKFILL = "bf-0007"
BACKFILL_START = datetime(2013, 7, 5, 10)
BACKFILL_SNAPSHOT = datetime(2013, 7, 3)       # the stale source snapshot the backfill read
BACKFILL_WRITES = {"2013-01": 0, "2013-02": 3, "2013-03": 6, "2013-04": 9}   # hours after its start
LOAD_EVERY = timedelta(hours=6)
LOAD_TAKES = timedelta(minutes=5)


def events(n: int, seed: int) -> pd.DataFrame:
    """The change log: one insert per shipment, then updates and sometimes a tombstone."""
    rng = np.random.default_rng(seed)
    rows = []
    last_day = (datetime(2013, 6, 30) - START).days
    for i in range(n):
        carrier = CARRIERS[i % len(CARRIERS)]
        tracking = 100_000 + i
        shipped = START + timedelta(days=int(rng.integers(0, last_day + 1)))
        at = shipped + timedelta(hours=float(rng.uniform(1, 48)))
        weight, cost, service = int(rng.integers(200, 30_000)), int(rng.integers(500, 90_000)), SERVICES[i % 3]
        rows.append((carrier, tracking, 1, "I", shipped.date(), weight, cost, service, at))
        for rev in (2, 3):
            if rng.random() > (0.45 if rev == 2 else 0.3):
                break
            at = at + timedelta(hours=float(rng.uniform(1, (END - at).total_seconds() / 3600 - 1)))
            if at >= END - timedelta(hours=1):
                break
            op = "D" if rng.random() < 0.12 else "U"
            cost, weight = int(cost * rng.uniform(0.8, 1.2)), int(weight * rng.uniform(0.9, 1.1))
            rows.append((carrier, tracking, rev, op, shipped.date(), weight, cost, service, at))
            if op == "D":
                break
    # changes that land in the days around the backfill, so it has something to lose
    for j, i in enumerate(range(0, n, 7)):
        if j % 3 == 2:
            continue
        at = [datetime(2013, 7, 4, 3), datetime(2013, 7, 5, 11)][j % 3] + timedelta(minutes=(i % 50))
        prior = [r for r in rows if r[1] == 100_000 + i]
        if prior[-1][3] == "D" or prior[-1][8] >= at:
            continue
        c, t, rev, _, shipped, weight, cost, service, _ = prior[-1]
        rows.append((c, t, rev + 1, "U", shipped, weight, cost + 111, service, at))
    # late arrivals: shipments of February and March first reported on the morning the backfill started
    for j in range(24):
        shipped = datetime(2013, 2 + j % 2, 1 + j)
        rows.append((CARRIERS[j % 4], 500_000 + j, 1, "I", shipped.date(), 1000 + j, 2000 + j, SERVICES[j % 3],
                     datetime(2013, 7, 5, 7) + timedelta(minutes=5 * j)))
    df = pd.DataFrame(rows, columns=KEY + ["rev", "change", "shipped_on", "weight_g", "cost_cents", "service", "arrived_at"])
    return df.sort_values(["arrived_at"] + KEY).reset_index(drop=True)


def transform(rows: pd.DataFrame) -> pd.DataFrame:
    """The team's own transform (the same logic as ``transforms/shipments.sql``)."""
    out = rows[KEY].copy()
    out["ship_month"] = pd.to_datetime(rows["shipped_on"]).dt.strftime("%Y-%m")
    out["weight_kg"] = rows["weight_g"] / 1000.0
    out["cost_usd"] = (rows["cost_cents"] / 100.0).round(2)
    out["service"] = rows["service"]
    out["src_rev"] = rows["rev"]
    return out


def latest(ev: pd.DataFrame, until: datetime, since: datetime | None = None) -> pd.DataFrame:
    """The latest change per key among changes arrived in (since, until]."""
    mask = ev["arrived_at"] <= until
    if since is not None:
        mask &= ev["arrived_at"] > since
    return ev[mask].sort_values("rev").groupby(KEY, as_index=False).tail(1)


@dataclass
class Mart:
    """The target as a list of rows per key, plus the history of every write (for the truth)."""

    rows: dict = field(default_factory=dict)
    log: list = field(default_factory=list)    # (key, load_id, rev, at, action)

    def put(self, key, row: dict, load_id: str, at: datetime, *, replace: bool = True) -> None:
        stamped = {**row, "load_id": load_id, "loaded_at": at}
        self.rows[key] = [stamped] if replace else self.rows.get(key, []) + [stamped]
        self.log.append((key, load_id, row["src_rev"], at, "put"))

    def drop(self, key, load_id: str, at: datetime) -> None:
        if self.rows.pop(key, None) is not None:
            self.log.append((key, load_id, None, at, "drop"))


def incremental_load(mart: Mart, ev: pd.DataFrame, load_id: str, since: datetime, until: datetime, done: datetime) -> None:
    lo, hi = ev["arrived_at"].searchsorted([since, until], side="right")   # ev is sorted by arrival
    changed = ev.iloc[lo:hi].sort_values("rev").groupby(KEY, as_index=False).tail(1)
    for op, key, row in zip(changed["change"], changed[KEY].itertuples(index=False, name=None),
                            transform(changed).to_dict("records")):
        mart.drop(key, load_id, done) if op == "D" else mart.put(key, row, load_id, done)


def backfill_partition(mart: Mart, ev: pd.DataFrame, month: str, at: datetime) -> None:
    """The faulty recompute of one month from the stale snapshot."""
    snap = latest(ev[ev["change"] != "D"], BACKFILL_SNAPSHOT)     # bug: tombstones ignored
    rows = transform(snap)
    rows = rows[rows["ship_month"] == month]
    if month == "2013-02":
        rows = rows.assign(cost_usd=rows["cost_usd"] * 100)      # bug: cents stored as dollars
        rows = rows[rows["tracking_no"] % 37 != 0]                # bug: a join dropped these
    if month == "2013-03":
        moved = rows["tracking_no"] % 53 == 0                     # bug: filed in the next month
        rows.loc[moved, "ship_month"] = "2013-04"
    if month == "2013-04":                                        # the run died half way: upserts, no delete
        rows = rows.iloc[: len(rows) // 2]
    else:
        for key in [k for k, rs in mart.rows.items() if any(r["ship_month"] == month for r in rs)]:
            mart.drop(key, BACKFILL, at)
    for key, row in zip(rows[KEY].itertuples(index=False, name=None), rows.to_dict("records")):
        mart.put(key, row, BACKFILL, at)
        if month == "2013-03" and key[1] % 41 == 0:               # bug: a retried insert
            mart.put(key, row, BACKFILL, at, replace=False)
    if month == "2013-01":
        for i in range(5):                                        # bug: test shipments left in
            mart.put(("TST", 900 + i), {"carrier_code": "TST", "tracking_no": 900 + i, "ship_month": month,
                                       "weight_kg": 1.0, "cost_usd": 1.0, "service": "ground", "src_rev": 1}, BACKFILL, at)


def simulate(ev: pd.DataFrame) -> tuple[Mart, list[dict], dict]:
    mart, runs = Mart(), []
    held_at_start: set | None = None
    writes = sorted((BACKFILL_START + timedelta(hours=h), m) for m, h in BACKFILL_WRITES.items())
    t, n = START, 0
    while t < END:
        nxt = t + LOAD_EVERY
        while writes and writes[0][0] < nxt:
            at, month = writes.pop(0)
            if held_at_start is None:
                held_at_start = set(mart.rows)
            backfill_partition(mart, ev, month, at)
        n += 1
        load_id = f"inc-{n:05d}"
        incremental_load(mart, ev, load_id, t, nxt, nxt + LOAD_TAKES)
        runs.append({"load_id": load_id, "job": "incremental", "started_at": nxt, "finished_at": nxt + LOAD_TAKES,
                     "status": "success", "source_high_watermark": nxt})
        t = nxt
    runs.append({"load_id": BACKFILL, "job": "backfill", "started_at": BACKFILL_START,
                 "finished_at": BACKFILL_START + timedelta(hours=9, minutes=30), "status": "failed",
                 "source_high_watermark": BACKFILL_SNAPSHOT})
    return mart, runs, {"held_at_start": held_at_start}


def truth(ev: pd.DataFrame, mart: Mart, facts: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Expected rows and one label per damaged key, by the damage vocabulary's rules in their order."""
    last = latest(ev, ev["arrived_at"].max())
    live = last[last["change"] != "D"]
    expected = transform(live).set_index(KEY)
    arrived = last.set_index(KEY)["arrived_at"]
    tomb = set(last.loc[last["change"] == "D", KEY].itertuples(index=False, name=None))
    in_source = set(ev[KEY].itertuples(index=False, name=None))
    payload = ["weight_kg", "cost_usd", "service"]
    writes: dict = {}
    for k, g, v, at, a in mart.log:
        writes.setdefault(k, []).append((g, v, at, a))
    labels = []
    for key in sorted(set(mart.rows) | set(expected.index)):
        rows = mart.rows.get(key, [])
        e = expected.loc[key].to_dict() if key in expected.index else None
        t = rows[0] if rows else None
        if len(rows) > 1:
            label = "duplicate"
        elif t and e is None:
            label = "resurrected" if key in tomb else ("unexpected" if key not in in_source else "unexplained")
        elif t is None and e is not None:
            label = "deleted" if key in facts["held_at_start"] else "missing"
        elif t is None:
            continue
        elif all(t[c] == e[c] for c in payload + ["src_rev"]) and t["ship_month"] == e["ship_month"]:
            continue                                               # correct
        elif all(t[c] == e[c] for c in payload) and t["ship_month"] != e["ship_month"]:
            label = "mispartitioned"
        elif t["src_rev"] < e["src_rev"] and t["load_id"] == BACKFILL:
            concurrent = any(g != BACKFILL and a == "put" and v > t["src_rev"] and at < t["loaded_at"]
                             for g, v, at, a in writes.get(key, ()))
            label = "overwritten" if concurrent and arrived[key] > BACKFILL_START else "stale"
        elif t["src_rev"] == e["src_rev"]:
            label = "incorrectly_transformed"
        else:
            label = "unexplained"
        labels.append({"carrier_code": key[0], "tracking_no": key[1], "label": label})
    exp = expected.reset_index()
    return exp, pd.DataFrame(labels)


def build(out: Path, *, shipments: int = 6000, seed: int = 7) -> Path:
    """Write ``OUT/warehouse.duckdb`` (the team's warehouse), the spec files and ``OUT/truth/``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("spec.yaml", "incident.yaml", "transforms", "downstream"):
        src = HERE / name
        if src.resolve() != (out / name).resolve():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, out / name, **({"dirs_exist_ok": True} if src.is_dir() else {}))
    ev = events(shipments, seed)
    mart, runs, facts = simulate(ev)
    target = pd.DataFrame([r for rs in mart.rows.values() for r in rs])
    target["cost_usd"] = target["cost_usd"].round(2)
    registry = pd.DataFrame(runs)
    db = out / "warehouse.duckdb"
    for stale in out.glob("warehouse.duckdb*"):
        stale.unlink()
    con = duckdb.connect(str(db))
    con.execute("CREATE SCHEMA raw; CREATE SCHEMA mart; CREATE SCHEMA ops")
    con.execute("CREATE TABLE raw.shipment_events AS SELECT carrier_code, CAST(tracking_no AS BIGINT) AS tracking_no, "
                "CAST(rev AS INTEGER) AS rev, change, CAST(shipped_on AS DATE) AS shipped_on, CAST(weight_g AS INTEGER) AS weight_g, "
                "CAST(cost_cents AS BIGINT) AS cost_cents, service, CAST(arrived_at AS TIMESTAMP) AS arrived_at FROM ev")
    con.execute("CREATE TABLE mart.shipments AS SELECT carrier_code, CAST(tracking_no AS BIGINT) AS tracking_no, ship_month, "
                "weight_kg, CAST(cost_usd AS DECIMAL(12, 2)) AS cost_usd, service, load_id, CAST(src_rev AS INTEGER) AS src_rev, "
                "CAST(loaded_at AS TIMESTAMP) AS loaded_at FROM target ORDER BY ship_month, carrier_code, tracking_no")
    con.execute("CREATE TABLE ops.load_runs AS SELECT * FROM registry ORDER BY started_at")
    con.close()
    expected, labels = truth(ev, mart, facts)
    (out / "truth").mkdir(exist_ok=True)
    expected.to_parquet(out / "truth" / "expected.parquet", index=False)
    labels.to_parquet(out / "truth" / "labels.parquet", index=False)
    return db


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(HERE), help="folder for warehouse.duckdb and truth/ (default: here)")
    p.add_argument("--shipments", type=int, default=6000)
    args = p.parse_args()
    db = build(Path(args.out), shipments=args.shipments)
    labels = pd.read_parquet(Path(args.out) / "truth" / "labels.parquet")
    print(f"wrote {db}; damage by label: {labels['label'].value_counts().to_dict()}")
