"""What a step of an incident's phase starts from: ``step = IncidentStep.of(context, config, warehouse)``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import dagster as dg

from recovery.defs.containment.config import IncidentConfig, incident_for_step
from recovery.defs.resources import WarehouseResource
from recovery.lib.control.plane import EventSource
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import Engine, open_engine
from recovery.lib.incident.model import Incident
from recovery.lib.write.writer import Writer


@dataclass(frozen=True)
class IncidentStep:
    """The incident a phase's run names (validated once per run, the runbook's order checked:
    ``incident_for_step``), its dataset spec and the run; the engine, writer and timeline source
    the step works with."""

    incident: Incident
    spec: DatasetSpec
    run_id: str

    @classmethod
    def of(
        cls,
        context: dg.OpExecutionContext | dg.AssetExecutionContext,
        config: IncidentConfig,
        warehouse: WarehouseResource,
    ) -> IncidentStep:
        incident, spec = incident_for_step(context, config, warehouse.spec_path)
        return cls(incident, spec, context.run.run_id)

    @property
    def incident_id(self) -> str:
        return self.incident.incident_id

    @cached_property
    def engine(self) -> Engine:
        """The warehouse the incident's spec names (the one this code location serves: ``incident_for_step``)."""
        return open_engine(self.spec.warehouse)

    def writer(self, actor: str) -> Writer:
        return Writer(self.engine, self.spec, actor=actor)

    def events(self, actor: str) -> EventSource:
        """The source of the timeline events this step records as ``actor``."""
        return EventSource(dataset=self.spec.dataset, incident_id=self.incident_id, actor=actor, run_id=self.run_id)
