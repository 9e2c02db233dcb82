"""Shared fixtures: the worked example's failed backfill, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery_tests.support.example_build import BuiltExample, build_example, copy_dataset

DEMO_EVENTS = 200_000


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory shared by every xdist worker of this session (``RECOVERY_TEST_SHARED`` names a
    lasting one, to reuse a built example across sessions while developing)."""
    lasting = os.environ.get("RECOVERY_TEST_SHARED")
    if lasting:
        Path(lasting).mkdir(parents=True, exist_ok=True)
        return Path(lasting)
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base
    path = shared / "shared"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def _tracebacks_restored():
    """A step's refusal run in this process (``execute_in_process``) hides its own stack trace by setting
    ``sys.tracebacklimit``; no test inherits that from the one before."""
    yield
    from recovery.refusal import restore_tracebacks

    restore_tracebacks()


@pytest.fixture(scope="session")
def failed_example(shared_dir: Path) -> BuiltExample:
    """The worked example after its faulty backfill (200k events). Read-only: copy to change it."""
    return build_example(shared_dir, events=DEMO_EVENTS)


@pytest.fixture
def example_copy(failed_example: BuiltExample, tmp_path: Path) -> Path:
    """A private copy of the failed example's dataset folder; returns its spec path."""
    return copy_dataset(failed_example.root, tmp_path / "transactions")


# The longest modules first. With ``--dist loadscope`` each module runs on one worker, in collection
# order: a module of several minutes collected last (alphabetical order put Spark there) runs alone
# at the end while the other workers idle.
LONGEST_FIRST = (
    "test_spark_engine.py",
    "test_spark_foreign_warehouse.py",  # the shipments warehouse recovered on both engines through the CLI
    "test_fencing_race.py",
    "test_team_project.py",  # a daemon backfill of a team's project, then its recovery (about 100 s on a quiet machine)
    "test_reconciliation.py",
    "test_recurrence_matrix.py",
    "test_browser_recovery.py",  # every phase of a recovery launched from the UI (about 5 min on a loaded machine)
    "test_browser.py",
    "test_recurrence.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest keep their order
