"""A small, deterministic order-events dataset for tests of the spec and the writer.

Everything is built from ``random.Random(seed)``, so a given ``(n_orders, seed)`` gives
byte-for-byte the same source rows. The layout deliberately differs from the shipped
example: a composite key ``[region, order_no]`` (each ``order_no`` occurs in two
regions), a string partition ``shard`` derived by the transform, ops ``put``/``drop``,
renamed metadata columns and no amount column.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import yaml

from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.snapshot import expected_rows_sql

REGIONS = ("north", "south", "east", "west")
SOURCE_TABLE = "src.order_events"
TARGET_TABLE = "mart.orders"
KEY = ("region", "order_no")
PAYLOAD = ("region", "order_no", "shard", "placed_at", "qty", "sku")
META = {"generation": "gen_id", "source_version": "src_rev", "written_at": "landed_at"}

TRANSFORM_SQL = """\
-- one row per live order: the shard is the region and the month the order was placed
SELECT
    region,
    order_no,
    region || '-' || strftime(placed_at, '%Y%m') AS shard,
    placed_at,
    qty,
    sku
FROM {{ source }}
"""

DOWNSTREAM_SQL = """\
SELECT shard, count(*) AS orders, sum(qty) AS units
FROM {{ target }}
GROUP BY shard
"""

SOURCE_DDL = f"""
CREATE SCHEMA IF NOT EXISTS src;
CREATE TABLE {SOURCE_TABLE} (
    region VARCHAR,
    order_no INTEGER,
    rev INTEGER,
    change VARCHAR,
    loaded_at TIMESTAMP,
    placed_at TIMESTAMP,
    qty INTEGER,
    sku VARCHAR
)
"""


@dataclass(frozen=True)
class OrderEvent:
    region: str
    order_no: int
    rev: int
    change: str
    loaded_at: datetime
    placed_at: datetime
    qty: int
    sku: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.region, self.order_no)

    @property
    def shard(self) -> str:
        return f"{self.region}-{self.placed_at:%Y%m}"

    def as_tuple(self) -> tuple:
        return (self.region, self.order_no, self.rev, self.change, self.loaded_at, self.placed_at, self.qty, self.sku)


def order_events(n_orders: int = 200, seed: int = 7) -> list[OrderEvent]:
    """The change log: 1-3 versions per order, some orders ending in a ``drop`` tombstone.

    Every fifth order has at least two versions and every seventh ends deleted, so
    both cases are present whatever the seed.
    """
    rng = random.Random(seed)
    base = datetime(2026, 3, 1, 6, 0, 0)
    events: list[OrderEvent] = []
    for i in range(n_orders):
        region, order_no = REGIONS[i % len(REGIONS)], 1000 + i // 2
        n_versions = rng.choice([1, 1, 2, 2, 3])
        if i % 5 == 0:
            n_versions = max(n_versions, 2)
        dropped = i % 7 == 3 or rng.random() < 0.05
        placed = datetime(2026, 1, 1) + timedelta(days=rng.randint(0, 88), minutes=rng.randint(0, 1439))
        loaded = base + timedelta(minutes=rng.randint(0, 600))
        qty, sku = rng.randint(1, 20), f"SKU-{rng.randint(1, 30):03d}"
        rev = rng.randint(1, 3)
        for v in range(n_versions):
            if v:
                rev += rng.randint(1, 4)
                loaded += timedelta(hours=rng.randint(1, 30), seconds=rng.randint(0, 59))
                qty = rng.randint(1, 20)
                if rng.random() < 0.3:  # a correction that moves the order to another month
                    placed = placed + timedelta(days=rng.choice([-40, -31, 31, 40]))
            events.append(OrderEvent(region, order_no, rev, "put", loaded, placed, qty, sku))
        if dropped:
            rev += 1
            loaded += timedelta(hours=rng.randint(1, 30))
            events.append(OrderEvent(region, order_no, rev, "drop", loaded, placed, qty, sku))
    return events


def latest_live(events: list[OrderEvent]) -> dict[tuple[str, int], OrderEvent]:
    """The oracle for "the source now": latest version of each key, tombstoned keys left out."""
    latest: dict[tuple[str, int], OrderEvent] = {}
    for e in events:
        if e.key not in latest or e.rev > latest[e.key].rev:
            latest[e.key] = e
    return {k: e for k, e in latest.items() if e.change == "put"}


def spec_dict() -> dict:
    """The valid spec as a plain dict (paths relative to the spec file)."""
    return {
        "dataset": "orders",
        "warehouse": {
            "engine": "duckdb",
            "path": "wh.duckdb",
            "memory_limit": "512MB",
            "threads": 2,
            "busy_timeout_s": 60,
        },
        "source": {
            "table": SOURCE_TABLE,
            "key": list(KEY),
            "version": "rev",
            "op": "change",
            "ingested_at": "loaded_at",
            "upsert_ops": ["put"],
            "delete_ops": ["drop"],
        },
        "target": {
            "table": TARGET_TABLE,
            "partition": "shard",
            "transform": "orders.sql",
            "metadata": dict(META),
        },
        "downstream": [
            {
                "name": "orders_by_shard",
                "kind": "report",
                "owner": "ops",
                "sql": "orders_by_shard.sql",
                "key": ["shard"],
                "materiality": {"column": "orders", "abs": 1},
            }
        ],
    }


def write_spec(directory: Path, data: object, name: str = "spec.yaml") -> Path:
    """Write ``data`` as YAML next to the warehouse; returns the spec path."""
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(copy.deepcopy(data), sort_keys=False))
    return path


def build_small_dataset(dir: Path, n_orders: int = 200, seed: int = 7) -> Path:  # noqa: A002 (the brief's name)
    """Build ``wh.duckdb``, ``orders.sql``, ``orders_by_shard.sql`` and ``spec.yaml`` in ``dir``."""
    directory = Path(dir)
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / "wh.duckdb"
    if db.exists():
        raise FileExistsError(f"{db} already exists; build into an empty directory")
    con = duckdb.connect(str(db))
    try:
        con.execute(SOURCE_DDL)
        con.executemany(
            f"INSERT INTO {SOURCE_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [e.as_tuple() for e in order_events(n_orders, seed)],
        )
        con.execute("CHECKPOINT")
    finally:
        con.close()
    (directory / "orders.sql").write_text(TRANSFORM_SQL)
    (directory / "orders_by_shard.sql").write_text(DOWNSTREAM_SQL)
    return write_spec(directory, spec_dict())


# ---- read-only probes used by the tests ----------------------------------------------------


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def catalog(db: Path) -> list[tuple[str, str, str]]:
    """(schema, table, type) of every table and view, through a read-only connection."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT table_schema, table_name, table_type FROM information_schema.tables ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()


def fetch(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    """Run one read-only query against the warehouse file."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def rows_digest(db: Path, relation: str) -> tuple[int, str]:
    """(row count, sha256 of the sorted rows) of a table or view."""
    rows = sorted(fetch(db, f"SELECT * FROM {relation}"), key=repr)
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


def target_equal_to_the_source(dir: Path, n_orders: int) -> tuple[DatasetSpec, DuckDBSession]:  # noqa: A002
    """The small dataset with its target built as exactly the source's expected rows (no drift yet), and an
    open session on its warehouse (the caller's to use; convergence tests stage their sides in it)."""
    spec = parse_spec(build_small_dataset(dir, n_orders=n_orders))
    s = DuckDBSession(duckdb.connect(str(spec.warehouse.path)))
    s.execute("CREATE SCHEMA _recovery")
    s.execute("CREATE SCHEMA mart")
    s.execute(
        f"CREATE TABLE mart.orders AS SELECT *, 'g1' AS gen_id, TIMESTAMP '2026-03-09' AS landed_at "
        f"FROM ({expected_rows_sql(spec, None)})"
    )
    return spec, s
