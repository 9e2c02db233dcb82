"""Launching the repair as Dagster runs, in order: plan, canary, each wave, then publish.

The CLI, ``recover`` and ``make run`` use these; from the UI a person launches the
same jobs. Each wave is its own run over its partition range; the loop stops at the
first run that fails (a failed gate has already stopped the expansion in the
control plane).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dagster as dg

from recovery.defs.repair.partitions import wave_tags
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.errors import RecoveryError
from recovery.lib.incident.phases import CANARY, PLAN, PUBLISH, WAVE
from recovery.lib.repair.gates import latest_gates
from recovery.lib.repair.plan import RepairPlan, load_plan, require_plan, wave_name

if TYPE_CHECKING:
    from recovery.launch.runner import Launcher


@dataclass
class WaveOutcome:
    wave: int
    partitions: int
    run_id: str
    gates: dict


@dataclass
class RepairOutcome:
    plan: RepairPlan
    plan_run_id: str
    waves: list[WaveOutcome] = field(default_factory=list)
    stopped: str | None = None


def _plan(spec: DatasetSpec, incident_id: str) -> RepairPlan:
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return require_plan(s, incident_id)


def run_repair(
    launcher: Launcher,
    *,
    canary: list[str] | None = None,
    canary_max: int = 5,
    wave_size: int = 30,
    through: str = "all",
    on_wave: Callable[[WaveOutcome, RepairPlan], None] | None = None,
) -> RepairOutcome:
    """Plan (idempotent), then build and gate the canary and the waves not built yet."""
    spec, incident_id = launcher.spec, launcher.incident.incident_id
    planned = launcher.run(PLAN, canary_partitions=canary or [], canary_max=canary_max, wave_size=wave_size)
    outcome = RepairOutcome(_plan(spec, incident_id), planned.run_id)
    while True:
        plan = _plan(spec, incident_id)
        wave = plan.next_wave()
        if wave is None or (through == "canary" and wave != 0):
            break
        try:
            result = launcher.run(CANARY if wave == 0 else WAVE, tags=wave_tags(plan, wave), check_order=False)
            run_id = result.run_id
        except RecoveryError as err:
            outcome.stopped = str(err)
            run_id = ""
        with open_engine(spec.warehouse).session(read_only=True) as s:
            gates = latest_gates(s, incident_id, wave_name(wave))
        done = WaveOutcome(wave, len(plan.waves[wave]), run_id, gates)
        outcome.waves.append(done)
        if on_wave:
            on_wave(done, plan)
        if outcome.stopped or any(not g.passed for g in gates.values()):
            outcome.stopped = outcome.stopped or _plan(spec, incident_id).stopped_reason
            break
    outcome.plan = _plan(spec, incident_id)
    return outcome


def run_publish(launcher: Launcher) -> dg.ExecuteInProcessResult:
    return launcher.run(PUBLISH)


def decision(launcher: Launcher):
    """Rollback or repair, for publish and ``recover`` alike: the decision rule over the control
    plane as it stands (the same rule the ``incident/decision`` asset records), unless a repair
    plan exists, which commits the incident to publishing the repair."""
    from recovery.lib.decision import decide

    with open_engine(launcher.spec.warehouse).session(read_only=True) as s:
        plan = load_plan(s, launcher.incident.incident_id)
        chosen = decide(s, launcher.spec, launcher.incident.failed_generations)
    return plan, chosen


def publish_notice(launcher: Launcher):
    """The publish notice to whoever asked for the recovery, through the code location's notifier."""
    from recovery.defs.alerts.resources import notifier_resource
    from recovery.lib.repair.publish import PublishNotice

    engine = open_engine(launcher.spec.warehouse)
    return PublishNotice(notifier_resource().notifier(engine), launcher.incident.requested_by)


def publish_or_roll_back(
    launcher: Launcher,
) -> tuple[str, dg.ExecuteInProcessResult | None, RepairPlan | None, list[str]]:
    """Publish the repair, or roll back when the decision chose it and no repair was planned.
    Returns what was done ('published', 'rolled_back', 'already_published', or 'finished' when an
    earlier publish committed but was stopped before what follows its commit), the run, the plan,
    and the steps after the commit that were finished now."""
    from recovery.lib.incident.phases import ROLLBACK
    from recovery.lib.repair.publish import finish_publish, publish_steps_left

    plan, chosen = decision(launcher)
    if plan is None and chosen.is_rollback:
        return "rolled_back", launcher.run(ROLLBACK), None, []
    if plan is not None and plan.status == "published":
        engine, spec, incident_id = open_engine(launcher.spec.warehouse), launcher.spec, launcher.incident.incident_id
        if not publish_steps_left(engine, spec, incident_id):
            return "already_published", None, plan, []
        finished = finish_publish(engine, spec, incident_id, notice=publish_notice(launcher), actor="publish")
        return "finished", None, plan, finished
    return "published", launcher.run(PUBLISH), plan, []
