"""A Delta or Iceberg table as the package sees it: its commits, its data files, one commit of ours.

Both formats answer the same questions: which commits came after version N (each with
its time, operation, properties and the data files it added and removed), which files
make up a version, and how to commit (a table property, an overwrite of partitions).
A version is a Delta table version or an Iceberg snapshot's sequence number (along the
main branch); ``ref`` keeps the snapshot id.

What cannot be read correctly from the data files alone is refused, in one line naming
the feature: Delta deletion vectors and column mapping, Iceberg delete files and renamed
columns, files outside the local file system.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlparse

from recovery.lib.dataset_spec.lakehouse import LakehouseTable
from recovery.lib.errors import RecoveryError

if TYPE_CHECKING:  # pyarrow is imported where a Delta or Iceberg table is read, not by every command
    import pyarrow as pa


class UnsupportedTable(RecoveryError):
    """The table uses a feature whose rows the package cannot read from the data files correctly."""


@dataclass(frozen=True)
class DataFile:
    path: str  # a local path DuckDB reads
    partition: tuple[tuple[str, str | None], ...] = ()  # Delta: partition values (not in the files), as text


@dataclass(frozen=True)
class Commit:
    version: int
    ref: str
    committed_at: datetime  # naive UTC, the commit's own timestamp
    operation: str
    properties: dict[str, str]
    added: tuple[DataFile, ...] = ()
    removed: tuple[DataFile, ...] = ()
    unsupported: str | None = None
    log_files: tuple[Path, ...] = field(default=(), compare=False)  # the commit's own log/metadata files


class TableLog(Protocol):
    table: LakehouseTable

    def head(self) -> int | None: ...
    def commits(self, after: int | None) -> list[Commit]: ...
    def files(self, version: int | None = None) -> list[DataFile]: ...
    def schema(self) -> pa.Schema: ...
    def partition_columns(self) -> list[str]: ...
    def properties(self) -> dict[str, str]: ...
    def set_properties(self, props: dict[str, str]) -> int | None: ...
    def overwrite(
        self, data: pa.Table, column: str, values: list[str], properties: dict[str, str], read_version: int | None
    ) -> int: ...
    def log_files(self) -> list[tuple[str, Path]]: ...


def _utc(ms: int | float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def local_path(uri: str, root: Path | None = None) -> str:
    """A data file's URI or relative path as a local path; an object-store URL is refused."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(unquote(uri))
        return str(path if path.is_absolute() or root is None else root / path)
    raise UnsupportedTable(
        f"data file {uri} is in an object store ({parsed.scheme}://): only local or mounted tables are supported yet"
    )


def open_log(table: LakehouseTable) -> TableLog:
    return DeltaLog(table) if table.format == "delta" else IcebergLog(table)


class DeltaLog:
    """A Delta table, its commits read from ``_delta_log/<version>.json`` (the Delta protocol's commit files)."""

    def __init__(self, table: LakehouseTable):
        assert table.path is not None  # validated: a delta table has a path
        self.table = table
        self.root = Path(table.path)
        self.log = self.root / "_delta_log"
        if not self.log.is_dir():
            raise RecoveryError(f"{self.root} is not a Delta table (no _delta_log folder): check the spec's path")

    def _dt(self, version: int | None = None):
        from deltalake import DeltaTable

        return DeltaTable(str(self.root), version=version) if version is not None else DeltaTable(str(self.root))

    def head(self) -> int | None:
        return int(self._dt().version())

    def _versions(self) -> list[int]:
        return sorted(int(p.stem) for p in self.log.glob("*.json") if p.stem.isdigit())

    def commits(self, after: int | None) -> list[Commit]:
        self._check_features()
        versions = [v for v in self._versions() if after is None or v > after]
        out: list[Commit] = []
        start = after + 1 if after is not None else 0
        if versions and versions[0] > start:  # older commit files were cleaned up: the version before is the base
            base = versions[0] - 1
            out.append(Commit(base, str(base), _utc(0), "BASE", {}, added=tuple(self.files(base)), log_files=()))
        for v in versions:
            out.append(self._commit(v))
        return out

    def _commit(self, version: int) -> Commit:
        path = self.log / f"{version:020d}.json"
        info: dict = {}
        added, removed, unsupported = [], [], None
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
            elif "add" in action:
                a = action["add"]
                if a.get("deletionVector"):
                    unsupported = "deletion vectors"
                added.append(self._file(a))
            elif "remove" in action and action["remove"].get("dataChange", True):
                removed.append(self._file(action["remove"]))
            elif "metaData" in action:
                conf = action["metaData"].get("configuration") or {}
                if conf.get("delta.columnMapping.mode", "none") != "none":
                    unsupported = "column mapping"
        props = {k: str(v) for k, v in info.items() if isinstance(v, (str, int, float)) and k != "timestamp"}
        op = str(info.get("operation", "UNKNOWN"))
        params = info.get("operationParameters") or {}
        if op == "WRITE" and params.get("mode"):
            op = f"WRITE {params['mode']}"
        when = _utc(info["timestamp"]) if "timestamp" in info else _utc(path.stat().st_mtime * 1000)
        return Commit(version, str(version), when, op, props, tuple(added), tuple(removed), unsupported, (path,))

    def _file(self, action: dict) -> DataFile:
        parts = tuple(sorted((k, v) for k, v in (action.get("partitionValues") or {}).items()))
        return DataFile(local_path(action["path"], self.root), parts)

    def _check_features(self) -> None:
        conf = self.properties()
        if conf.get("delta.columnMapping.mode", "none") != "none":
            raise UnsupportedTable(
                f"{self.root} uses Delta column mapping (delta.columnMapping.mode={conf['delta.columnMapping.mode']}): "
                f"its data files name columns by physical ids, which the package does not read yet"
            )

    def files(self, version: int | None = None) -> list[DataFile]:
        self._check_features()
        dt = self._dt(version)
        import pyarrow as pa

        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        parts = [
            c.removeprefix("partition.") for c in (actions[0].keys() if actions else []) if c.startswith("partition.")
        ]
        if actions and any(a.get("deletionVector.storageType") for a in actions):
            raise UnsupportedTable(f"{self.root} has deletion vectors, which the package does not read yet")
        return [
            DataFile(local_path(a["path"], self.root), tuple(sorted((p, _text(a[f"partition.{p}"])) for p in parts)))
            for a in actions
        ]

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.schema(self._dt().schema().to_arrow())

    def partition_columns(self) -> list[str]:
        return list(self._dt().metadata().partition_columns)

    def properties(self) -> dict[str, str]:
        return dict(self._dt().metadata().configuration)

    def set_properties(self, props: dict[str, str]) -> int | None:
        from deltalake import CommitProperties

        dt = self._dt()
        dt.alter.set_table_properties(
            props, raise_if_not_exists=False, commit_properties=CommitProperties(custom_metadata=props)
        )
        return int(self._dt().version())

    def overwrite(
        self, data: pa.Table, column: str, values: list[str], properties: dict[str, str], read_version: int | None
    ) -> int:
        from deltalake import CommitProperties, write_deltalake

        dt = self._dt(read_version)
        listed = ", ".join("'" + v.replace("'", "''") + "'" for v in values)
        write_deltalake(
            dt,
            data,
            mode="overwrite",
            predicate=f"{column} IN ({listed})",
            partition_by=self.partition_columns() or None,
            commit_properties=CommitProperties(custom_metadata=properties),
        )
        return int(self._dt().version())

    def log_files(self) -> list[tuple[str, Path]]:
        return [(f"_delta_log/{p.name}", p) for p in sorted(self.log.iterdir()) if p.is_file()]


def _text(value) -> str | None:
    return None if value is None else str(value)


class IcebergLog:
    """An Iceberg table through pyiceberg: snapshots along the main branch, each with the manifests it added."""

    def __init__(self, table: LakehouseTable):
        from pyiceberg.catalog import load_catalog

        assert table.catalog is not None and table.identifier is not None  # validated
        self.table = table
        self.identifier: str = table.identifier
        cat = table.catalog
        props = {"type": cat.type, "uri": cat.uri, **({"warehouse": cat.warehouse} if cat.warehouse else {})}
        self.catalog = load_catalog(cat.name, **props, **cat.properties)
        try:
            self.tbl = self.catalog.load_table(self.identifier)
        except Exception as e:  # pyiceberg's NoSuchTableError and the catalog's own errors
            raise RecoveryError(f"iceberg table {table.location} cannot be loaded: {e}") from None

    def _snapshots(self) -> list:
        """The main branch's snapshots, oldest first."""
        snap = self.tbl.current_snapshot()
        out = []
        while snap is not None:
            out.append(snap)
            snap = self.tbl.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
        return out[::-1]

    def head(self) -> int | None:
        snap = self.tbl.current_snapshot()
        return None if snap is None else int(snap.sequence_number or 0)

    def _check_schema(self) -> None:
        current = {f.field_id: f.name for f in self.tbl.schema().fields}
        for schema in self.tbl.schemas().values():
            for f in schema.fields:
                if f.field_id in current and current[f.field_id] != f.name:
                    raise UnsupportedTable(
                        f"iceberg table {self.table.location} renamed column {f.name!r} to {current[f.field_id]!r}: "
                        f"its older data files name it otherwise, which the package does not read yet"
                    )

    def commits(self, after: int | None) -> list[Commit]:
        from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

        self._check_schema()
        io = self.tbl.io
        out = []
        for snap in self._snapshots():
            if after is not None and snap.sequence_number <= after:
                continue
            added, removed, unsupported = [], [], None
            for manifest in snap.manifests(io):
                if manifest.added_snapshot_id != snap.snapshot_id:
                    continue
                for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                    if entry.snapshot_id != snap.snapshot_id:
                        continue
                    if entry.data_file.content != DataFileContent.DATA:
                        unsupported = "delete files (merge-on-read)"
                    f = DataFile(local_path(entry.data_file.file_path))
                    if entry.status == ManifestEntryStatus.ADDED:
                        added.append(f)
                    elif entry.status == ManifestEntryStatus.DELETED:
                        removed.append(f)
            summary = snap.summary
            props = dict(summary.additional_properties) if summary is not None else {}
            op = str(summary.operation.value) if summary is not None else "unknown"
            out.append(
                Commit(
                    int(snap.sequence_number),
                    str(snap.snapshot_id),
                    _utc(snap.timestamp_ms),
                    op,
                    props,
                    tuple(added),
                    tuple(removed),
                    unsupported,
                )
            )
        return out

    def files(self, version: int | None = None) -> list[DataFile]:
        self._check_schema()
        snap = self.tbl.current_snapshot()
        if version is not None:
            snap = next((s for s in self._snapshots() if s.sequence_number == version), None)
        if snap is None:
            return []
        out = []
        for task in self.tbl.scan(snapshot_id=snap.snapshot_id).plan_files():
            if task.delete_files:
                raise UnsupportedTable(
                    f"iceberg table {self.table.location} has delete files (merge-on-read), which the package "
                    f"does not read yet"
                )
            out.append(DataFile(local_path(task.file.file_path)))
        return out

    def schema(self) -> pa.Schema:
        return self.tbl.schema().as_arrow()

    def partition_columns(self) -> list[str]:
        schema = self.tbl.schema()
        return [schema.find_field(f.source_id).name for f in self.tbl.spec().fields]

    def properties(self) -> dict[str, str]:
        return dict(self.tbl.properties)

    def set_properties(self, props: dict[str, str]) -> int | None:
        with self.tbl.transaction() as tx:
            tx.set_properties(props)
        self.tbl = self.catalog.load_table(self.identifier)
        return self.head()

    def overwrite(
        self, data: pa.Table, column: str, values: list[str], properties: dict[str, str], read_version: int | None
    ) -> int:
        """One catalog commit (a delete and an append snapshot, atomically) that fails when another commit
        landed since ``read_version`` (pyiceberg asserts the branch's snapshot id)."""
        from pyiceberg.expressions import In

        if self.head() != read_version:
            raise RecoveryError(
                f"iceberg table {self.table.location} moved since version {read_version} (now {self.head()})"
            )
        tx = self.tbl.transaction()
        tx.overwrite(data, overwrite_filter=In(term=column, literals=tuple(values)), snapshot_properties=properties)
        tx.commit_transaction()
        self.tbl = self.catalog.load_table(self.identifier)
        head = self.head()
        assert head is not None
        return head

    def log_files(self) -> list[tuple[str, Path]]:
        meta = Path(local_path(self.tbl.metadata_location))
        files = [(f"metadata/{meta.name}", meta)]
        seen = set()
        for snap in self._snapshots():
            lst = Path(local_path(snap.manifest_list))
            files.append((f"metadata/{lst.name}", lst))
            for m in snap.manifests(self.tbl.io):
                p = Path(local_path(m.manifest_path))
                if p not in seen:
                    seen.add(p)
                    files.append((f"metadata/{p.name}", p))
        return files


def iter_groups(files: list[DataFile]) -> Iterator[tuple[tuple[tuple[str, str | None], ...], list[str]]]:
    """Data files grouped by their partition values (Delta keeps them out of the files)."""
    groups: dict[tuple, list[str]] = {}
    for f in files:
        groups.setdefault(f.partition, []).append(f.path)
    yield from groups.items()
