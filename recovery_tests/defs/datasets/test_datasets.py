"""Two datasets of different shapes in one code location: one under incident, the other ingesting.

What the UI shows of the two, served by one dagster-webserver, is browser-tested in
``test_browser.py`` (``test_one_code_location_shows_both_datasets_and_a_refused_gates_reason``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from recovery.config import LOCATION_NAME, PROJECT_ROOT, spec_paths
from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.resources import warehouse_resource
from recovery.example.defs import TARGET_KEY
from recovery.lib.catalog_checks import load_spec
from recovery.lib.control.plane import SCHEMA
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import parse_incident
from recovery.lib.write.fencing import fence_incident
from recovery.lib.write.writer import Writer
from recovery.orchestration import run_job
from recovery_tests.support.small_dataset import build_small_dataset, latest_live, order_events


@pytest.fixture
def two_datasets(example_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The worked example (served, RECOVERY_SPEC) and the small orders dataset (composite key, string
    partitions) in a directory named by RECOVERY_SPECS."""
    orders = build_small_dataset(tmp_path / "datasets" / "orders", n_orders=120)
    monkeypatch.setenv("RECOVERY_SPEC", str(example_copy))
    monkeypatch.setenv("RECOVERY_SPECS", str(tmp_path / "datasets"))
    monkeypatch.delenv("RECOVERY_ALERT_WEBHOOK", raising=False)
    from recovery.definitions import defs

    return example_copy, orders, defs()


def test_spec_paths_take_a_directory_or_a_list_and_default_to_the_one_spec(tmp_path, monkeypatch):
    a = build_small_dataset(tmp_path / "specs" / "a", n_orders=10)
    served = tmp_path / "served.yaml"
    monkeypatch.setenv("RECOVERY_SPEC", str(served))
    monkeypatch.delenv("RECOVERY_SPECS", raising=False)
    assert spec_paths() == [served.resolve()]
    monkeypatch.setenv("RECOVERY_SPECS", str(tmp_path / "specs"))
    assert spec_paths() == [served.resolve(), a.resolve()]
    monkeypatch.setenv("RECOVERY_SPECS", os.pathsep.join([str(a), str(served), str(a)]))
    assert spec_paths() == [served.resolve(), a.resolve()]


def test_each_dataset_sits_under_its_own_prefix_and_group_and_the_served_one_keeps_its_names(two_datasets):
    _, _, defs = two_datasets
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    orders_keys = {k for k in graph.get_all_asset_keys() if k.path[0] == "orders"}
    assert orders_keys == {
        dg.AssetKey(["orders", "mart", "orders"]),
        dg.AssetKey(["orders", "consumers", "orders_by_shard"]),
    }
    assert {graph.get(k).group_name for k in orders_keys} == {"orders"}
    assert (
        dg.AssetKey(["orders", "mart", "orders"])
        in graph.get(dg.AssetKey(["orders", "consumers", "orders_by_shard"])).parent_keys
    )
    # the served dataset keeps the unprefixed names
    assert TARGET_KEY in graph.get_all_asset_keys()
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"ingest__orders", "contain_backfill", "contain_backfill__orders"} <= jobs
    assert "ingest_transactions" not in jobs  # the worked example's pipeline is its own code location
    assert defs.resolve_schedule_def("ingest__orders_hourly").job_name == "ingest__orders"
    sensors = {s.name for s in defs.sensors}
    assert {
        "fencing_sensor",
        "fencing_sensor__orders",
        "backfill_incident_sensor",
        "backfill_incident_sensor__orders",
    } <= sensors


def test_one_dataset_under_incident_while_the_other_keeps_ingesting(two_datasets, tmp_path):
    example, orders_path, defs = two_datasets
    transactions, orders = load_spec(example), load_spec(orders_path)
    fence_incident(
        Writer(open_engine(transactions.warehouse), transactions), parse_incident(example.with_name("incident.yaml"))
    )

    with dg.instance_for_test() as instance:
        first = run_job(defs, "ingest__orders", instance)
        with open_engine(orders.warehouse).session(read_only=True) as s:
            rows = s.fetchall("SELECT region, order_no, qty, src_rev FROM mart.orders ORDER BY 1, 2")
            gens = s.fetchall(f"SELECT generation, kind, fenced_at FROM {SCHEMA}.generations")
        expected = sorted((e.region, e.order_no, e.qty, e.rev) for e in latest_live(order_events(120, 7)).values())
        assert rows == expected
        assert [(g[1], g[2]) for g in gens] == [("ingest", None)]
        assert first.success

        # each dataset's fencing sensor watches its own warehouse: the fence is the transactions'
        def tick(sensor_name: str, resource: str, spec_path: Path) -> str:
            with dg.build_sensor_context(
                instance=instance,
                resources={
                    resource: warehouse_resource(str(spec_path)),
                    "notifier": NotifierResource(kind="file", path=str(tmp_path / "alerts.jsonl")),
                },
            ) as context:
                return defs.resolve_sensor_def(sensor_name).evaluate_tick(context).skip_message

        assert tick("fencing_sensor__orders", "warehouse__orders", orders_path) == "no fenced generation"
        assert tick("fencing_sensor", "warehouse", example).startswith("1 fenced generation(s)")

        # the orders' ingestion goes on: a second run is a no-op write of the same rows, not refused
        second = run_job(defs, "ingest__orders", instance)
        assert second.success
        with open_engine(orders.warehouse).session(read_only=True) as s:
            assert s.fetchall("SELECT region, order_no, qty, src_rev FROM mart.orders ORDER BY 1, 2") == expected
            assert s.scalar(f"SELECT count(*) FROM {SCHEMA}.fence_attempts") == 0


def test_the_orders_containment_job_fences_only_the_orders_backfill(two_datasets, tmp_path):
    """``contain_backfill__orders`` takes an orders incident and fences it in the orders' warehouse; an
    incident of the served dataset is refused by it, naming the spec."""
    import yaml

    from recovery.lib.errors import RecoveryError
    from recovery.lib.incident.phases import CONTAIN
    from recovery.lib.snapshot import expected_rows_sql

    example, orders_path, defs = two_datasets
    orders = load_spec(orders_path)
    writer = Writer(open_engine(orders.warehouse), orders, actor="test")
    writer.ensure()
    writer.register_generation("bf-orders", "backfill")
    writer.write(
        "bf-orders",
        f"SELECT * REPLACE (qty * 9 AS qty) FROM ({expected_rows_sql(orders, None)})",
        mode="replace_partitions",
    )
    incident = orders_path.with_name("incident.yaml")
    incident.write_text(
        yaml.safe_dump(
            {
                "incident_id": "INC-orders-1",
                "spec": "spec.yaml",
                "failed_generations": ["bf-orders"],
                "requested_by": "oncall",
            }
        )
    )
    with dg.instance_for_test() as instance:
        assert run_job(defs, "contain_backfill__orders", instance, run_config=CONTAIN.run_config(str(incident))).success
        with pytest.raises(RecoveryError, match="spec"):
            run_job(
                defs,
                "contain_backfill__orders",
                instance,
                run_config=CONTAIN.run_config(str(example.with_name("incident.yaml"))),
            )
    assert writer.is_fenced("bf-orders")
    transactions = load_spec(example)
    with open_engine(transactions.warehouse).session(read_only=True) as s:
        assert s.scalar(f"SELECT count(*) FROM {SCHEMA}.fences") == 0  # the served dataset is not touched


def test_a_location_serving_a_teams_dataset_lists_none_of_the_worked_examples_definitions(tmp_path: Path):
    """A team's workspace loads the package's location alone, pointed at its spec (RECOVERY_SPEC):
    Dagster validates it, and as Dagster loads it (a code location from the module) it lists the
    team's consumers and the recovery jobs, none of the example's assets, jobs or schedules, and
    its executor is Dagster's default, not the example's in-process one."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    orders = build_small_dataset(tmp_path / "orders", n_orders=20)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: recovery.definitions\n"
        f"      working_directory: {PROJECT_ROOT}\n      location_name: {LOCATION_NAME}\n"
    )
    environ = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_SPEC": str(orders)}
    environ.pop("RECOVERY_SPECS", None)
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate", "-w", str(workspace)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"Validation successful for code location {LOCATION_NAME}" in out, out
    assert "worked_example" not in out, out

    example_jobs = {"ingest_transactions"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECOVERY_SPEC", str(orders))
        mp.delenv("RECOVERY_SPECS", raising=False)
        origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name="recovery.definitions"), location_name=LOCATION_NAME
        )
        with dg.instance_for_test() as instance, origin.create_location(instance) as location:
            (repo,) = location.get_repositories().values()
            keys = {n.asset_key for n in repo.get_asset_node_snaps()}
            jobs = {j.name for j in repo.get_all_jobs()}
            schedules = {s.name for s in repo.get_schedules()}
        from recovery.definitions import defs

        served = defs()
    assert dg.AssetKey(["consumers", "orders_by_shard"]) in keys and dg.AssetKey(["mart", "orders"]) in keys
    assert TARGET_KEY not in keys and not [k for k in keys if k.path[0] == "analytics"], keys
    assert not jobs & example_jobs and {"contain_backfill", "refresh_consumers", "publish_repair"} <= jobs, jobs
    assert "ingest_transactions_daily" not in schedules, schedules
    assert served.executor is None  # Dagster's default, not the example's in-process executor
    refresh = served.resolve_job_def("refresh_consumers")
    assert refresh.asset_layer.selected_asset_keys == {dg.AssetKey(["consumers", "orders_by_shard"])}
