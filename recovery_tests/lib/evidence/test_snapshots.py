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
