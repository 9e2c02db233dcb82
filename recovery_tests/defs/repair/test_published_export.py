"""The supported read path for outside readers during a recovery: the published generation as
one Parquet file beside the warehouse, replaced atomically at each publish. Readers of it
never lock the warehouse and, across many pointer swaps, see one generation whole every
time (``python -m bench share`` runs 10,000+ reads)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb

from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.pointers.namespaces import move_pointer
from recovery.lib.pointers.published_export import export_dir, read_marker, refresh_published_export
from recovery.lib.write.writer import Writer
from recovery_tests.support.published_export import read_export, two_generations
from recovery_tests.support.rows import present

ROOT = Path(__file__).resolve().parents[3]


def swap(spec, w, ns: str) -> None:
    with w.engine.transaction() as s:
        move_pointer(s, spec, ns, actor="test", reason="swap")
    refresh_published_export(w.engine, spec)


def test_outside_readers_see_one_generation_whole_across_swaps_and_never_lock_the_warehouse(tmp_path):
    spec, w, ns = two_generations(tmp_path / "orders")
    swap(spec, w, ns["g-a"])
    path = str(export_dir(spec) / "current.duckdb")
    rows = present(duckdb.connect(path, read_only=True).execute("SELECT count(*) FROM orders").fetchone())[0]
    out = {"stop": threading.Event(), "reads": 0, "mixed": 0, "errors": [], "rows": rows}
    readers = [threading.Thread(target=read_export, args=(path, out)) for _ in range(2)]
    for t in readers:
        t.start()
    swaps = 0
    while out["reads"] < 1000 or swaps < 20:
        swap(spec, w, ns["g-b" if swaps % 2 == 0 else "g-a"])
        swaps += 1
    out["stop"].set()
    for t in readers:
        t.join(timeout=60)
    assert out["errors"] == [] and out["mixed"] == 0 and out["reads"] >= 1000
    # the file holds the generation the pointer names, and says so
    marker = present(read_marker(spec))
    gen = "g-b" if swaps % 2 else "g-a"
    assert marker["namespace"] == ns[gen] and marker["rows"] == rows
    con = duckdb.connect(path, read_only=True)
    assert con.execute("SELECT DISTINCT gen_id FROM orders").fetchall() == [(gen,)]
    con.close()
    # a refresh with nothing new published rewrites nothing
    before = (export_dir(spec) / "current.duckdb").stat().st_mtime_ns
    refresh_published_export(w.engine, spec)
    assert (export_dir(spec) / "current.duckdb").stat().st_mtime_ns == before
    names = sorted(p.name for p in export_dir(spec).iterdir())
    assert names[:2] == ["current.duckdb", "current.json"] and marker["file"] in names
    assert not any(n.startswith(".") for n in names)  # no temp file left behind


# what each fault point, after publish's commit, leaves undone (injected there, not by timing)
LEFT_AT = {
    "publish:committed": ["the read copy", "the timeline entry", "the notification"],
    "publish:exported": ["the timeline entry", "the notification"],
    "publish:read_copy_recorded": ["the notification"],
}


def _sorted_rows(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


def test_a_publish_killed_after_its_commit_is_finished_by_the_rerun_at_every_step(tmp_path):
    """The read copy, its timeline entry and the notice follow the commit; a publisher killed
    before any of them leaves them to the rerun, which does each exactly once."""
    from recovery.lib.incident.model import parse_incident
    from recovery.lib.notify import FileChannel, Notifier
    from recovery.lib.repair.publish import PublishNotice, gate_candidate, publish, publish_steps_left
    from recovery_tests.support.repair_support import current_plan, repair_through_library
    from recovery_tests.support.repaired_small import INCIDENT, build_damaged

    damaged = build_damaged(tmp_path / "template")
    repair_through_library(damaged.spec, parse_incident(damaged.incident_path), wave_size=40)
    gate_candidate(damaged.writer, current_plan(damaged.spec, INCIDENT))
    for point, left in LEFT_AT.items():
        d = tmp_path / point.replace(":", "-")
        shutil.copytree(tmp_path / "template", d)
        ready, alerts = tmp_path / f"{d.name}.ready", tmp_path / f"{d.name}.alerts.jsonl"
        child = subprocess.Popen(
            [sys.executable, "-m", "recovery_tests.support.repair_support", "publish", str(d / "spec.yaml"), INCIDENT]
            + [str(alerts)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "RECOVERY_FAULT_AT": point, "RECOVERY_FAULT_READY": str(ready)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert child.poll() is None, (point, child.stderr.read().decode()[-1500:] if child.stderr else "")
            assert time.monotonic() < deadline, f"the publisher never reached {point}"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

        spec = load_spec(d / "spec.yaml")
        engine = open_engine(spec.warehouse)
        assert publish_steps_left(engine, spec, INCIDENT) == left, point
        notice = PublishNotice(Notifier(FileChannel(alerts), engine), "ops-oncall")
        assert publish(Writer(engine, spec), INCIDENT, notice=notice)["already"] is True
        assert publish_steps_left(engine, spec, INCIDENT) == [], point
        assert _sorted_rows(export_dir(spec) / "current.duckdb", "SELECT * FROM orders") == _sorted_rows(
            d / "wh.duckdb", "SELECT * FROM mart.orders"
        ), point
        entries = _sorted_rows(
            d / "wh.duckdb",
            f"SELECT kind FROM _recovery.timeline WHERE incident_id = '{INCIDENT}' "
            "AND kind IN ('read_copy_refreshed', 'alert')",
        )
        assert entries == [("alert",), ("read_copy_refreshed",)], point
        assert len(alerts.read_text().splitlines()) == 1, point  # told once, whoever finished
        publish(Writer(engine, spec), INCIDENT, notice=notice)  # and a further rerun changes nothing
        assert len(alerts.read_text().splitlines()) == 1 and publish_steps_left(engine, spec, INCIDENT) == []
