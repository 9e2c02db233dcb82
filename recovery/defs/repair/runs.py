"""Launching the repair as Dagster runs, in order: plan, canary, each wave, then publish.

The CLI and ``make run`` use these; from the UI a person launches the same jobs.
Each wave is its own run over its partition range; the loop stops at the first
run that fails (a failed gate has already stopped the expansion in the control plane).
"""

from dataclasses import dataclass, field
from typing import Callable

import dagster as dg

from recovery.defs.repair.partitions import wave_tags
from recovery.lib.engine import open_engine
from recovery.lib.errors import RecoveryError
from recovery.lib.repair.gates import latest_gates
from recovery.lib.repair.plan import RepairPlan, load_plan, wave_name
from recovery.lib.spec import DatasetSpec
from recovery.orchestration import run_job


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


def incident_ops_config(incident_file: str, *ops: str, **extra) -> dict:
    return {"ops": {op: {"config": {"incident_file": incident_file, **(extra if i == 0 else {})}} for i, op in enumerate(ops)}}


def _plan(spec: DatasetSpec, incident_id: str) -> RepairPlan:
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return load_plan(s, incident_id)


def run_repair(defs: dg.Definitions, instance: dg.DagsterInstance, spec: DatasetSpec, incident_file: str, incident_id: str, *,
               canary: list[str] | None = None, canary_max: int = 5, wave_size: int = 30, through: str = "all",
               on_wave: Callable[[WaveOutcome, RepairPlan], None] | None = None) -> RepairOutcome:
    """Plan (idempotent), then build and gate the canary and the waves not built yet."""
    cfg = incident_ops_config(incident_file, "repair__plan", canary_partitions=canary or [], canary_max=canary_max,
                              wave_size=wave_size)
    planned = run_job(defs, "plan_repair", instance, run_config=cfg)
    outcome = RepairOutcome(_plan(spec, incident_id), planned.run_id)
    while True:
        plan = _plan(spec, incident_id)
        wave = plan.next_wave()
        if wave is None or (through == "canary" and wave != 0):
            break
        job = "repair_canary" if wave == 0 else "repair_waves"
        try:
            result = run_job(defs, job, instance, tags=wave_tags(plan, wave),
                             run_config=incident_ops_config(incident_file, "repair__generation"))
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
        if outcome.stopped or any(not g["passed"] for g in gates.values()):
            outcome.stopped = outcome.stopped or _plan(spec, incident_id).stopped_reason
            break
    outcome.plan = _plan(spec, incident_id)
    return outcome


def run_publish(defs: dg.Definitions, instance: dg.DagsterInstance, incident_file: str) -> dg.ExecuteInProcessResult:
    return run_job(defs, "publish_repair", instance,
                   run_config=incident_ops_config(incident_file, "repair__candidate", "repair__publication"))
