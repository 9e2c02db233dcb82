"""A command's start-up runs with the cyclic collector paused while it imports and builds its
definitions, freezes what that leaves alive for the rest of the command, and gives it all back
to the collector when the command ends, whatever its exit."""

from __future__ import annotations

import gc
from pathlib import Path

from rich.console import Console

from recovery.cli import main
from recovery.startup import command_scope, settling


def test_settling_pauses_the_collector_and_freezes_only_inside_a_command():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with settling():
        assert not gc.isenabled()
        with settling():  # nested: the outer block decides when the collector resumes
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == frozen  # outside a command: nothing frozen

    with command_scope():
        with settling():
            kept = [object() for _ in range(10)]
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        assert kept
    assert gc.get_freeze_count() == 0  # the command's end gives every object back to the collector


def test_a_paused_collector_resumes_when_the_block_raises():
    try:
        with command_scope(), settling():
            raise ValueError("bad input")
    except ValueError:
        pass
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_cli_leaves_nothing_frozen_after_a_refused_command(tmp_path: Path):
    code = main(["reconcile", "--incident", str(tmp_path / "missing.yaml")], console=Console(width=150))
    assert code == 2
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _console_script() -> str:
    import sys

    return str(Path(sys.executable).with_name("recovery"))


def test_the_console_script_ends_with_the_commands_exit_status_and_its_whole_output(tmp_path: Path):
    """The ``recovery`` script skips the interpreter's teardown: what the user sees must not change."""
    import subprocess

    refused = subprocess.run(
        [_console_script(), "reconcile", "--incident", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert "missing.yaml" in refused.stdout and refused.stdout.endswith("\n")


def test_the_console_script_leaves_dagsters_files_checkpointed_and_its_run_recorded(tmp_path: Path):
    import os
    import shutil
    import sqlite3
    import subprocess

    import yaml

    from recovery.config import PROJECT_ROOT
    from recovery_tests.support.input_fuzz import build_fuzz_dataset, valid_incident

    d = build_fuzz_dataset(tmp_path / "contain")
    (d / "incident.yaml").write_text(yaml.safe_dump(valid_incident()))
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    done = subprocess.run(
        [_console_script(), "contain", "--incident", str(d / "incident.yaml")],
        capture_output=True,
        text=True,
        env={**os.environ, "DAGSTER_HOME": str(home)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "contained by run" in done.stdout
    leftover = [p for p in home.rglob("*.db-wal") if p.stat().st_size > 0]
    assert not leftover, f"write-ahead logs left uncheckpointed: {leftover}"
    with sqlite3.connect(home / "history" / "runs.db") as con:
        statuses = [s for (s,) in con.execute("SELECT status FROM runs")]
    assert statuses == ["SUCCESS"]
