"""A team's own Dagster asset writing a Delta target through ``FencedDeltaLakeIOManager``: stamped, and fenced.

The IO manager is dagster-deltalake's; for a spec's target it stamps the run's generation
into the rows and the commit, and refuses a generation the table's fence property names.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster_deltalake import LocalConfig
from dagster_deltalake.io_manager import WriteMode
from deltalake import DeltaTable, write_deltalake

from recovery.io.lakehouse import FencedDeltaLakeIOManager
from recovery.lib.lakehouse.fence import FENCE_PROPERTY
from recovery_tests.support.rows import present

SPEC = """\
dataset: orders
warehouse: {engine: duckdb, path: recovery.duckdb}
source: {table: raw.orders_cdc, lakehouse: {format: delta, path: lake/raw/orders_cdc}, key: [order_id], version: seq,
         op: action, upsert_ops: [I], delete_ops: [D], ingested_at: loaded_ts}
target:
  table: dw.orders
  lakehouse: {format: delta, path: lake/dw/orders}
  partition: order_day
  transform: t.sql
  metadata: {generation: batch_id, source_version: seq, written_at: batch_ts}
"""


def rows(ids: list[int], day: str) -> pa.Table:
    return pa.table(
        {
            "order_id": pa.array(ids, pa.int64()),
            "order_day": [day] * len(ids),
            "total": [float(i) for i in ids],
            "seq": pa.array([1] * len(ids), pa.int64()),
        }
    )


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "t.sql").write_text("SELECT order_id, order_day, total FROM {{ source }}\n")
    first = rows([1, 2], "2024-03-01")
    first = first.append_column("batch_id", pa.array(["load-1"] * 2)).append_column(
        "batch_ts", pa.array([None, None], pa.timestamp("us"))
    )
    write_deltalake(str(tmp_path / "lake" / "dw" / "orders"), first, partition_by=["order_day"])
    return tmp_path


def materialize(lake: Path, generation: str) -> dg.ExecuteInProcessResult:
    @dg.asset(key=["dw", "orders"])
    def orders() -> pa.Table:
        return rows([3], "2024-03-02")

    io = FencedDeltaLakeIOManager(
        root_uri=str(lake / "lake"),
        storage_options=LocalConfig(),
        specs=[str(lake / "spec.yaml")],
        mode=WriteMode.append,
    )
    return dg.materialize(
        [orders], resources={"io_manager": io}, tags={"recovery/generation": generation}, raise_on_error=False
    )


def test_a_managed_write_is_stamped_in_its_rows_and_its_commit(lake):
    result = materialize(lake, "inc-7")
    assert result.success
    table = DeltaTable(str(lake / "lake" / "dw" / "orders"))
    info = table.history(1)[0]
    assert info["recovery.writer"] == "io_manager" and info["recovery.generation"] == "inc-7"
    new = [r for r in table.to_pyarrow_table().to_pylist() if r["order_id"] == 3]
    assert new[0]["batch_id"] == "inc-7" and new[0]["batch_ts"] is not None


def test_a_fenced_generation_is_refused_in_one_sentence_and_nothing_is_committed(lake):
    path = str(lake / "lake" / "dw" / "orders")
    DeltaTable(path).alter.set_table_properties({FENCE_PROPERTY: "bf-9"}, raise_if_not_exists=False)
    before = DeltaTable(path).version()
    result = materialize(lake, "bf-9")
    assert not result.success
    failure = present(next(e for e in result.all_events if e.is_step_failure).step_failure_data.error)
    assert "generation 'bf-9' is fenced" in failure.message and "nothing was written" in failure.message
    assert DeltaTable(path).version() == before
