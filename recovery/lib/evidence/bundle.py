"""Build an incident's evidence bundle: an immutable, owner-only folder with a manifest.

Immutability: a bundle is built in a private staging folder beside its final
place and renamed into place only when complete (manifest written last). If the
incident's folder already holds a bundle, building **refuses politely and returns
the existing manifest untouched**: the first evidence, taken before anyone cleaned
up, is the one that matters, and an identical re-run must change nothing. To take
a later snapshot, give the incident another ``evidence_root``.

Consistency: every table is written by DuckDB's own ``COPY ... TO (FORMAT parquet)``
inside one read-only transaction, so all copies show the same committed state.
Sensitive columns are replaced in that same SQL by HMAC-SHA256 hashes under the
evidence key: the spec's ``source.sensitive`` and ``target.sensitive`` by name in every
copied relation, plus every target and consumer column that sqlglot's lineage derives
from one (:mod:`.lineage`), whatever it is called.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path

import recovery
from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, control_plane_exists, utcnow
from recovery.lib.control.run_history import RunHistory
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.sensitive_lineage import follow_sensitive
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError
from recovery.lib.evidence.keys import EvidenceKey, load_evidence_key
from recovery.lib.evidence.manifest import (
    DIR_MODE,
    FILE_MODE,
    FORMAT,
    MANIFEST,
    read_manifest,
    restrict,
    sha256_file,
    write_manifest,
)
from recovery.lib.evidence.snapshots import snapshot_rows_sql
from recovery.lib.evidence.tables import TableCopy, planned_copies, safe_name
from recovery.lib.identifiers import quote
from recovery.lib.incident.failed_generations import generation_facts
from recovery.lib.incident.model import Incident
from recovery.lib.lakehouse.evidence import commit_log_files, pinned_versions
from recovery.lib.retry import retrying

KEY_VARIABLE = "recovery_evidence_key"
_INNER, _OUTER = f"{KEY_VARIABLE}_inner", f"{KEY_VARIABLE}_outer"
# HMAC-SHA256 (RFC 2104) in SQL: sha256((K ^ opad) || sha256((K ^ ipad) || value)); the padded keys are
# bound as BLOB variables, never inlined, and reset before the transaction ends
HASH_SQL = (
    f"sha256(getvariable('{_OUTER}') || unhex(sha256(getvariable('{_INNER}') || encode(CAST({{col}} AS VARCHAR)))))"
)


# types whose values are equal exactly when their text is: a map of such a column is joined on the
# value itself (no cast of every row to text); any other type (floats: -0.0 = 0.0, intervals: 1 day =
# 24 hours) is joined on the text the hash is taken of
_JOINED_ON_VALUE = re.compile(
    r"(U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|VARCHAR|DATE|TIMESTAMP(_S|_MS|_NS)?|BOOLEAN|UUID|DECIMAL\(\d+,\s*\d+\))"
)


def hashed_select(
    sql: str, params: list, hashed: list[str], types: dict[str, str] | None = None, values_from: str | None = None
) -> tuple[str, list]:
    """``SELECT * FROM (sql)`` with each ``hashed`` column replaced by its HMAC, and its parameters.

    Each distinct value is hashed once (a map per column), not once per row: an HMAC is two SHA-256,
    the bulk of a copy's work, and sensitive columns name entities that recur across rows (far
    fewer customers than events). The stand-in is exactly HMAC of ``CAST(value AS VARCHAR)``. A map
    is joined on the value where ``types`` (column -> DuckDB type) says equal values have equal text
    (no cast of every row to text), else on its text, cast once per row beforehand: a lookup by
    ``CAST(t.x AS VARCHAR)`` is grouped by ``t.x``, so a DOUBLE's -0.0 and 0.0 (equal values, two
    texts) would share one hash. Lookups are scalar
    subqueries, not joins: Spark's SQL path replaces columns of one relation only. The relation is
    read once more per hashed column for its distinct values; ``values_from`` (a relation holding
    every value the copy can, without parameters) is read instead where the copy is costly to compute
    twice (a source snapshot resolves the change log)."""
    maps, replace, texts, text_names = [], [], [], []
    for i, c in enumerate(hashed):
        col, m = quote(c), f"__hmac{i}"
        by_value = _JOINED_ON_VALUE.fullmatch((types or {}).get(c, "").upper()) is not None
        value = col if by_value else f"CAST({col} AS VARCHAR)"
        maps.append(
            f"{m} AS (SELECT __v, {HASH_SQL.format(col='__v')} AS __h FROM "
            f"(SELECT DISTINCT {value} AS __v FROM ({values_from or sql}) WHERE {col} IS NOT NULL))"
        )
        if not by_value:  # looked up by a text column: the engine's lookup groups rows by what it is given
            texts.append(f"{value} AS __text{i}")
            text_names.append(f"__text{i}")
        looked_up = f"t.{col}" if by_value else f"t.__text{i}"
        replace.append(f"(SELECT __h FROM {m} WHERE {m}.__v = {looked_up}) AS {col}")
    rows = f"(SELECT *, {', '.join(texts)} FROM ({sql}))" if texts else f"({sql})"
    dropped = f"EXCLUDE ({', '.join(text_names)}) " if texts else ""
    select = f"WITH {', '.join(maps)} SELECT * {dropped}REPLACE ({', '.join(replace)}) FROM {rows} AS t"
    return select, params * (1 if values_from else len(hashed) + 1)


def hmac_pads(secret: str) -> tuple[bytes, bytes]:
    """The inner and outer padded keys of HMAC-SHA256 for ``secret`` (block size 64 bytes)."""
    key = secret.encode()
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


@dataclass(frozen=True)
class EvidenceResult:
    bundle: Path
    manifest: dict
    manifest_sha256: str
    created: bool  # False: the bundle already existed and was left untouched
    seconds: float

    @property
    def total_bytes(self) -> int:
        return sum(f["bytes"] for f in self.manifest["files"])

    @property
    def table_rows(self) -> int:
        return sum(f.get("rows") or 0 for f in self.manifest["files"] if f["path"].endswith(".parquet"))


class _Files:
    """Writes bundle files into the staging folder and remembers their manifest entries."""

    def __init__(
        self,
        root: Path,
        sensitive: set[str],
        by_path: dict[str, frozenset[str]] | None = None,
        positions: dict[str, tuple[frozenset[int], int]] | None = None,
    ):
        self.root = root
        self.sensitive = sensitive
        self.by_path = by_path or {}  # extra columns to hash in one copy (a consumer's derived outputs)
        # the same by position (DuckDB names ``upper(x)`` and two outputs called alike its own way); a copy
        # whose width is not the lineage's has every column hashed: which one holds what is not known
        self.positions = positions or {}
        self.entries: list[dict] = []

    def _path(self, rel: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        return path

    def _add(self, rel: str, description: str, rows: int | None = None, **extra) -> None:
        path = self.root / rel
        os.chmod(path, FILE_MODE)
        entry = {
            "path": rel,
            "sha256": sha256_file(path),
            "bytes": path.stat().st_size,
            "rows": rows,
            "description": description,
        }
        self.entries.append({**entry, **extra})

    def table(self, s: Session, copy: TableCopy) -> None:
        types = {r[0]: r[1] for r in s.fetchall(f"DESCRIBE {copy.sql}", copy.params)}
        extra = self.by_path.get(copy.path, frozenset())
        at, width = self.positions.get(copy.path, (frozenset(), len(types)))
        hashed = [
            c
            for i, c in enumerate(types)
            if c.lower() in self.sensitive or c.lower() in extra or i in at or (at and width != len(types))
        ]
        select, params = f"SELECT * FROM ({copy.sql}) AS t", list(copy.params)
        if hashed:
            select, params = hashed_select(copy.sql, list(copy.params), hashed, types, copy.values_from)
        path = self._path(copy.path)
        rows = s.export_parquet(select, str(path), params)
        about = dict(copy.about)
        if "snapshot" in about:  # the SELECT of its rows, to run from the bundle's folder
            entry = {"path": copy.path, "snapshot": about["snapshot"]}
            about["snapshot"] = {**about["snapshot"], "rows": snapshot_rows_sql(None, entry)}
        self._add(copy.path, copy.description, int(rows), hashed_columns=hashed, **about)

    def data(self, rel: str, payload: bytes, description: str, rows: int | None = None) -> None:
        fd = os.open(self._path(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        self._add(rel, description, rows)

    def json(self, rel: str, obj, description: str) -> None:
        self.data(
            rel,
            (json.dumps(obj, indent=2, default=str) + "\n").encode(),
            description,
            len(obj) if isinstance(obj, list) else None,
        )

    def lines(self, rel: str, lines: tuple[str, ...] | list[str], description: str) -> None:
        self.data(rel, "".join(line + "\n" for line in lines).encode(), description, len(lines))

    def copy_file(self, rel: str, source: Path, description: str) -> None:
        self.data(rel, source.read_bytes(), description)


def code_version() -> dict:
    """The recovery package's version and git commit (when it runs from a checkout), and key libraries."""
    info: dict = {"package": "backfill-recovery", "version": recovery.__version__, "python": sys.version.split()[0]}
    for dist in ("dagster", "duckdb", "pyarrow"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    repo = Path(recovery.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=20)
        if head.returncode == 0:
            info["git_sha"] = head.stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=repo,
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
        else:
            info["git_sha"], info["git_note"] = None, head.stderr.strip()[:200] or "not a git checkout"
    except (OSError, subprocess.TimeoutExpired) as err:
        info["git_sha"], info["git_note"] = None, f"git unavailable ({err})"
    return info


def _spec_files(spec: DatasetSpec) -> list[tuple[str, Path, str]]:
    base = spec.spec_path.parent if spec.spec_path else Path(".")

    def rel(p: Path) -> str:
        try:
            return Path(p).resolve().relative_to(base).as_posix()
        except ValueError:
            return f"outside/{safe_name(Path(p).name)}"

    files = [(f"config/spec/{rel(spec.spec_path)}", spec.spec_path, "the dataset spec")] if spec.spec_path else []
    files.append((f"config/spec/{rel(spec.target.transform)}", spec.target.transform, "the target's transform SQL"))
    files += [(f"config/spec/{rel(d.sql)}", d.sql, f"consumer {d.name}'s SQL") for d in spec.downstream]
    return files


def _run_record(run) -> dict:
    return {
        "run_id": run.run_id,
        "generation": run.generation,
        "job_name": run.job_name,
        "status": run.status,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "parent_run_id": run.parent_run_id,
        "partition_range": run.partition_range,
        "tags": run.tags,
        "run_config": run.run_config,
    }


def _fill(
    root: Path,
    incident: Incident,
    spec: DatasetSpec,
    engine: Engine,
    history: RunHistory,
    key: EvidenceKey,
    actor: str,
    built_at: datetime,
) -> dict:
    with engine.session(read_only=True) as s:
        s.execute("BEGIN TRANSACTION")  # one snapshot for every copy
        followed = follow_sensitive(
            spec, dict(s.columns(spec.source.table_name.sql())), dict(s.columns(spec.target.table_name.sql()))
        )
        sensitive = {c.lower() for c in [*spec.source.sensitive, *spec.target.sensitive]} | set(followed.target)
        files = _Files(
            root,
            sensitive,
            {f"consumers/{name}.parquet": cols for name, cols in followed.consumers.items()},
            {f"consumers/{name}.parquet": at for name, at in followed.consumer_positions.items()},
        )
        inner, outer = hmac_pads(key.secret)
        s.execute(f"SET VARIABLE {_INNER} = ?", [inner])
        s.execute(f"SET VARIABLE {_OUTER} = ?", [outer])
        facts = generation_facts(s, spec, incident.failed_generations)
        copies, notes = planned_copies(s, spec, facts)
        for copy in copies:
            files.table(s, copy)
        latest_ingested = s.scalar(f"SELECT max({quote(spec.source.ingested_at)}) FROM {spec.source.table_name.sql()}")
        lakehouse = pinned_versions(s, spec)
        s.execute(f"RESET VARIABLE {_INNER}")
        s.execute(f"RESET VARIABLE {_OUTER}")
        s.execute("COMMIT")
    for rel, path, description in _spec_files(spec):
        files.copy_file(rel, path, description)
    for rel, path, description in commit_log_files(spec):  # a lakehouse table's history, as it is now
        files.copy_file(rel, path, description)
    if incident.incident_path:
        files.copy_file("config/incident.yaml", incident.incident_path, "the incident file as given")
    else:
        files.json("config/incident.json", incident.model_dump(mode="json"), "the incident, given as run config")
    files.json(
        "code_version.json", code_version(), "version and git commit of the recovery code that built this bundle"
    )
    files.json(
        "dagster/runs.json",
        [_run_record(r) for r in history.runs],
        "the failed generations' runs: status, tags, run config",
    )
    files.json(
        "dagster/backfills.json", [b.__dict__ for b in history.backfills], "the Dagster backfills that produced them"
    )
    for run in history.runs:
        files.lines(
            f"dagster/event_logs/{safe_name(run.run_id)}.jsonl",
            run.event_log_lines,
            f"Dagster event log of run {run.run_id} ({run.job_name}, {run.status}), one serialized record per line",
        )
    return {
        "format": FORMAT,
        "incident_id": incident.incident_id,
        "dataset": spec.dataset,
        "built_at": built_at.isoformat(),
        "built_by": actor,
        "warehouse": str(spec.warehouse.path),
        "failed_generations": [
            {
                **f.__dict__,
                "snapshot_watermark": f.snapshot_watermark[0],
                "snapshot_watermark_basis": f.snapshot_watermark[1],
                "dagster_runs": [r.run_id for r in history.runs_of(f.generation)],
            }
            for f in facts
        ],
        "source_as_of_now": {"built_at": built_at.isoformat(), "latest_ingested_at": latest_ingested},
        "sensitive_columns": {
            "columns": sorted(sensitive),
            "consumer_columns": {name: sorted(cols) for name, cols in followed.consumers.items() if cols},
            "followed_by": "sqlglot column lineage through the transform and every consumer's SQL",
            "stored_as": "HMAC-SHA256(key, CAST(value AS VARCHAR) as UTF-8) as lowercase hex; NULL stays NULL",
            "key_id": key.key_id,
            "key_held": "environment variable"
            if key.origin.startswith("env")
            else "key file beside the warehouse (not in this bundle)",
        },
        "orchestrator": {
            "name": history.orchestrator,
            "runs": len(history.runs),
            "backfills": [b.backfill_id for b in history.backfills],
            "notes": list(history.notes),
        },
        "notes": notes,
        **({"lakehouse": lakehouse} if lakehouse else {}),
        "files": files.entries,
    }


def _existing(final: Path, t0: float) -> EvidenceResult | None:
    if not final.exists() or (final.is_dir() and not any(final.iterdir())):
        return None  # an empty folder holds no evidence; the rename below replaces it
    if not (final / MANIFEST).is_file():
        raise RecoveryError(
            f"{final} exists but holds no {MANIFEST}: it is not a bundle this package finished; "
            f"move it aside (never delete evidence) and build again"
        )
    return EvidenceResult(final, read_manifest(final), sha256_file(final / MANIFEST), False, time.monotonic() - t0)


def build_evidence(
    incident: Incident,
    spec: DatasetSpec,
    engine: Engine,
    history: RunHistory,
    *,
    actor: str = "recovery",
    run_id: str | None = None,
) -> EvidenceResult:
    """Freeze the incident's evidence into ``incident.evidence_dir(spec)``; an existing bundle is returned untouched."""
    t0 = time.monotonic()
    final = incident.evidence_dir(spec)
    found = _existing(final, t0)
    if found:
        _record_if_missing(engine, incident, spec, found, actor, run_id)
        return found
    key = load_evidence_key(spec.warehouse.path)
    final.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    staging = final.parent / f".{final.name}.partial-{secrets.token_hex(4)}"
    staging.mkdir(mode=DIR_MODE)
    try:
        manifest = _fill(staging, incident, spec, engine, history, key, actor, utcnow())
        sha = write_manifest(staging, manifest)
        restrict(staging)
        try:
            os.rename(staging, final)  # atomic; fails if a concurrent build put a bundle there first
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            found = _existing(final, t0)
            if found:
                _record_if_missing(engine, incident, spec, found, actor, run_id)
                return found
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _record(engine, incident, spec, final, sha, manifest, actor, run_id)
    return EvidenceResult(final, manifest, sha, True, time.monotonic() - t0)


def _record_if_missing(
    engine: Engine, incident: Incident, spec: DatasetSpec, found: EvidenceResult, actor: str, run_id: str | None
) -> None:
    """A bundle renamed into place by a build killed before it told the control plane: record it
    now, once (found by the kill -9 matrix: the timeline otherwise never learns of it)."""
    if recorded_manifest_sha256(engine, incident.incident_id, found.bundle) is None:
        _record(engine, incident, spec, found.bundle, found.manifest_sha256, found.manifest, actor, run_id)


def _record(
    engine: Engine,
    incident: Incident,
    spec: DatasetSpec,
    bundle: Path,
    sha: str,
    manifest: dict,
    actor: str,
    run_id: str | None,
) -> None:
    details = json.dumps(
        {
            "bundle": str(bundle),
            "manifest_sha256": sha,
            "files": len(manifest["files"]),
            "bytes": sum(f["bytes"] for f in manifest["files"]),
        }
    )

    with engine.session(read_only=True) as s:
        if not control_plane_exists(
            s
        ):  # built before containment: no control plane to record in (nothing is written to the warehouse)
            return

    def txn() -> None:
        with engine.transaction() as s:
            EventSource(dataset=spec.dataset, incident_id=incident.incident_id, actor=actor, run_id=run_id).record(
                s,
                "evidence_preserved",
                f"evidence bundle {bundle.name}: {len(manifest['files'])} files, manifest sha256 {sha[:12]}",
                details,
            )
            faults.checkpoint("evidence:recorded")  # the bundle on disk, its timeline event not committed

    retrying(txn)
    faults.checkpoint("evidence:committed")


def recorded_manifest_sha256(engine: Engine, incident_id: str, bundle: Path) -> str | None:
    """The manifest checksum the control plane recorded when ``bundle`` was built, if any."""
    with engine.session(read_only=True) as s:
        if not control_plane_exists(s):
            return None
        return s.scalar(
            f"SELECT details->>'manifest_sha256' FROM {SCHEMA}.timeline WHERE kind = 'evidence_preserved' "
            f"AND incident_id = ? AND details->>'bundle' = ? ORDER BY event_id DESC LIMIT 1",
            [incident_id, str(bundle)],
        )
