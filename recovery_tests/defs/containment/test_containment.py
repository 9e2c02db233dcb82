"""Containment's promises on the worked example (a private copy, a fresh Dagster instance):

- a bad incident is refused with one message naming the field, and the warehouse stays
  byte-identical;
- a generation this instance never ran (written by another tool, as ``backfill-0042`` is
  to a fresh instance) is fenced anyway, and containment says it found no runs to cancel;
- re-running containment for the same incident changes nothing, not one byte;
- after the fence, a write or registration by the generation is refused, counted, on the
  timeline and alerted once through the notifier; consumers refuse to propagate its rows;
- the fencing sensor stops a run or retry of the generation launched after the fence.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.utils import make_new_run_id

from recovery.cli import main as cli
from recovery.config import PROJECT_ROOT
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.containment.config import IncidentConfig, resolve_incident
from recovery.defs.containment.sensors import fencing_sensor
from recovery.defs.resources import warehouse_resource
from recovery.lib.consumers.sql import materialize_consumer
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.errors import FencedGenerationError, RecoveryError, SpecError
from recovery.lib.incident.phases import CONTAIN
from recovery.lib.write.fencing import GENERATION_TAG
from recovery.lib.write.writer import Writer
from recovery.orchestration import run_job
from recovery_tests.support.containment import Env
from recovery_tests.support.rows import present

GEN = "backfill-0042"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _contain(env: Env, **config) -> dg.ExecuteInProcessResult:
    from recovery.definitions import defs

    run_config = {"ops": {"validate_incident": {"config": config}}} if config else CONTAIN.run_config(str(env.incident))
    with dg.DagsterInstance.get() as instance:
        return run_job(defs(), CONTAIN.job, instance, run_config=run_config)


GOOD: dict[str, Any] = {
    "incident_id": "INC-TEST-1",
    "failed_generations": [GEN],
    "requested_by": "data-platform-oncall",
}
BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    "unknown generation": ({"failed_generations": ["backfill-9999"]}, "failed_generations[0]", "unknown"),
    "not a backfill": ({"failed_generations": ["ingest-2024-07-05"]}, "failed_generations[0]", "not a backfill"),
    "range outside the data": (
        {"partitions": {"start": "2031-01-01", "end": "2031-02-01"}},
        "partitions",
        "outside the data",
    ),
    "missing requester": ({"requested_by": None}, "requested_by", "required"),
}


def test_each_bad_incident_is_refused_naming_the_field_and_the_warehouse_stays_byte_identical(env):
    wal = env.warehouse.with_name(env.warehouse.name + ".wal")
    before = _digest(env.warehouse)
    assert not wal.exists()
    from recovery.definitions import defs

    code_location = defs()
    with dg.DagsterInstance.get() as instance:  # one instance for the four cases: it is slow to create
        for case, (change, field, problem) in BAD.items():
            config = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
            with pytest.raises(SpecError) as err:
                resolve_incident(IncidentConfig(**config), env.spec_path)
            assert err.value.field == field and problem in str(err.value), case
            with pytest.raises(RecoveryError, match=re.escape(field) + ": .*" + problem):
                run_job(
                    code_location, CONTAIN.job, instance, run_config={"ops": {"validate_incident": {"config": config}}}
                )
            assert _digest(env.warehouse) == before, f"{case}: a refused incident changed the warehouse"
            assert not wal.exists(), case


def test_the_cli_refuses_a_bad_incident_file_with_one_message_and_exit_status_2(env, tmp_path, capsys):
    bad = tmp_path / "incident.yaml"
    bad.write_text(yaml.safe_dump({**GOOD, "spec": str(env.spec_path), "failed_generations": ["ingest-2024-07-05"]}))
    before = _digest(env.warehouse)
    assert cli(["contain", "--incident", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "failed_generations[0]" in out and "not a backfill" in out and "Traceback" not in out
    assert _digest(env.warehouse) == before
    assert not (env.home / "storage").exists() or not list((env.home / "storage").iterdir()), "a run was created"


def test_a_generation_without_runs_is_fenced_and_a_second_containment_changes_nothing(env, capsys):
    assert cli(["contain", "--incident", str(env.incident)]) == 0
    first = capsys.readouterr().out
    assert f"{GEN}: fenced at" in first and "by data-platform-oncall (incident INC-2024-031" in first
    assert "no runs to cancel" in first

    fences = env.fetch(f"SELECT incident_id, token, fenced_by, seq FROM {SCHEMA}.fences WHERE generation = ?", [GEN])
    assert len(fences) == 1 and fences[0][:3] == ("INC-2024-031", fences[0][1], "data-platform-oncall")
    kinds = [
        r[0]
        for r in env.fetch(f"SELECT kind FROM {SCHEMA}.timeline WHERE incident_id = 'INC-2024-031' ORDER BY event_id")
    ]
    assert kinds == ["fence", "containment_no_runs"]
    digest = _digest(env.warehouse)

    assert cli(["contain", "--incident", str(env.incident)]) == 0
    second = capsys.readouterr().out
    assert f"{GEN}: already fenced" in second and "already contained: nothing changed" in second
    assert f"token {fences[0][1]}, commit seq {fences[0][3]}" in second
    assert (
        env.fetch(f"SELECT incident_id, token, fenced_by, seq FROM {SCHEMA}.fences WHERE generation = ?", [GEN])
        == fences
    )
    assert _digest(env.warehouse) == digest, "re-running containment changed the warehouse"


def _evaluate_sensor(env: Env, instance: dg.DagsterInstance, alerts: Path):
    resources = {
        "warehouse": warehouse_resource(str(env.spec_path)),
        "notifier": NotifierResource(kind="file", path=str(alerts)),
    }
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        return fencing_sensor(context)


def test_a_write_after_containment_is_refused_counted_alerted_once_and_on_the_timeline(env, tmp_path):
    _contain(env)
    spec = parse_spec(env.spec_path)
    engine = open_engine(spec.warehouse)
    rows_before = env.fetch(
        f"SELECT count(*), max(_written_at) FROM {spec.target.table_name.sql()} WHERE _generation = ?", [GEN]
    )
    stray = Writer(engine, spec, actor="stray-worker")
    with pytest.raises(FencedGenerationError):
        stray.write(
            GEN,
            f"SELECT * EXCLUDE (_generation, _written_at) FROM {spec.target.table_name.sql()} LIMIT 5",
            mode="append",
            run_id="stray-run-1",
        )
    with pytest.raises(FencedGenerationError):
        stray.register_generation(GEN, "backfill", run_id="stray-run-2")
    assert (
        env.fetch(f"SELECT count(*), max(_written_at) FROM {spec.target.table_name.sql()} WHERE _generation = ?", [GEN])
        == rows_before
    )

    attempts = env.fetch(
        f"SELECT action, run_id FROM {SCHEMA}.fence_attempts WHERE generation = ? ORDER BY attempted_at", [GEN]
    )
    assert attempts == [("write:append", "stray-run-1"), ("register", "stray-run-2")]
    events = env.fetch(
        f"SELECT run_id FROM {SCHEMA}.timeline WHERE kind = 'fence_attempt' AND incident_id = 'INC-2024-031' "
        "ORDER BY event_id"
    )
    assert events == [("stray-run-1",), ("stray-run-2",)]

    alerts = tmp_path / "alerts.jsonl"
    with dg.DagsterInstance.get() as instance:
        for _ in range(3):  # the sensor re-evaluates; each alert is delivered once
            assert isinstance(_evaluate_sensor(env, instance, alerts), dg.SkipReason)
    delivered = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [a["subject"] for a in delivered] == [
        f"write:append by fenced generation {GEN} refused",
        f"register by fenced generation {GEN} refused",
    ]
    assert {a["incident_id"] for a in delivered} == {"INC-2024-031"} and {a["owner"] for a in delivered} == {
        "data-platform-oncall"
    }
    assert len(env.fetch(f"SELECT * FROM {SCHEMA}.timeline WHERE kind = 'alert' AND incident_id = 'INC-2024-031'")) == 2

    consumer = spec.downstream[0]
    with pytest.raises(FencedGenerationError, match=f"consumer {consumer.name} is paused"):
        materialize_consumer(engine, spec, consumer)


def _queued_run(tags: dict, parent: str | None = None) -> dg.DagsterRun:
    """A run waiting in the queue, as one re-executed from the UI (or retried) would be."""
    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="recovery.definitions")), "__repository__"
        ),
        "__ASSET_JOB",
    )
    return dg.DagsterRun(
        job_name="__ASSET_JOB",
        run_id=make_new_run_id(),
        status=dg.DagsterRunStatus.QUEUED,
        tags=tags,
        parent_run_id=parent,
        root_run_id=parent,
        remote_job_origin=origin,
    )


def test_the_sensor_stops_a_run_and_a_retry_launched_after_the_fence_once(env, tmp_path):
    _contain(env)
    alerts = tmp_path / "alerts.jsonl"
    with dg.DagsterInstance.get() as instance:
        relaunch = _queued_run({GENERATION_TAG: GEN})
        retry = _queued_run({GENERATION_TAG: GEN, "dagster/parent_run_id": relaunch.run_id}, parent=relaunch.run_id)
        unrelated = _queued_run({GENERATION_TAG: "ingest-2024-07-05"})
        for run in (relaunch, retry, unrelated):
            instance.add_run(run)

        for _ in range(2):
            _evaluate_sensor(env, instance, alerts)

        for run in (relaunch, retry):
            stopped = present(instance.get_run_by_id(run.run_id))
            assert stopped.status == dg.DagsterRunStatus.CANCELED
            assert stopped.tags["dagster/max_retries"] == "0" and stopped.tags["dagster/will_retry"] == "false"
        assert present(instance.get_run_by_id(unrelated.run_id)).status == dg.DagsterRunStatus.QUEUED

    attempts = env.fetch(f"SELECT run_id, action, detail FROM {SCHEMA}.fence_attempts WHERE generation = ?", [GEN])
    assert sorted(a[0] for a in attempts) == sorted([relaunch.run_id, retry.run_id])
    assert all(a[1] == "run:QUEUED" and "created after the fence" in a[2] for a in attempts)
    assert f"parent {relaunch.run_id}" in next(a[2] for a in attempts if a[0] == retry.run_id)
    timeline = {r[0] for r in env.fetch(f"SELECT run_id FROM {SCHEMA}.timeline WHERE kind = 'fence_attempt'")}
    assert timeline == {relaunch.run_id, retry.run_id}
    delivered = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert sorted(a["subject"] for a in delivered) == sorted(
        f"run {r.run_id} of fenced generation {GEN} stopped" for r in (relaunch, retry)
    )


def test_containment_killed_after_stopping_dagster_work_is_recorded_once_by_the_rerun(env, tmp_path):
    """The contain job's run-stopping step SIGKILLed at its commit (``contain:dagster_stopped``: the
    backfill cancelled and its queued runs stopped in Dagster's storage, their timeline events not
    yet committed to the warehouse): the backfill stays cancelled and the rerun records each stop
    once, as an unkilled containment would; a third run records nothing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
    from dagster._core.storage.tags import BACKFILL_ID_TAG

    backfill_id = "kill0042"
    with dg.DagsterInstance.get() as instance:
        instance.add_backfill(
            PartitionBackfill(
                backfill_id=backfill_id,
                status=BulkActionStatus.REQUESTED,
                from_failure=False,
                tags={GENERATION_TAG: GEN},
                backfill_timestamp=time.time(),
            )
        )
        queued = [_queued_run({GENERATION_TAG: GEN, BACKFILL_ID_TAG: backfill_id}) for _ in range(2)]
        for run in queued:
            instance.add_run(run)
    reached = tmp_path / "reached"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from recovery.cli import main; main(['contain', '--incident', {str(env.incident)!r}])",
        ],
        env={
            **os.environ,
            "PYTHONPATH": str(PROJECT_ROOT),
            "RECOVERY_FAULT_AT": "contain:dagster_stopped",
            "RECOVERY_FAULT_READY": str(reached),
        },
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while not reached.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert reached.exists(), proc.stderr.read().decode()[-2000:] if proc.stderr else ""

    def stops() -> list[tuple]:
        return env.fetch(
            f"SELECT kind, coalesce(json_extract_string(details, '$.backfill_id'), ''), coalesce(run_id, '') "
            f"FROM {SCHEMA}.timeline WHERE incident_id = 'INC-2024-031' AND kind LIKE 'containment_%' ORDER BY ALL"
        )

    with dg.DagsterInstance.get() as instance:  # stopped in Dagster, not a word on the timeline
        assert present(instance.get_backfill(backfill_id)).status == BulkActionStatus.CANCELING
        assert {present(instance.get_run_by_id(r.run_id)).status for r in queued} == {dg.DagsterRunStatus.CANCELED}
    assert stops() == []
    assert [k for (k,) in env.fetch(f"SELECT kind FROM {SCHEMA}.timeline WHERE incident_id = 'INC-2024-031'")] == [
        "fence"
    ]

    assert cli(["contain", "--incident", str(env.incident)]) == 0  # the rerun
    expected = sorted(
        [("containment_cancel_backfill", backfill_id, "")]
        + [("containment_terminate_run", backfill_id, r.run_id) for r in queued]
    )
    assert stops() == expected
    with dg.DagsterInstance.get() as instance:
        assert present(instance.get_backfill(backfill_id)).status in (
            BulkActionStatus.CANCELING,
            BulkActionStatus.CANCELED,
        )
        assert {present(instance.get_run_by_id(r.run_id)).status for r in queued} == {dg.DagsterRunStatus.CANCELED}
    assert cli(["contain", "--incident", str(env.incident)]) == 0  # nothing more to record
    assert stops() == expected
    assert len(env.fetch(f"SELECT * FROM {SCHEMA}.fences WHERE generation = ?", [GEN])) == 1
