"""Control-plane tables of a repair: the plan, its partitions and waves, gate results, diffs."""

from __future__ import annotations

from recovery.lib.control.plane import dataset_table
from recovery.lib.control.tables import (  # noqa: F401 - the repair's tables, re-exported
    DIFFS,
    FINGERPRINTS,
    GATES,
    PARTITIONS,
    PLANS,
    REPAIR_DDL,
    REPLAYS,
)
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session


def ensure_repair_tables(s: Session) -> None:
    for stmt in REPAIR_DDL:
        s.execute(stmt)


def snapshot_table(spec: DatasetSpec) -> str:
    """The fixed source snapshot's expected rows for the repair of ``spec``'s dataset."""
    return dataset_table("repair_snapshot", spec.dataset)
