"""The scope preview (the dry run): what a backfill would touch, computed without writing.

Everything is read in one read-only session, in SQL: the range's partitions (typed
by the partition column), the published rows in it, the rows the source yields for
it as of the watermark the backfill would take, the keys on either side, the bytes
of the new generation (a full copy: seed plus range), the run time (from earlier
guarded backfills' throughput, else the policy's), the current partitions normal
ingestion writes (a range reaching them is flagged), and the consumers reading it.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import duckdb
from pydantic import BaseModel, ConfigDict

from recovery.lib.control.plane import SCHEMA, control_plane_exists
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.pointers.namespaces import current_namespace, namespace_sql
from recovery.lib.recurrence.request import BackfillRequest
from recovery.lib.recurrence.tables import BACKFILLS, tables_exist
from recovery.lib.snapshot import expected_rows_sql

_WIDTHS = {
    "BIGINT": 8,
    "DOUBLE": 8,
    "TIMESTAMP": 8,
    "INTEGER": 4,
    "DATE": 4,
    "FLOAT": 4,
    "BOOLEAN": 1,
    "SMALLINT": 2,
    "TINYINT": 1,
    "HUGEINT": 16,
    "UUID": 16,
}


class ConsumerImpact(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    kind: str
    owner: str
    material: bool


class ScopePreview(BaseModel):
    """What the backfill would touch; every figure computed without writing."""

    model_config = ConfigDict(frozen=True)
    dataset: str
    backfill_id: str
    generation: str
    range_start: str
    range_end: str
    partitions: list[str]
    published_namespace: str
    published_rows: int
    expected_rows: int
    keys: int
    seed_rows: int
    row_bytes: float
    estimated_bytes: int
    estimated_seconds: float
    throughput_from: str
    free_disk_bytes: int
    current_partitions: list[str]
    current_touched: list[str]
    consumers: list[ConsumerImpact]
    source_watermark: datetime | None

    @property
    def estimated_rows(self) -> int:
        return max(self.published_rows, self.expected_rows)

    def summary(self) -> str:
        flag = f"; REACHES CURRENT PARTITIONS {', '.join(self.current_touched)}" if self.current_touched else ""
        return (
            f"{len(self.partitions)} partitions {self.range_start}..{self.range_end}: {self.published_rows:,} "
            "rows published, "
            f"{self.expected_rows:,} from the source as of {self.source_watermark}, {self.keys:,} keys, "
            f"~{self.estimated_bytes / 1e6:,.1f} MB, ~{self.estimated_seconds:,.1f} s{flag}; "
            f"consumers: {', '.join(c.name for c in self.consumers) or 'none'}"
        )


def range_partitions(s: Session, spec: DatasetSpec, ns: str, start: str, end: str, expected: str) -> list[str]:
    """The range's partitions, compared as the partition column's type (every day of a DATE range)."""
    part = quote(spec.target.partition)
    typ = dict(s.columns(namespace_sql(ns)))[spec.target.partition]
    for field, value in (("start", start), ("end", end)):
        if s.scalar(f"SELECT TRY_CAST(? AS {typ}) IS NULL", [value]):
            raise SpecError(
                field,
                f"{value!r} is not a value of the partition column {spec.target.partition} ({typ})",
                "give a partition value, e.g. 2024-06-01",
            )
    if s.scalar(f"SELECT CAST(? AS {typ}) > CAST(? AS {typ})", [start, end]):
        raise SpecError("end", f"{end} is before start {start}", "give an end at or after the start")
    between = f"{part} BETWEEN CAST(? AS {typ}) AND CAST(? AS {typ})"
    days = (
        (
            "UNION SELECT CAST(CAST(d AS DATE) AS VARCHAR) FROM generate_series(CAST(? AS DATE), CAST(? AS DATE), "
            "INTERVAL 1 DAY) AS g(d)"
        )
        if typ == "DATE"
        else ""
    )
    rows = s.fetchall(
        f"SELECT p FROM (SELECT CAST({part} AS VARCHAR) AS p FROM {namespace_sql(ns)} WHERE {between} "
        f"UNION SELECT CAST({part} AS VARCHAR) FROM {expected} WHERE {between} {days}) ORDER BY p",
        [start, end, start, end] + ([start, end] if days else []),
    )
    return [r[0] for r in rows]


def current_partitions(s: Session, spec: DatasetSpec, ns: str, n: int) -> list[str]:
    """The ``n`` latest partitions (by value) that non-fenced ingest generations have written."""
    if not control_plane_exists(s):
        return []
    typ = dict(s.columns(namespace_sql(ns)))[spec.target.partition]
    rows = s.fetchall(
        f"SELECT p FROM (SELECT DISTINCT unnest(w.partitions) AS p FROM {SCHEMA}.writes w "
        f"JOIN {SCHEMA}.generations g USING (generation) WHERE w.dataset = ? AND g.kind = 'ingest' "
        "AND g.fenced_at IS NULL) "
        f"ORDER BY TRY_CAST(p AS {typ}) DESC NULLS LAST, p DESC LIMIT {int(n)}",
        [spec.dataset],
    )
    return sorted(r[0] for r in rows)


def row_bytes(s: Session, ns: str) -> float:
    """Estimated bytes per row: fixed widths, plus the sampled mean length of text columns."""
    cols = s.columns(namespace_sql(ns))

    def width(t: str) -> int:
        if t.startswith("DECIMAL("):
            return 8 if int(t[8:].split(",")[0]) <= 18 else 16
        return _WIDTHS.get(t, 8)

    fixed = sum(width(t) for c, t in cols if t != "VARCHAR")
    text = [c for c, t in cols if t == "VARCHAR"]
    if not text:
        return float(fixed)
    avg = s.mean_text_bytes(namespace_sql(ns), text, 10_000)
    return float(fixed + avg + 4 * len(text))


def throughput(s: Session, spec: DatasetSpec) -> tuple[float, str]:
    """Rows per second of earlier guarded backfills of the dataset (median), else the policy's figure."""
    default = spec.recurrence_policy.capacity.rows_per_second
    if not tables_exist(s):
        return default, "policy"
    rates = [
        r[0]
        for r in s.fetchall(
            f"SELECT CAST(json_extract(manifest, '$.build.rows_per_second') AS DOUBLE) FROM {BACKFILLS} "
            f"WHERE dataset = ? AND json_extract(manifest, '$.build.rows_per_second') IS NOT NULL",
            [spec.dataset],
        )
        if r[0]
    ]
    if not rates:
        return default, "policy"
    rates.sort()
    return rates[len(rates) // 2], f"median of {len(rates)} earlier backfill(s)"


def preview_in(s: Session, spec: DatasetSpec, request: BackfillRequest, location: str) -> ScopePreview:
    ns = current_namespace(s, spec) if control_plane_exists(s) else None
    if ns is None:
        raise RecoveryError(
            f"{spec.target.table} is not a managed dataset yet (no published namespace). "
            f"Fix: ingest it through the writer first"
        )
    src = spec.source
    watermark = s.scalar(f"SELECT max({quote(src.ingested_at)}) FROM {src.table_name.sql()}")
    s.temp_view("__bf_expected", f"{expected_rows_sql(spec, watermark)}")
    partitions = range_partitions(s, spec, ns, request.start, request.end, "__bf_expected")
    inside = in_partitions(s, spec, partitions)
    key = quote_all(spec.key)
    published, seed = s.fetchrow(
        f"SELECT count(*) FILTER (WHERE {inside}), count(*) FILTER (WHERE NOT ({inside})) FROM {namespace_sql(ns)}"
    )
    expected = s.scalar(f"SELECT count(*) FROM __bf_expected WHERE {inside}")
    keys = s.scalar(
        f"SELECT count(*) FROM (SELECT {key} FROM {namespace_sql(ns)} WHERE {inside} "
        f"UNION SELECT {key} FROM __bf_expected WHERE {inside})"
    )
    width = row_bytes(s, ns)
    rate, rate_from = throughput(s, spec)
    current = current_partitions(s, spec, ns, spec.recurrence_policy.current_partitions)
    est_bytes = int((seed + max(published, expected)) * width)
    consumers = (
        [
            ConsumerImpact(name=d.name, kind=d.kind, owner=d.owner, material=d.materiality is not None)
            for d in spec.downstream
        ]
        if partitions
        else []
    )
    return ScopePreview(
        dataset=spec.dataset,
        backfill_id=request.id,
        generation=request.generation,
        range_start=request.start,
        range_end=request.end,
        partitions=partitions,
        published_namespace=ns,
        published_rows=int(published or 0),
        expected_rows=int(expected or 0),
        keys=int(keys or 0),
        seed_rows=int(seed or 0),
        row_bytes=width,
        estimated_bytes=est_bytes,
        estimated_seconds=(seed + max(published, expected)) / rate,
        throughput_from=rate_from,
        free_disk_bytes=shutil.disk_usage(Path(location).resolve().parent).free,
        current_partitions=current,
        current_touched=[p for p in current if p in set(partitions)],
        consumers=consumers,
        source_watermark=watermark,
    )


def preview_scope(engine: Engine, spec: DatasetSpec, request: BackfillRequest) -> ScopePreview:
    """The dry run: a read-only session; the warehouse file is left byte-identical."""
    try:
        with engine.session(read_only=True) as s:
            return preview_in(s, spec, request, engine.location)
    except duckdb.CatalogException as err:
        raise RecoveryError(
            f"the warehouse lacks a table the spec names ({str(err).splitlines()[0]}). "
            f"Fix: check the spec against the warehouse (recovery reconcile validates it)"
        ) from None


def preview_json(p: ScopePreview) -> str:
    return json.dumps(p.model_dump(mode="json"))
