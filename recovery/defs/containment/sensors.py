"""The fencing sensor: after containment, any run, retry or write attempt of a fenced
generation is stopped, counted and alerted on.

It runs by default because a tick is cheap: one short read-only look at the
control plane (skipped when the warehouse does not exist yet) and a few run-storage
queries per fenced generation; with no fence and no refused write it does nothing
else. It waits at most ``BUSY_TIMEOUT_S`` for the warehouse file (a run may hold
DuckDB's single-writer lock) and otherwise skips the tick rather than stall the
sensor daemon. A tick whose alert could not be delivered fails, visibly, and the
alert is retried on the next tick.
"""

from pathlib import Path

import dagster as dg

from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.containment.patrol import patrol
from recovery.defs.resources import WarehouseResource
from recovery.lib.errors import WarehouseBusyError

BUSY_TIMEOUT_S = 20.0


@dg.sensor(
    name="fencing_sensor",
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Stops any run or retry of a fenced generation, counts it as a fence attempt, and alerts on "
    "every refused attempt through the notifier.",
)
def fencing_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource, notifier: NotifierResource
) -> dg.SkipReason:
    spec = warehouse.spec()
    if not Path(spec.warehouse.path).exists():
        return dg.SkipReason(f"warehouse {spec.warehouse.path} does not exist yet")
    engine = warehouse.engine()
    engine.busy_timeout_s = BUSY_TIMEOUT_S
    try:
        report = patrol(context.instance, engine, notifier.notifier(engine), spec, str(warehouse.spec_path))
    except WarehouseBusyError as err:
        return dg.SkipReason(f"warehouse busy, trying again next tick: {err}")
    for run_id in report.runs_stopped:
        context.log.warning(f"stopped run {run_id} of a fenced generation")
    if report.alert_failures:
        raise dg.Failure(description="alerts not delivered (retried next tick): " + "; ".join(report.alert_failures))
    return dg.SkipReason(report.summary())


@dg.definitions
def containment_sensors() -> dg.Definitions:
    return dg.Definitions(sensors=[fencing_sensor])
