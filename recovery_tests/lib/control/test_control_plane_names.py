"""Each per-dataset control-plane table is named in one place (``control_plane.dataset_table``),
so no module can drift to a name another module does not read."""

from __future__ import annotations

import re

import pytest

from recovery.config import PROJECT_ROOT
from recovery.lib.control.plane import PER_DATASET_TABLES, dataset_table, dataset_table_name, is_dataset_table_name

KINDS = "|".join(PER_DATASET_TABLES)
BUILT_BY_HAND = re.compile(rf"[\"'.](?:{KINDS})__\{{")  # "delta__{ds}" or _recovery.recon__{ds}


def test_no_module_builds_a_per_dataset_table_name_itself():
    offenders = [
        f"{p.relative_to(PROJECT_ROOT)}:{n}"
        for p in sorted((PROJECT_ROOT / "recovery").rglob("*.py"))
        if p.name != "control_names.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if BUILT_BY_HAND.search(line)
    ]
    assert offenders == []


def test_the_registry_names_and_refuses_unknown_kinds():
    assert dataset_table("delta", "orders") == '_recovery."delta__orders"'
    assert dataset_table_name("recon_partitions", "orders") == "recon_partitions__orders"
    with pytest.raises(ValueError, match="not a per-dataset control-plane table"):
        dataset_table("deltas", "orders")


def test_an_engine_tells_a_per_dataset_log_from_a_control_table_by_the_registry():
    assert is_dataset_table_name("delta__orders") and is_dataset_table_name("recon_partitions__a__b")
    assert not is_dataset_table_name("generations")  # the transactional control plane
    assert not is_dataset_table_name("deltas__orders")  # not a registered kind
    assert not is_dataset_table_name("recon__")  # no dataset
