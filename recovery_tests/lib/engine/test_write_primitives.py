"""The engine's write primitives (ADR 0001) on DuckDB: what the writer and a pointer move ask for.

A phase asks an engine for a change (``replace_rows``, ``swap_pointer``) instead of handing it
DML text; these are the semantics every engine keeps. Spark's own versions are checked against
the same expectations in ``test_spark_engine.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.lib.engine.duckdb_engine import DuckDBEngine


@pytest.fixture
def engine(tmp_path: Path) -> DuckDBEngine:
    engine = DuckDBEngine(str(tmp_path / "w.duckdb"))
    with engine.transaction() as s:
        s.execute("CREATE SCHEMA raw")
        s.execute("CREATE TABLE raw.t (k INTEGER, p VARCHAR, v VARCHAR)")
        s.execute("INSERT INTO raw.t VALUES (1, 'a', 'x'), (2, 'a', 'y'), (3, 'b', 'z'), (4, NULL, 'n')")
    return engine


def _rows(engine: DuckDBEngine) -> list[tuple]:
    with engine.session(read_only=True) as s:
        return s.fetchall("SELECT k, p, v FROM raw.t ORDER BY k")


def test_replace_rows_removes_what_the_predicate_matches_and_adds_the_select(engine):
    with engine.transaction() as s:
        s.replace_rows("raw.t", ["v", "k", "p"], remove="p = 'a'", insert="SELECT ?, 5, 'a'", params=["new"])
    # the insert names its columns in its own order; the NULL-partition row is kept (NULL is not 'a')
    assert _rows(engine) == [(3, "b", "z"), (4, None, "n"), (5, "a", "new")]


def test_replace_rows_with_one_side_is_an_append_or_a_delete(engine):
    with engine.transaction() as s:
        s.replace_rows("raw.t", ["k", "p", "v"], insert="SELECT 9, 'c', 'w'")
        s.replace_rows("raw.t", ["k", "p", "v"], remove="k IN (1, 3)")
    assert _rows(engine) == [(2, "a", "y"), (4, None, "n"), (9, "c", "w")]


def test_replace_rows_rolls_back_with_the_callers_transaction(engine):
    before = _rows(engine)
    with pytest.raises(RuntimeError):
        with engine.transaction() as s:
            s.replace_rows("raw.t", ["k", "p", "v"], remove="true", insert="SELECT 7, 'x', 'x'")
            raise RuntimeError("the step failed after its write")
    assert _rows(engine) == before


def test_swap_pointer_repoints_a_public_view(engine):
    with engine.transaction() as s:
        s.execute("CREATE TABLE raw.t2 AS SELECT k, p, upper(v) AS v FROM raw.t")
        s.swap_pointer("raw.pub", "SELECT k, v FROM raw.t")
        s.swap_pointer("raw.pub", "SELECT k, v FROM raw.t2")
    with engine.session(read_only=True) as s:
        assert s.fetchall("SELECT v FROM raw.pub ORDER BY k") == [("X",), ("Y",), ("Z",), ("N",)]
        assert s.object_kind("raw", "pub") == "view"


def test_the_named_writes_create_materialize_update_drop_and_export(engine, tmp_path: Path):
    """Every data write a phase makes is one of these operations; DuckDB runs its own statement."""
    import pyarrow.parquet as pq

    with engine.transaction() as s:
        s.create_table("raw.log", "k INTEGER, note VARCHAR")
        s.create_table("raw.log", "other BOOLEAN")  # exists: left as it is
        s.materialize("raw.a", "SELECT k, v FROM raw.t WHERE k <= ?", [2])
        s.materialize("raw.a", "SELECT 0 AS k, 'no' AS v", keep_existing=True)  # exists: kept
        s.materialize("raw.b", "SELECT k FROM raw.t WHERE k > ?", [2])  # replaced below
        s.materialize("raw.b", "SELECT k FROM raw.t WHERE k = 1")
        s.update_rows("raw.t", [("v", "upper(v) || ?")], where="p = ?", params=["!", "a"])
        s.temp_table("__k", "SELECT k FROM raw.t WHERE p IS NULL")
        s.collect_table("__n", "SELECT count(*) AS n FROM raw.t")
        s.temp_view("__v", "SELECT v FROM raw.t JOIN __k USING (k)")
        assert s.fetchall("SELECT * FROM __v") == [("n",)] and s.scalar("SELECT n FROM __n") == 4
        s.drop_relation("__v", view=True)
        s.drop_relation("raw.b")
        s.drop_relation("raw.nothing")  # absent: nothing to do
        rows = s.export_parquet("SELECT k, v FROM raw.t WHERE k < ? ORDER BY k", str(tmp_path / "out.parquet"), [3])
    assert rows == 2 and pq.read_table(tmp_path / "out.parquet").to_pylist() == [
        {"k": 1, "v": "X!"},
        {"k": 2, "v": "Y!"},
    ]
    with engine.session(read_only=True) as s:
        assert [c for c, _ in s.columns("raw.log")] == ["k", "note"]
        assert s.fetchall("SELECT k, v FROM raw.a ORDER BY k") == [(1, "x"), (2, "y")]
        assert s.object_kind("raw", "b") is None
        assert s.fetchall("SELECT k, v FROM raw.t ORDER BY k")[2:] == [(3, "z"), (4, "n")]  # NULL p: not updated


def test_has_temp_sees_this_sessions_temp_tables_only(engine):
    with engine.session() as s:
        assert not s.has_temp("scratch")
        s.temp_table("scratch", "SELECT k FROM raw.t WHERE p = ?", ["a"])
        assert s.has_temp("scratch") and not s.has_temp("t")  # raw.t is a table, not a temp
    with engine.session() as s:
        assert not s.has_temp("scratch")  # gone with the session that made it
