"""Keeps the ``target_partitions`` of the UI in step with the target's data."""

import dagster as dg

from recovery.defs.resources import WarehouseResource
from recovery.defs.target_partitions import TARGET_PARTITIONS, TARGET_PARTITIONS_NAME, data_partitions


@dg.sensor(
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Register the target's partitions (from the data) as target_partitions, "
    "so reconciliation can run per partition.",
)
def target_partitions_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource) -> dg.SensorResult:
    known = set(context.instance.get_dynamic_partitions(TARGET_PARTITIONS_NAME))
    new = [p for p in data_partitions(warehouse.spec()) if p not in known]
    requests = [TARGET_PARTITIONS.build_add_request(new)] if new else []
    return dg.SensorResult(dynamic_partitions_requests=requests, skip_reason=None if new else "no new partitions")
