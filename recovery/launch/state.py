"""How far an incident has got, read from the warehouse (read-only), and what a phase needs first.

A verb run out of order is refused here, before any Dagster run is created, with
one line naming the verb to run first; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib.control_plane import SCHEMA, control_plane_exists, has_dataset_table
from recovery.lib.engine import open_engine
from recovery.lib.errors import OutOfOrderError
from recovery.lib.incident import Incident
from recovery.lib.namespaces import is_managed
from recovery.lib.reconcile.classify import partition_table
from recovery.lib.repair.plan import load_plan
from recovery.lib.snapshot import str_list
from recovery.lib.spec import DatasetSpec


@dataclass(frozen=True)
class IncidentState:
    managed: bool = False  # the target is a view this package manages (adopted or created)
    contained: bool = False  # every failed generation is fenced
    assessed: bool = False  # a reconciliation of this incident is recorded in the control plane
    planned: bool = False  # a repair plan exists
    built: bool = False  # every wave of the plan is built and gated


def read_state(incident: Incident, spec: DatasetSpec) -> IncidentState:
    with open_engine(spec.warehouse).session(read_only=True) as s:
        if not control_plane_exists(s):
            return IncidentState()
        managed = is_managed(s, spec)
        fenced = s.scalar(
            f"SELECT count(DISTINCT generation) FROM {SCHEMA}.fences WHERE generation IN "
            f"({str_list(incident.failed_generations)})"
        )
        assessed = has_dataset_table(s, "recon_partitions", spec.dataset) and bool(
            s.scalar(f"SELECT count(*) FROM {partition_table(spec)} WHERE incident_id = ?", [incident.incident_id])
        )
        plan = load_plan(s, incident.incident_id) if s.object_kind(SCHEMA, "repair_plans") else None
    built = plan is not None and plan.next_wave() is None
    return IncidentState(
        managed=managed,
        contained=fenced == len(incident.failed_generations),
        assessed=assessed,
        planned=plan is not None,
        built=built,
    )


FIRST = {
    "managed": ("contain", "the target is not managed yet"),
    "contained": ("contain", "the failed generations are not fenced yet"),
    "assessed": ("assess", "the incident has no recorded reconciliation"),
    "planned": ("repair", "the incident has no repair plan"),
    "built": ("repair", "the repair's waves are not all built and gated"),
}


def require(needs: tuple[str, ...], state: IncidentState, incident_file: str, verb: str) -> None:
    """Raise ``OutOfOrderError`` naming the verb to run first when a need does not hold."""
    for need in needs:
        if not getattr(state, need):
            first, why = FIRST[need]
            raise OutOfOrderError(f"{verb}: {why}; run `recovery {first} --incident {incident_file}` first")
