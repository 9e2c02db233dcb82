"""Launch a phase's Dagster job for an incident, in this process, against the project's instance.

The definitions are built for the incident's own spec (a value, never an
environment variable), once per launcher, so a command or ``recover`` that runs
several phases loads the code location once. Every run shows in the UI like a
launchpad run.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import dagster as dg

from recovery.defs.location import remember
from recovery.launch.state import IncidentState, read_state, require
from recovery.lib.catalog_checks import checked_once
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import shared_reads
from recovery.lib.incident.model import Incident, check_incident, parse_incident
from recovery.lib.incident.phases import Phase, incident_tags
from recovery.startup import settling


class Launcher:
    """Launches one incident's phases."""

    def __init__(
        self,
        incident: Incident,
        spec: DatasetSpec,
        *,
        instance: dg.DagsterInstance | None = None,
        definitions: dg.Definitions | None = None,
    ):
        self.incident = incident
        self.spec = spec
        self._instance = instance
        self._definitions = definitions
        self._shapes_checked: set[str] = set()  # the spec's SQL shapes, checked by this launcher's first run

    @classmethod
    def for_file(cls, incident_file: str | Path, **kwargs) -> Launcher:
        """Validate the incident file (shape, then meaning against the warehouse, read-only) first."""
        incident = parse_incident(Path(incident_file).resolve())
        checked: set[str] = set()
        # the runs this launcher starts do not check the same shapes again; Dagster's storages,
        # their modules and the instance are long-lived objects (``settling``)
        with checked_once(checked), settling(), shared_reads():
            from recovery.dagster_history import resolve_backfill
            from recovery.orchestration import project_instance

            # a bad spec is refused before the Dagster instance (and its storage) is opened; the
            # incident's checks below use this spec rather than checking it against the warehouse again
            spec = incident.load_spec()
            kwargs["instance"] = kwargs.get("instance") or project_instance()
            incident = resolve_backfill(kwargs["instance"], incident)  # a failed Dagster backfill: one subject
            launcher = cls(incident, check_incident(incident, spec), **kwargs)
        launcher._shapes_checked = checked
        return launcher

    @property
    def incident_file(self) -> str:
        return str(self.incident.incident_path)

    @cached_property
    def definitions(self) -> dg.Definitions:
        if self._definitions is not None:
            # steps run in this process find the asset graph (a team's assets merged in) here
            remember(self.incident.spec, self._definitions)
            return self._definitions
        from recovery.definitions import definitions_for

        return definitions_for(self.incident.spec, plugin_catalog=False)  # its jobs run in process

    @cached_property
    def instance(self) -> dg.DagsterInstance:
        if self._instance is not None:
            return self._instance
        from recovery.orchestration import project_instance

        return project_instance()

    def state(self) -> IncidentState:
        return read_state(self.incident, self.spec)

    def require(self, phase: Phase) -> None:
        """Refuse (``OutOfOrderError``, nothing written) when an earlier phase has not run."""
        require(phase, self.state(), self.incident)

    def run(
        self,
        phase: Phase,
        *,
        tags: dict[str, str] | None = None,
        check_order: bool = True,
        **config,
    ) -> dg.ExecuteInProcessResult:
        """Run the phase's job; ``config`` goes to its first node's config next to the incident file."""
        from recovery.defs.target_partitions import reconciliation_tags
        from recovery.orchestration import run_job

        all_tags = {**incident_tags(self.incident_file), **(tags or {})}  # the incident, chosen once for the run
        with shared_reads():  # the order's and the partitions' reads: one open
            if check_order:  # before a run is created; the job's first step refuses a launch from the UI the same way
                self.require(phase)
            if phase.whole_target:
                all_tags.update(reconciliation_tags(self.instance, self.spec))
        with checked_once(self._shapes_checked):
            return run_job(
                self.definitions,
                phase.job,
                self.instance,
                run_config=phase.run_config(**config),
                tags=all_tags,
            )
