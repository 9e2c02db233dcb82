"""Shared fixtures: the worked example's failed backfill, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery_tests.support.example_build import SESSION_EVENTS, BuiltExample, build_example, copy_dataset


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
    """The worked example after its faulty backfill (``SESSION_EVENTS``, 20k: the size the Spark test and
    the reconciliation's small build use, so one build serves them all). Read-only: copy to change it."""
    return build_example(shared_dir, events=SESSION_EVENTS)


@pytest.fixture
def example_copy(failed_example: BuiltExample, tmp_path: Path) -> Path:
    """A private copy of the failed example's dataset folder; returns its spec path."""
    return copy_dataset(failed_example.root, tmp_path / "transactions")


# The longest modules first (longest-processing-time-first scheduling). With ``--dist loadscope`` each
# module runs on one worker, modules handed out in collection order when the Makefile passes
# ``--no-loadscope-reorder`` (xdist's default reorder sorts them by their number of tests, which put
# the two-test preservation property, the longest of all, last). A module of several minutes
# handed out last runs alone at the end while the other worker idles. Seconds: one module alone on
# a loaded 2-core machine, for the order only.
LONGEST_FIRST = (
    "test_publish_preservation.py",  # 200 generated examples of ingestion during a repair (330 s)
    "test_spark_engine.py",  # the worked example recovered on both engines (230 s)
    "test_spark_foreign_warehouse.py",  # the shipments warehouse recovered on both engines through the CLI (220 s)
    "test_recurrence.py",  # (200 s)
    "test_reconciliation.py",  # (190 s)
    "test_kill_matrix.py",  # 124 commit points and random kills (165 s)
    "test_repair.py",  # (155 s)
    "test_fencing_race.py",  # (140 s)
    "test_browser_recovery.py",  # every phase of a recovery launched from the UI (135 s)
    "test_team_project.py",  # a daemon backfill of a team's project, then its recovery (about 100 s on a quiet machine)
    "test_io_manager.py",  # (110 s)
    "test_containment.py",  # (100 s)
    "test_gate_sql.py",  # one repair of the worked example, then the gates' SQL read both ways (90 s)
    "test_datasets.py",
    "test_browser.py",
    "test_phase_order.py",
    "test_evidence.py",
    "test_reports.py",
    "test_timeline.py",
    "test_intake.py",
    "test_recurrence_matrix.py",
    "test_unique_keys.py",
    "test_bench_spark.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest keep their order
