"""``backfill_incident_sensor``: a failed backfill of a managed dataset opens a draft incident.

It watches Dagster's asset backfills that target the served dataset's asset (the
spec's ``target.table`` as an asset key, ``analytics/transactions`` for
``analytics.transactions``). One that failed, was canceled, or has failed runs (a
blocking check that fails stops its run) gets a draft incident: the file beside the
warehouse with the backfill's generation and partition range, the incident's
timeline started, and one alert carrying the backfill's page, the
``contain_backfill`` launchpad prefilled with the draft, and the command. It runs by
default: a tick with no such backfill reads only Dagster's run storage.
"""

from pathlib import Path

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

from recovery.config import LOCATION_NAME
from recovery.dagster_history import backfill_incident
from recovery.defs.alerts.check_alerts import DEFAULT_OWNER, ui_url
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.resources import WarehouseResource
from recovery.lib.errors import WarehouseBusyError
from recovery.lib.incident.draft import Draft, FailedBackfill, draft_incident_id, launchpad_url, open_draft
from recovery.lib.incident.phases import CONTAIN
from recovery.lib.notify import NotificationError

BUSY_TIMEOUT_S = 20.0
RECENT_BACKFILLS = 50
NEEDS_CONTAINMENT = {
    BulkActionStatus.FAILED,
    BulkActionStatus.FAILING,
    BulkActionStatus.CANCELING,
    BulkActionStatus.CANCELED,
    BulkActionStatus.COMPLETED_FAILED,
}


def failed_backfills(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, spec_path: str | Path
) -> list[FailedBackfill]:
    """Recent asset backfills of ``asset_key`` that failed, were canceled or have failed runs, each
    resolved to one subject (``backfill_incident``: every run of it, whatever its rows carry,
    the runs that wrote nothing included) and its partition range."""
    found = []
    for b in instance.get_backfills(limit=RECENT_BACKFILLS):
        if not b.is_asset_backfill or asset_key not in (b.asset_selection or []):
            continue
        failed_runs = tuple(
            r.run_id
            for r in instance.get_runs(
                dg.RunsFilter(tags={"dagster/backfill": b.backfill_id}, statuses=[dg.DagsterRunStatus.FAILURE])
            )
        )
        if b.status not in NEEDS_CONTAINMENT and not failed_runs:
            continue
        incident = backfill_incident(
            instance, spec_path, b.backfill_id, incident_id=draft_incident_id(b.backfill_id), requested_by=DEFAULT_OWNER
        )
        found.append(
            FailedBackfill(
                b.backfill_id,
                b.status.value,
                tuple(incident.failed_generations),
                _partition_keys(b, asset_key),
                failed_runs,
            )
        )
    return found


def _partition_keys(backfill: PartitionBackfill, asset_key: dg.AssetKey) -> tuple[str, ...]:
    data = backfill.asset_backfill_data
    if data is None or asset_key not in data.target_subset.partitions_subsets_by_asset_key:
        return ()
    return tuple(sorted(data.target_subset.get_partitions_subset(asset_key).get_partition_keys()))


def draft_alert(
    failed: FailedBackfill, incident_file: Path, incident_id: str, base: str, contain_job: str = CONTAIN.job
) -> tuple[str, str]:
    subject = (
        f"draft incident {incident_id} opened: backfill {failed.backfill_id} of {failed.generation} needs containment"
    )
    body = "\n".join(
        [
            f"{failed.reason}; its generation {failed.generation} may have damaged the dataset.",
            f"Draft incident: {incident_file} (add approved_by, check the range).",
            f"Contain in one click: {launchpad_url(base, LOCATION_NAME, incident_file, contain_job)}",
            f"or: recovery contain --incident {incident_file}",
            f"Backfill: {base}/runs/b/{failed.backfill_id}",
        ]
    )
    return subject, body


def open_drafts(
    instance: dg.DagsterInstance,
    warehouse: WarehouseResource,
    notifier: NotifierResource,
    log=None,
    *,
    asset_key: dg.AssetKey | None = None,
    contain_job: str = CONTAIN.job,
) -> tuple[list[Draft], list[str]]:
    """One pass of the sensor: a draft (file, timeline, alert) for every failed backfill of the dataset.
    ``asset_key`` is the dataset's target asset (default: the target table as a key, the served
    dataset's form; a further dataset's sits under its prefix) and ``contain_job`` the job its
    alert's launchpad link opens. Returns (drafts, undelivered alerts). The worked example calls it
    once its backfill has failed, so ``make run`` opens its draft whether or not the daemon's tick
    came first."""
    spec = warehouse.spec()
    key = asset_key or dg.AssetKey([spec.target.table_name.schema, spec.target.table_name.name])
    failed = failed_backfills(instance, key, warehouse.spec_path)
    if not failed or not Path(spec.warehouse.path).exists():
        return [], []
    engine = warehouse.engine()
    engine.busy_timeout_s = BUSY_TIMEOUT_S
    n = notifier.notifier(engine)
    drafts, errors = [], []
    for f in failed:
        draft = open_draft(engine, Path(warehouse.spec_path), spec, f, requested_by=DEFAULT_OWNER)
        drafts.append(draft)
        subject, body = draft_alert(f, draft.path, draft.incident_id, ui_url(), contain_job)
        try:
            n.notify(
                DEFAULT_OWNER,
                subject,
                body,
                "critical",
                f"draft-incident:{f.backfill_id}",
                incident_id=draft.incident_id,
                dataset=spec.dataset,
            )
        except NotificationError as err:
            errors.append(f"{draft.incident_id}: {err}")
        if draft.newly_opened and log is not None:
            log.warning(f"opened draft incident {draft.path}: {f.reason}")
    return drafts, errors


@dg.sensor(
    name="backfill_incident_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=f"Opens a draft incident (file, timeline, prefilled {CONTAIN.job} launchpad, alert) for every "
    "failed or canceled backfill of the managed dataset, or one whose runs failed.",
)
def backfill_incident_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource, notifier: NotifierResource
) -> dg.SkipReason:
    try:
        drafts, errors = open_drafts(context.instance, warehouse, notifier, context.log)
    except WarehouseBusyError as err:
        return dg.SkipReason(f"warehouse busy, trying again next tick: {err}")
    if errors:
        raise dg.Failure(description="alerts not delivered (retried next tick): " + "; ".join(errors))
    if not drafts:
        return dg.SkipReason("no failed backfill of the managed dataset")
    opened = sum(d.newly_opened for d in drafts)
    return dg.SkipReason(f"{opened} draft incident(s) opened, {len(drafts) - opened} already open")


@dg.definitions
def intake_sensors() -> dg.Definitions:
    return dg.Definitions(sensors=[backfill_incident_sensor])
