"""A verb run out of order is refused here, before any Dagster run is created, with the
phase's one sentence naming the verb (and job) to run first; nothing is written.

The state and the sentence are the library's (``recovery.lib.incident_state``), the same
a phase's job refuses with when launched too early from the UI.
"""

from __future__ import annotations

from recovery.lib.errors import OutOfOrderError
from recovery.lib.incident.model import Incident
from recovery.lib.incident.phases import Phase
from recovery.lib.incident_state import IncidentState, read_state, refusal

__all__ = ["IncidentState", "read_state", "require"]


def require(phase: Phase, state: IncidentState, incident: Incident) -> None:
    """Raise ``OutOfOrderError`` (the phase's refusal sentence) when a need does not hold."""
    refused = refusal(phase, state, incident)
    if refused is not None:
        raise OutOfOrderError(refused.sentence)
