"""What an evidence bundle keeps of a lakehouse table: its commit log, and the versions it pins.

The rows themselves are copied as for any target (the warehouse file holds them as of
the fence); the log is what proves how they came to be: Delta's ``_delta_log`` commit
files, Iceberg's current metadata JSON, manifest lists and manifests, each copied with
its checksum into the bundle's manifest.
"""

from __future__ import annotations

from pathlib import Path

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.lakehouse.formats import open_log
from recovery.lib.lakehouse.history import FENCES, TABLES


def commit_log_files(spec: DatasetSpec) -> list[tuple[str, Path, str]]:
    """(bundle path, file, description) of every lakehouse table's commit log files."""
    out = []
    for role, lake in (("source", spec.source.lakehouse), ("target", spec.target.lakehouse)):
        if lake is None:
            continue
        for rel, path in open_log(lake).log_files():
            out.append((f"lakehouse/{role}/{rel}", path, f"{lake.format} commit log of the {role} {lake.location}"))
    return out


def pinned_versions(s: Session, spec: DatasetSpec) -> dict:
    """The versions the warehouse file was synced to, and the target's fence version."""
    out: dict = {}
    if s.object_kind("_recovery", "lakehouse_tables") is None:
        return out
    for role, location, fmt, version in s.fetchall(
        f"SELECT role, location, format, version FROM {TABLES} WHERE dataset = ?", [spec.dataset]
    ):
        out[role] = {"table": location, "format": fmt, "synced_version": version}
    fence = s.fetchone(
        f"SELECT version, ref, incident_id, fenced_at FROM {FENCES} WHERE dataset = ? ORDER BY version LIMIT 1",
        [spec.dataset],
    )
    if fence and "target" in out:
        out["target"].update(fence_version=fence[0], fence_ref=fence[1], fenced_by=fence[2], fenced_at=str(fence[3]))
    return out
