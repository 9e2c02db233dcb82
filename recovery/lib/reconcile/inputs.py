"""What a reconciliation is asked, and where it keeps its results."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from recovery.lib.control.plane import dataset_table, dataset_table_name
from recovery.lib.dataset_spec.models import DatasetSpec


@dataclass(frozen=True)
class ReconcileInputs:
    spec: DatasetSpec
    failed_generations: tuple[str, ...]
    watermark: datetime | None = None  # snapshot watermark; default: the source's max ingested_at
    incident_id: str = "adhoc"
    persist: bool = True  # False: results in temp tables only (a read-only look before containment)
    # True: the whole target (damage outside the failed generations' footprint is counted as drift);
    # False: only the footprint (``footprint.py``): the keys the failed generations wrote and the keys
    # held or expected in their partition range; None: the footprint where there is one (the failed
    # generations wrote something or the incident gives a range), else the whole target
    full: bool | None = True
    partitions: tuple[date | int | str, date | int | str] | None = None  # the incident's range (start, end)
    # True: E is read from the expected rows kept at (or caught up to) the watermark when they serve
    # (``expected_cache.py``); a recovery's later classification of its repair generation does this
    reuse_kept: bool = False


def recon_table(spec: DatasetSpec, persist: bool = True) -> str:
    name = dataset_table_name("recon", spec.dataset)
    return dataset_table("recon", spec.dataset) if persist else f'"{name}"'


def partition_table(spec: DatasetSpec, persist: bool = True) -> str:
    name = dataset_table_name("recon_partitions", spec.dataset)
    return dataset_table("recon_partitions", spec.dataset) if persist else f'"{name}"'


def side(which: str, column: str) -> str:
    """A column of the target side ('t') or expected side ('e') of ``__diff``."""
    return f'"{which}__{column}"'
