"""Spark: the data plane on Spark SQL over Parquet, the control plane in a transactional store.

ADR 0001 explains the split. Datasets, namespaces, consumers and the per-dataset logs
(``_recovery.<kind>__<dataset>``) are Parquet directories that Spark reads and writes;
which directories make up each relation is a row of ``_recovery.spark_objects`` in the
control-plane DuckDB file, next to generations, fences, pointers and the clock.

A write follows the commit protocol of table formats: Spark **stages** the relation's
new version in a fresh directory no reader knows about; the control-plane transaction
that also took the clock and compare-and-set the generation's fence **commits** it by
changing the relation's row; later sessions **expose** it by registering the row's
directories as the view the SQL reads. A fence committed first makes the
compare-and-set fail, the transaction rolls back, and the staged directory is deleted
unseen: fencing is still enforced at write time. Publishing is one pointer move, the
``CREATE OR REPLACE VIEW`` row committed with the pointer row.

Statements arrive in the phases' dialect (DuckDB SQL, see :class:`~recovery.lib.engine.base.Session`).
One that names no Spark relation runs in the control store unchanged (full transactions,
``RETURNING``); a query that reads Spark relations is transpiled by sqlglot and runs on Spark
(control-plane tables it reads are shipped as small temporary views). Writes to Spark
relations are never SQL text: the named operations (``materialize``, ``replace_rows``,
``update_rows``, ``swap_pointer``, ...) write each new version as Parquet directories, and
DML text naming a Spark relation is refused.

The engine is split by job: :mod:`spark_start` starts Spark, :mod:`spark_catalog` keeps the
relation catalog and types, :mod:`spark_query` routes and runs reads, :mod:`spark_writes` makes
the named writes, and this module opens sessions and transactions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recovery.lib.engine.base import Engine
from recovery.lib.engine.duckdb_engine import DuckDBEngine
from recovery.lib.engine.spark_catalog import _CATALOG_DDL, CATALOG, SparkObject, SparkStatementError, duckdb_type
from recovery.lib.engine.spark_start import _PROCESS_LOCK, spark_session
from recovery.lib.engine.spark_writes import SparkWarehouseSession

__all__ = [
    "CATALOG",
    "SparkEngine",
    "SparkObject",
    "SparkStatementError",
    "SparkWarehouseSession",
    "_CATALOG_DDL",
    "duckdb_type",
    "spark_session",
]


class SparkEngine(Engine):
    """A warehouse whose data plane is Spark and whose control plane is a DuckDB file."""

    dialect = "spark"

    def __init__(
        self,
        control_path: str,
        data_path: str,
        *,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
        busy_timeout_s: float = 300.0,
        memory_limit: str | None = None,
        threads: int | None = None,
    ):
        self.location = control_path
        self.data_root = Path(data_path)
        self.master = master
        self.conf = dict(conf or {})
        self.control = DuckDBEngine(
            control_path, memory_limit=memory_limit, threads=threads, busy_timeout_s=busy_timeout_s
        )
        self._ready = False

    @property
    def busy_timeout_s(self) -> float:
        return self.control.busy_timeout_s

    @busy_timeout_s.setter
    def busy_timeout_s(self, value: float) -> None:  # the lock is the control-plane file's
        self.control.busy_timeout_s = value

    def spark(self):
        return spark_session(self.master, self.conf)

    def _ensure_catalog(self) -> None:
        if self._ready:
            return
        self.data_root.mkdir(parents=True, exist_ok=True)
        with self.control.transaction() as s:
            for ddl in _CATALOG_DDL:
                s.execute(ddl)
        self._ready = True

    @contextmanager
    def session(self, read_only: bool = False) -> Iterator[SparkWarehouseSession]:
        self._ensure_catalog()
        with _PROCESS_LOCK, self.control.session(read_only) as control:
            s = SparkWarehouseSession(self, control, transactional=False)
            try:
                yield s
            finally:
                s.close()

    @contextmanager
    def transaction(self) -> Iterator[SparkWarehouseSession]:
        self._ensure_catalog()
        with _PROCESS_LOCK:
            s: SparkWarehouseSession | None = None
            try:
                with self.control.transaction() as control:
                    s = SparkWarehouseSession(self, control, transactional=True)
                    yield s
                    s.commit_catalog()  # same control-store transaction as the fence and the clock
            except BaseException:
                if s is not None:
                    s.discard()
                raise
            finally:
                if s is not None:
                    s.close()
