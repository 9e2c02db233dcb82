"""The code locations: they load the way Dagster loads them; the worked example's shapes are its own location's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml

from recovery.config import LOCATION_NAME, PROJECT_ROOT, spec_path
from recovery.definitions import defs
from recovery.example.defs import TARGET_KEY
from recovery.example.location import defs as example_location
from recovery.example.scenario import SCENARIO
from recovery.lib.dataset_spec.models import parse_spec

CONSUMERS = [c.name for c in parse_spec(spec_path()).downstream]


@pytest.fixture(scope="module")
def definitions() -> dg.Definitions:
    return defs()


@pytest.fixture(scope="module")
def example() -> dg.Definitions:
    return example_location()


@pytest.fixture(scope="module")
def test_instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_spec_names_the_five_consumers():
    assert sorted(CONSUMERS) == sorted(
        ["daily_revenue", "customer_statements", "risk_features", "experiment_metrics", "regulatory_extract"]
    )


def test_the_location_name_is_spelled_the_same_in_workspace_yaml_and_pyproject():
    """Launchpad links name the location as ``LOCATION_NAME``; the files Dagster and ``dg`` read say the same."""
    workspace = yaml.safe_load((PROJECT_ROOT / "workspace.yaml").read_text())
    names = [entry["python_module"]["location_name"] for entry in workspace["load_from"]]
    modules = [entry["python_module"]["module_name"] for entry in workspace["load_from"]]
    assert names[modules.index("recovery.definitions")] == LOCATION_NAME
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["dagster"]["code_location_name"] == LOCATION_NAME
    assert pyproject["tool"]["dg"]["project"]["code_location_name"] == LOCATION_NAME


def test_code_location_loads_through_workspace_yaml(tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    environ = {**os.environ, "DAGSTER_HOME": str(home)}
    environ.pop("RECOVERY_SPEC", None)
    exe = Path(sys.executable).with_name("dagster")
    proc = subprocess.run(
        [str(exe), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for location in (LOCATION_NAME, "worked_example"):
        assert f"Validation successful for code location {location}" in out, out


def test_dagster_commands_work_from_a_fresh_clone_with_no_variable_set(tmp_path: Path):
    """`dagster definitions validate -w workspace.yaml` from the repo root, no DAGSTER_HOME: the
    tracked files only (no .dagster_home, no warehouse), and one line saying which variable to set."""
    clone = tmp_path / "clone"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        src = PROJECT_ROOT / name
        if src.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / name)
    assert not (clone / ".dagster_home").exists()
    environ = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "RECOVERY_SPEC")}
    environ["PYTHONPATH"] = str(clone)  # this clone's package, not the one the venv was installed from
    exe = Path(sys.executable).with_name("dagster")
    proc = subprocess.run(
        [str(exe), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=clone,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"Validation successful for code location {LOCATION_NAME}" in out, out
    hints = [line for line in out.splitlines() if "DAGSTER_HOME is not set" in line]
    assert len(hints) == 1 and f"export DAGSTER_HOME={clone / '.dagster_home'}" in hints[0], out
    assert "Traceback" not in out, out
    assert not list(clone.glob(".tmp_dagster_home_*"))  # Dagster's temporary instance is gone

    # and the dg CLI's habit, from the same clone with the same (unset) variables
    dg_exe = Path(sys.executable).with_name("dg")
    proc = subprocess.run(
        [str(dg_exe), "check", "defs"],
        cwd=clone,
        env={**environ, "VIRTUAL_ENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "All definitions loaded successfully" in out and "Traceback" not in out, out


def test_definitions_are_loadable(definitions: dg.Definitions, example: dg.Definitions):
    dg.Definitions.validate_loadable(definitions)
    dg.Definitions.validate_loadable(example)


def test_a_launcher_builds_what_the_ui_serves_without_the_plugin_catalog(definitions: dg.Definitions):
    """The CLI's runs are launched from definitions built without the installed plugins' component
    catalog (metadata only ``dg`` and the UI's component list read); everything else, every job,
    asset, check, sensor and schedule as the UI's snapshot of the code location holds it, is the same."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value
    from dagster.components.core.component_tree import PLUGIN_COMPONENT_TYPES_JSON_METADATA_KEY
    from dagster_shared.record import replace

    from recovery.definitions import definitions_for

    launched = definitions_for(spec_path(), plugin_catalog=False)
    served = RepositorySnap.from_def(definitions.get_repository_def())
    built = RepositorySnap.from_def(launched.get_repository_def())
    assert PLUGIN_COMPONENT_TYPES_JSON_METADATA_KEY in (served.metadata or {})
    assert not built.metadata
    assert serialize_value(replace(served, metadata={})) == serialize_value(replace(built, metadata={}))
    assert PLUGIN_COMPONENT_TYPES_JSON_METADATA_KEY in (defs().metadata or {})  # the switch is off again


def test_jobs_schedule_and_assets(definitions: dg.Definitions, example: dg.Definitions):
    # the worked example's pipeline is its own location's, with its own executor
    assert {j.name for j in example.resolve_all_job_defs()} - {"__ASSET_JOB"} == {"ingest_transactions"}
    schedule = example.resolve_schedule_def("ingest_transactions_daily")
    assert schedule.job_name == "ingest_transactions"
    assert example.resolve_job_def("ingest_transactions").executor_def is dg.in_process_executor
    assert example.resolve_asset_graph().get_all_asset_keys() == {TARGET_KEY}
    # ...and none of it is the package's location's, whose executor is Dagster's default
    jobs = {j.name for j in definitions.resolve_all_job_defs()}
    assert "refresh_consumers" in jobs and "ingest_transactions" not in jobs
    assert not [s for s in definitions.schedules or [] if s.name == "ingest_transactions_daily"]
    # the location's default executor is Dagster's (a team's own assets merged in keep it); each of the
    # package's jobs declares the in-process one itself (its steps share the warehouse file)
    assert definitions.executor is None
    for job in definitions.resolve_all_job_defs():
        if not job.name.startswith("__"):
            assert job.executor_def is dg.in_process_executor, job.name

    graph = definitions.resolve_asset_graph()
    keys = graph.get_all_asset_keys()
    consumer_keys = {dg.AssetKey(["consumers", name]) for name in CONSUMERS}
    assert consumer_keys <= keys
    assert {k for k in keys if k.path[0] == "consumers"} == consumer_keys
    # the served dataset's target is the consumers' upstream key here, materialized by the example's location
    assert TARGET_KEY in keys and not graph.get(TARGET_KEY).is_materializable
    assert consumer_keys <= set(graph.get(TARGET_KEY).child_keys)

    target = example.resolve_asset_graph().get(TARGET_KEY)
    assert target.partitions_def is not None
    assert target.partitions_def.get_first_partition_key() == SCENARIO.first_day.isoformat()
    assert target.partitions_def.get_last_partition_key() == SCENARIO.last_day.isoformat()
    assert target.code_version == "2.3.0"
    for key in consumer_keys:
        assert TARGET_KEY in graph.get(key).parent_keys, key

    # refreshing the consumers materializes exactly the consumer assets, never the target
    refresh = definitions.resolve_job_def("refresh_consumers")
    selected = {k for k in refresh.asset_layer.selected_asset_keys}
    assert selected == consumer_keys


def test_target_asset_retries_once_and_backfills_in_bounded_runs(example: dg.Definitions):
    asset = example.resolve_assets_def(TARGET_KEY)
    policy = asset.backfill_policy
    assert policy is not None and policy.max_partitions_per_run == SCENARIO.max_partitions_per_run
    assert isinstance(asset.node_def, dg.OpDefinition)
    retry = asset.node_def.retry_policy
    assert retry is not None and retry.max_retries == 1


def test_every_job_needs_only_resources_the_location_provides(definitions: dg.Definitions, example: dg.Definitions):
    assert "warehouse" in example.resolve_job_def("ingest_transactions").resource_defs
    assert "warehouse" in definitions.resolve_job_def("refresh_consumers").resource_defs


@pytest.mark.parametrize("day", ["2024-01-01", "2024-03-20", SCENARIO.last_day.isoformat()])
def test_schedule_requests_the_previous_days_partition(example: dg.Definitions, test_instance, day: str):
    schedule = example.resolve_schedule_def("ingest_transactions_daily")
    tick = datetime.fromisoformat(day).replace(tzinfo=UTC) + timedelta(days=1)
    context = dg.build_schedule_context(instance=test_instance, scheduled_execution_time=tick)
    result = schedule.evaluate_tick(context)
    requests = result.run_requests or []
    assert len(requests) == 1, result
    assert requests[0].partition_key == day


def test_the_repair_is_launchable_and_its_gates_are_blocking_checks(definitions: dg.Definitions):
    jobs = {j.name for j in definitions.resolve_all_job_defs()}
    assert {"plan_repair", "repair_canary", "repair_waves", "publish_repair", "rollback_incident"} <= jobs
    graph = definitions.resolve_asset_graph()
    generation = graph.get(dg.AssetKey(["repair", "generation"]))
    assert isinstance(generation.partitions_def, dg.DynamicPartitionsDefinition)
    assert generation.partitions_def.name == "repair_partitions"
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    spec_suites = [s.name for s in parse_spec(spec_path()).suites]
    assert spec_suites == ["transaction_values"]
    for asset in ("repair/generation", "repair/candidate"):
        for gate in (
            "repair_keys",
            "repair_partitioning",
            "repair_fencing",
            "repair_tombstones",
            "repair_partition_totals",
            "repair_reconciliation",
            *spec_suites,
        ):
            assert (asset, gate) in checks
    blocking = [graph.get_check_spec(k).blocking for k in graph.asset_check_keys if k.asset_key.path[0] == "repair"]
    assert blocking and all(blocking)
