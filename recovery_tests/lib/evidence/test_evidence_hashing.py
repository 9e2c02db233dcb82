"""Evidence copies hash each distinct sensitive value once, and every row still gets exactly
HMAC-SHA256(key, CAST(value AS VARCHAR)); NULL stays NULL, the other columns and their order
are untouched, and the copy's parameters reach every read of the relation."""

from __future__ import annotations

import hashlib
import hmac

import duckdb

from recovery.lib.evidence.bundle import _INNER, _OUTER, hashed_select, hmac_pads

SECRET = "test-evidence-key"


def _mac(value: object) -> str:
    return hmac.new(SECRET.encode(), str(value).encode(), hashlib.sha256).hexdigest()


def _keyed_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding the evidence key's padded halves, as a bundle's session does."""
    con = duckdb.connect()
    inner, outer = hmac_pads(SECRET)
    con.execute(f"SET VARIABLE {_INNER} = ?", [inner])
    con.execute(f"SET VARIABLE {_OUTER} = ?", [outer])
    return con


def test_each_row_gets_the_hmac_of_its_value_and_nulls_stay_null():
    con = _keyed_connection()
    con.execute(
        "CREATE TABLE t AS SELECT * FROM (VALUES (1, 'alice', 7, 'x'), (2, 'bob', 7, 'y'), (3, 'alice', NULL, 'z'), "
        "(4, NULL, 8, 'x'), (5, 'carol', 9, 'y')) AS v(id, name, account, gen)"
    )
    select, params = hashed_select("SELECT * FROM t WHERE gen <> ?", ["z"], ["name", "account"])
    assert params == ["z", "z", "z"]  # the distinct values of each hashed column, and the rows
    got = con.execute(f"SELECT * FROM ({select}) ORDER BY id", params).fetchall()
    assert [d[0] for d in con.description] == ["id", "name", "account", "gen"]
    assert got == [
        (1, _mac("alice"), _mac(7), "x"),
        (2, _mac("bob"), _mac(7), "y"),
        (4, None, _mac(8), "x"),
        (5, _mac("carol"), _mac(9), "y"),
    ]


def test_a_map_joined_on_the_value_gives_each_row_the_hmac_of_its_own_text():
    """Columns whose equal values have equal text are looked up by value, the rest by text: a
    DOUBLE's -0.0 and 0.0 are one value but two texts, and each keeps the HMAC of its own text."""
    con = _keyed_connection()
    con.execute(
        "CREATE TABLE t AS SELECT id, CAST(customer AS BIGINT) AS customer, name, CAST(score AS DOUBLE) AS score "
        "FROM (VALUES (1, 7, 'alice', '-0.0'), (2, 7, 'bob', '0.0'), (3, NULL, 'alice', '0.5'), (4, 9, NULL, NULL)) "
        "AS v(id, customer, name, score)"
    )
    types = {r[0]: r[1] for r in con.execute("DESCRIBE t").fetchall()}
    select, params = hashed_select("SELECT * FROM t", [], ["customer", "name", "score"], types)
    got = con.execute(f"SELECT * FROM ({select}) ORDER BY id", params).fetchall()
    assert [d[0] for d in con.description] == ["id", "customer", "name", "score"]
    assert got == [
        (1, _mac(7), _mac("alice"), _mac("-0.0")),
        (2, _mac(7), _mac("bob"), _mac("0.0")),
        (3, None, _mac("alice"), _mac("0.5")),
        (4, _mac(9), None, None),
    ]


def test_a_snapshot_hashed_with_the_change_logs_values_equals_its_own():
    """A source snapshot takes its sensitive values' hashes from the change log it ranks (a
    superset), instead of ranking the log a second time: the rows are the same."""
    con = _keyed_connection()
    con.execute(
        "CREATE TABLE log AS SELECT * FROM (VALUES (1, 1, 'alice'), (1, 2, 'bob'), (2, 1, 'carol'), (3, 1, NULL), "
        "(3, 2, 'dave')) AS v(id, version, customer)"
    )
    snap = (
        "SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY version DESC) AS rn "
        "FROM log) WHERE rn = 1"
    )
    own, p1 = hashed_select(snap, [], ["customer"])
    shared, p2 = hashed_select(snap, [], ["customer"], values_from="SELECT * FROM log")
    assert "FROM (SELECT * FROM log)" in shared and p2 == []
    rows = con.execute(f"SELECT * FROM ({shared}) ORDER BY id", p2).fetchall()
    assert rows == con.execute(f"SELECT * FROM ({own}) ORDER BY id", p1).fetchall()
    assert rows == [(1, 2, _mac("bob")), (2, 1, _mac("carol")), (3, 2, _mac("dave"))]
