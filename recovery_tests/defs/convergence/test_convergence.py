"""Runbook step 12, convergence verification, as promises (small dataset, repair published):

- late events for repaired partitions, ingested after publish through the writer,
  converge: the check and the ``verify_convergence`` job pass once they land (before
  they land they are pending, not drift);
- a late event deliberately not applied fails verification (an ERROR check), and the
  alert sensor delivers one alert with a link to the run to a local receiver, once;
- drift is recorded per partition over time, and clears once ingestion applies it;
- the hourly schedule is in the code location and evaluates to a valid run request;
- ``recovery verify`` exits 1 while anything drifts, 0 once converged; bad input is a
  clear error.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from recovery.config import PROJECT_ROOT
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.alerts.sensors import asset_check_alert_sensor
from recovery.defs.convergence.assets import (
    LAG_CHECK,
    RECENT_CHECK,
    REPAIRED_CHECK,
    VERIFY_JOB,
    convergence,
    verify_convergence_job,
)
from recovery.defs.resources import warehouse_resource
from recovery.lib.convergence import drift_history, verify_convergence
from recovery.lib.errors import SpecError
from recovery.lib.incident.phases import VERIFY
from recovery.lib.write.ingest import apply_changes, ingestion_watermark
from recovery_tests.support.repaired_small import Receiver, build_repaired, now
from recovery_tests.support.rows import present


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _late_events(r, at: datetime) -> None:
    """Three late changes for old, repaired partitions: a correction, a new order, a tombstone."""
    live = r.fetch("SELECT region, order_no FROM mart.orders ORDER BY placed_at, region, order_no LIMIT 2")
    with r.engine.transaction() as s:
        for (region, order_no), change, qty in zip(live, ("put", "drop"), (99, 0)):
            s.execute(
                "INSERT INTO src.order_events SELECT region, order_no, max(rev) + 1, ?, ?, arg_max(placed_at, rev), ?, "
                "arg_max(sku, rev) FROM src.order_events WHERE region = ? AND order_no = ? GROUP BY ALL",
                [change, at, qty, region, order_no],
            )
        s.execute(
            "INSERT INTO src.order_events VALUES ('west', 9001, 1, 'put', ?, TIMESTAMP '2026-01-03 10:00', 5, "
            "'SKU-001')",
            [at],
        )


def _resources(r, url: str) -> dict:
    return {"warehouse": warehouse_resource(r.spec_path), "notifier": NotifierResource(kind="webhook", url=url)}


def _defs(r, url: str) -> dg.Definitions:
    return dg.Definitions(
        assets=[convergence],
        jobs=[verify_convergence_job],
        sensors=[asset_check_alert_sensor],
        resources=_resources(r, url),
    )


def test_late_events_ingested_after_publish_converge(tmp_path, receiver):
    r = build_repaired(tmp_path / "orders")
    first = verify_convergence(r.engine, r.spec)
    assert first.converged and first.repaired_partitions and first.recent_partitions
    at = now() + timedelta(seconds=1)
    _late_events(r, at)
    pending = verify_convergence(r.engine, r.spec)
    assert pending.converged and pending.pending_changes == 3  # not ingested yet: pending, not drift
    r.writer.register_generation("ingest-2", "ingest")
    apply_changes(r.writer, "ingest-2", until=at + timedelta(seconds=1))
    after = verify_convergence(r.engine, r.spec)
    assert after.converged and after.pending_changes == 0
    late_shards = {
        x[0]
        for x in r.fetch(
            "SELECT DISTINCT region || '-' || strftime(placed_at, '%Y%m') FROM src.order_events WHERE loaded_at = ?",
            [at],
        )
    }
    assert late_shards <= set(after.recent_partitions)  # ingestion wrote them last
    assert late_shards & set(after.repaired_partitions)  # old partitions the repair rebuilt
    with r.engine.session(read_only=True) as s:
        history = drift_history(s, r.spec)
    assert {h[0] for h in history} == {first.check_id, pending.check_id, after.check_id}
    with dg.instance_for_test() as instance:
        result = _defs(r, receiver.url).resolve_job_def(VERIFY_JOB).execute_in_process(instance=instance)
    assert result.success
    assert {c.check_name: c.passed for c in result.get_asset_check_evaluations()} == {
        RECENT_CHECK: True,
        REPAIRED_CHECK: True,
        LAG_CHECK: True,
    }


def test_a_late_event_not_applied_fails_verification_and_alerts_once_with_a_link_to_the_run(
    tmp_path, receiver, monkeypatch
):
    monkeypatch.delenv("RECOVERY_UI_URL", raising=False)
    r = build_repaired(tmp_path / "orders")
    watermark = present(ingestion_watermark(r.writer))
    region, order_no, shard = r.fetch("SELECT region, order_no, shard FROM mart.orders ORDER BY placed_at LIMIT 1")[0]
    late_at = watermark - timedelta(seconds=5)  # landed behind the watermark: ingestion's window never sees it
    with r.engine.transaction() as s:
        s.execute(
            "INSERT INTO src.order_events SELECT region, order_no, max(rev) + 1, 'put', ?, arg_max(placed_at, rev), "
            "77, "
            "arg_max(sku, rev) FROM src.order_events WHERE region = ? AND order_no = ? GROUP BY ALL",
            [late_at, region, order_no],
        )
    defs = _defs(r, receiver.url)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(VERIFY_JOB).execute_in_process(instance=instance)
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert checks[REPAIRED_CHECK].passed is False and checks[REPAIRED_CHECK].severity == dg.AssetCheckSeverity.ERROR
        assert shard in present(checks[REPAIRED_CHECK].description)
        for _ in range(2):  # two ticks see the same failed evaluation: one alert
            with dg.build_sensor_context(
                instance=instance, definitions=defs, resources=_resources(r, receiver.url)
            ) as context:
                tick = asset_check_alert_sensor(context)
        assert isinstance(tick, dg.SensorResult) and tick.cursor is not None
        with dg.build_sensor_context(
            instance=instance, definitions=defs, resources=_resources(r, receiver.url)
        ) as context:  # no cursor: the control plane remembers
            asset_check_alert_sensor(context)
    alerts = [a for a in receiver.received if REPAIRED_CHECK in a["subject"]]
    assert len(alerts) == 1, receiver.received
    assert alerts[0]["severity"] == "critical" and alerts[0]["owner"] == "data-platform-oncall"
    assert f"http://127.0.0.1:3000/runs/{result.run_id}" in alerts[0]["body"]
    drifted = verify_convergence(r.engine, r.spec).drifted()
    assert [(p.partition, p.changed, p.sample_keys) for p in drifted] == [(shard, 1, [f"{region}|{order_no}"])]
    assert drifted[0].drifting_since is not None
    # ingestion replays the missed window: the partition converges, and its history shows the drift clearing
    r.writer.register_generation("ingest-fix", "ingest")
    apply_changes(r.writer, "ingest-fix", since=late_at - timedelta(microseconds=1), until=watermark)
    assert verify_convergence(r.engine, r.spec).converged
    with r.engine.session(read_only=True) as s:
        history = [h[3] for h in sorted(drift_history(s, r.spec, partition=shard))]
    assert history[-3:] == [1, 1, 0]


def test_the_hourly_schedule_is_registered_and_evaluates_to_a_valid_run_request():
    from recovery.definitions import defs

    d = defs()
    schedule = d.resolve_schedule_def("verify_convergence_hourly")
    assert schedule.job_name == VERIFY_JOB and schedule.cron_schedule == "0 * * * *"
    assert d.resolve_sensor_def("asset_check_alert_sensor").name == "asset_check_alert_sensor"
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 3, 2, 5, tzinfo=UTC)
        )
        requests = schedule.evaluate_tick(context).run_requests or []
    assert len(requests) == 1
    dg.validate_run_config(d.resolve_job_def(VERIFY_JOB), requests[0].run_config)
    dg.validate_run_config(d.resolve_job_def(VERIFY_JOB), VERIFY.run_config("incident.yaml", recent_partitions=5))


def test_verify_cli_exits_1_while_a_partition_drifts_and_0_once_converged(tmp_path, monkeypatch, capsys):
    from recovery.cli import main

    r = build_repaired(tmp_path / "orders")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(r.spec_path))
    with r.engine.transaction() as s:  # a tombstone the ingestion never applied
        s.execute(
            "INSERT INTO src.order_events SELECT region, order_no, max(rev) + 1, 'drop', ?, arg_max(placed_at, rev), "
            "0, "
            "arg_max(sku, rev) FROM src.order_events WHERE (region, order_no) = (SELECT (region, order_no) "
            "FROM mart.orders "
            "ORDER BY ALL LIMIT 1) GROUP BY ALL",
            [present(ingestion_watermark(r.writer)) - timedelta(seconds=1)],
        )
    assert main(["verify", "--incident", str(r.incident_path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and REPAIRED_CHECK in out
    r.writer.register_generation("ingest-fix", "ingest")
    apply_changes(
        r.writer,
        "ingest-fix",
        since=present(ingestion_watermark(r.writer)) - timedelta(seconds=2),
        until=present(ingestion_watermark(r.writer)),
    )
    assert main(["verify", "--incident", str(r.incident_path)]) == 0
    assert main(["verify", "--incident", str(r.incident_path), "--recent", "0"]) == 2
    assert "--recent: 0 is not a positive number" in capsys.readouterr().out


def test_bad_input_is_a_clear_error(tmp_path):
    r = build_repaired(tmp_path / "orders")
    with pytest.raises(SpecError, match="recent_partitions: 0 is not a positive whole number"):
        verify_convergence(r.engine, r.spec, recent=0)


def test_a_check_where_no_generation_recorded_a_watermark_names_the_source_time_it_compared_with(tmp_path):
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.write.writer import Writer
    from recovery_tests.support.small_dataset import build_small_dataset

    spec = load_spec(build_small_dataset(tmp_path / "orders", n_orders=40))
    writer = Writer(open_engine(spec.warehouse), spec)
    writer.ensure()
    writer.register_generation("ingest-1", "ingest")
    apply_changes(writer, "ingest-1", until=now())
    with writer.engine.transaction() as s:  # as a foreign loader leaves it: nothing says how far it read
        s.execute("UPDATE _recovery.generations SET source_watermark = NULL")
        s.execute("DELETE FROM _recovery.source_watermarks")
    result = verify_convergence(writer.engine, spec)
    with writer.engine.session(read_only=True) as s:
        latest = s.scalar("SELECT max(loaded_at) FROM src.order_events")
    assert result.watermark == latest and result.converged
    assert "None" not in result.summary()
    assert (
        f"watermark {latest:%Y-%m-%d %H:%M:%S} (the source's latest change: no write or registry recorded how far "
        f"ingestion applied it)" in result.summary()
    )
