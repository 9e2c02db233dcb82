"""How far an incident has got, read from the warehouse (read-only), and whether a phase may run.

The CLI asks before it creates a run; a phase's job asks again in its first step (a
launch from the UI), and both refuse with the phase's one sentence
(``recovery.lib.incident.phases.Phase.refusal``); nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib.control.plane import SCHEMA, control_plane_exists, has_dataset_table
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import Incident
from recovery.lib.incident.phases import Phase, Refusal
from recovery.lib.pointers.namespaces import is_managed
from recovery.lib.reconcile.classify import partition_table
from recovery.lib.repair.plan import load_plan
from recovery.lib.snapshot import str_list


@dataclass(frozen=True)
class IncidentState:
    managed: bool = False  # the target is a view this package manages (adopted or created)
    contained: bool = False  # every failed generation is fenced
    assessed: bool = False  # a reconciliation of this incident is recorded in the control plane
    planned: bool = False  # a repair plan exists
    built: bool = False  # every wave of the plan is built and gated (or the repair is published)


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
    # a published plan's partitions are 'published', no longer 'built': it was built and gated all the same
    built = plan is not None and (plan.status == "published" or plan.next_wave() is None)
    return IncidentState(
        managed=managed,
        contained=fenced == len(incident.failed_generations),
        assessed=assessed,
        planned=plan is not None,
        built=built,
    )


def refusal(phase: Phase, state: IncidentState, incident: Incident) -> Refusal | None:
    """Why ``phase`` may not run yet for ``incident`` (None when every need holds)."""
    unmet = tuple(need for need in phase.needs if not getattr(state, need))
    if not unmet:
        return None
    return phase.refusal(unmet, str(incident.incident_path) if incident.incident_path else None)
