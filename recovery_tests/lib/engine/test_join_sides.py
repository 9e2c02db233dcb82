"""``joins_as_written``: the reconciliation's diff chooses its hash joins' build sides itself.

DuckDB builds a join on the input it estimates smaller; joining wide rows to a narrow index of
as many keys, its estimate can pick the wide rows. Within ``joins_as_written`` each join builds
on the side the SQL puts on the right, and the session's own optimizer settings come back after.
"""

from __future__ import annotations

import json
from pathlib import Path

from recovery.lib.dataset_spec.sql_files import joins_nothing
from recovery.lib.engine.duckdb_engine import DuckDBEngine, DuckDBSession


def _build_side(s: DuckDBSession, sql: str) -> str:
    """The table a one-join query builds its hash table from (DuckDB's second child)."""
    node = json.loads(s.fetchall(f"EXPLAIN (FORMAT json) {sql}")[0][1])[0]
    while node["name"] != "HASH_JOIN":
        (node,) = node["children"]
    return node["children"][1]["extra_info"]["Table"].rsplit(".", 1)[-1]


def test_within_it_a_join_builds_on_its_right_side_and_the_setting_comes_back(tmp_path: Path):
    engine = DuckDBEngine(str(tmp_path / "w.duckdb"))
    with engine.session() as s:
        s.execute("CREATE TABLE few AS SELECT range AS k FROM range(1000)")
        s.execute("CREATE TABLE many AS SELECT range AS k, range * 2 AS v FROM range(100000)")
        s.execute("SET disabled_optimizers = 'top_n'")  # the caller's own setting
        join = "SELECT * FROM few JOIN many USING (k)"
        assert _build_side(s, join) == "few"  # DuckDB's choice: the smaller input
        with s.joins_as_written():
            assert _build_side(s, join) == "many"  # as written: the right side
            off = s.scalar("SELECT current_setting('disabled_optimizers')")
            assert set(off.split(",")) == {"top_n", "build_side_probe_side"}
        assert s.scalar("SELECT current_setting('disabled_optimizers')") == "top_n"
        assert _build_side(s, join) == "few"


def test_only_a_transform_that_joins_nothing_of_its_own_gets_the_joins_as_written():
    assert joins_nothing("SELECT k, v * 2 AS v FROM {{ source }} WHERE op <> 'x'", "source")
    assert joins_nothing("WITH a AS (SELECT * FROM {{ source }}) SELECT * FROM a", "source")
    assert not joins_nothing("SELECT s.*, d.x FROM {{ source }} s JOIN dim d USING (k)", "source")
    assert not joins_nothing("SELECT s.* FROM {{ source }} s, dim d WHERE s.k = d.k", "source")
    assert not joins_nothing("SELECT * FROM {{ source }} WHERE k IN (SELECT k FROM dim)", "source")
    assert not joins_nothing("SELECT * FROM {{ source }} WHERE", "source")  # in doubt: DuckDB plans
