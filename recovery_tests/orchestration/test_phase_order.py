"""The runbook's order, enforced by the jobs themselves: a phase launched from the UI (here through
Dagster's own API) before the phases it requires fails its first step with the sentence the CLI
prints, and writes nothing; a publish launched again after the publish is a no-op that leaves the
published candidate's gates as they were.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from rich.console import Console

from recovery.config import PROJECT_ROOT
from recovery.lib.engine import open_engine
from recovery.lib.errors import OutOfOrderError
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.incident.phases import ASSESS, CONTAIN, PLAN, PUBLISH
from recovery.lib.pointers.namespaces import current_namespace
from recovery.lib.repair.plan import load_plan
from recovery_tests.support.rows import present


def _warehouse_digest(spec) -> list[tuple]:
    """Every table and view of the warehouse with its row count: what a write would change."""
    with open_engine(spec.warehouse).session(read_only=True) as s:
        relations = s.fetchall(
            "SELECT schema_name, table_name, 'table' FROM duckdb_tables() "
            "UNION ALL SELECT schema_name, view_name, 'view' FROM duckdb_views() WHERE NOT internal ORDER BY 1, 2"
        )
        return [
            (schema, name, kind, s.scalar(f'SELECT count(*) FROM "{schema}"."{name}"'))
            for schema, name, kind in relations
        ]


def _cli(argv: list[str]) -> tuple[int, str]:
    from recovery.cli import main

    out = io.StringIO()
    code = main(argv, console=Console(file=out, width=1000))
    return code, out.getvalue()


def _home(tmp_path: Path, monkeypatch, spec_path: Path, copy_from: Path | None = None) -> None:
    home = tmp_path / "dagster_home"
    if copy_from is not None:
        shutil.copytree(copy_from, home, ignore=shutil.ignore_patterns("*.log"))
    else:
        home.mkdir()
        shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(spec_path))


def test_publish_launched_after_containment_alone_is_refused_inside_its_run(
    failed_example, example_copy, tmp_path, monkeypatch
):
    from recovery.definitions import defs
    from recovery.launch import Launcher

    _home(tmp_path, monkeypatch, example_copy, failed_example.dagster_home)
    incident_file = example_copy.with_name("incident.yaml")
    incident = parse_incident(incident_file)
    spec = check_incident(incident)
    sentence = (
        f"publish: the incident has no recorded reconciliation; run `recovery assess --incident {incident_file}` "
        f"(Dagster job assess_incident) first"
    )
    with dg.DagsterInstance.get() as instance:
        code_location = defs()
        launcher = Launcher(incident, spec, instance=instance, definitions=code_location)
        launcher.run(CONTAIN)
        assert launcher.state().contained and not launcher.state().assessed
        before = _warehouse_digest(spec)

        # launched as the UI launches it: the run fails in its first step, with the sentence and its facts
        result = code_location.resolve_job_def(PUBLISH.job).execute_in_process(
            instance=instance, run_config=PUBLISH.run_config(str(incident_file)), raise_on_error=False
        )
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        assert failure.step_key == PUBLISH.nodes[0]
        user_failure = present(failure.step_failure_data.user_failure_data)
        assert user_failure.description == sentence
        assert {k: v.value for k, v in user_failure.metadata.items()} == {
            "phase": "publish",
            "requires": "contain, assess, wave",
            "missing": "assessed, built",
            "run_first": "assess_incident",
        }
        assert present(failure.step_failure_data.error).cls_name == "Failure"  # a decision, not an unexpected exception
        assert not [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
        assert not [e for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]

        # the CLI reads that run's refusal as its own: the same sentence, exit 2
        with pytest.raises(OutOfOrderError) as refused:
            launcher.run(PUBLISH, check_order=False)
        assert str(refused.value) == sentence and refused.value.exit_code == 2
    # and refuses before any run when asked itself
    with dg.DagsterInstance.get() as instance:
        runs_before = len(instance.get_runs())
    code, out = _cli(["publish", "--incident", str(incident_file)])
    assert code == 2 and out.strip() == f"error: {sentence}"
    with dg.DagsterInstance.get() as instance:
        assert len(instance.get_runs()) == runs_before
    assert _warehouse_digest(spec) == before  # nothing was written
    with open_engine(spec.warehouse).session(read_only=True) as s:
        assert load_plan(s, incident.incident_id) is None

    # the assess job is refused the same way for an incident that is not contained yet: another sentence
    other = parse_incident(incident_file).model_copy(update={"failed_generations": ["backfill-never-fenced"]})
    from recovery.lib.incident_state import read_state, refusal

    refused_assess = refusal(ASSESS, read_state(other, spec), other)
    assert refused_assess is not None and refused_assess.sentence == (
        f"assess: the failed generations are not fenced yet; run `recovery contain --incident {incident_file}` "
        f"(Dagster job contain_backfill) first"
    )


def test_publish_after_a_publish_is_a_no_op_that_changes_no_gate(tmp_path, monkeypatch):
    from recovery.definitions import defs
    from recovery.defs.repair.checks import CANDIDATE_KEY
    from recovery.launch import Launcher
    from recovery.launch.repair import run_publish, run_repair
    from recovery_tests.support.repaired_small import build_damaged

    r = build_damaged(tmp_path / "orders")  # ingested, damaged by bf-7, fenced
    _home(tmp_path, monkeypatch, r.spec_path)
    incident = parse_incident(r.incident_path)
    spec = check_incident(incident)
    with dg.DagsterInstance.get() as instance:
        code_location = defs()
        launcher = Launcher(incident, spec, instance=instance, definitions=code_location)
        launcher.run(CONTAIN)
        launcher.run(ASSESS)
        repaired = run_repair(launcher, wave_size=5)
        assert repaired.stopped is None, repaired.stopped
        published = run_publish(launcher)
        job = code_location.resolve_job_def(PUBLISH.job)
        gates = [k for k in job.asset_layer.asset_graph.asset_check_keys if k.asset_key == CANDIDATE_KEY]
        assert len(gates) >= 6

        def evaluations() -> dict[str, tuple[str, bool, str | None]]:
            """Each gate's latest evaluation (a passed or failed one): the run that made it, passed, its sentence."""
            done = {AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED}
            out: dict[str, tuple[str, bool, str | None]] = {}
            for key in gates:
                (latest,) = instance.event_log_storage.get_asset_check_execution_history(key, limit=1, status=done)
                ev = present(present(latest.event).dagster_event).event_specific_data
                assert isinstance(ev, dg.AssetCheckEvaluation), ev
                out[key.name] = (latest.run_id, ev.passed, ev.description)
            return out

        gated = evaluations()
        assert {run for run, _, _ in gated.values()} == {published.run_id}
        assert all(passed for _, passed, _ in gated.values())
        before = _warehouse_digest(spec)
        with open_engine(spec.warehouse).session(read_only=True) as s:
            namespace = current_namespace(s, spec)

        # launched again from the UI: a successful run that replays, gates and publishes nothing
        again = job.execute_in_process(
            instance=instance, run_config=PUBLISH.run_config(str(incident.incident_path)), raise_on_error=False
        )
        assert again.success
        kinds = [e.event_type_value for e in again.all_events]
        assert "ASSET_MATERIALIZATION" not in kinds and "ASSET_CHECK_EVALUATION" not in kinds
        assert evaluations() == gated  # every gate of the published candidate as it was
    assert _warehouse_digest(spec) == before
    with open_engine(spec.warehouse).session(read_only=True) as s:
        assert current_namespace(s, spec) == namespace
        assert present(load_plan(s, incident.incident_id)).status == "published"
    code, out = _cli(["publish", "--incident", str(incident.incident_path)])
    assert code == 0 and "already published" in out and "nothing to do" in out


def test_the_incident_is_chosen_once_and_every_later_phase_reads_it_from_the_run_tag(tmp_path, monkeypatch):
    """Contain launched from the old link (the incident file in its config) records the incident on
    its run as the tag recovery/incident; assess launched with that tag alone (nothing typed) runs its
    three steps on one validation of the incident; a phase launched with no incident at all fails its
    first step with the one-line refusal naming the tag and the fix, and writes nothing."""
    from recovery.definitions import defs
    from recovery.defs.containment import config as incident_config
    from recovery.defs.target_partitions import reconciliation_tags
    from recovery.launch import Launcher
    from recovery.lib.convergence.verify import history_table
    from recovery.lib.errors import RecoveryError
    from recovery.lib.incident.phases import INCIDENT_TAG, TIMELINE, VERIFY, incident_tags
    from recovery.orchestration import run_failure
    from recovery_tests.support.repaired_small import build_damaged

    r = build_damaged(tmp_path / "orders")  # ingested, damaged by bf-7, fenced
    _home(tmp_path, monkeypatch, r.spec_path)
    incident = parse_incident(r.incident_path)
    spec = check_incident(incident)
    path = str(r.incident_path)
    with dg.DagsterInstance.get() as instance:
        code_location = defs()
        contained = code_location.resolve_job_def(CONTAIN.job).execute_in_process(
            instance=instance, run_config=CONTAIN.run_config(path), raise_on_error=False
        )
        assert contained.success
        assert present(instance.get_run_by_id(contained.run_id)).tags[INCIDENT_TAG] == path  # a re-execution keeps it

        validated: list[str] = []
        real = incident_config.check_incident

        def counted(inc):
            validated.append(inc.incident_id)
            return real(inc)

        monkeypatch.setattr(incident_config, "check_incident", counted)
        assessed = code_location.resolve_job_def(ASSESS.job).execute_in_process(
            instance=instance,
            tags={**incident_tags(path), **reconciliation_tags(instance, spec)},
            raise_on_error=False,
        )
        assert assessed.success, [e.message for e in assessed.all_events if e.is_failure]
        assert validated == [incident.incident_id]  # three steps, one validation
        assert Launcher(incident, spec, instance=instance, definitions=code_location).state().assessed
        assert present(instance.get_run_by_id(assessed.run_id)).run_config.get("ops", {}) == {}  # nothing typed
        logs = [e.message for e in instance.all_logs(assessed.run_id) if e.message]
        assert any(f"{PLAN.job}/playground/setup?tags[0][key]=recovery%2Fincident" in m for m in logs), logs

        # the convergence check (which also runs for no incident, on its schedule) reads the tag too
        verified = code_location.resolve_job_def(VERIFY.job).execute_in_process(
            instance=instance, tags=incident_tags(path), raise_on_error=False
        )
        assert verified.success, [e.message for e in verified.all_events if e.is_failure]
        with open_engine(spec.warehouse).session(read_only=True) as s:
            recorded = s.fetchall(
                f"SELECT DISTINCT incident_id FROM {history_table(spec)} WHERE run_id = ?", [verified.run_id]
            )
        assert recorded == [(incident.incident_id,)]

        before = _warehouse_digest(spec)
        bare = code_location.resolve_job_def(TIMELINE.job).execute_in_process(instance=instance, raise_on_error=False)
        assert not bare.success
        (failure,) = [e for e in bare.all_events if e.is_step_failure]
        assert failure.step_key == TIMELINE.nodes[0]
        refused = present(failure.step_failure_data.user_failure_data)
        error = present(failure.step_failure_data.error)
        assert refused.description == (
            "recovery/incident: no incident was chosen for this run. Fix: launch it from the draft incident's link "
            "(or a link a phase's run logged), or set the run tag recovery/incident to the incident file"
        )
        assert "\n" not in refused.description and refused.metadata["field"].value == INCIDENT_TAG
        assert error.cls_name == "Failure"
        assert error.stack == []  # a decision: the run page shows no stack trace
        assert not [e for e in bare.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
        read = run_failure(bare, TIMELINE.job)  # the CLI reads it as bad input: exit 2, not a gate's no
        assert type(read) is RecoveryError and read.exit_code == 2 and refused.description in str(read)
    assert _warehouse_digest(spec) == before
