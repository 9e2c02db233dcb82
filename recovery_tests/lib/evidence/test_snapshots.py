"""Choosing a bundle's source snapshot: by its watermark, "now", or the only failed generation's read;
a bundle of the first format (snapshots as Parquet files of their own) is told where they are."""

from __future__ import annotations

import pytest

from recovery.lib.errors import RecoveryError
from recovery.lib.evidence import choose_snapshot


def _entry(as_of: str) -> dict:
    return {"path": f"source/{as_of}.keys.parquet", "snapshot": {"as_of": as_of}}


def test_the_failed_generations_read_is_the_default_and_two_reads_must_be_named():
    one = {"format": "recovery-evidence/2", "files": [_entry("2024-07-05 01:00:00"), _entry("now")]}
    assert choose_snapshot(one, None)["snapshot"]["as_of"] == "2024-07-05 01:00:00"
    assert choose_snapshot(one, "now")["snapshot"]["as_of"] == "now"
    two = {"format": "recovery-evidence/2", "files": [_entry("2024-07-05 01:00:00"), _entry("2024-08-01 00:00:00")]}
    with pytest.raises(RecoveryError, match="as of 2024-07-05 01:00:00, 2024-08-01 00:00:00; name one with --as-of"):
        choose_snapshot(two, None)


def test_a_bundle_of_the_first_format_is_told_where_its_snapshots_are():
    old = {"format": "recovery-evidence/1", "files": [{"path": "source/snapshot_now.parquet", "rows": 3}]}
    with pytest.raises(RecoveryError, match=r"format is recovery-evidence/1\).*source/snapshot_\*\.parquet"):
        choose_snapshot(old, None)


def test_rows_are_read_null_safely_by_key_and_version(tmp_path):
    """A key part or a version may be NULL: the snapshot's rows still come back through its list."""
    import duckdb

    from recovery.lib.evidence import snapshot_rows_sql

    (tmp_path / "source").mkdir()
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT * FROM (VALUES (1, 'a', 1, 'x'), (1, 'a', 2, 'y'), (NULL, 'b', 1, 'z'), (2, 'c', NULL, 'w')) "
        "AS v(k1, k2, version, payload)) TO ? (FORMAT parquet)",
        [str(tmp_path / "source/change_log.parquet")],
    )
    con.execute(
        "COPY (SELECT * FROM (VALUES (1, 'a', 2), (NULL, 'b', 1), (2, 'c', NULL)) AS v(k1, k2, version)) "
        "TO ? (FORMAT parquet)",
        [str(tmp_path / "source/s.keys.parquet")],
    )
    entry = {
        "path": "source/s.keys.parquet",
        "snapshot": {"as_of": "now", "rows_of": "source/change_log.parquet", "key": ["k1", "k2"], "version": "version"},
    }
    rows = con.execute(f"SELECT payload FROM ({snapshot_rows_sql(tmp_path, entry)}) ORDER BY payload").fetchall()
    assert rows == [("w",), ("y",), ("z",)]
