"""A failure that comes from the machine (a full disk, too little memory) says what to do
about it, in the words the engine and the operating system use for it."""

from __future__ import annotations

import pytest

from recovery.lib.errors import environment_hint


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (
            'IOException: IO Error: Could not write file "/w/warehouse.duckdb.tmp/duckdb_temp_1.tmp": '
            "No space left on device",
            "the disk is full",
        ),
        ("OSError: [Errno 28] No space left on device: '/ev/source/change_log.parquet'", "the disk is full"),
        (
            "OutOfMemoryException: Out of Memory Error: failed to allocate data of size 512.0 MiB (2.5 "
            "GiB/2.7 GiB used)",
            "warehouse.memory_limit",
        ),
    ],
)
def test_a_full_disk_or_memory_names_what_to_do(message, says):
    hint = environment_hint(message)
    assert hint is not None and says in hint and "run the command again" in hint


@pytest.mark.parametrize(
    "message", ["BinderException: Referenced column x not found", "KeyError: 'generation'", "ZeroDivisionError: "]
)
def test_any_other_failure_gets_no_hint(message):
    assert environment_hint(message) is None
