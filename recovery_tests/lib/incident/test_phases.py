"""The phase table names real jobs and nodes, and its run config is what each job accepts."""

from __future__ import annotations

import dagster as dg
import pytest

from recovery.definitions import defs
from recovery.lib.incident.phases import PHASES


@pytest.fixture(scope="module")
def code_location() -> dg.Definitions:
    return defs()


@pytest.mark.parametrize("name", sorted(PHASES))
def test_each_phase_launches_a_job_of_the_code_location_with_config_it_accepts(code_location, name):
    phase = PHASES[name]
    job = code_location.resolve_job_def(phase.job)
    nodes = {n.name for n in job.nodes}
    assert set(phase.nodes) <= nodes, (phase.job, sorted(nodes))
    extra = (
        {"recent_partitions": 5}
        if name == "verify"
        else {"out_dir": "/tmp/out"}
        if name in ("reconcile", "report")
        else {}
    )
    result = dg.validate_run_config(job, phase.run_config("incident.yaml", **extra))
    assert result["ops"][phase.nodes[0]]["config"]["incident_file"] == "incident.yaml"


def test_without_an_incident_file_the_config_holds_only_the_first_nodes_extra(code_location):
    """The CLI names the incident by the run tag (``incident_tags``): the config holds only what it adds."""
    from recovery.lib.incident.phases import INCIDENT_TAG, REPORT, incident_tags

    assert incident_tags("i.yaml") == {INCIDENT_TAG: "i.yaml"}
    assert REPORT.run_config() == {}
    config = REPORT.run_config(out_dir="/tmp/out")
    assert config == {"ops": {REPORT.nodes[0]: {"config": {"out_dir": "/tmp/out"}}}}
    dg.validate_run_config(code_location.resolve_job_def(REPORT.job), config)
