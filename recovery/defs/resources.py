"""The warehouse resource every phase uses: one dataset spec, one engine, one writer path."""

import dagster as dg
import duckdb
from dagster_duckdb import DuckDBResource
from pydantic import Field, PrivateAttr

from recovery.config import spec_path
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.engine import DuckDBEngine, Engine, open_engine
from recovery.lib.write.writer import Writer


class WarehouseResource(dg.ConfigurableResource):
    """A dataset's warehouse, opened through dagster-duckdb's ``DuckDBResource``."""

    spec_path: str = Field(description="Path of the dataset spec YAML this code location serves.")
    duckdb: DuckDBResource = Field(description="The DuckDB file named by the spec's warehouse.path.")
    _spec: DatasetSpec | None = PrivateAttr(default=None)

    def spec(self) -> DatasetSpec:
        if self._spec is None:
            self._spec = parse_spec(self.spec_path)
        return self._spec

    def engine(self) -> Engine:
        spec = self.spec()
        if spec.warehouse.engine != "duckdb":  # the DuckDB file holds only the control plane
            return open_engine(spec.warehouse)
        extra = dict(self.duckdb.connection_config)

        def connect(database: str, read_only: bool, config: dict) -> duckdb.DuckDBPyConnection:
            return duckdb.connect(database=self.duckdb.database, read_only=read_only, config={**extra, **config})

        return DuckDBEngine(
            self.duckdb.database,
            memory_limit=spec.warehouse.memory_limit,
            threads=spec.warehouse.threads,
            busy_timeout_s=spec.warehouse.busy_timeout_s,
            connect=connect,
        )

    def writer(self, actor: str = "dagster") -> Writer:
        return Writer(self.engine(), self.spec(), actor=actor)


def warehouse_resource(path: str | None = None) -> WarehouseResource:
    path = str(path or spec_path())
    spec = parse_spec(path)
    return WarehouseResource(spec_path=path, duckdb=DuckDBResource(database=str(spec.warehouse.path)))


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources={"warehouse": warehouse_resource()})
