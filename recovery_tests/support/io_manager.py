"""A team's assets writing a managed dataset through ``ManagedDuckDBIOManager``: their resources, and a
failed run's message."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from recovery.io import ManagedDuckDBIOManager
from recovery_tests.support.rows import present


def resources(spec_path: Path, db: Path) -> dict:
    return {"io_manager": ManagedDuckDBIOManager(database=str(db), specs=[str(spec_path)])}


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    return " ".join(
        present(e.step_failure_data.error).message + str(e.step_failure_data.user_failure_data)
        for e in result.all_events
        if e.is_step_failure
    )
