"""Build the worked example's failed backfill once per test session, shared by xdist workers.

Building runs real Dagster (ingestion runs in process, the backfill through
``dagster-daemon`` in other processes), so it is built once under a file lock in a
directory shared by all workers, and tests copy the dataset folder when they
intend to change it.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from filelock import FileLock

from recovery.config import EXAMPLE_OUTPUTS, EXAMPLE_SPEC

EXAMPLE_DIR = EXAMPLE_SPEC.parent
# the session's failed example (``failed_example``): the size tests' "a real volume" thresholds scale with
SESSION_EVENTS = int(os.environ.get("RECOVERY_TEST_EVENTS", "20000"))


@dataclass(frozen=True)
class BuiltExample:
    root: Path  # folder holding spec.yaml, SQL files and warehouse.duckdb
    dagster_home: Path  # the instance the example's runs were recorded in
    events: int
    info: dict  # DemoResult fields (backfill id, run ids, counts, labels)

    @property
    def spec_path(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"


def copy_dataset(src_root: Path, dest: Path, *, outputs: tuple[str, ...] = ("evidence", "out")) -> Path:
    """Copy a dataset folder (spec, SQL, warehouse) to ``dest``, leaving out ``outputs``; returns the new spec path."""
    shutil.copytree(src_root, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*outputs))
    return dest / "spec.yaml"


@contextmanager
def env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_example(shared: Path, *, events: int) -> BuiltExample:
    """Build (or reuse) the failed example of ``events`` events under ``shared``."""
    root = shared / f"example-{events}"
    home = shared / f"dagster-home-{events}"
    done = root / "built.json"
    with FileLock(str(shared / f"example-{events}.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            shutil.copy(EXAMPLE_SPEC.parents[2] / "dagster.yaml", home / "dagster.yaml")
            spec_path = copy_dataset(EXAMPLE_DIR, root, outputs=EXAMPLE_OUTPUTS)  # whatever make run left there
            with env(DAGSTER_HOME=str(home), RECOVERY_SPEC=str(spec_path)):
                from recovery.definitions import defs
                from recovery.example.demo import build_failed_backfill

                with dg.DagsterInstance.get() as instance:
                    result = build_failed_backfill(spec_path, instance=instance, defs=defs(), events=events)
            info = {
                "backfill_id": result.backfill_id,
                "backfill_status": result.backfill_status,
                "run_ids": result.run_ids,
                "counts": result.counts,
                "truth_labels": result.truth_labels,
            }
            done.write_text(json.dumps(info, indent=2, default=str))
    return BuiltExample(root, home, events, json.loads(done.read_text()))
