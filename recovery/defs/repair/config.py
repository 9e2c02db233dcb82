"""Typed run configuration of the repair (the launchpad form)."""

from pydantic import Field

from recovery.defs.containment.config import IncidentConfig


class RepairPlanConfig(IncidentConfig):
    canary_partitions: list[str] = Field(
        default_factory=list, description="Canary partitions; empty: chosen to cover every damage label found."
    )
    canary_max: int = Field(5, description="At most this many canary partitions when they are chosen automatically.")
    wave_size: int = Field(30, description="Partitions per wave after the canary.")
