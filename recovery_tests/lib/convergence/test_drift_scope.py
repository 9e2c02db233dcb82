"""Convergence compares every row of each key with a row in scope, on either side: a scope of a
few partitions collects those keys first, a scope of most of the table compares the whole table
and keeps what falls in scope. Both report the same drift for the same partitions, a key moved
across the scope's edge included."""

from __future__ import annotations

from pathlib import Path

from recovery.lib.convergence.drift import compare_partitions, stage_sides
from recovery_tests.support.rows import present
from recovery_tests.support.small_dataset import target_equal_to_the_source

COLUMNS = "partition, expected_rows, actual_rows, missing, extra, changed, duplicate, drift_keys, sample_keys"


def test_a_narrow_and_a_wide_scope_report_the_same_drift(tmp_path: Path):
    spec, s = target_equal_to_the_source(tmp_path, 400)
    shards = [r[0] for r in s.fetchall("SELECT shard FROM mart.orders GROUP BY 1 ORDER BY count(*) DESC, 1")]
    a, b, far = shards[0], shards[1], shards[-1]  # the two fullest partitions, and one far from them
    one = "(SELECT region, order_no FROM mart.orders WHERE shard = ? ORDER BY ALL LIMIT 1 OFFSET ?)"
    s.execute(f"INSERT INTO mart.orders SELECT * FROM mart.orders WHERE (region, order_no) IN {one}", [a, 0])  # a copy
    s.execute(f"UPDATE mart.orders SET qty = qty + 1 WHERE (region, order_no) IN {one}", [a, 2])  # changed
    s.execute(f"DELETE FROM mart.orders WHERE (region, order_no) IN {one}", [b, 0])  # missing
    s.execute(f"UPDATE mart.orders SET shard = ? WHERE (region, order_no) IN {one}", [far, b, 1])  # moved out of scope
    s.execute(
        "INSERT INTO mart.orders VALUES ('east', 77777, ?, TIMESTAMP '2026-01-01', 1, 'SKU-1', 1, 'g1', now())", [a]
    )
    narrow_scope = [a, b]
    assert 2 * len(narrow_scope) < len(shards)  # the keys path

    values = stage_sides(s, spec, None)
    compare_partitions(s, spec, narrow_scope, values)
    narrow = s.fetchall(f"SELECT {COLUMNS} FROM __cv_drift ORDER BY partition")
    wide_scope = [x for x in shards if x != far]  # most of the table, not where the moved key went
    assert 2 * len(wide_scope) >= len(shards)  # the whole-table path
    compare_partitions(s, spec, wide_scope, values)
    wide = s.fetchall(f"SELECT {COLUMNS} FROM __cv_drift WHERE partition IN (?, ?) ORDER BY partition", narrow_scope)
    assert narrow == wide
    by_partition = {r[0]: r for r in narrow}
    assert by_partition[a][3:8] == (0, 1, 1, 1, 3)  # extra, changed, duplicate
    assert by_partition[b][3:8] == (1, 0, 1, 0, 2)  # the missing key, and the one moved out (changed)


def test_a_copy_in_another_partition_counts_where_both_rows_sit_though_one_partition_is_unchanged(tmp_path: Path):
    """Partitions whose rows hash alike on both sides are not compared key by key; a key copied
    from such a partition into another one is still a duplicate in both, and the partitions with
    no drift at all report their row counts and nothing else."""
    spec, s = target_equal_to_the_source(tmp_path, 400)
    shards = [r[0] for r in s.fetchall("SELECT shard FROM mart.orders GROUP BY 1 ORDER BY count(*) DESC, 1")]
    x, y = shards[0], shards[1]
    k = present(s.fetchone("SELECT region, order_no FROM mart.orders WHERE shard = ? ORDER BY ALL LIMIT 1", [x]))
    s.execute(
        "INSERT INTO mart.orders SELECT * REPLACE (? AS shard) FROM mart.orders WHERE region = ? AND order_no = ?",
        [y, *k],
    )
    compare_partitions(s, spec, shards, stage_sides(s, spec, None))
    drift = {r[0]: r for r in s.fetchall(f"SELECT {COLUMNS} FROM __cv_drift ORDER BY partition")}
    assert drift[x][3:8] == (0, 0, 0, 1, 1) and drift[y][3:8] == (0, 0, 0, 1, 1)  # the duplicate, in both
    assert drift[y][1] + 1 == drift[y][2]  # one row more than expected where the copy landed
    for p in shards[2:]:
        assert drift[p][1] == drift[p][2] > 0 and drift[p][3:8] == (0, 0, 0, 0, 0)
