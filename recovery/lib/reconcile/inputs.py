"""What a reconciliation is asked, and where it keeps its results."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.lib.control_plane import SCHEMA
from recovery.lib.spec import DatasetSpec


@dataclass(frozen=True)
class ReconcileInputs:
    spec: DatasetSpec
    failed_generations: tuple[str, ...]
    watermark: datetime | None = None      # snapshot watermark; default: the source's max ingested_at
    incident_id: str = "adhoc"
    persist: bool = True                   # False: results in temp tables only (a read-only look before containment)


def recon_table(spec: DatasetSpec, persist: bool = True) -> str:
    return f'{SCHEMA}."recon__{spec.dataset}"' if persist else f'"recon__{spec.dataset}"'


def partition_table(spec: DatasetSpec, persist: bool = True) -> str:
    return f'{SCHEMA}."recon_partitions__{spec.dataset}"' if persist else f'"recon_partitions__{spec.dataset}"'
