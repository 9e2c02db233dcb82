"""The containment tests' environment: a private copy of the failed example and its Dagster home."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine


@dataclass(frozen=True)
class Env:
    spec_path: Path
    incident: Path
    home: Path

    @property
    def warehouse(self) -> Path:
        return self.spec_path.parent / "warehouse.duckdb"

    def fetch(self, sql: str, params: list | None = None) -> list[tuple]:
        with open_engine(parse_spec(self.spec_path).warehouse).session(read_only=True) as s:
            return s.fetchall(sql, params or [])
