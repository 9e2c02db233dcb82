"""How the Spark engine reads a statement of the phases' DuckDB SQL: queries only, never DML."""

from __future__ import annotations

import logging

import pytest

from recovery.lib.engine.spark_sql import parse, query_of


def test_a_statement_sqlglot_has_no_grammar_for_is_not_a_query_and_logs_no_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        tree = parse("RESET VARIABLE recovery_evidence_key_inner")
    assert query_of(tree) is None
    assert not caplog.records, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("sql", "query"),
    [
        ("INSERT INTO a.t SELECT * FROM b.s", None),
        ("DELETE FROM a.t WHERE k = 1", None),
        ("CREATE OR REPLACE VIEW a.v AS SELECT 1 AS x", None),
        ("COPY (SELECT 1) TO 'x.parquet'", None),
        ("SELECT * FROM a.t", "SELECT * FROM a.t"),
        ("DESCRIBE SELECT * FROM a.t", "SELECT * FROM a.t"),
    ],
)
def test_only_a_query_or_describe_has_a_query_to_run_on_spark(sql: str, query):
    found = query_of(parse(sql))
    assert (found.sql("duckdb") if found is not None else None) == query
