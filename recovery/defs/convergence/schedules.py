"""``verify_convergence_hourly``: keep checking, after a repair, that ingestion and late arrivals converge.

Stopped by default, like the example's ingestion schedule: turn it on in the UI
(or with ``dagster schedule start``) for the dataset being recovered. A tick asks
for one run of ``verify_convergence`` with the default config (no incident, the
three partitions ingestion wrote last, every repaired partition).
"""

import dagster as dg

from recovery.defs.convergence.assets import verify_convergence_job

verify_convergence_hourly = dg.ScheduleDefinition(
    name=f"{verify_convergence_job.name}_hourly",
    cron_schedule="0 * * * *",
    job=verify_convergence_job,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Hourly: reconcile the most recent and the repaired partitions against the source; "
    "a drifting partition fails an ERROR check and alerts.",
)


@dg.definitions
def convergence_schedules() -> dg.Definitions:
    return dg.Definitions(schedules=[verify_convergence_hourly])
