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
