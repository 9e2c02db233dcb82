"""``asset_check_alert_sensor``: every failed ERROR or blocking asset check becomes one notification.

A tick reads the check evaluations recorded since its cursor (the event log's
record ids) for every check in the code location, and sends each failure to the
checked asset's owner (``team:`` owners; else the data-platform on-call) with a
link to the run in the UI (``RECOVERY_UI_URL``, default http://127.0.0.1:3000).
The cursor advances only when every alert was accepted, and the notifier keeps
delivered keys in the warehouse's control plane, so a failed delivery is retried
on the next tick and a delivered one is never repeated. With nothing new, the tick
does not open the warehouse at all.
"""

from pathlib import Path

import dagster as dg

from recovery.defs.alerts.check_alerts import failed_checks, ui_url
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.location import asset_graph
from recovery.defs.resources import WarehouseResource
from recovery.lib.errors import WarehouseBusyError
from recovery.lib.notify import NotificationError

BUSY_TIMEOUT_S = 20.0


def _asset_graph(context: dg.SensorEvaluationContext, spec_path: str):
    graph = asset_graph(context, spec_path)  # outside a code location (e.g. a bare test context): the one last built
    if graph is None:
        from recovery.config import spec_path as served

        raise RuntimeError(f"no code location was built for {spec_path} (served: {served()})")
    return graph


@dg.sensor(
    name="asset_check_alert_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Notifies the owner of every failed ERROR or blocking asset check (repair gates, restatement, "
    "convergence), once per evaluation, with a link to the run.",
)
def asset_check_alert_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource, notifier: NotifierResource
) -> dg.SensorResult:
    after = int(context.cursor or 0)
    failures = failed_checks(context.instance, _asset_graph(context, warehouse.spec_path), after)
    if not failures:
        return dg.SensorResult(skip_reason="no new failed ERROR or blocking checks")
    spec = warehouse.spec()
    engine = None
    if Path(spec.warehouse.path).exists():
        engine = warehouse.engine()
        engine.busy_timeout_s = BUSY_TIMEOUT_S
    n = notifier.notifier(engine)
    sent, errors = 0, []
    try:
        for f in failures:
            subject, body, severity = f.alert(ui_url())
            try:
                sent += n.notify(f.owner, subject, body, severity, f.dedupe_key, dataset=spec.dataset)
            except NotificationError as err:
                errors.append(f"{f.name} (run {f.run_id}): {err}")
    except WarehouseBusyError as err:
        return dg.SensorResult(skip_reason=f"warehouse busy, trying again next tick: {err}")
    if errors:
        raise dg.Failure(description="alerts not delivered (retried next tick): " + "; ".join(errors))
    return dg.SensorResult(
        cursor=str(max(f.record_id for f in failures)),
        skip_reason=f"{sent} alert(s) sent for {len(failures)} failed check evaluation(s)",
    )


@dg.definitions
def alert_sensors() -> dg.Definitions:
    return dg.Definitions(sensors=[asset_check_alert_sensor])
