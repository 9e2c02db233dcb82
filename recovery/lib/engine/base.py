"""Engine interface: sessions that run SQL, and transactions that either all land or none."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa


class Session(ABC):
    """One connection's worth of work. Statements run in the session's transaction, if any."""

    dialect: str

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None: ...

    @abstractmethod
    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]: ...

    @abstractmethod
    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table: ...

    def fetchone(self, sql: str, params: Sequence[Any] | None = None) -> tuple | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None

    def scalar(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        row = self.fetchone(sql, params)
        return None if row is None else row[0]

    @abstractmethod
    def arrow_batches(self, sql: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Stream a query's result in record batches of at most ``batch_rows`` rows (bounded memory)."""

    @abstractmethod
    def columns(self, table_sql: str) -> list[tuple[str, str]]:
        """(name, type) of a table or view, in order; [] if it does not exist."""

    @abstractmethod
    def relation_columns(self, select_sql: str) -> list[tuple[str, str]]:
        """(name, type) of a SELECT without running it over the data."""

    @abstractmethod
    def object_kind(self, schema: str, name: str) -> str | None:
        """'table', 'view' or None."""


class Engine(ABC):
    """A warehouse. ``session()`` reads; ``transaction()`` writes atomically."""

    dialect: str
    location: str

    @abstractmethod
    def session(self, read_only: bool = False) -> AbstractContextManager[Session]: ...

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Session]:
        """A read-write session inside one transaction: commit on exit, roll back on error.

        Write-write conflicts and lock contention surface as
        :class:`recovery.lib.engine.base.RetryableConflict` so callers can retry
        the whole transaction.
        """


class RetryableConflict(Exception):
    """The transaction lost a race (write-write conflict or lock); retrying it is safe."""
