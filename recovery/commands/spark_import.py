"""``recovery spark-import --spec FILE``: move a DuckDB warehouse's data plane to the Spark layout.

For a spec whose ``warehouse.engine`` is ``spark``: the datasets, namespaces, consumers
and per-dataset logs still inside ``warehouse.path`` (a warehouse built or piloted on
DuckDB, such as the worked example) become Parquet directories under
``warehouse.spark.data_path``; the control plane stays where it is.
"""

from __future__ import annotations

import argparse

from rich.console import Console


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.engine.spark_engine import SparkEngine
    from recovery.lib.engine.spark_import import import_duckdb_data_plane
    from recovery.lib.errors import SpecError

    spec = parse_spec(args.spec)
    if spec.warehouse.engine != "spark":
        raise SpecError(
            "warehouse.engine",
            f"is {spec.warehouse.engine!r}, so there is nothing to move to Spark",
            "set warehouse: {engine: spark, path: <control file>, spark: {data_path: <dir>}} first",
            source=str(args.spec),
        )
    engine = open_engine(spec.warehouse)
    assert isinstance(engine, SparkEngine)  # warehouse.engine is spark (checked above)
    with console.status("moving the data plane to Spark …"):
        moved = import_duckdb_data_plane(engine)
    console.print(
        f"moved {len(moved)} relations to {engine.data_root}: {', '.join(moved) or 'none'}",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spark-import", help="move a DuckDB warehouse's data relations into the Spark engine's layout")
    p.add_argument("--spec", required=True, help="dataset spec YAML with warehouse.engine: spark")
    p.set_defaults(fn=run)
