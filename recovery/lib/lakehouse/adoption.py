"""Containment's adoption of a lakehouse target's copy in the warehouse file.

The history sync keeps the table's rows at the public name until containment; adoption
(``recovery.lib.pointers.adoption``) then moves them into the first namespace, pinned at the
fence's version. The write log's rows written before that say where they now live.
"""

from __future__ import annotations

import dataclasses

from recovery.lib import faults
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.lakehouse.fence import TableFence
from recovery.lib.pointers.adoption import Adoption, point_write_log_at
from recovery.lib.retry import retrying


def adopted_lakehouse(engine: Engine, spec: DatasetSpec, adoption: Adoption, fence: TableFence) -> Adoption:
    """Point the history's rows at the adopted namespace (idempotent: ``adopt`` does it in its own commit; this
    covers a target adopted before it did) and add the table's fence to the line."""

    def txn() -> None:
        with engine.transaction() as s:
            point_write_log_at(s, spec, adoption.namespace)
            faults.checkpoint("lake_adopt:recorded")  # the write log's rows pointed at the namespace, not committed

    retrying(txn)
    faults.checkpoint("lake_adopt:committed")
    kept_out = [c for r in fence.synced for c in r.not_applied]
    note = fence.line() + (f"; {len(kept_out)} commit(s) after the fence kept out of the repair" if kept_out else "")
    return dataclasses.replace(adoption, note=note)
