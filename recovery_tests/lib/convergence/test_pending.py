"""Pending vs drift, key by key (``recovery/lib/convergence/pending.py`` with ``drift.py``).

The small dataset's target equal to its source, then changes that arrive after the
watermark: one not applied (pending), one the target already shows (converged, not
pending), a tombstone and a new key not applied (pending where the key sits and where it
goes), and, apart from them, a row changed in the target with no change in the source
(drift) and a row without a source version (compared on its payload: no drift).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from recovery.lib.convergence.drift import compare_partitions, stage_sides
from recovery.lib.convergence.pending import PENDING, pending_totals, stage_pending
from recovery.lib.convergence.watermark import stage_partition_watermarks
from recovery_tests.support.small_dataset import target_equal_to_the_source

NEW = "region, order_no, rev, change, loaded_at, placed_at, qty, sku"


def test_late_changes_are_pending_where_the_key_sits_and_where_it_goes_and_the_rest_is_drift(tmp_path: Path):
    spec, s = target_equal_to_the_source(tmp_path, 200)
    watermark: datetime = s.scalar("SELECT max(loaded_at) FROM src.order_events")
    keys = s.fetchall("SELECT region, order_no, shard FROM mart.orders ORDER BY shard, region, order_no LIMIT 6")
    (a, b, c, drifted, unversioned, _) = keys
    late, later = watermark + timedelta(hours=1), watermark + timedelta(hours=5)

    def change(key, op: str, at: datetime, qty: int = 9) -> None:
        s.execute(
            f"INSERT INTO src.order_events ({NEW}) SELECT region, order_no, max(rev) + 1, ?, ?, arg_max(placed_at, "
            "rev), "
            f"?, arg_max(sku, rev) FROM src.order_events WHERE region = ? AND order_no = ? GROUP BY ALL",
            [op, at, qty, key[0], key[1]],
        )

    change(a, "put", late)  # not applied: pending
    change(a, "put", later, qty=11)  # twice: two pending changes
    change(b, "put", late)  # applied already (the target shows it): converged
    s.execute("UPDATE mart.orders SET qty = 9, src_rev = src_rev + 1 WHERE region = ? AND order_no = ?", [b[0], b[1]])
    change(c, "drop", later)  # a tombstone not applied: pending where the target still has the key
    s.execute(  # a new key, not applied: pending where the source puts it
        f"INSERT INTO src.order_events ({NEW}) SELECT 'west', 99001, 1, 'put', ?, placed_at, 1, 'SKU-001' "
        f"FROM src.order_events WHERE region = ? AND order_no = ? LIMIT 1",
        [later, a[0], a[1]],
    )
    s.execute("UPDATE mart.orders SET qty = qty + 100 WHERE region = ? AND order_no = ?", list(drifted[:2]))
    s.execute("UPDATE mart.orders SET src_rev = NULL WHERE region = ? AND order_no = ?", list(unversioned[:2]))

    stage_partition_watermarks(s, spec, watermark)
    values = stage_sides(s, spec, None)
    stage_pending(s, spec, watermark, later - timedelta(minutes=1), values)
    pending = s.fetchall(f"SELECT region, order_no, p, changes, overdue FROM {PENDING} ORDER BY ALL")
    new_shard = s.scalar("SELECT shard FROM __cv_e WHERE region = 'west' AND order_no = 99001")
    assert pending == sorted(
        [(a[0], a[1], a[2], 2, 1), (c[0], c[1], c[2], 1, 0), ("west", 99001, new_shard, 1, 0)]
    )  # b is not there: its target row is the source's latest
    assert pending_totals(s, spec)[0] == 4 and pending_totals(s, spec)[2] == 1

    scope = sorted({k[2] for k in keys} | {new_shard})
    compare_partitions(s, spec, scope, values, leave_out=PENDING)
    drift = s.fetchall("SELECT partition, drift_keys, changed FROM __cv_drift WHERE drift_keys > 0")
    assert drift == [(drifted[2], 1, 1)]  # only the row changed behind the watermark; unversioned is no drift
