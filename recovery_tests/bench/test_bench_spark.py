"""The reconcile bench's ``--spark`` step labels every key as the DuckDB package does.

The bench times the package's reconciliation on a spark-imported copy of each lineitem dataset
and fails when its labels differ from DuckDB's; this is the same check in miniature (20k TPC-H
lineitem rows, every damage kind), through the same worker in fresh processes. No time is measured.

The lineitem transform rounds money; its inputs stay DECIMAL (``bench/lineitem.py``'s build 2), since
the two engines round a DOUBLE's half-cent ties differently (build 1 held one: 41 keys of 20k differed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from bench import lineitem
from bench.measure import in_subprocess
from bench.reconcile_bench import disagreements, spark_dataset
from recovery.lib.catalog_checks import load_spec

pytestmark = pytest.mark.skipif(
    not Path(sys.executable).with_name("tpchgen-cli").exists()
    or importlib.util.find_spec("pyspark") is None
    or not (shutil.which("java") or os.environ.get("JAVA_HOME")),
    reason="needs tpchgen-cli (the bench extra), pyspark (the spark extra) and Java",
)


def test_spark_step_assigns_the_duckdb_labels_key_by_key(tmp_path):
    spec_path = lineitem.build(tmp_path / "li", 20_000, memory_limit="1GB", cache=tmp_path)
    spark_spec, _ = spark_dataset(spec_path, "1GB")
    doc = yaml.safe_load(spark_spec.read_text())
    assert doc["warehouse"]["engine"] == "spark"
    # small data: adaptive planning, many shuffle tasks and compiling each stage only add latency (~20%)
    doc["warehouse"]["spark"]["conf"].update(
        {
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.codegen.wholeStage": "false",
        }
    )
    spark_spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    duck = in_subprocess("bench.reconcile_worker", "recon", str(spec_path), lineitem.FAILED, str(tmp_path / "d.pq"))
    spark = in_subprocess("bench.reconcile_worker", "recon", str(spark_spec), lineitem.FAILED, str(tmp_path / "s.pq"))
    assert spark["jvm_peak_rss_mb"] > 0  # the JVM was stopped and reaped: its peak is the worker's child's
    assert disagreements(tmp_path / "d.pq", tmp_path / "s.pq", load_spec(spec_path).key) == []
    assert spark["labels"] == duck["labels"]
