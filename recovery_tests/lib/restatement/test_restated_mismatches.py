"""A restated output is compared with its consumer's SQL over the source as multisets: every row
that one side holds more often than the other counts, NULLs match NULLs, and outputs whose
columns differ are told apart from outputs that merely disagree."""

from __future__ import annotations

import duckdb

from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.restatement.record import mismatched_rows


def _session() -> DuckDBSession:
    con = duckdb.connect()
    con.execute("CREATE TABLE a AS SELECT * FROM (VALUES (1, 'x'), (1, 'x'), (2, NULL), (4, 'z')) v(k, s)")
    con.execute("CREATE TABLE b AS SELECT * FROM (VALUES (1, 'x'), (2, NULL), (3, 'y'), (4, 'z')) v(k, s)")
    return DuckDBSession(con)


def test_rows_held_more_often_on_one_side_count_and_nulls_match():
    s = _session()
    # a holds (1, 'x') once more; b holds (3, 'y'); (2, NULL) and (4, 'z') are on both sides once
    assert mismatched_rows(s, "SELECT * FROM a", "SELECT * FROM b") == 2
    assert mismatched_rows(s, "SELECT * FROM b", "SELECT * FROM a") == 2
    assert mismatched_rows(s, "SELECT * FROM a", "SELECT * FROM a") == 0
    # a consumer's SQL ending in a comment still compares
    assert mismatched_rows(s, "SELECT * FROM a", "SELECT * FROM a -- every row") == 0


def test_outputs_with_other_columns_are_not_compared_row_by_row():
    s = _session()
    assert mismatched_rows(s, "SELECT * FROM a", "SELECT k FROM b") == -1
    assert mismatched_rows(s, "SELECT k, s AS t FROM a", "SELECT * FROM b") == -1
