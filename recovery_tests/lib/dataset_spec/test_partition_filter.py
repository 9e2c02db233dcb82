"""Partitions travel as text; a predicate on them is written in the partition column's own type so
the engine can skip what lies outside, and selects exactly the rows the text comparison did."""

from __future__ import annotations

import duckdb
import pytest

from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery_tests.support.small_dataset import build_small_dataset

VALUES = {
    "DATE": ["DATE '2024-01-01'", "DATE '2024-01-02'", "DATE '2024-02-29'"],
    "INTEGER": ["7", "-3", "1000000"],
    "VARCHAR": ["'north'", "'south'", "'2024-01-01'"],
    "TIMESTAMP": ["TIMESTAMP '2024-01-01 00:00:00'", "TIMESTAMP '2024-01-01 12:30:00.5'", "TIMESTAMP '2024-03-01'"],
    "DOUBLE": ["0.1", "-0.0", "1e20"],
    "DECIMAL(10,2)": ["1.50", "2.00", "-0.25"],
    "BOOLEAN": ["true", "false", "true"],
}


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return parse_spec(build_small_dataset(tmp_path_factory.mktemp("pf"), n_orders=20))


def _session(spec, column_type: str) -> DuckDBSession:
    s = DuckDBSession(duckdb.connect())
    table = spec.target.table_name
    s.execute(f"CREATE SCHEMA {table.schema}")
    rows = ", ".join(f"({i}, CAST({v} AS {column_type}))" for i, v in enumerate(VALUES[column_type] * 2))
    s.execute(f"CREATE TABLE {table.sql()} AS SELECT * FROM (VALUES {rows}, (99, NULL)) AS v(id, shard)")
    return s


@pytest.mark.parametrize("column_type", sorted(VALUES))
def test_the_typed_predicate_selects_the_rows_the_text_one_did(spec, column_type):
    s = _session(spec, column_type)
    table = spec.target.table_name.sql()
    texts = [r[0] for r in s.fetchall(f"SELECT DISTINCT CAST(shard AS VARCHAR) FROM {table} WHERE shard IS NOT NULL")]
    chosen = texts[:2] + ["not a value of any type", "2024-13-45"]  # two that cast to nothing
    predicate = in_partitions(s, spec, chosen)
    if column_type != "VARCHAR":
        assert 'CAST("shard" AS VARCHAR)' not in predicate
    text = f"CAST(shard AS VARCHAR) IN ({', '.join(repr(t) for t in chosen)})"
    for where, as_text in [(predicate, text), (f"NOT ({predicate})", f"NOT ({text})")]:
        got = s.fetchall(f"SELECT id FROM {table} WHERE {where} ORDER BY id")
        assert got == s.fetchall(f"SELECT id FROM {table} WHERE {as_text} ORDER BY id"), where
    assert s.fetchall(f"SELECT id FROM {table} WHERE {predicate}")  # the test selects something


def test_texts_that_name_no_value_select_nothing_and_no_list_selects_nothing(spec):
    s = _session(spec, "DATE")
    table = spec.target.table_name.sql()
    assert in_partitions(s, spec, []) == "false"
    only_bad = in_partitions(s, spec, ["2024-13-45"])
    assert s.scalar(f"SELECT count(*) FROM {table} WHERE {only_bad}") == 0
    assert s.scalar(f"SELECT count(*) FROM {table} WHERE NOT ({only_bad})") == 7  # every row but the NULL one


def test_the_engine_prunes_by_the_typed_predicate(spec):
    """The predicate reaches the table scan as a filter on the column (zone maps skip row groups),
    which a cast of every row to text never does."""
    s = _session(spec, "DATE")
    table = spec.target.table_name.sql()
    plan = s.fetchall(f"EXPLAIN SELECT id FROM {table} WHERE {in_partitions(s, spec, ['2024-01-01', '2024-01-02'])}")
    scan = "\n".join(r[1] for r in plan).split("Seq Scan")[-1]
    assert "shard IN ('2024-01-01'::DATE, '2024-01-02'::DATE)" in scan.split("Filters:")[1]
    assert "AS VARCHAR" not in scan


def test_without_a_target_the_predicate_compares_text(spec):
    s = DuckDBSession(duckdb.connect())
    assert in_partitions(s, spec, ["a", "b"]) == "CAST(\"shard\" AS VARCHAR) IN ('a', 'b')"
