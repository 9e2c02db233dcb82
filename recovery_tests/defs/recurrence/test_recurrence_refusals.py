"""Refusals read as decisions: ``backfill plan`` exits 1 exactly when ``run`` refuses and names
the columns that would change (table, metadata, HTML preview with a plot); ``run`` prints one
line per refusing gate with no stack trace; in Dagster the failed blocking check's
description, the run's failure message and the alert carry that same sentence."""

from __future__ import annotations

import hashlib
from pathlib import Path

import dagster as dg
import pytest

from recovery.defs.alerts.check_alerts import failed_checks
from recovery.lib.recurrence.gates.value_preview import headline
from recovery_tests.support.example_build import env
from recovery_tests.support.recurrence import orders_dataset
from recovery_tests.support.rows import present

UNIT_CHANGE = "recovery_tests.support.faulty_recomputes:unit_change"
SWAPPED = "recovery_tests.support.faulty_recomputes:swapped_columns"


@pytest.fixture
def orders(tmp_path: Path):
    return orders_dataset(tmp_path)


def _file_hash(ds) -> str:
    return hashlib.sha256(Path(ds.spec.warehouse.path).read_bytes()).hexdigest()


def _cli(ds, tmp_path: Path, capfd, action: str, *extra: str) -> tuple[int, str, str]:
    from recovery.cli import main

    with env(DAGSTER_HOME=str(tmp_path / "dagster-home"), RECOVERY_SPEC=str(ds.spec_path)):
        code = main(
            [
                "backfill",
                action,
                "--spec",
                str(ds.spec_path),
                "--start",
                ds.start,
                "--end",
                ds.end,
                "--approved-by",
                "head-of-data",
                "--requested-by",
                "oncall",
                *extra,
            ]
        )
    out, err = capfd.readouterr()
    return code, out, err


def test_plan_exits_1_exactly_when_run_refuses_and_names_the_changed_columns(orders, tmp_path, capfd):
    before = _file_hash(orders)
    code, out, _ = _cli(orders, tmp_path, capfd, "plan", "--recompute", SWAPPED)
    assert code == 1, out
    assert _file_hash(orders) == before  # rehearsed on a copy: nothing written
    changed_row = next(line for line in out.splitlines() if "columns that would change" in line)
    assert "qty, price" in changed_row and "sku" not in changed_row
    refusals = [line for line in out.splitlines() if line.startswith("gate ")]
    assert refusals and refusals[0].startswith("gate values refused: changed_share of qty")
    assert "(allowed 20%, not declared)" in refusals[0] and "preview: " in refusals[0]
    preview = Path(out.split("preview: ")[1].split()[0])
    page = preview.read_text()
    assert "<svg" in page and "would refuse: values" in page and ">qty: before → after<" in page

    code_run, out_run, err_run = _cli(orders, tmp_path, capfd, "run", "--recompute", SWAPPED)
    assert code_run == code == 1
    run_lines = [line for line in out_run.splitlines() if line.startswith("gate ")]
    assert [line.split()[1] for line in run_lines] == ["values", "profile"]  # one line per refusing gate
    assert [line.split(": preview")[0].split("; preview")[0] for line in run_lines] == [
        line.split("; preview")[0] for line in refusals
    ]  # the same decision, the same words
    assert "Traceback" not in out_run + err_run and "DagsterAssetCheckFailedError" not in out_run + err_run
    assert "mart.orders unchanged; the candidate is kept in" in out_run

    assert _cli(orders, tmp_path, capfd, "plan")[0] == 0  # the correct recompute: plan 0, run 0
    assert _cli(orders, tmp_path, capfd, "run")[0] == 0


def test_declared_change_is_a_flag_and_a_wrong_column_is_bad_input(orders, tmp_path, capfd):
    code, out, _ = _cli(orders, tmp_path, capfd, "plan", "--recompute", UNIT_CHANGE, "--expect-change", "price")
    assert code == 0, out  # declared: the unit change of price is intended
    assert "would publish" in out
    code, out, _ = _cli(orders, tmp_path, capfd, "plan", "--expect-change", "prize")
    assert code == 2 and "expect_change" in out and "prize" in out


def test_refusal_is_the_check_description_the_run_failure_and_the_alert(orders, tmp_path, monkeypatch):
    monkeypatch.setenv("RECOVERY_SPEC", str(orders.spec_path))
    from recovery.definitions import defs

    d = defs()
    cfg = {
        "start": orders.start,
        "end": orders.end,
        "recompute": UNIT_CHANGE,
        "requested_by": "oncall",
        "approved_by": ["head-of-data"],
    }
    with dg.instance_for_test() as instance:
        result = d.resolve_job_def("guarded_backfill").execute_in_process(
            instance=instance, raise_on_error=False, run_config={"ops": {"recurrence__backfill": {"config": cfg}}}
        )
        assert not result.success
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        values = checks["values"]
        description = present(values.description)
        assert not values.passed and description.startswith("gate values refused: changed_share of price")
        changed = values.metadata["changed_columns"].value
        assert isinstance(changed, (list, str)) and "price" in changed
        assert str(values.metadata["preview"].value).endswith("-run.html")
        profile = checks["profile"]  # the GE suite's expectations, one by one
        assert not profile.passed and profile.metadata["failing_columns"].value == "price"
        table = profile.metadata["expectations"].value
        assert isinstance(table, str)
        assert "| expect_column_mean_to_be_between(price) | **failed** |" in table
        assert "| expect_column_mean_to_be_between(qty) | passed |" in table
        failure = next(e for e in result.all_events if e.is_step_failure)
        message = present(failure.step_failure_data.error).message
        assert description in message and "DagsterAssetCheckFailedError" not in message
        alerts = [f for f in failed_checks(instance, d.resolve_asset_graph()) if f.key.name == "values"]
        _, body, _ = alerts[0].alert("http://ui")
        assert description in body and f"http://ui/runs/{result.run_id}" in body


def test_headline_stops_at_the_first_top_level_clause():
    assert headline("a (x; y) b; c. Fix: z") == "a (x; y) b"
    assert headline("one. Fix: two") == "one"
