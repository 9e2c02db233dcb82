"""The incident as run configuration: the launchpad form of ``incident.yaml``.

The fields are the incident file's (the contract), so an incident can be typed
into the launchpad or named by ``incident_file``; either way it goes through the
same validation as the file (``incident_from_mapping`` / ``parse_incident`` then
``check_incident``) before anything writes. Relative paths are resolved against
the project root, the code location's working directory.

Chosen once: with no incident in the config, a step reads the run tag ``recovery/incident``
(``INCIDENT_TAG``, the incident file), which the draft incident's launchpad link, the CLI and
the links each phase's run logs set. A run validates its incident once (cached by run id) and
records the tag on itself, so a re-execution or "Open in Launchpad" keeps it.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import dagster as dg
from pydantic import Field

from recovery.config import PROJECT_ROOT
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.errors import SpecError
from recovery.lib.incident.model import Incident, check_incident, incident_from_mapping, parse_incident
from recovery.lib.incident.phases import (
    BY_JOB,
    CANARY,
    INCIDENT_TAG,
    PLAN,
    PUBLISH,
    ROLLBACK,
    RUNBOOK,
    WAVE,
    Phase,
    incident_tags,
)
from recovery.lib.incident_state import read_state, refusal
from recovery.refusal import refuse, restore_tracebacks


class PartitionRangeConfig(dg.Config):
    start: str = Field(
        description="First partition of the failed range, in the partition column's format "
        "(2024-01-01, 2013-02, 201302)."
    )
    end: str = Field(description="Last partition of the failed range, inclusive, in the same format.")


class IncidentConfig(dg.Config):
    """Which failed generations to contain, for which incident, asked for and approved by whom."""

    incident_file: str | None = Field(
        None,
        description="Path of an incident YAML (relative to the project root). When set, leave the other fields empty.",
    )
    incident_id: str | None = Field(
        None, description="Incident id, e.g. INC-2024-031 (letters, digits, '-', '_', '.')."
    )
    spec: str | None = Field(
        None,
        description="Dataset spec the incident concerns (default: the spec this code location serves, RECOVERY_SPEC).",
    )
    failed_generations: list[str] = Field(
        default_factory=list,
        description="Generations to fence, e.g. [backfill-0042]; each must be a backfill of the dataset.",
    )
    dagster_backfill: str | None = Field(
        None, description="The failed Dagster backfill's id: all of its runs are contained and repaired as one."
    )
    partitions: PartitionRangeConfig | None = Field(
        None, description="Nominal failed range; omit to infer it from the generation's writes."
    )
    requested_by: str | None = Field(None, description="Who asks for containment; recorded as the fence's author.")
    approved_by: list[str] = Field(default_factory=list, description="Who approved the recovery.")
    notes: str = Field("", description="Free text kept with the incident.")

    def has_fields(self) -> bool:
        return bool(
            self.incident_id
            or self.spec
            or self.failed_generations
            or self.dagster_backfill
            or self.partitions
            or self.requested_by
            or self.approved_by
            or self.notes
        )


NO_INCIDENT = SpecError(
    INCIDENT_TAG,
    "no incident was chosen for this run",
    "launch it from the draft incident's link (or a link a phase's run logged), "
    f"or set the run tag {INCIDENT_TAG} to the incident file",
)


def resolve_incident(
    config: IncidentConfig,
    served_spec: str | Path,
    instance: dg.DagsterInstance | None = None,
    tag: str | None = None,
) -> tuple[Incident, DatasetSpec]:
    """Validate the incident (shape, then meaning against the warehouse, read-only) and check
    that it concerns the dataset this code location serves. Raises ``SpecError``. The config's
    incident (a file or the fields) wins; else ``tag``, the run's ``recovery/incident`` (a file).
    With the run's ``instance``, a failed Dagster backfill the incident names is resolved to one
    subject (every run of it, whatever its rows carry: ``recovery.dagster_history.resolve_backfill``)."""
    if not config.incident_file and not config.has_fields():
        if not tag:
            raise NO_INCIDENT
        config = config.model_copy(update={"incident_file": tag})
    if config.incident_file:
        if config.has_fields():
            raise SpecError(
                "incident_file",
                "both an incident file and incident fields were given",
                "name the file only, or leave incident_file empty and fill in the fields",
            )
        path = Path(config.incident_file)
        incident = parse_incident(path if path.is_absolute() else PROJECT_ROOT / path)
    else:
        raw = config.model_dump(exclude={"incident_file"})
        raw["spec"] = raw["spec"] or str(served_spec)
        incident = incident_from_mapping(raw, base_dir=PROJECT_ROOT)
    if instance is not None:
        from recovery.dagster_history import resolve_backfill

        incident = resolve_backfill(instance, incident)
    spec = check_incident(incident)
    served = Path(served_spec).resolve()
    if incident.spec != served:
        from recovery.lib.dataset_spec.models import parse_spec

        other = parse_spec(served)
        if (other.dataset, other.warehouse.path) != (spec.dataset, spec.warehouse.path):
            raise SpecError(
                "spec",
                f"the incident concerns {incident.spec} but this code location serves {served}",
                "launch from the code location that serves that dataset (RECOVERY_SPEC), or fix the incident's spec",
            )
    return incident, spec


def names_incident(context: dg.OpExecutionContext | dg.AssetExecutionContext, config: IncidentConfig) -> bool:
    """Whether the run names an incident, by its config or its ``recovery/incident`` tag (a step that
    also runs for no incident, like the scheduled convergence check, asks this first)."""
    return bool(config.incident_file or config.has_fields() or context.run.tags.get(INCIDENT_TAG))


_RESOLVED: OrderedDict[tuple[str, str, str], tuple[Incident, DatasetSpec]] = OrderedDict()
"""The incident each run validated, by (run id, served spec, the incident's config and tag): its
steps (in one process, the jobs' in-process executor) parse and check it once per run."""
_KEEP = 32


def incident_for_step(
    context: dg.OpExecutionContext | dg.AssetExecutionContext, config: IncidentConfig, served_spec: str | Path
) -> tuple[Incident, DatasetSpec]:
    """``resolve_incident`` for a step of a phase's job, from its config or the run's ``recovery/incident``
    tag, once per run; in the phase's first step, the runbook's order too: a phase launched before the
    phases it requires fails here (``refuse_out_of_order``). A missing or invalid incident fails the
    step with its one sentence (``dg.Failure``, the field and the fix as metadata)."""
    from recovery.lib.engine import shared_reads

    restore_tracebacks()  # a refusal earlier in this process hid its own stack trace only
    tag = context.run.tags.get(INCIDENT_TAG)
    chosen = config.model_dump_json(include=set(IncidentConfig.model_fields))
    key = (context.run.run_id, str(served_spec), f"{chosen}|{tag}")
    with shared_reads():  # the checks below read the warehouse one after another: one open
        if key in _RESOLVED:
            incident, spec = _RESOLVED[key]
        else:
            try:
                incident, spec = resolve_incident(config, served_spec, context.instance, tag)
            except SpecError as err:
                refuse(str(err), {"field": err.field, "fix": err.fix})
            _RESOLVED[key] = (incident, spec)
            while len(_RESOLVED) > _KEEP:
                _RESOLVED.popitem(last=False)
            _carry_tag(context, incident, spec, tag)
        refuse_out_of_order(context, incident, spec)
    return incident, spec


def _carry_tag(
    context: dg.OpExecutionContext | dg.AssetExecutionContext, incident: Incident, spec: DatasetSpec, tag: str | None
) -> None:
    """Record the incident on the run (a re-execution keeps it) and log the launchpad links that
    launch the next phases for it with nothing to type (the repair's phases log theirs once their
    step did its work: the next wave is known then)."""
    phase = BY_JOB.get(context.job_name)
    if incident.incident_path is None or phase is None:
        return
    if tag is None:
        context.instance.add_run_tags(context.run.run_id, incident_tags(str(incident.incident_path)))
    if phase not in (PLAN, CANARY, WAVE):
        log_next_phases(context, incident, spec)


def next_launches(
    phase: Phase, incident: Incident, spec: DatasetSpec, instance: dg.DagsterInstance
) -> list[tuple[Phase, dict[str, str]]]:
    """The (at most two) phases launched after ``phase`` for this incident, in the runbook's order, each
    with the run tags its launch needs besides the incident: the whole target's partition range for a
    whole-target phase, the next wave's range for the canary and the waves (after a wave, the next wave
    while one is left). Publish is offered once a repair is planned, roll back while none is."""
    from recovery.defs.target_partitions import reconciliation_tags, whole_range_tags
    from recovery.lib.engine import open_engine
    from recovery.lib.repair.plan import load_plan

    order = [p for step in RUNBOOK for p in step.phases]
    if phase not in order:
        return []
    later = [WAVE, *order[order.index(WAVE) + 1 :]] if phase in (CANARY, WAVE) else order[order.index(phase) + 1 :]
    with open_engine(spec.warehouse).session(read_only=True) as s:
        plan = load_plan(s, incident.incident_id)
    wave = plan.next_wave() if plan is not None else None
    out: list[tuple[Phase, dict[str, str]]] = []
    for p in later:
        if p in (CANARY, WAVE):
            if plan is None or wave is None or (wave == 0) != (p is CANARY):
                continue
            out.append((p, whole_range_tags(plan.waves[wave])))  # the wave's range (repair.partitions.wave_tags)
        elif (p is PUBLISH and plan is None) or (p is ROLLBACK and plan is not None):
            continue
        else:
            out.append((p, reconciliation_tags(instance, spec) if p.whole_target else {}))
        if len(out) == 2:
            break
    return out


def log_next_phases(
    context: dg.OpExecutionContext | dg.AssetExecutionContext, incident: Incident, spec: DatasetSpec
) -> None:
    """Log the launchpad links of the next phases (``next_launches``): the incident and any partition
    range already chosen, so the person follows a link and types nothing."""
    from recovery.config import LOCATION_NAME
    from recovery.defs.alerts.check_alerts import ui_url
    from recovery.lib.incident.draft import launchpad_url

    phase = BY_JOB.get(context.job_name)
    if phase is None or incident.incident_path is None:
        return
    path = incident.incident_path
    links = "; ".join(
        f"{p.job}: {launchpad_url(ui_url(), LOCATION_NAME, path, p.job, tags)}"
        for p, tags in next_launches(phase, incident, spec, context.instance)
    )
    if links:
        context.log.info(f"incident {incident.incident_id} chosen for this run ({INCIDENT_TAG}); next: {links}")


def refuse_out_of_order(
    context: dg.OpExecutionContext | dg.AssetExecutionContext, incident: Incident, spec: DatasetSpec
) -> None:
    """Fail the phase's first step with the phase's refusal sentence (the one the CLI prints, exit 2)
    and its facts as metadata when an earlier phase has not run for this incident; nothing is written.
    A step of a job that is no phase, or not its phase's first, checks nothing."""
    phase = BY_JOB.get(context.job_name)
    if phase is None or not phase.needs or context.op_def.name != phase.nodes[0]:
        return
    refused = refusal(phase, read_state(incident, spec), incident)
    if refused is not None:
        refuse(refused.sentence, refused.metadata())
