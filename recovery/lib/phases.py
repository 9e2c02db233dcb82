"""The table of recovery phases: which job each launches, with which config, after what.

Job names and config shapes live here once, as plain names (no Dagster import, so
the Dagster-free library can name a launchpad config too, e.g. a draft incident's);
the definitions own the jobs, this table only names them, and
``recovery_tests/lib/test_phases.py`` checks every name against the code location.
"""

from __future__ import annotations

from dataclasses import dataclass

Need = str
"""A fact about the incident that must hold before a phase runs (see ``state.NEEDS``)."""


@dataclass(frozen=True)
class Phase:
    name: str  # the CLI verb (or the step of ``recover``)
    job: str  # the Dagster job it launches
    nodes: tuple[str, ...]  # ops / assets whose config carries the incident
    needs: tuple[Need, ...] = ()  # what must have run before
    whole_target: bool = False  # runs over every target partition (reconciliation tags)

    def run_config(self, incident_file: str, **extra) -> dict:
        """``{"ops": {node: {"config": {"incident_file": F, ...}}}}``; ``extra`` goes to the first node."""
        return {
            "ops": {
                node: {"config": {"incident_file": incident_file, **(extra if i == 0 else {})}}
                for i, node in enumerate(self.nodes)
            }
        }


CONTAIN = Phase("contain", "contain_backfill", ("validate_incident",))
EVIDENCE = Phase("evidence", "preserve_evidence", ("incident__evidence_bundle",))
RECONCILE = Phase("reconcile", "reconcile_incident", ("incident__reconciliation",), whole_target=True)
ASSESS = Phase(
    "assess",
    "assess_incident",
    ("incident__reconciliation", "incident__impact", "incident__decision"),
    needs=("contained",),
    whole_target=True,
)
TIMELINE = Phase("timeline", "render_incident_timeline", ("incident__timeline",), needs=("managed",))
PLAN = Phase("plan", "plan_repair", ("repair__plan",), needs=("contained", "assessed"))
CANARY = Phase("canary", "repair_canary", ("repair__generation",), needs=("planned",))
WAVE = Phase("wave", "repair_waves", ("repair__generation",), needs=("planned",))
PUBLISH = Phase(
    "publish", "publish_repair", ("repair__candidate", "repair__publication"), needs=("contained", "assessed", "built")
)
ROLLBACK = Phase("rollback", "rollback_incident", ("roll_back",), needs=("contained", "assessed"))
RESTATE = Phase(
    "restate", "restate_consumers", ("restatement",), needs=("managed",)
)  # + check_request: no fenced row published
VERIFY = Phase("verify", "verify_convergence", ("convergence__drift",), needs=("managed",))
REPORT = Phase("report", "render_incident_reports", ("incident__reports",), needs=("managed",))

PHASES: dict[str, Phase] = {
    p.name: p
    for p in (
        CONTAIN,
        EVIDENCE,
        RECONCILE,
        ASSESS,
        TIMELINE,
        PLAN,
        CANARY,
        WAVE,
        PUBLISH,
        ROLLBACK,
        RESTATE,
        VERIFY,
        REPORT,
    )
}
