"""The small orders dataset ingested once (generation ``ingest-1``), and the expected rows of a slice of
its source: a dataset this package never saw (composite key, string partitions, no amounts)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.writer import Writer
from recovery_tests.support.small_dataset import build_small_dataset


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def ingested_small(tmp_path: Path):
    spec_path = build_small_dataset(tmp_path / "orders", n_orders=120)
    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec)
    writer.ensure()
    writer.register_generation("ingest-1", "ingest")
    apply_changes(writer, "ingest-1", until=now())
    return spec, writer


def latest_rows_sql(spec, where: str, rev: int | None = None) -> str:
    src = f"SELECT * FROM src.order_events WHERE {where}" + (f" AND rev = {rev}" if rev is not None else "")
    if rev is None:
        src = f"SELECT * FROM ({src}) QUALIFY row_number() OVER (PARTITION BY region, order_no ORDER BY rev DESC) = 1"
    return expected_rows_sql(spec, None, source_relation=src)
