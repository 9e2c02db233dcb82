"""The daemons we start and wait on iterate every few seconds, not Dagster's 30: a backfill is
marked finished on the backfill daemon's next iteration after its last run, so the worked
example's build (``make run``) and the tests' daemon backfills would otherwise wait up to 30 s for nothing."""

from __future__ import annotations

import sys

import pytest
from dagster._daemon import cli as dagster_cli
from dagster._daemon import controller

from recovery import dagster_daemon


def _started_with(monkeypatch: pytest.MonkeyPatch, value: str | None) -> tuple[float, list[str]]:
    seen: dict = {}

    def fake_main() -> None:
        seen["interval"] = controller.DEFAULT_DAEMON_INTERVAL_SECONDS
        seen["argv"] = list(sys.argv)

    monkeypatch.setattr(dagster_cli, "main", fake_main)
    monkeypatch.setattr(controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", controller.DEFAULT_DAEMON_INTERVAL_SECONDS)
    monkeypatch.setattr(sys, "argv", ["recovery.dagster_daemon", "run", "-w", "workspace.yaml"])
    if value is None:
        monkeypatch.delenv(dagster_daemon.INTERVAL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(dagster_daemon.INTERVAL_VARIABLE, value)
    dagster_daemon.main()
    return seen["interval"], seen["argv"]


def test_the_daemon_we_start_is_dagsters_own_command_with_a_short_loop(monkeypatch):
    interval, argv = _started_with(monkeypatch, None)
    assert interval == dagster_daemon.DEFAULT_INTERVAL_S < 30
    assert argv == ["dagster-daemon", "run", "-w", "workspace.yaml"]
    assert _started_with(monkeypatch, "0.5")[0] == 0.5


@pytest.mark.parametrize("value", ["soon", "0", "-2"])
def test_a_bad_interval_is_one_line_naming_the_variable(monkeypatch, value):
    with pytest.raises(SystemExit) as stopped:
        _started_with(monkeypatch, value)
    said = str(stopped.value)
    assert said.startswith(f"{dagster_daemon.INTERVAL_VARIABLE}={value!r}") and "unset it" in said and "\n" not in said


def test_the_backfill_loop_reads_the_interval_we_set():
    """Dagster's backfill loop imports the constant inside the function, at each call: if a release
    moves it to module level, the patch stops working and this says so."""
    import inspect

    from dagster._daemon import backfill

    source = inspect.getsource(backfill.execute_backfill_iteration_loop)
    assert "from dagster._daemon.controller import DEFAULT_DAEMON_INTERVAL_SECONDS" in source
