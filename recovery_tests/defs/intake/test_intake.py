"""From the failure to containment: the worked example's failed backfill opens its own draft incident."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import dagster as dg
import pytest

from recovery.cli import main as cli
from recovery.config import LOCATION_NAME
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.intake.sensors import backfill_incident_sensor, failed_backfills
from recovery.defs.resources import warehouse_resource
from recovery.example.defs import TARGET_KEY
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.incident.draft import FailedBackfill, draft_incident_id, partition_range
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.incident.phases import INCIDENT_TAG
from recovery_tests.support.rows import present


def test_partition_range_is_the_first_and_last_day_or_nothing():
    assert partition_range(["2024-03-02", "2024-01-05", "2024-02-01"]) == (date(2024, 1, 5), date(2024, 3, 2))
    assert partition_range(["north-202601"]) is None
    assert partition_range([]) is None
    assert (
        FailedBackfill("abc", "CANCELED", ("backfill-abc",), (), ()).reason
        == "Dagster backfill abc is CANCELED with no failed run"
    )


@pytest.fixture
def incident_env(failed_example, example_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The failed example's Dagster instance (copied) and dataset (copied), as the sensor daemon sees them."""
    home = tmp_path / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home, ignore=shutil.ignore_patterns("*.log"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(example_copy))
    monkeypatch.delenv("RECOVERY_ALERT_WEBHOOK", raising=False)
    monkeypatch.setenv("RECOVERY_UI_URL", "http://ui.example:3000")
    return example_copy, home, tmp_path / "alerts.jsonl"


def _tick(home: Path, spec_path: Path, alerts: Path):
    with dg.DagsterInstance.get() as instance:
        with dg.build_sensor_context(
            instance=instance,
            resources={
                "warehouse": warehouse_resource(str(spec_path)),
                "notifier": NotifierResource(kind="file", path=str(alerts)),
            },
        ) as context:
            return backfill_incident_sensor(context)


def _fetch(spec_path: Path, sql: str, params: list | None = None) -> list[tuple]:
    with open_engine(parse_spec(spec_path).warehouse).session(read_only=True) as s:
        return s.fetchall(sql, params or [])


def _draft_state(spec_path: Path, incident_id: str) -> tuple[list[str], int]:
    kinds = [
        r[0]
        for r in _fetch(
            spec_path, f"SELECT kind FROM {SCHEMA}.timeline WHERE incident_id = ? ORDER BY event_id", [incident_id]
        )
    ]
    sent = _fetch(spec_path, f"SELECT count(*) FROM {SCHEMA}.notifications WHERE incident_id = ?", [incident_id])[0][0]
    return kinds, sent


def _check_draft(path: Path, incident_id: str, backfill_id: str, spec_path: Path) -> None:
    """The incident file: the backfill's generation and partition range, beside the warehouse."""
    incident = parse_incident(path)
    assert incident.incident_id == incident_id
    assert incident.failed_generations == ["backfill-0042"]
    with dg.DagsterInstance.get() as instance:
        keys = (
            present(present(instance.get_backfill(backfill_id)).asset_backfill_data)
            .target_subset.get_partitions_subset(TARGET_KEY)
            .get_partition_keys()
        )
    partitions = present(incident.partitions)
    assert (str(partitions.start), str(partitions.end)) == (min(keys), max(keys))
    assert incident.spec == spec_path.resolve() and incident.approved_by == []
    check_incident(incident)  # valid against the warehouse as it is


def _check_alert(alert: dict, path: Path, incident_id: str, backfill_id: str, ui: str | None) -> None:
    """The alert carries the backfill's page, the command and the prefilled contain_backfill launchpad
    (``ui`` None: whatever RECOVERY_UI_URL was when it was sent)."""
    assert alert["incident_id"] == incident_id and alert["severity"] == "critical"
    body = alert["body"]
    if ui is None:
        ui = next(w for w in body.split() if w.endswith(f"/runs/b/{backfill_id}")).removesuffix(
            f"/runs/b/{backfill_id}"
        )
    assert f"{ui}/runs/b/{backfill_id}" in body
    assert f"recovery contain --incident {path}" in body
    link = next(w for w in body.split() if "/playground/setup" in w)
    parsed = urlparse(link)
    assert f"{parsed.scheme}://{parsed.netloc}" == ui
    assert parsed.path == f"/locations/__repository__@{LOCATION_NAME}/jobs/contain_backfill/playground/setup"
    # the incident chosen by the run tag recovery/incident, nothing to type
    assert parse_qs(parsed.query) == {"tags[0][key]": [INCIDENT_TAG], "tags[0][value]": [str(path)]}


def test_the_worked_examples_failed_backfill_opened_its_draft_and_contain_takes_it_unchanged(
    incident_env, failed_example, capsys
):
    spec_path, home, alerts = incident_env
    backfill_id = failed_example.info["backfill_id"]
    incident_id = draft_incident_id(backfill_id)
    # opened while the example was built (by the daemon's tick or right after the failure, whichever came first)
    built = failed_example.root / "incidents" / f"{incident_id}.yaml"
    assert built.exists()
    path = spec_path.parent / "incidents" / f"{incident_id}.yaml"  # the same draft in this copy of the dataset
    assert path.read_text() == built.read_text()
    assert _draft_state(spec_path, incident_id) == (["incident_drafted", "alert"], 1)
    delivered = [
        json.loads(line) for line in (failed_example.dagster_home / "recovery-alerts.jsonl").read_text().splitlines()
    ]
    drafted = [a for a in delivered if a["incident_id"] == incident_id]
    assert len(drafted) == 1
    _check_alert(drafted[0], built, incident_id, backfill_id, None)

    # the sensor's next tick finds it open: nothing rewritten, no second alert
    again = _tick(home, spec_path, alerts)
    assert again.skip_message == "0 draft incident(s) opened, 1 already open"
    assert path.read_text() == built.read_text() and not alerts.exists()
    assert _draft_state(spec_path, incident_id) == (["incident_drafted", "alert"], 1)

    # `recovery contain --incident <that file>` works unchanged
    capsys.readouterr()
    assert cli(["contain", "--incident", str(path)]) == 0
    out = capsys.readouterr().out
    assert "backfill-0042: fenced at" in out and incident_id in out
    assert _fetch(spec_path, f"SELECT incident_id FROM {SCHEMA}.fences WHERE generation = 'backfill-0042'") == [
        (incident_id,)
    ]


def test_the_sensor_opens_the_draft_of_a_failed_backfill_nobody_drafted(incident_env, failed_example):
    spec_path, home, alerts = incident_env
    backfill_id = failed_example.info["backfill_id"]
    incident_id = draft_incident_id(backfill_id)
    # as if the backfill had just failed: no draft yet
    shutil.rmtree(spec_path.parent / "incidents")
    with open_engine(parse_spec(spec_path).warehouse).transaction() as s:
        s.execute(f"DELETE FROM {SCHEMA}.timeline WHERE incident_id = ?", [incident_id])
        s.execute(f"DELETE FROM {SCHEMA}.notifications WHERE incident_id = ?", [incident_id])
    with dg.DagsterInstance.get() as instance:
        found = failed_backfills(instance, TARGET_KEY, spec_path)
    assert [f.backfill_id for f in found] == [backfill_id]
    assert found[0].status == "COMPLETED_FAILED" and found[0].failed_runs and found[0].generation == "backfill-0042"

    result = _tick(home, spec_path, alerts)
    assert result.skip_message == "1 draft incident(s) opened, 0 already open"
    path = spec_path.parent / "incidents" / f"{incident_id}.yaml"
    _check_draft(path, incident_id, backfill_id, spec_path)
    events = _fetch(
        spec_path, f"SELECT kind, summary FROM {SCHEMA}.timeline WHERE incident_id = ? ORDER BY event_id", [incident_id]
    )
    assert [e[0] for e in events] == ["incident_drafted", "alert"]
    assert "backfill-0042" in events[0][1] and backfill_id in events[0][1] and "2024-01-01.." in events[0][1]
    sent = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert len(sent) == 1
    _check_alert(sent[0], path, incident_id, backfill_id, "http://ui.example:3000")

    # an edited draft is never overwritten by a later tick
    path.write_text(path.read_text().replace("approved_by: []", "approved_by: [head-of-data]"))
    edited = path.read_text()
    assert _tick(home, spec_path, alerts).skip_message == "0 draft incident(s) opened, 1 already open"
    assert path.read_text() == edited and len(alerts.read_text().splitlines()) == 1


def test_the_launchpad_link_opens_the_named_containment_job_with_the_draft_chosen(tmp_path):
    """The incident is chosen by the run tag recovery/incident (Dagster's launchpad reads ``tags[i][key]``
    and ``tags[i][value]``), with no config to type: every later phase's run carries the same tag."""
    from recovery.lib.incident.draft import launchpad_url

    draft = tmp_path / "incidents" / "INC-DRAFT-x.yaml"
    for job in ("contain_backfill", "contain_backfill__orders"):
        parsed = urlparse(launchpad_url("http://ui:3000/", LOCATION_NAME, draft, job))
        assert parsed.path == f"/locations/__repository__@{LOCATION_NAME}/jobs/{job}/playground/setup"
        assert parse_qs(parsed.query) == {"tags[0][key]": [INCIDENT_TAG], "tags[0][value]": [str(draft)]}
