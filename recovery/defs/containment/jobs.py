"""``contain_backfill``: the containment job, launched from the UI launchpad or ``recovery contain``.

It runs its three steps in one process (``in_process_executor``): it is a short
control job, and a subprocess per step would only delay the fence.
"""

from __future__ import annotations

import dagster as dg

from recovery.defs.containment.ops import adopt_target, fence_generations, stop_dagster_work, validate_incident
from recovery.lib.incident.phases import CONTAIN


@dg.job(
    name=CONTAIN.job,
    executor_def=dg.in_process_executor,
    tags={"recovery/phase": "containment", "dagster/max_retries": "0"},
    description="Contain a failed backfill: validate the incident, take a foreign target under management, "
    "fence its generations in the warehouse, "
    "cancel the Dagster backfill and stop its runs. Idempotent per incident.",
)
def contain_backfill():
    incident = validate_incident()
    stop_dagster_work(incident, fence_generations(incident, adopt_target(incident)))


@dg.definitions
def containment_jobs() -> dg.Definitions:
    return dg.Definitions(jobs=[contain_backfill])
