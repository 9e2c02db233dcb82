"""Dagster's SQLite storages reuse one pooled engine per file in a process, and stay correct:
another process sees every event at once, a deleted or re-created instance is never written
through an old handle, and open files stay bounded."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from recovery import dagster_sqlite
from recovery.dagster_sqlite import STORAGE_MODULES, EngineCache
from recovery_tests.support.rows import present


def test_dagsters_sqlite_storages_build_their_engines_through_the_cache():
    import recovery.orchestration  # noqa: F401 - installs the cache

    for name in STORAGE_MODULES:
        assert importlib.import_module(name).create_engine == dagster_sqlite.ENGINES.create_engine, name
        assert importlib.import_module(name).check_alembic_revision == dagster_sqlite.check_alembic_revision, name


def test_a_files_schema_revision_is_checked_against_the_same_head_as_dagster_reads(tmp_path: Path):
    """The head of Dagster's migration scripts is read once per process; each check still reads the file's own."""
    import sqlalchemy
    from dagster._core.storage import sql
    from dagster._core.storage.event_log.sqlite import sqlite_event_log

    config = sql.get_alembic_config(sqlite_event_log.__file__)
    with dg.DagsterInstance.from_ref(dg._core.instance.InstanceRef.from_dir(str(tmp_path))) as instance:
        assert instance.get_runs() == []  # the instance's files exist, stamped at the head
        index = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'history' / 'runs' / 'index.db'}")
        with index.connect() as conn:
            ours = dagster_sqlite.check_alembic_revision(config, conn)
            assert ours == sql.check_alembic_revision(config, conn) and ours[0] == ours[1] is not None
        index.dispose()
    empty = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with empty.connect() as conn:  # a file never stamped: no revision of its own, the same head
        assert dagster_sqlite.check_alembic_revision(config, conn) == sql.check_alembic_revision(config, conn)
        assert dagster_sqlite.check_alembic_revision(config, conn)[0] is None
    empty.dispose()


def test_one_engine_per_file_a_replaced_file_gets_a_new_one_and_the_oldest_is_disposed(tmp_path: Path):
    cache = EngineCache(max_engines=2)
    a, b, c = (tmp_path / f"{n}.db" for n in "abc")
    first = cache.create_engine(f"sqlite:///{a}")
    with first.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INT)")
        conn.commit()
    assert cache.create_engine(f"sqlite:///{a}") is first
    a.unlink()
    a.write_bytes(b"")  # a new file at the same path (a wiped instance)
    second = cache.create_engine(f"sqlite:///{a}")
    assert second is not first
    with second.connect() as conn:  # the new, empty file: the old table is not there
        assert conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar() == 0
    cache.create_engine(f"sqlite:///{b}")
    cache.create_engine(f"sqlite:///{c}")
    assert len(cache) == 2
    assert cache.create_engine(f"sqlite:///{a}") is not second  # evicted as least recently used
    memory = cache.create_engine("sqlite://")
    assert memory is not cache.create_engine("sqlite://") and len(cache) == 2  # not a file: not cached


def test_pooled_connections_commit_without_a_sync_per_statement_unless_asked(tmp_path: Path, monkeypatch):
    """WAL with ``synchronous=NORMAL``: a commit no longer waits for the disk (the last commits
    may be lost on power loss, never the file's consistency), a new file's first commits included;
    ``RECOVERY_SQLITE_SYNC=full`` restores Dagster's."""

    def synchronous(cache: EngineCache, name: str) -> int:
        with cache.create_engine(f"sqlite:///{tmp_path / name}").connect() as conn:
            return present(conn.exec_driver_sql("PRAGMA synchronous").scalar())

    def journal(cache: EngineCache, name: str) -> str:
        with cache.create_engine(f"sqlite:///{tmp_path / name}").connect() as conn:
            return present(conn.exec_driver_sql("PRAGMA journal_mode").scalar())

    assert synchronous(EngineCache(), "normal.db") == 1  # NORMAL
    assert journal(EngineCache(), "new.db") == "wal"  # a new file is in WAL mode before Dagster creates its tables
    monkeypatch.setenv("RECOVERY_SQLITE_SYNC", "full")
    assert synchronous(EngineCache(), "full.db") == 2  # FULL, SQLite's default
    assert journal(EngineCache(), "new_full.db") == "delete"  # as Dagster leaves it until its tables exist


READ_RUNS = """
import sys, dagster as dg
with dg.DagsterInstance.from_ref(dg._core.instance.InstanceRef.from_dir(sys.argv[1])) as instance:
    runs = instance.get_runs()
    print(len(runs), sum(len(instance.all_logs(r.run_id)) for r in runs))
"""


@dg.op
def _step() -> int:
    return 1


@dg.job
def _tiny():
    _step()


def _other_process_sees(home: Path) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", READ_RUNS, str(home)], capture_output=True, text=True, check=True)
    runs, events = out.stdout.split()
    return int(runs), int(events)


def test_another_process_sees_each_run_and_a_recreated_instance_starts_empty(tmp_path: Path):
    import shutil

    import recovery.orchestration  # noqa: F401 - installs the cache

    home = tmp_path / "home"
    for expected_runs in (1, 2):
        home.mkdir(exist_ok=True)
        with dg.DagsterInstance.from_ref(dg._core.instance.InstanceRef.from_dir(str(home))) as instance:
            result = _tiny.execute_in_process(instance=instance)
            assert result.success
            events = len(instance.all_logs(result.run_id))
        runs, seen = _other_process_sees(home)
        assert runs == expected_runs and seen >= events > 0
    shutil.rmtree(home)  # the same path, a new instance: nothing of the old one shows, and it works
    home.mkdir()
    with dg.DagsterInstance.from_ref(dg._core.instance.InstanceRef.from_dir(str(home))) as instance:
        assert instance.get_runs() == []
        assert _tiny.execute_in_process(instance=instance).success
    assert _other_process_sees(home)[0] == 1


@pytest.mark.parametrize("value", ["off", "0"])
def test_the_pool_can_be_switched_off(value: str, monkeypatch):
    import recovery.orchestration  # noqa: F401

    monkeypatch.setenv("RECOVERY_SQLITE_POOL", value)
    module = importlib.import_module(STORAGE_MODULES[0])
    monkeypatch.setattr(module, "create_engine", dagster_sqlite._create_engine)
    dagster_sqlite.install()
    assert module.create_engine is dagster_sqlite._create_engine


def _planned_events(run_id: str, n: int):
    from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent
    from dagster._core.events.log import EventLogEntry

    return [
        EventLogEntry(
            error_info=None,
            level=10,
            user_message="",
            run_id=run_id,
            timestamp=1.0 + i,
            job_name="job",
            dagster_event=DagsterEvent.build_asset_materialization_planned_event(
                "job", "step", AssetMaterializationPlannedData(dg.AssetKey(["a", "b"]), partition=f"p{i:03d}")
            ),
        )
        for i in range(n)
    ]


def _stored(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str | None]]:
    return [
        (e.dagster_event.event_type_value, e.dagster_event.partition)
        for e in instance.all_logs(run_id)
        if e.dagster_event is not None
    ]


def test_an_event_batch_is_stored_in_one_transaction_per_file_with_the_same_rows(tmp_path: Path):
    """A run's planned events (one per partition) come as one batch: stored together, one commit to
    the run's file and one to ``index.db``, the same rows as stored one by one; a batch that fails
    leaves none of its rows (Dagster then stores them one by one)."""
    import sqlalchemy

    import recovery.orchestration  # noqa: F401 - installs the batches

    commits: list[str] = []

    def count(conn) -> None:
        commits.append(str(conn.engine.url))

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "commit", count)
    try:
        with dg.DagsterInstance.from_ref(dg._core.instance.InstanceRef.from_dir(str(tmp_path))) as instance:
            assert instance._get_event_batch_size() == dagster_sqlite.MAX_BATCH
            storage: Any = instance.event_log_storage  # Dagster's SQLite event storage
            for run_id in ("one_by_one", "batched"):  # each run's file exists first, as create_run makes it
                storage.store_event(_planned_events(run_id, 1)[0])
            commits.clear()
            for event in _planned_events("one_by_one", 20):
                storage.store_event(event)
            assert len(commits) >= 40  # the run's file and index.db, for each event
            commits.clear()
            storage.store_event_batch(_planned_events("batched", 20))
            assert len(commits) == 2 and len(set(commits)) == 2, commits
            assert _stored(instance, "batched") == _stored(instance, "one_by_one")
            with storage.index_connection() as conn:  # the cross-run index holds both runs' rows alike
                indexed = conn.exec_driver_sql(
                    "SELECT run_id, count(*) FROM event_logs WHERE dagster_event_type = "
                    "'ASSET_MATERIALIZATION_PLANNED' GROUP BY run_id ORDER BY run_id"
                ).all()
            assert [tuple(r) for r in indexed] == [("batched", 21), ("one_by_one", 21)]

            events = _planned_events("failed", 5)
            storage.store_event(events[0])
            shipped = storage.prepare_insert_event
            seen: list[int] = []

            def fail_on_the_fourth(event):
                seen.append(1)
                if len(seen) == 4:
                    raise RuntimeError("disk full")
                return shipped(event)

            storage.prepare_insert_event = fail_on_the_fourth
            with pytest.raises(RuntimeError, match="disk full"):
                storage.store_event_batch(events[1:])
            storage.prepare_insert_event = shipped
            assert _stored(instance, "failed") == _stored(instance, "one_by_one")[:1]  # only the first, stored alone
            with storage.index_connection() as conn:
                assert conn.exec_driver_sql("SELECT count(*) FROM event_logs WHERE run_id = 'failed'").scalar() == 1
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "commit", count)
