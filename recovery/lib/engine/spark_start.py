"""Starting the process's SparkSession (local mode needs only Java), and the lock that keeps one
Spark unit of work at a time per process."""

from __future__ import annotations

import threading
from typing import Any

from recovery.lib.errors import RecoveryError

# one Spark unit of work at a time per process: temporary views are global to the
# SparkSession, and the control store admits one writing process anyway
_PROCESS_LOCK = threading.RLock()
_SPARK: dict[str, Any] = {}


def spark_session(master: str, conf: dict[str, str]):
    """The process's SparkSession (started once; local mode needs only Java)."""
    if "session" not in _SPARK:
        try:
            from pyspark.sql import SparkSession
        except ImportError as err:  # pragma: no cover - depends on the install
            raise RecoveryError(
                "warehouse.engine is 'spark' but pyspark is not installed; "
                "install the extra: pip install 'backfill-recovery[spark]'"
            ) from err
        builder = (
            SparkSession.builder.master(master)
            .appName("backfill-recovery")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.timestampType", "TIMESTAMP_NTZ")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        )
        for k, v in conf.items():
            builder = builder.config(k, v)
        try:
            session = builder.getOrCreate()
        except Exception as err:  # JVM could not start
            raise RecoveryError(
                f"Spark could not start ({err}); warehouse.engine 'spark' needs Java 17 or newer on PATH or JAVA_HOME"
            ) from err
        session.sparkContext.setLogLevel("ERROR")
        _SPARK["session"] = session
        _SPARK["registered"] = {}
    return _SPARK["session"]
