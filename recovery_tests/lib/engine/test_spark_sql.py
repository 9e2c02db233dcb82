"""How the Spark engine reads a statement of the phases' DuckDB SQL."""

from __future__ import annotations

import logging

import pytest

from recovery.lib.engine.spark_sql import statement


def test_a_statement_sqlglot_has_no_grammar_for_is_routed_as_other_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        st = statement("RESET VARIABLE recovery_evidence_key_inner")
    assert st.kind == "other" and st.target is None
    assert not caplog.records, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("sql", "kind", "target"),
    [
        ("INSERT INTO a.t SELECT * FROM b.s", "insert", ("a", "t")),
        ("DELETE FROM a.t WHERE k = 1", "delete", ("a", "t")),
        ("CREATE OR REPLACE VIEW a.v AS SELECT 1 AS x", "create_view", ("a", "v")),
        ("SELECT * FROM a.t", "select", None),
    ],
)
def test_statements_are_classified_with_their_target(sql: str, kind: str, target):
    st = statement(sql)
    assert (st.kind, st.target_key) == (kind, target)
