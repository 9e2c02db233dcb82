"""The runbook's promise for the next backfill, as a matrix: every recompute carrying one
realistic bug is refused by a named gate with the published view unchanged, on the
worked example and on a second dataset with other column types, with no per-column
configuration in either spec; the correct recompute and a declared one-column
correction publish, and an undeclared or misdeclared correction does not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.pointers.namespaces import move_pointer
from recovery.lib.recurrence.guarded import run_guarded_backfill
from recovery.lib.recurrence.request import BackfillRequest
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.writer import Writer
from recovery_tests.example_build import copy_dataset
from recovery_tests.faulty_recomputes import MATRIX
from recovery_tests.small_dataset import build_small_dataset, spec_dict, write_spec

APPROVERS = ["head-of-data", "data-platform-lead"]

# which gate names each bug (any of them refusing is the promise; the first is the one expected to)
REFUSED_BY = {
    "unit_change": {"values"},
    "sign_flip": {"values"},
    "swapped_columns": {"values"},
    "column_nulled": {"values"},
    "timezone_shift": {"values"},
    "rounding": {"values"},
    "lookup_fanout": {"invariants"},
    "duplicate_retries": {"invariants"},
    "half_dropped": {"anomaly", "values"},
    "stale_snapshot": {"invariants"},
    "tombstones_ignored": {"invariants"},
    "wrong_partition": {"values", "invariants"},
}

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


def _publish_baseline(spec_path: Path, *, ensure: bool) -> None:
    spec = parse_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    if ensure:
        writer.ensure()
    ns = writer.register_generation("baseline-clean", "repair", own_namespace=True)
    writer.write("baseline-clean", expected_rows_sql(spec, None), mode="append")
    with writer.engine.transaction() as s:
        move_pointer(s, spec, ns, actor="test", reason="clean baseline for the recurrence matrix")


def transactions_dataset(root: Path, failed_example) -> Dataset:
    """The worked example, published correctly, its spec's recurrence policy reduced to approvals (no thresholds,
    no SQL invariants, no suites): what the gates catch, they catch from their defaults."""
    spec_path = copy_dataset(failed_example.root, root / "transactions")
    raw = yaml.safe_load(spec_path.read_text())
    raw["recurrence"] = {"approval": raw["recurrence"]["approval"]}
    raw.pop("suites", None)
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    _publish_baseline(spec_path, ensure=False)
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
    _publish_baseline(spec_path, ensure=True)
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


@pytest.fixture(scope="module")
def matrix_datasets(failed_example, tmp_path_factory) -> dict[str, Dataset]:
    """Both datasets, published once for the whole matrix (a refused backfill changes nothing they publish)."""
    root = tmp_path_factory.mktemp("matrix")
    return {"transactions": transactions_dataset(root, failed_example), "orders": orders_dataset(root)}


@pytest.mark.parametrize("bug", MATRIX)
@pytest.mark.parametrize("name", ["transactions", "orders"])
def test_each_faulty_recompute_is_refused_by_a_named_gate_and_nothing_is_published(matrix_datasets, name, bug):
    ds = matrix_datasets[name]
    before = ds.public_hash()
    out = ds.launch(f"recovery_tests.faulty_recomputes:{bug}")
    failed = set(out.failed_gates)
    assert out.status == "stopped", (out.status, out.reason)
    assert failed & REFUSED_BY[bug], (bug, {g: r.details[:300] for g, r in out.gates.items() if not r.passed})
    assert ds.public_hash() == before
    gen = f"guarded-{out.backfill_id}"
    ns = ds.query(f"SELECT namespace FROM {SCHEMA}.generations WHERE generation = ?", [gen])[0][0]
    assert ds.query(f"SELECT count(*) FROM {ns}")[0][0] > 0  # the candidate is kept for inspection
    assert (
        ds.query(f"SELECT count(*) FROM {ds.public} WHERE {ds.spec.target.metadata.generation} = ?", [gen])[0][0] == 0
    )


def _value_bug_names_the_column(out, column: str) -> bool:
    return column in out.gates["values"].details and "not declared" in out.gates["values"].details


def test_value_refusals_name_the_column_and_the_observed_vs_allowed_share(matrix_datasets):
    out = matrix_datasets["transactions"].launch(
        "recovery_tests.faulty_recomputes:unit_change", backfill_id="unit-change-2"
    )
    values = out.gates["values"]
    assert not values.passed
    assert "changed_share of amount_usd" in values.details and "allowed 20%, not declared" in values.details
    assert "100.0%" in values.details  # every key's amount changed
    assert "event_ts" not in values.details.split(". ")[0]  # columns that did not change are not blamed


@pytest.mark.parametrize("name", ["transactions", "orders"])
def test_correct_and_declared_corrections_publish_undeclared_ones_do_not(name, failed_example, tmp_path):
    ds = transactions_dataset(tmp_path, failed_example) if name == "transactions" else orders_dataset(tmp_path)
    correct = ds.launch()
    assert correct.status == "published", correct.reason
    assert correct.gates["values"].passed and "changed: none" in correct.gates["values"].details

    ds.damage_published()  # now the published generation carries a one-column bug
    before = ds.public_hash()
    undeclared = ds.launch(backfill_id=f"fix-undeclared-{name}")
    assert undeclared.status == "stopped" and not undeclared.gates["values"].passed
    assert _value_bug_names_the_column(undeclared, ds.damage_column)
    other = "qty" if name == "orders" else "status"
    misdeclared = ds.launch(backfill_id=f"fix-misdeclared-{name}", expect_change=[other])
    assert misdeclared.status == "stopped" and _value_bug_names_the_column(misdeclared, ds.damage_column)
    assert ds.public_hash() == before

    declared = ds.launch(backfill_id=f"fix-declared-{name}", expect_change=[ds.damage_column], expected_share=0.6)
    assert declared.status == "published", declared.reason
    share = next(
        float(p.split()[1].rstrip("%"))
        for p in declared.gates["values"].details.split("changed: ")[1].split(";")[0].split(", ")
        if p.startswith(ds.damage_column)
    )
    assert 40 < share < 60  # about half the keys were corrected, as declared
    manifest = ds.query(f"SELECT manifest FROM {SCHEMA}.backfills WHERE backfill_id = ?", [f"fix-declared-{name}"])[0][
        0
    ]
    assert yaml.safe_load(manifest)["declared_intent"] == {"expect_change": [ds.damage_column], "expected_share": 0.6}
    assert f"declared change: {ds.damage_column} on up to 60% of keys" in declared.gates["approval"].details
    # what consumers read now is the source's truth again
    diff = ds.query(
        f"SELECT count(*) FROM (SELECT * EXCLUDE ({ds.spec.target.metadata.generation}, "
        f"{ds.spec.target.metadata.written_at}) FROM {ds.public} EXCEPT ALL "
        f"SELECT * FROM ({expected_rows_sql(ds.spec, None)}))"
    )[0][0]
    assert diff == 0
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_per_column_overrides_in_the_spec_and_unknown_columns_are_named(tmp_path):
    ds = orders_dataset(tmp_path)
    raw = yaml.safe_load(ds.spec_path.read_text())
    raw["recurrence"] = {
        "anomaly": {
            "columns": {
                "qty": {
                    "max_changed_share": 1.0,
                    "max_mean_shift": 100,
                    "max_quantile_shift": 100,
                    "max_distinct_change": 10,
                }
            }
        }
    }
    ds.spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    flipped = ds.launch("recovery_tests.faulty_recomputes:sign_flip")  # qty may change as much as it likes
    assert flipped.gates["values"].passed and flipped.gates["profile"].passed, flipped.gates["values"].details
    assert "qty 100.0%" in flipped.gates["values"].details
    raw["recurrence"]["anomaly"]["columns"] = {"quantity": {"max_changed_share": 1.0}}
    ds.spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    from recovery.lib.errors import SpecError

    with pytest.raises(SpecError) as err:
        ds.launch("recovery_tests.faulty_recomputes:rounding")
    assert err.value.field == "recurrence.anomaly.columns.quantity" and "qty" in str(err.value)


def test_a_partition_without_published_rows_is_said_so_not_passed_silently(tmp_path):
    ds = orders_dataset(tmp_path)
    gen = ds.query(f"SELECT generation FROM {SCHEMA}.generations g JOIN {SCHEMA}.pointers p USING (namespace)")[0][0]
    ds.writer().write(
        gen,
        f"SELECT region, order_no, src_rev FROM {ds.public} WHERE shard = 'east-202603'",
        mode="delete_keys",
        note="the partition was never published",
    )
    out = ds.launch()
    values, profile = out.gates["values"], out.gates["profile"]
    assert values.passed, values.details  # new keys of an unpublished partition are not "added"
    assert "1 partition(s) had no published rows (east-202603" in values.details
    assert "profiled against the published history" in values.details
    assert "(vs history)" not in values.details  # the history profile found nothing wrong
    assert profile.passed and "published rows of the range" in profile.details
