"""What a step of an incident's phase starts from: the validated incident, its spec and the run.

Every phase asset is declared with ``@incident_asset``: the incident as launchpad config, the
warehouse this code location serves, and the runbook's order checked before its body runs.
Ops and multi-assets (rollback, restatement) start from ``IncidentStep.of`` themselves.
"""

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from inspect import Parameter, Signature
from typing import Any, Generic, TypeVar

import dagster as dg

from recovery.defs.containment.config import IncidentConfig, incident_for_step
from recovery.defs.resources import WarehouseResource
from recovery.lib.control.plane import EventSource
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import Engine, open_engine
from recovery.lib.incident.model import Incident
from recovery.lib.write.writer import Writer

ConfigT = TypeVar("ConfigT", bound=IncidentConfig)


@dataclass(frozen=True)
class IncidentStep(Generic[ConfigT]):
    """The incident a phase's run names (validated once per run, the runbook's order checked:
    ``incident_for_step``), its dataset spec, the run and the launchpad config it came with; the
    engine, writer and timeline source the step works with."""

    incident: Incident
    spec: DatasetSpec
    run_id: str
    config: ConfigT
    warehouse: WarehouseResource

    @classmethod
    def of(
        cls,
        context: dg.OpExecutionContext | dg.AssetExecutionContext,
        config: ConfigT,
        warehouse: WarehouseResource,
    ) -> "IncidentStep[ConfigT]":
        incident, spec = incident_for_step(context, config, warehouse.spec_path)
        return cls(incident, spec, context.run.run_id, config, warehouse)

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


def incident_asset(
    *,
    config: type[IncidentConfig] = IncidentConfig,
    resources: Mapping[str, type[dg.ConfigurableResource]] | None = None,
    group_name: str = "recovery",
    kinds: set[str] | None = None,
    **asset_args: Any,
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """An asset a step of an incident's phase materializes: ``body(context, step)``.

    The asset takes ``config`` (``IncidentConfig`` or a phase's subclass of it, so the launchpad
    asks the same incident fields everywhere), the ``warehouse`` resource and any other
    ``resources`` (the body reads them from ``context.resources``); ``step`` is built before the
    body runs, so no phase can skip the incident's validation or the runbook's order. A generator
    body (an asset that may materialize nothing) stays one; other ``dg.asset`` arguments pass
    through."""
    parameters = [
        Parameter("context", Parameter.POSITIONAL_OR_KEYWORD, annotation=dg.AssetExecutionContext),
        Parameter("config", Parameter.POSITIONAL_OR_KEYWORD, annotation=config),
        Parameter("warehouse", Parameter.POSITIONAL_OR_KEYWORD, annotation=WarehouseResource),
        *(Parameter(k, Parameter.KEYWORD_ONLY, annotation=t) for k, t in (resources or {}).items()),
    ]

    def decorate(body: Callable[..., Any]) -> dg.AssetsDefinition:
        if inspect.isgeneratorfunction(body):

            def compute(context, config, warehouse, **_resources):
                yield from body(context, IncidentStep.of(context, config, warehouse))

        else:

            def compute(context, config, warehouse, **_resources):
                return body(context, IncidentStep.of(context, config, warehouse))

        # what Dagster reads: the launchpad's schema from ``config``, the resources from their types
        compute.__signature__ = Signature(parameters)  # type: ignore[attr-defined]
        compute.__name__ = compute.__qualname__ = body.__name__
        compute.__doc__ = body.__doc__
        return dg.asset(group_name=group_name, kinds=kinds or {"duckdb"}, **asset_args)(compute)

    return decorate
