"""Each per-dataset control-plane table is named in one place (``control_plane.dataset_table``),
so no module can drift to a name another module does not read."""

from __future__ import annotations

import re

import pytest

from recovery.config import PROJECT_ROOT
from recovery.lib.control_plane import PER_DATASET_TABLES, dataset_table, dataset_table_name

KINDS = "|".join(PER_DATASET_TABLES)
BUILT_BY_HAND = re.compile(rf"[\"'](?:{KINDS})__\{{")


def test_no_module_builds_a_per_dataset_table_name_itself():
    offenders = [f"{p.relative_to(PROJECT_ROOT)}:{n}" for p in sorted((PROJECT_ROOT / "recovery").rglob("*.py"))
                 if p.name != "control_plane.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if BUILT_BY_HAND.search(line)]
    assert offenders == []


def test_the_registry_names_and_refuses_unknown_kinds():
    assert dataset_table("delta", "orders") == '_recovery."delta__orders"'
    assert dataset_table_name("recon_partitions", "orders") == "recon_partitions__orders"
    with pytest.raises(ValueError, match="not a per-dataset control-plane table"):
        dataset_table("deltas", "orders")
