"""The served dataset's downstream consumers (``RECOVERY_SPEC``), whatever dataset that is.

One asset ``consumers/<name>`` per consumer of the spec, downstream of the spec's target
(its ``target.table`` as an asset key, ``analytics/transactions`` for ``analytics.transactions``),
and ``refresh_consumers``, which re-materializes them. The target itself is not defined here:
the pipeline that writes it is the team's (the worked example's is its own code location,
``recovery.example.location``), so here it is the consumers' upstream key only.
"""

import dagster as dg

from recovery.config import spec_path
from recovery.defs.resources import WarehouseResource
from recovery.lib.consumers.sql import materialize_consumer
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec


def served_target_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey([spec.target.table_name.schema, spec.target.table_name.name])


def consumer_assets(spec: DatasetSpec) -> list[dg.AssetsDefinition]:
    """One asset per downstream consumer of the spec, downstream of the target."""
    target = served_target_key(spec)
    assets = []
    for consumer in spec.downstream:

        def build(consumer=consumer):
            @dg.asset(
                key=dg.AssetKey(["consumers", consumer.name]),
                deps=[target],
                kinds={"duckdb"},
                group_name="consumers",
                owners=[f"team:{consumer.owner}"],
                tags={"recovery/consumer_kind": consumer.kind},
                description=f"{consumer.kind.capitalize()} owned by {consumer.owner}: {consumer.sql.name} over "
                f"{spec.target.table}.",
            )
            def _consumer(warehouse: WarehouseResource) -> dg.MaterializeResult:
                rows = materialize_consumer(warehouse.engine(), warehouse.spec(), consumer)
                return dg.MaterializeResult(metadata={"dagster/row_count": rows})

            return _consumer

        assets.append(build())
    return assets


@dg.definitions
def served_dataset() -> dg.Definitions:
    consumers = consumer_assets(parse_spec(spec_path()))
    refresh = dg.define_asset_job(
        "refresh_consumers",
        selection=dg.AssetSelection.groups("consumers"),
        executor_def=dg.in_process_executor,
        description="Re-materialize every downstream consumer from the public target.",
    )
    return dg.Definitions(assets=consumers, jobs=[refresh])
