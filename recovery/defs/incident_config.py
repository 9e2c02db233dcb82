"""The run config every incident phase takes: the incident file it works on."""

import dagster as dg
from pydantic import Field


class IncidentFileConfig(dg.Config):
    incident_file: str = Field(description="Incident YAML (names the dataset spec and the failed generations).")
