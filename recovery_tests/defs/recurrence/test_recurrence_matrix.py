"""The runbook's promise for the next backfill, as a matrix: every recompute carrying one
realistic bug is refused by a named gate with the published view unchanged, on the
worked example and on a second dataset with other column types, with no per-column
configuration in either spec; the correct recompute and a declared one-column
correction publish, and an undeclared or misdeclared correction does not."""

from __future__ import annotations

import shutil

import pytest
import yaml

from recovery.lib.control.plane import SCHEMA
from recovery.lib.snapshot import expected_rows_sql
from recovery_tests.support.faulty_recomputes import MATRIX
from recovery_tests.support.recurrence import Dataset, orders_dataset, transactions_dataset

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
    out = ds.launch(f"recovery_tests.support.faulty_recomputes:{bug}")
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
        "recovery_tests.support.faulty_recomputes:unit_change", backfill_id="unit-change-2"
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
    flipped = ds.launch("recovery_tests.support.faulty_recomputes:sign_flip")  # qty may change as much as it likes
    assert flipped.gates["values"].passed and flipped.gates["profile"].passed, flipped.gates["values"].details
    assert "qty 100.0%" in flipped.gates["values"].details
    raw["recurrence"]["anomaly"]["columns"] = {"quantity": {"max_changed_share": 1.0}}
    ds.spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    from recovery.lib.errors import SpecError

    with pytest.raises(SpecError) as err:
        ds.launch("recovery_tests.support.faulty_recomputes:rounding")
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
