"""Datasets for the recurrence tests: the worked example published correctly, the guarded launcher
called on it, and the matrix's two datasets (the worked example and the small orders dataset)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from recovery.config import EXAMPLE_SPEC
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.pointers.namespaces import move_pointer
from recovery.lib.recurrence.guarded import run_guarded_backfill
from recovery.lib.recurrence.request import BackfillRequest
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.writer import Writer
from recovery_tests.support.example_build import copy_dataset
from recovery_tests.support.rows import present
from recovery_tests.support.small_dataset import build_small_dataset, spec_dict, write_spec

APPROVER, SECOND = "head-of-data", "data-platform-lead"


def clean_baseline(spec_path: Path) -> Path:
    """The example's dataset with a correct published generation (what the next backfill starts from)."""
    shutil.copy(EXAMPLE_SPEC, spec_path)  # the sample spec carries the recurrence policy
    spec = parse_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    ns = writer.register_generation("baseline-clean", "repair", own_namespace=True)
    writer.write("baseline-clean", expected_rows_sql(spec, None), mode="append")
    with writer.engine.transaction() as s:
        move_pointer(s, spec, present(ns), actor="test", reason="clean baseline for the recurrence tests")
    return spec_path


def dataset_writer(spec_path: Path) -> Writer:
    spec = parse_spec(spec_path)
    return Writer(open_engine(spec.warehouse), spec, actor="test")


def query_dataset(spec_path: Path, sql: str, params=None):
    spec = parse_spec(spec_path)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return s.fetchall(sql, params or [])


def public_hash(spec_path: Path) -> str:
    """Content hash of what consumers read."""
    return query_dataset(
        spec_path,
        "SELECT md5(string_agg(CAST(t AS VARCHAR), '|' ORDER BY txn_id, _generation, _written_at)) "
        "FROM analytics.transactions t",
    )[0][0]


def launch(
    spec_path: Path,
    start: str,
    end: str,
    *,
    recompute: str = "transform",
    approved_by=(APPROVER,),
    fn=None,
    dry_run: bool = False,
    **extra,
):
    request = BackfillRequest(
        start=start,
        end=end,
        recompute=recompute,
        requested_by="data-platform-oncall",
        approved_by=list(approved_by),
        **extra,
    )
    return run_guarded_backfill(dataset_writer(spec_path), request, dry_run=dry_run, recompute=fn)


APPROVERS = ["head-of-data", "data-platform-lead"]


ORDERS_TRANSFORM = """\
-- one row per live order, with a column of every kind the value gate profiles
SELECT
    region,
    order_no,
    region || '-' || strftime(placed_at, '%Y%m') AS shard,
    placed_at,
    CAST(placed_at AS DATE) AS placed_on,
    qty,
    CAST(round(qty * (1.5 + CAST(substr(sku, 5) AS INTEGER) * 0.25), 2) AS DOUBLE) AS price,
    qty >= 10 AS bulk,
    sku
FROM {{ source }}
"""


class Dataset:
    """A published, correct generation of a dataset, and how to launch backfills of one range of it."""

    def __init__(
        self,
        spec_path: Path,
        public: str,
        key: str,
        start: str,
        end: str,
        damage_column: str,
        damage_sql: str,
        partition: str,
    ):
        self.spec_path, self.public, self.key, self.start, self.end = spec_path, public, key, start, end
        self.damage_column, self.damage_sql, self.partition = damage_column, damage_sql, partition

    @property
    def spec(self):
        return parse_spec(self.spec_path)

    def writer(self) -> Writer:
        return Writer(open_engine(self.spec.warehouse), self.spec, actor="test")

    def query(self, sql: str, params=None):
        with open_engine(self.spec.warehouse).session(read_only=True) as s:
            return s.fetchall(sql, params or [])

    def public_hash(self) -> str:
        """Digest of the rows consumers read, as a multiset: any changed, added or removed row changes it.
        (A sorted ``string_agg`` of every row took 3.2 s of each test at 200k rows; this takes 5 ms.)"""
        return self.query(f"SELECT count(*) || ':' || sum(hash(t)::HUGEINT) FROM (SELECT * FROM {self.public}) t")[0][0]

    def launch(self, recompute: str = "transform", **extra):
        request = BackfillRequest(
            start=self.start,
            end=self.end,
            recompute=recompute,
            requested_by="data-platform-oncall",
            approved_by=APPROVERS,
            **extra,
        )
        return run_guarded_backfill(self.writer(), request)

    def damage_published(self) -> None:
        """A past bug left one column wrong on half the range's keys of the published generation."""
        spec = self.spec
        gen = self.query(
            f"SELECT generation FROM {SCHEMA}.generations g JOIN {SCHEMA}.pointers p USING (namespace) "
            f"WHERE p.public_name = ?",
            [self.public],
        )[0][0]
        self.writer().write(
            gen,
            self.damage_sql.format(public=self.public, start=self.start, end=self.end),
            mode="upsert_keys",
            note="a past bug in one column",
        )
        assert spec.dataset


def publish_baseline(spec_path: Path, *, ensure: bool) -> None:
    spec = parse_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    if ensure:
        writer.ensure()
    ns = writer.register_generation("baseline-clean", "repair", own_namespace=True)
    writer.write("baseline-clean", expected_rows_sql(spec, None), mode="append")
    with writer.engine.transaction() as s:
        move_pointer(s, spec, present(ns), actor="test", reason="clean baseline for the recurrence matrix")


def transactions_dataset(root: Path, failed_example) -> Dataset:
    """The worked example, published correctly, its spec's recurrence policy reduced to approvals (no thresholds,
    no SQL invariants, no suites): what the gates catch, they catch from their defaults."""
    spec_path = copy_dataset(failed_example.root, root / "transactions")
    raw = yaml.safe_load(spec_path.read_text())
    raw["recurrence"] = {"approval": raw["recurrence"]["approval"]}
    raw.pop("suites", None)
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    publish_baseline(spec_path, ensure=False)
    return Dataset(
        spec_path,
        "analytics.transactions",
        "txn_id",
        "2024-06-03",
        "2024-06-07",
        "amount_usd",
        "SELECT * EXCLUDE (_generation, _written_at) REPLACE (CAST(amount_usd * 1.1 AS DECIMAL(18, 2)) AS amount_usd) "
        "FROM {public} WHERE event_date BETWEEN '{start}' AND '{end}' AND hash(txn_id) % 2 = 0",
        "event_date",
    )


def orders_dataset(root: Path) -> Dataset:
    """The small orders dataset with a wider transform: composite key, VARCHAR partitions, INTEGER, DOUBLE,
    BOOLEAN, DATE and TIMESTAMP columns, no amount column; no recurrence section at all."""
    spec_path = build_small_dataset(root / "orders", n_orders=2400)
    (root / "orders" / "orders.sql").write_text(ORDERS_TRANSFORM)
    write_spec(root / "orders", spec_dict())
    publish_baseline(spec_path, ensure=True)
    return Dataset(
        spec_path,
        "mart.orders",
        "order_no",
        "east-202601",
        "east-202603",
        "price",
        "SELECT * EXCLUDE (gen_id, landed_at) REPLACE (price * 1.1 AS price) FROM {public} "
        "WHERE shard BETWEEN '{start}' AND '{end}' AND hash(order_no) % 2 = 0",
        "shard",
    )
