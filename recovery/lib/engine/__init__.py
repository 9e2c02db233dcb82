"""The one narrow door to the warehouse.

Phases talk to an :class:`Engine`; only the engine knows the dialect and how to
connect. DuckDB is the embedded default; a distributed engine (Spark) implements
the same interface.
"""

from recovery.lib.engine.base import Engine, Session
from recovery.lib.engine.duckdb_engine import DuckDBEngine, shared_reads


def open_engine(warehouse) -> Engine:
    """Build the engine a spec's ``warehouse`` section asks for."""
    if warehouse.engine == "duckdb":
        return DuckDBEngine(
            str(warehouse.path),
            memory_limit=warehouse.memory_limit,
            threads=warehouse.threads,
            busy_timeout_s=warehouse.busy_timeout_s,
        )
    if warehouse.engine == "spark":
        from recovery.lib.engine.spark_engine import SparkEngine

        return SparkEngine(
            str(warehouse.path),
            str(warehouse.spark.data_path),
            master=warehouse.spark.master,
            conf=warehouse.spark.conf,
            busy_timeout_s=warehouse.busy_timeout_s,
        )
    raise NotImplementedError(f"warehouse.engine {warehouse.engine!r} is not available")


__all__ = ["Engine", "Session", "DuckDBEngine", "open_engine", "shared_reads"]
