"""The runbook's phases, each declared once: its verb, its Dagster job, what it requires, its refusal.

Job names, the order of the runbook and the sentence that refuses a phase launched
too early live here once, as plain names (no Dagster import, so the Dagster-free
library can name a job in a message or a launchpad config, e.g. a draft incident's).
The definitions name their jobs from this table and refuse an early launch inside
the run (``recovery.defs.containment.config.incident_for_step``); the CLI verbs and
``recovery recover`` launch the same phases in ``RUNBOOK`` order and refuse with the
same sentence before any run is created. ``recovery_tests/lib/incident/test_phases.py`` checks
every name against the code location, ``test_phase_declarations.py`` that no job name
or phase order is written a second time.
"""

from __future__ import annotations

from dataclasses import dataclass

INCIDENT_TAG = "recovery/incident"
"""The run tag naming the incident file: the incident is chosen once (the draft incident's launchpad
link sets it on the containment run; the CLI sets it on every run it launches; each phase's run logs
the links that launch the next phases with it), and a step whose config names no incident reads it
from this tag. Config that names an incident (``incident_file`` or the fields) wins over the tag."""


def incident_tags(incident_file: str) -> dict[str, str]:
    """The run tags that choose the incident for every step of a phase's run."""
    return {INCIDENT_TAG: incident_file}


Need = str
"""A fact about the incident that must hold before a phase runs (a field of ``IncidentState``)."""


@dataclass(frozen=True)
class Phase:
    name: str  # the phase (and, unless ``verb`` says otherwise, its CLI verb)
    job: str  # the Dagster job it launches
    nodes: tuple[str, ...]  # ops / assets whose config carries the incident; the first one checks the order
    needs: tuple[Need, ...] = ()  # facts that must hold before it runs (each produced by an earlier phase)
    whole_target: bool = False  # runs over every target partition (reconciliation tags)
    verb: str = ""  # the ``recovery`` verb that launches it (default: ``name``)

    @property
    def command(self) -> str:
        return self.verb or self.name

    @property
    def requires(self) -> tuple[Phase, ...]:
        """The phases that produce this phase's needs, in need order, each once."""
        out: list[Phase] = []
        for need in self.needs:
            first = NEEDS[need][0]
            if first not in out:
                out.append(first)
        return tuple(out)

    def run_config(self, incident_file: str | None = None, **extra) -> dict:
        """``{"ops": {node: {"config": {"incident_file": F, ...}}}}``; ``extra`` goes to the first node.
        Without ``incident_file``, only ``extra``: the run's ``INCIDENT_TAG`` names the incident."""
        if incident_file is None:
            return {"ops": {self.nodes[0]: {"config": extra}}} if extra else {}
        return {
            "ops": {
                node: {"config": {"incident_file": incident_file, **(extra if i == 0 else {})}}
                for i, node in enumerate(self.nodes)
            }
        }

    def refusal(self, unmet: tuple[Need, ...], incident_file: str | None) -> Refusal:
        """The one sentence (and its facts) refusing this phase while ``unmet`` needs do not hold."""
        first, why = NEEDS[unmet[0]]
        how = (
            f"run `recovery {first.command} --incident {incident_file}` (Dagster job {first.job}) first"
            if incident_file
            else f"launch the Dagster job {first.job} for this incident first"
        )
        return Refusal(
            sentence=f"{self.command}: {why}; {how}",
            phase=self.name,
            requires=tuple(p.name for p in self.requires),
            missing=unmet,
            run_first=first.job,
        )


@dataclass(frozen=True)
class Refusal:
    """A phase launched before the phases it requires: nothing was written."""

    sentence: str  # what the CLI prints and the run's failure says
    phase: str
    requires: tuple[str, ...]  # the phases it requires
    missing: tuple[Need, ...]  # the needs that do not hold yet
    run_first: str  # the job to launch first

    def metadata(self) -> dict[str, str]:
        return {
            "phase": self.phase,
            "requires": ", ".join(self.requires),
            "missing": ", ".join(self.missing),
            "run_first": self.run_first,
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
PLAN = Phase("plan", "plan_repair", ("repair__plan",), needs=("contained", "assessed"), verb="repair")
CANARY = Phase("canary", "repair_canary", ("repair__generation",), needs=("planned",), verb="repair")
WAVE = Phase("wave", "repair_waves", ("repair__generation",), needs=("planned",), verb="repair")
PUBLISH = Phase(
    "publish", "publish_repair", ("repair__candidate", "repair__publication"), needs=("contained", "assessed", "built")
)
ROLLBACK = Phase("rollback", "rollback_incident", ("roll_back",), needs=("contained", "assessed"), verb="publish")
RESTATE = Phase(
    "restate", "restate_consumers", ("restatement",), needs=("managed",)
)  # + check_request: no fenced row published
VERIFY = Phase("verify", "verify_convergence", ("convergence__drift",), needs=("managed",))
REPORT = Phase("report", "render_incident_reports", ("incident__reports",), needs=("managed",))

NEEDS: dict[Need, tuple[Phase, str]] = {
    "managed": (CONTAIN, "the target is not managed yet"),
    "contained": (CONTAIN, "the failed generations are not fenced yet"),
    "assessed": (ASSESS, "the incident has no recorded reconciliation"),
    "planned": (PLAN, "the incident has no repair plan"),
    "built": (WAVE, "the repair's waves are not all built and gated"),
}
"""Each need: the phase that makes it hold, and why a phase needing it is refused until then."""

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

BY_JOB: dict[str, Phase] = {p.job: p for p in PHASES.values()}
"""The phase a Dagster job launches (the job checks its order by this)."""


@dataclass(frozen=True)
class Step:
    """One step of ``recovery recover``: its phases, run in this order (``PUBLISH`` or ``ROLLBACK``
    as the decision chose; the repair's steps are skipped on a rollback)."""

    name: str
    phases: tuple[Phase, ...]


RUNBOOK: tuple[Step, ...] = (
    Step("contain", (CONTAIN,)),
    Step("evidence", (EVIDENCE,)),
    Step("assess", (ASSESS,)),
    Step("repair", (PLAN, CANARY, WAVE)),
    Step("publish", (PUBLISH, ROLLBACK)),
    Step("restate", (RESTATE,)),
    Step("verify", (VERIFY,)),
    Step("reports", (TIMELINE, REPORT)),
)
"""The runbook's order: no repair before assess, no publish before the waves."""
