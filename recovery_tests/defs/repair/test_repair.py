"""The repair's promises (runbook step 8): rebuilt in isolation from a fixed snapshot, concurrent
ingestion captured and replayed, gated by blocking checks, published by one pointer move that
readers and crashes only ever see whole, re-runnable, stopped by unexplained differences, and
honest about partitions whose source is gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.errors import RecoveryError
from recovery.lib.incident.model import parse_incident
from recovery.lib.pointers.namespaces import current_namespace
from recovery.lib.repair.build import build_wave, start_repair
from recovery.lib.repair.gates import latest_gates
from recovery.lib.repair.plan import load_plan
from recovery.lib.repair.publish import gate_candidate, publish
from recovery.lib.repair.waves import gate_wave
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.writer import Writer
from recovery_tests.support.example_build import SESSION_EVENTS, copy_dataset, env
from recovery_tests.support.repair_support import (
    current_plan,
    gate_and_publish,
    key_with_an_older_version,
    repair_through_library,
    stage_live_events,
)
from recovery_tests.support.rows import present

ROOT = Path(__file__).resolve().parents[3]
INCIDENT = "INC-2024-031"
FAILED = "backfill-0042"
PAYLOAD_DIFF = """
    WITH p AS (SELECT * EXCLUDE (_generation, _written_at) FROM analytics.transactions),
         e AS ({expected})
    SELECT (SELECT count(*) FROM (SELECT * FROM p EXCEPT ALL SELECT * FROM e)),
           (SELECT count(*) FROM (SELECT * FROM e EXCEPT ALL SELECT * FROM p)),
           (SELECT count(*) FROM p)
"""


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "recovery_tests.support.repair_support", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _query(db: Path, sql: str, params=None):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


# ---- end to end through Dagster, with ingestion and readers in other processes ------------------


@pytest.fixture(scope="module")
def repaired_live(failed_example, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repair-live")
    spec_path = copy_dataset(failed_example.root, tmp / "transactions")
    home = tmp / "dagster-home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    spec = load_spec(spec_path)
    incident = parse_incident(spec_path.with_name("incident.yaml"))
    staged = stage_live_events(spec, steps=400)
    stop, stop_readers = tmp / "stop-ingest", tmp / "stop-readers"
    ingest_log, reads = tmp / "ingest.json", tmp / "reads.json"
    from recovery.lib.reconcile.run import run_reconciliation
    from recovery.lib.write.fencing import fence_incident

    fence_incident(Writer(open_engine(spec.warehouse), spec), incident)  # contained first, as the runbook says
    run_reconciliation(spec, incident.failed_generations, incident_id=INCIDENT)
    ingest = _spawn("ingest", str(spec_path), "400", "0.3", str(stop), "4", str(ingest_log))
    reader = _spawn("read", str(spec_path), FAILED, str(stop_readers), str(reads))
    try:
        with env(DAGSTER_HOME=str(home), RECOVERY_SPEC=str(spec_path)):
            from recovery.launch import Launcher
            from recovery.launch.repair import run_publish, run_repair

            with dg.DagsterInstance.get() as instance:
                launcher = Launcher(incident, spec, instance=instance)
                repaired = run_repair(launcher, wave_size=60)
                assert repaired.stopped is None, repaired.stopped
                writes_before_publish = len(json.loads(ingest_log.read_text()))
                published = run_publish(launcher)
        stop.write_text("published")
        ingest_out, ingest_err = ingest.communicate(timeout=300)
        assert ingest.returncode == 0, ingest_err[-3000:]
    finally:
        stop.write_text("stop")
        stop_readers.write_text("stop")
        reader.wait(timeout=60)
        if ingest.poll() is None:
            ingest.kill()
    return {
        "spec": spec,
        "spec_path": spec_path,
        "plan": repaired.plan,
        "published": published,
        "staged": staged,
        "ingest": json.loads(ingest_log.read_text()),
        "writes_before_publish": writes_before_publish,
        "reads": json.loads(reads.read_text()),
        "home": home,
    }


def test_after_publish_the_public_table_equals_the_source_with_every_concurrent_write(repaired_live):
    spec = repaired_live["spec"]
    wh = spec.warehouse.path
    extra, missing, rows = _query(wh, PAYLOAD_DIFF.format(expected=expected_rows_sql(spec, None)))[0]
    assert (extra, missing) == (0, 0) and rows > 0.75 * SESSION_EVENTS
    # keys the live events never touched equal the ground truth built before the repair
    untouched = _query(
        wh,
        """
        SELECT count(*) FROM (
            SELECT * EXCLUDE (_generation, _written_at) FROM analytics.transactions
            WHERE txn_id NOT IN (SELECT txn_id FROM test_live.pending)
            EXCEPT ALL SELECT * FROM truth.expected WHERE txn_id NOT IN (SELECT txn_id FROM test_live.pending))""",
    )[0][0]
    assert untouched == 0


def test_no_ingestion_write_made_during_the_repair_is_lost(repaired_live):
    spec = repaired_live["spec"]
    wh = spec.warehouse.path
    plan = repaired_live["plan"]
    ingest = repaired_live["ingest"]
    assert repaired_live["writes_before_publish"] >= 5, "ingestion must have been writing during the repair"
    assert len(ingest) > repaired_live["writes_before_publish"], "and after the publish"
    replays = _query(
        wh, "SELECT stage, upserted, deleted FROM _recovery.delta_replays WHERE incident_id = ?", [INCIDENT]
    )
    assert sum(r[1] for r in replays) > 0 and sum(r[2] for r in replays) > 0
    # every key's last write by live ingestion is what the public table shows
    lost = _query(
        wh,
        f"""
        WITH last AS (SELECT txn_id, _source_version AS v, _delta_op AS op FROM {'_recovery."delta__transactions"'}
                      WHERE _generation = 'ingest-live'
                      QUALIFY row_number() OVER (PARTITION BY txn_id ORDER BY _delta_seq DESC, _delta_op DESC) = 1)
        SELECT count(*) FILTER (WHERE op = 'upsert' AND (p.txn_id IS NULL OR p._source_version <> last.v)),
               count(*) FILTER (WHERE op = 'delete' AND p.txn_id IS NOT NULL), count(*)
        FROM last LEFT JOIN analytics.transactions p USING (txn_id)""",
    )[0]
    assert lost[:2] == (0, 0) and lost[2] > 100
    # writes after publish went to the repair generation's namespace, the published one
    published_seq = current_plan(spec, INCIDENT).published_seq
    after = _query(
        wh,
        "SELECT DISTINCT namespace FROM _recovery.writes WHERE generation = 'ingest-live' AND seq > ?",
        [published_seq],
    )
    assert after == [(plan.namespace,)]


def test_readers_in_another_process_see_the_old_or_the_new_generation_never_an_error_or_a_mix(repaired_live):
    reads = repaired_live["reads"]
    assert reads["errors"] == [] and reads["mixed"] == 0
    assert reads["old"] > 0 and reads["new"] > 0, reads


def test_publish_moved_the_pointer_once_and_kept_the_prior_generation(repaired_live):
    spec, plan = repaired_live["spec"], repaired_live["plan"]
    wh = spec.warehouse.path
    history = _query(wh, "SELECT from_namespace, to_namespace, reason FROM _recovery.pointer_history ORDER BY seq")
    assert history[-1][:2] == (plan.from_namespace, plan.namespace)
    assert _query(wh, "SELECT status FROM _recovery.namespaces WHERE namespace = ?", [plan.from_namespace]) == [
        ("retained",)
    ]
    assert _query(wh, f"SELECT count(*) FROM {plan.from_namespace}")[0][0] > 0
    # the before/after diff: every damage label found before is gone after
    diffs = dict(
        (r[0], (r[1], r[2]))
        for r in _query(
            wh,
            "SELECT label, sum(keys_before), sum(keys_after) FROM _recovery.repair_diffs WHERE incident_id = ? "
            "GROUP BY 1",
            [INCIDENT],
        )
    )
    assert diffs["duplicate"][0] > 0 and all(after == 0 for _, after in diffs.values()), diffs
    gates = _query(wh, "SELECT DISTINCT stage FROM _recovery.gate_results WHERE incident_id = ?", [INCIDENT])
    assert {"canary", "candidate"} <= {g[0] for g in gates}


def test_the_expected_rows_are_kept_once_and_are_the_change_log_at_their_watermark(repaired_live):
    """The reconciliation keeps E for the phases after it; the repair's fixed snapshot and its
    before/after classification catch it up to the plan's watermark instead of resolving the change
    log again. What is kept is exactly the change log resolved at its watermark, though ingestion
    appended to the change log the whole time."""
    spec, plan = repaired_live["spec"], repaired_live["plan"]
    wh = spec.warehouse.path
    [(kept,)] = _query(wh, "SELECT watermark FROM _recovery.expected_rows_kept WHERE dataset = ?", [spec.dataset])
    assert kept <= plan.source_watermark
    appended = _query(wh, "SELECT count(*) FROM raw.transaction_events WHERE ingested_at > ?", [kept])[0][0]
    assert appended > 0, "ingestion must have appended past the kept watermark"
    expected = expected_rows_sql(spec, kept)
    differ = _query(
        wh,
        f"SELECT count(*) FROM ((SELECT * FROM _recovery.expected__transactions EXCEPT ALL {expected}) "
        f"UNION ALL ({expected} EXCEPT ALL SELECT * FROM _recovery.expected__transactions))",
    )[0][0]
    assert differ == 0
    # the snapshot the waves were built from is the change log at the plan's watermark, caught up or not
    snap = "_recovery.repair_snapshot__transactions"
    at_plan = (
        f"SELECT * FROM ({expected_rows_sql(spec, plan.source_watermark)}) "
        f"WHERE event_date IN (SELECT event_date FROM {snap})"
    )
    differ = _query(
        wh,
        f"SELECT count(*) FROM ((SELECT * FROM {snap} EXCEPT ALL {at_plan}) UNION ALL ({at_plan} EXCEPT ALL SELECT * "
        f"FROM {snap}))",
    )[0][0]
    assert differ == 0


def test_each_phase_rerun_with_the_same_inputs_changes_nothing(repaired_live):
    spec, plan = repaired_live["spec"], repaired_live["plan"]
    wh = spec.warehouse.path
    incident = parse_incident(repaired_live["spec_path"].with_name("incident.yaml"))
    writer = Writer(open_engine(spec.warehouse), spec)
    before = _query(wh, f"SELECT count(*), sum(hash(x)) FROM {plan.namespace} x")
    assert start_repair(writer, incident) == current_plan(spec, INCIDENT)  # the plan is found, not redone
    assert publish(writer, INCIDENT)["already"] is True  # publish finds it happened
    with pytest.raises(RecoveryError, match="published"):
        build_wave(writer, current_plan(spec, INCIDENT), 0)  # a published generation is final
    assert _query(wh, f"SELECT count(*), sum(hash(x)) FROM {plan.namespace} x") == before


# ---- phases on private copies, through the library ------------------------------------------------


def test_rebuilding_a_wave_again_and_replaying_twice_leave_identical_tables(example_copy):
    spec = load_spec(example_copy)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    plan = repair_through_library(spec, incident, wave_size=200, waves=1)
    writer = Writer(open_engine(spec.warehouse), spec)
    digest = f"SELECT count(*), sum(hash(x)) FROM {plan.namespace} x"
    once = _query(spec.warehouse.path, digest)
    build_wave(writer, current_plan(spec, INCIDENT), 0)
    assert _query(spec.warehouse.path, digest) == once
    for n in sorted(plan.waves)[1:]:
        build_wave(writer, current_plan(spec, INCIDENT), n)
        gate_wave(writer, INCIDENT, n)
    # a write by normal ingestion, then the candidate replayed twice
    writer.register_generation("ingest-late", "ingest")
    writer.write(
        "ingest-late",
        f"SELECT * REPLACE (amount_usd + 1 AS amount_usd, _source_version + 5 AS _source_version) "
        f"FROM ({expected_rows_sql(spec, None)}) WHERE txn_id % 97 = 0",
        mode="upsert_keys",
    )
    first, results, _ = gate_candidate(writer, current_plan(spec, INCIDENT))
    replayed = _query(spec.warehouse.path, digest)
    second, _, _ = gate_candidate(writer, current_plan(spec, INCIDENT))
    assert first.upserted > 100 and (second.upserted, second.deleted) == (0, 0)
    assert _query(spec.warehouse.path, digest) == replayed
    # the replayed rows keep the ingestion generation that wrote them
    assert (
        _query(spec.warehouse.path, f"SELECT count(*) FROM {plan.namespace} WHERE _generation = 'ingest-late'")[0][0]
        == first.upserted
    )


def test_an_unexplained_difference_in_a_wave_stops_the_expansion_and_keeps_both_generations(example_copy):
    spec = load_spec(example_copy)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    plan = repair_through_library(spec, incident, wave_size=40, waves=1)
    assert all(g.passed for g in _gates(spec, "canary").values())
    victim = plan.waves[0][0]
    # something outside the repair changes a canary row (a stray job, a manual fix)
    with open_engine(spec.warehouse).transaction() as s:
        s.execute(
            f"UPDATE {plan.namespace} SET amount_usd = amount_usd + 7 "
            f"WHERE CAST(event_date AS VARCHAR) = ? AND txn_id = (SELECT min(txn_id) FROM {plan.namespace} "
            f"WHERE CAST(event_date AS VARCHAR) = ?)",
            [victim, victim],
        )
    writer = Writer(open_engine(spec.warehouse), spec)
    build_wave(writer, current_plan(spec, INCIDENT), 1)
    results = {r.gate: r for r in gate_wave(writer, INCIDENT, 1)}
    assert not results["repair_reconciliation"].passed and "changed 1" in results["repair_reconciliation"].details
    # found by the canary partitions' fingerprints, then named key by key
    assert f"1 earlier partition(s) changed since their gate: ['{victim}']" in results["repair_reconciliation"].details
    stopped = current_plan(spec, INCIDENT)
    assert stopped.status == "stopped" and "wave 1" in present(stopped.stopped_reason)
    with pytest.raises(RecoveryError, match="stopped"):
        build_wave(writer, stopped, 2)
    with pytest.raises(RecoveryError, match="stopped"):
        gate_candidate(writer, stopped)
    with open_engine(spec.warehouse).session() as s:
        assert current_namespace(s, spec) == plan.from_namespace
        assert (
            s.scalar(f"SELECT count(*) FROM {plan.namespace}") > 0
            and s.scalar(f"SELECT count(*) FROM {plan.from_namespace}") > 0
        )
        assert (
            s.scalar(
                "SELECT count(*) FROM _recovery.timeline WHERE kind = 'repair_stopped' AND summary LIKE '%both kept%'"
            )
            == 1
        )


def test_a_row_outside_the_partition_its_source_row_derives_fails_the_partitioning_gate(example_copy):
    """Two rows of the canary moved to another canary partition: one is the snapshot's row (its
    partition is the snapshot's derivation), one holds an older version of its key (derived from
    that source row by the transform again). The canary's gate names both."""
    spec = load_spec(example_copy)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    plan = repair_through_library(spec, incident, wave_size=40, waves=1)
    a, b = plan.waves[0][:2]
    ns = plan.namespace
    with open_engine(spec.warehouse).transaction() as s:
        # a key with an older version whose source row derives partition a as well
        older = key_with_an_older_version(s, ns, a, deriving_the_same_partition=True)
        assert older is not None
        snapshot_row = s.scalar(
            f"SELECT min(txn_id) FROM {ns} WHERE CAST(event_date AS VARCHAR) = ? AND txn_id <> ?", [a, older[0]]
        )
        s.execute(f"UPDATE {ns} SET event_date = CAST(? AS DATE) WHERE txn_id = ?", [b, snapshot_row])
        s.execute(
            f"UPDATE {ns} SET event_date = CAST(? AS DATE), _source_version = ? WHERE txn_id = ?",
            [b, older[1], older[0]],
        )
    results = {r.gate: r for r in gate_wave(Writer(open_engine(spec.warehouse), spec), INCIDENT, 0)}
    assert not results["repair_partitioning"].passed
    assert results["repair_partitioning"].observed == 2
    assert results["repair_keys"].passed and results["repair_fencing"].passed


def _gates(spec, stage):
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return latest_gates(s, INCIDENT, stage)


def test_a_bad_row_in_the_repair_generation_fails_a_blocking_check_and_publish_does_not_happen(example_copy, tmp_path):
    spec = load_spec(example_copy)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    plan = repair_through_library(spec, incident, wave_size=200)
    from recovery.lib.write.fencing import fence_incident

    fence_incident(Writer(open_engine(spec.warehouse), spec), incident)
    with open_engine(
        spec.warehouse
    ).transaction() as s:  # a row of the fenced generation slips into a rebuilt partition
        s.execute(
            f"INSERT INTO {plan.namespace} SELECT * REPLACE ('{FAILED}' AS _generation) FROM {plan.namespace} "
            "WHERE event_date = CAST(? AS DATE) ORDER BY txn_id LIMIT 1",
            [sorted(plan.rebuild)[0]],
        )
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    with env(DAGSTER_HOME=str(home), RECOVERY_SPEC=str(example_copy)):
        from recovery.launch import Launcher
        from recovery.launch.repair import run_publish

        with dg.DagsterInstance.get() as instance:
            with pytest.raises(RecoveryError):
                run_publish(Launcher(incident, spec, instance=instance))
            run = instance.get_runs(dg.RunsFilter(job_name="publish_repair"))[0]
            evaluations = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            checks = {ev.check_name: ev.passed for e in evaluations if (ev := e.asset_check_evaluation) is not None}
            published = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    assert checks["repair_keys"] is False and checks["repair_fencing"] is False
    assert checks["repair_reconciliation"] is False  # key by key: the copy is a row the reference does not hold
    assert checks["repair_partitioning"] is True
    assert [present(present(e.dagster_event).asset_key).path for e in published] == [
        ["repair", "candidate"]
    ]  # publication blocked
    with open_engine(spec.warehouse).session() as s:
        assert current_namespace(s, spec) == plan.from_namespace
        assert present(load_plan(s, INCIDENT)).status == "building"
    with pytest.raises(RecoveryError, match="publish refused"):
        publish(Writer(open_engine(spec.warehouse), spec), INCIDENT)


FAULT_POINTS = ("publish:locked", "publish:replayed", "publish:view_moved", "publish:recorded", "publish:committed")


def test_a_publisher_killed_at_each_step_leaves_the_pointer_fully_old_or_fully_new(example_copy, tmp_path):
    spec = load_spec(example_copy)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    plan = repair_through_library(spec, incident, wave_size=200)
    writer = Writer(open_engine(spec.warehouse), spec)
    gate_candidate(writer, current_plan(spec, INCIDENT))
    wh = spec.warehouse.path
    ready_copy = tmp_path / "candidate.duckdb"
    shutil.copy(wh, ready_copy)
    outcomes = {}
    for point in FAULT_POINTS:
        shutil.copy(ready_copy, wh)
        Path(str(wh) + ".wal").unlink(missing_ok=True)
        ready = tmp_path / f"ready-{point.replace(':', '-')}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "recovery_tests.support.repair_support", "publish", str(example_copy), INCIDENT],
            cwd=ROOT,
            env={**os.environ, "RECOVERY_FAULT_AT": point, "RECOVERY_FAULT_READY": str(ready)},
        )
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"publisher never reached {point}"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        view_sql = _query(
            wh, "SELECT sql FROM duckdb_views() WHERE schema_name = 'analytics' AND view_name = 'transactions'"
        )[0][0]
        pointer = _query(wh, "SELECT namespace FROM _recovery.pointers")[0][0]
        status = _query(wh, "SELECT status FROM _recovery.repair_plans WHERE incident_id = ?", [INCIDENT])[0][0]
        moves = _query(wh, "SELECT count(*) FROM _recovery.pointer_history WHERE to_namespace = ?", [plan.namespace])[
            0
        ][0]
        side = "new" if pointer == plan.namespace else "old"
        assert (plan.namespace.split(".")[1] in view_sql) == (side == "new"), (point, view_sql, pointer)
        assert (status == "published") == (side == "new") and moves == (1 if side == "new" else 0)
        outcomes[point] = side
        # and publishing again completes (or finds it done)
        result = publish(writer, INCIDENT)
        assert result["already"] is (side == "new")
        assert _query(wh, "SELECT namespace FROM _recovery.pointers")[0][0] == plan.namespace
    assert outcomes == {
        "publish:locked": "old",
        "publish:replayed": "old",
        "publish:view_moved": "old",
        "publish:recorded": "old",
        "publish:committed": "new",
    }, outcomes


# ---- source truth unavailable ---------------------------------------------------------------------


def test_a_partition_whose_source_rows_were_purged_is_kept_and_marked_qualified_not_emptied(example_copy):
    spec = load_spec(example_copy)
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    with open_engine(spec.warehouse).session(read_only=True) as s:
        # a partition the backfill damaged that also holds orders of other days (misfiled there): the most such
        purged = str(
            s.scalar(
                "SELECT t.event_date FROM analytics.transactions t JOIN raw.transaction_events e USING (txn_id) "
                "WHERE t._generation = ? AND t.event_date <> CAST(e.event_ts AS DATE) "
                "GROUP BY 1 ORDER BY count(DISTINCT t.txn_id) DESC, 1 LIMIT 1",
                [FAILED],
            )
        )
    with open_engine(spec.warehouse).transaction() as s:
        s.execute("DELETE FROM raw.transaction_events WHERE CAST(event_ts AS DATE) = ?", [purged])
        before = s.fetchall(
            "SELECT count(*), sum(amount_usd) FROM analytics.transactions WHERE event_date = ? "
            "AND txn_id NOT IN (SELECT txn_id FROM raw.transaction_events)",
            [purged],
        )[0]
        strays = s.fetchall(
            "SELECT txn_id FROM analytics.transactions WHERE event_date = ? "
            "AND txn_id IN (SELECT txn_id FROM raw.transaction_events)",
            [purged],
        )
    plan = repair_through_library(spec, incident, wave_size=200)
    assert purged in plan.qualified and "no row for this partition" in plan.qualified[purged]
    assert purged not in plan.rebuild
    result = gate_and_publish(spec, INCIDENT)
    assert result["already"] is False
    assert before[0] > 20 and strays
    with open_engine(spec.warehouse).session() as s:
        # the rows the source cannot speak for are kept as they were; rows of keys the source
        # knows (strays from other days) are rebuilt where the source puts them, once
        assert (
            s.fetchall("SELECT count(*), sum(amount_usd) FROM analytics.transactions WHERE event_date = ?", [purged])[0]
            == before
        )
        assert (
            s.fetchall(
                "SELECT txn_id, count(*) FROM analytics.transactions WHERE txn_id IN (SELECT unnest(?)) "
                "GROUP BY 1 HAVING count(*) > 1",
                [[t for (t,) in strays]],
            )
            == []
        )
        assert s.fetchone(
            "SELECT action, qualified_reason IS NOT NULL, status FROM _recovery.repair_partitions "
            "WHERE incident_id = ? AND partition = ?",
            [INCIDENT, purged],
        ) == ("keep (qualified)", True, "kept")
    # the recovery report and each consumer owner's notice say so
    from recovery.lib.notify import FileChannel, Notifier
    from recovery.lib.reports import build_reports
    from recovery.lib.restatement import restate_consumers

    engine = open_engine(spec.warehouse)
    html = build_reports(incident, spec, engine, None).html["recovery"]
    assert "Qualified partitions" in html and purged in html
    alerts = example_copy.parent / "alerts.jsonl"
    restate_consumers(
        engine,
        spec,
        INCIDENT,
        failed_generations=incident.failed_generations,
        notifier=Notifier(FileChannel(alerts), engine),
    )
    notices = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert notices and all("Qualified" in n["body"] and purged in n["body"] for n in notices)


def test_partitions_before_source_available_from_are_qualified(example_copy):
    spec_text = example_copy.read_text().replace(
        "  sensitive: [customer_id]\ntarget:", "  sensitive: [customer_id]\n  available_from: 2024-02-01\ntarget:", 1
    )
    example_copy.write_text(spec_text)
    spec = load_spec(example_copy)
    assert str(spec.source.available_from) == "2024-02-01"
    incident = parse_incident(example_copy.with_name("incident.yaml"))
    from recovery.lib.reconcile.run import run_reconciliation

    run_reconciliation(spec, incident.failed_generations, incident_id=INCIDENT)
    plan = start_repair(Writer(open_engine(spec.warehouse), spec), incident)
    january = [p for p in plan.qualified if p < "2024-02-01"]
    assert january and all(p >= "2024-02-01" for p in plan.rebuild)
    assert all("available_from" in plan.qualified[p] for p in january)


# ---- a dataset this package never wrote ---------------------------------------------------------


def test_a_table_another_tool_wrote_is_adopted_and_repaired_from_its_own_spec(tmp_path):
    from recovery_tests.support.small_dataset import build_small_dataset, catalog

    spec_path = build_small_dataset(tmp_path / "orders", n_orders=400)
    spec = load_spec(spec_path)
    db = spec.warehouse.path
    expected = expected_rows_sql(spec, None)
    con = duckdb.connect(str(db))
    try:  # another tool publishes a plain table with the metadata columns, then its backfill damages it
        con.execute("CREATE SCHEMA mart")
        con.execute(
            "CREATE TABLE mart.orders AS SELECT *, 'etl-v1' AS gen_id, TIMESTAMP '2026-03-02' AS landed_at "
            f"FROM ({expected})"
        )
        bf = "'etl-bf-9' AS gen_id, TIMESTAMP '2026-03-05' AS landed_at"
        con.execute(
            f"INSERT INTO mart.orders SELECT * EXCLUDE (gen_id, landed_at), {bf} FROM mart.orders "
            "WHERE order_no % 11 = 0"
        )
        con.execute(
            "UPDATE mart.orders SET qty = qty * 100, gen_id = 'etl-bf-9' WHERE order_no % 13 = 0 AND gen_id = 'etl-v1'"
        )
        con.execute(
            "UPDATE mart.orders SET shard = shard || '-x', gen_id = 'etl-bf-9' WHERE order_no % 17 = 0 "
            "AND gen_id = 'etl-v1'"
        )
        con.execute("DELETE FROM mart.orders WHERE order_no % 19 = 0")
        con.execute(f"""INSERT INTO mart.orders
            SELECT * EXCLUDE (__rn), {bf} FROM (
                SELECT region, order_no, region || '-' || strftime(placed_at, '%Y%m') AS shard, placed_at, qty, sku,
                       rev AS src_rev, row_number() OVER (PARTITION BY region, order_no ORDER BY rev DESC) AS __rn
                FROM src.order_events WHERE change = 'put'
                  AND (region, order_no) IN (SELECT (region, order_no) FROM src.order_events WHERE change = 'drop'))
            WHERE __rn = 1""")
    finally:
        con.close()
    (tmp_path / "orders" / "incident.yaml").write_text(
        "incident_id: INC-ORD-1\nspec: spec.yaml\nfailed_generations: [etl-bf-9]\nrequested_by: ops-oncall\n"
    )
    incident = parse_incident(tmp_path / "orders" / "incident.yaml")
    assert check_incident_spec(incident).dataset == "orders"  # the generation is found in the target's own column
    writer = Writer(open_engine(spec.warehouse), spec)
    assert writer.ensure() == "mart.orders__g0001"  # adopted on first use
    writer.fence("etl-bf-9", incident_id="INC-ORD-1", fenced_by="test")
    plan = repair_through_library(spec, incident, wave_size=5)
    assert len(plan.waves) > 2 and plan.status == "building" and not plan.qualified
    assert any("-x" in p for p in plan.rebuild)  # the mispartitioned rows' partitions, beyond any range
    assert gate_and_publish(spec, "INC-ORD-1")["namespace"] == plan.namespace
    diff = _query(
        db,
        f"""SELECT (SELECT count(*) FROM (SELECT * EXCLUDE (gen_id, landed_at) FROM mart.orders
                EXCEPT ALL ({expected}))),
                                 (SELECT count(*) FROM (({expected}) EXCEPT ALL SELECT * EXCLUDE (gen_id, landed_at)
                                     FROM mart.orders))""",
    )
    assert diff == [(0, 0)]
    assert ("mart", "orders", "VIEW") in catalog(db)
    assert (
        _query(db, "SELECT count(*) FROM mart.orders__g0001 WHERE gen_id = 'etl-bf-9'")[0][0] > 0
    )  # damaged generation kept


def check_incident_spec(incident):
    from recovery.lib.incident.model import check_incident

    return check_incident(incident)
