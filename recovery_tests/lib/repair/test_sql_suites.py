"""Great Expectations through its SQL datasource on DuckDB: every expectation computed by the
engine over the whole relation (a query over a non-default schema), correct for aggregates that
batches get wrong; and a guard that fails when upstream changes the method we replace."""

from __future__ import annotations

import hashlib
import inspect

import duckdb
import pytest

from recovery.lib.errors import RecoveryError
from recovery.lib.repair.sql_suites import SqlSuiteRunner, engine_classes
from recovery.lib.repair.suites import Expectation, Suite, _gx

# sha256 of great_expectations 1.24.1's SqlAlchemyExecutionEngine.execute_query source
UPSTREAM_EXECUTE_QUERY = "00b686f959e59eec0a8dc12d352dd8c65d3273e42cff8e6e3d4e42862598d06b"
E = Expectation


@pytest.fixture
def table(tmp_path):
    conn = duckdb.connect(str(tmp_path / "w.duckdb"), config={"python_enable_replacements": False})
    conn.execute("CREATE SCHEMA analytics")
    # 100k rows: v = id % 100 (mean 49.5, median 49.5), s null on every 10th row, id unique; one extra duplicate id
    conn.execute(
        "CREATE TABLE analytics.t AS SELECT range AS id, range % 100 AS v, "
        "CASE WHEN range % 10 = 0 THEN NULL ELSE 'x' END AS s FROM range(100000)"
    )
    yield conn
    conn.close()


def _suite(name: str, *exps: Expectation) -> Suite:
    return Suite(name, tuple(exps))


def test_the_replaced_upstream_method_is_unchanged():
    """BufferedExecutionEngine overrides execute_query; when GE changes it, re-examine the override
    (the upstream fix may have landed, or the override may now skip something new)."""
    from great_expectations.execution_engine import SqlAlchemyExecutionEngine

    _gx()
    source = inspect.getsource(SqlAlchemyExecutionEngine.execute_query)
    assert hashlib.sha256(source.encode()).hexdigest() == UPSTREAM_EXECUTE_QUERY, source
    buffered, _ = engine_classes()
    assert buffered.__dict__["execute_query"] is not SqlAlchemyExecutionEngine.execute_query  # its own override


def test_aggregates_are_computed_over_the_whole_relation_in_the_engine(table):
    runner = SqlSuiteRunner(
        table,
        [
            _suite(
                "right",
                E("expect_column_mean_to_be_between", {"column": "v", "min_value": 49.49, "max_value": 49.51}),
                E(
                    "expect_column_quantile_values_to_be_between",
                    {"column": "v", "quantile_ranges": {"quantiles": [0.5], "value_ranges": [[49, 50]]}},
                ),
                E("expect_column_values_to_be_unique", {"column": "id"}),
                E("expect_column_values_to_not_be_null", {"column": "s", "mostly": 0.89}),
            ),
            _suite(
                "wrong",
                E("expect_column_mean_to_be_between", {"column": "v", "min_value": 60, "max_value": 70}),
                E("expect_column_values_to_not_be_null", {"column": "s", "mostly": 0.95}),
            ),
        ],
    )
    results = runner.validate('SELECT * FROM "analytics"."t"')
    assert results["right"].passed, results["right"].describe()
    assert results["right"].rows == 100_000
    wrong = results["wrong"]
    assert set(wrong.failures) == {"expect_column_mean_to_be_between(v)", "expect_column_values_to_not_be_null(s)"}
    assert wrong.failures["expect_column_values_to_not_be_null(s)"] == 10_000
    # what a refusal shows comes back in GE's BASIC result: the observed value of an aggregate
    assert wrong.samples["expect_column_mean_to_be_between(v)"] == ["observed 49.5"]
    # uniqueness over the whole relation: one duplicate id anywhere is seen (batches never compare across each other)
    dup = runner.validate('SELECT * FROM "analytics"."t" UNION ALL SELECT 99999, 1, \'x\'')
    assert dup["right"].failures == {"expect_column_values_to_be_unique(id)": 2}
    assert dup["right"].samples["expect_column_values_to_be_unique(id)"] == [99999, 99999]  # the offending values


def test_the_runner_sees_the_callers_uncommitted_rows_and_leaves_its_transaction_open(table):
    """A gate runs inside the transaction that wrote what it checks: GE reads through the session's own
    connection (its uncommitted rows and temporary tables), never commits nor rolls back, and the
    caller's rollback still undoes everything."""
    table.execute("BEGIN")
    table.execute('INSERT INTO "analytics"."t" VALUES (7, 7, \'x\')')  # a duplicate id, not committed
    table.execute('CREATE TEMP TABLE scratch AS SELECT * FROM "analytics"."t" WHERE id < 5000')
    runner = SqlSuiteRunner(table, [_suite("u", E("expect_column_values_to_be_unique", {"column": "id"}))])
    assert runner.validate('SELECT * FROM "analytics"."t"')["u"].failures == {
        "expect_column_values_to_be_unique(id)": 2
    }
    assert runner.validate("SELECT * FROM scratch")["u"].rows == 5001
    assert table.execute('SELECT count(*) FROM "analytics"."t"').fetchone() == (100_001,)  # still in the transaction
    table.execute("ROLLBACK")
    assert table.execute('SELECT count(*) FROM "analytics"."t"').fetchone() == (100_000,)
    assert runner.validate('SELECT * FROM "analytics"."t"')["u"].passed


def test_a_query_that_fails_in_the_engine_is_named_instead_of_writing_to_an_aborted_transaction(table):
    """DuckDB aborts the transaction on a failed query: the runner says so, naming the expectation."""
    table.execute("BEGIN")
    runner = SqlSuiteRunner(
        table, [_suite("bad", E("expect_column_values_to_be_between", {"column": "s", "min_value": 0, "max_value": 1}))]
    )
    with pytest.raises(RecoveryError, match=r"expect_column_values_to_be_between\(s\).*aborted the transaction"):
        runner.validate('SELECT * FROM "analytics"."t"')
    table.execute("ROLLBACK")


def test_each_validation_can_take_its_own_suites(table):
    keys = _suite("keys", E("expect_column_values_to_be_unique", {"column": "id"}))
    values = _suite("values", E("expect_column_max_to_be_between", {"column": "v", "min_value": 99, "max_value": 99}))
    runner = SqlSuiteRunner(table, [keys, values])
    assert set(runner.validate('SELECT id FROM "analytics"."t"', [keys])) == {"keys"}
    assert runner.validate('SELECT v FROM "analytics"."t"', [values])["values"].passed
