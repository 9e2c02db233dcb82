"""Helpers for the repair tests: live ingestion and readers in other processes, a publisher to
kill, and the repair's phases run in order through the library.

Run as scripts (``python -m recovery_tests.support.repair_support <role> ...``) they play the
other processes of a real incident: normal ingestion that keeps appending to the
source and applying it through the writer, readers of the public name, a publisher.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import Incident
from recovery.lib.notify import FileChannel, Notifier
from recovery.lib.reconcile.run import run_reconciliation
from recovery.lib.repair.build import build_wave, start_repair
from recovery.lib.repair.plan import RepairPlan, load_plan
from recovery.lib.repair.publish import PublishNotice, gate_candidate, publish
from recovery.lib.repair.waves import gate_wave
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.writer import Writer
from recovery_tests.support.rows import present

LIVE_START = datetime(2024, 7, 5, 6, 0, 0)  # the worked example's source ends just before this
STEP = timedelta(minutes=1)


def stage_live_events(spec: DatasetSpec, *, steps: int, per_step: int = 40) -> int:
    """Prepare, in ``test_live.pending``, the source events that arrive during the repair (one batch
    per step): corrections and tombstones of existing keys, including late ones for old
    partitions, and new transactions. Returns how many."""
    with open_engine(spec.warehouse).transaction() as s:
        s.execute("CREATE SCHEMA IF NOT EXISTS test_live")
        s.execute(f"""CREATE OR REPLACE TABLE test_live.pending AS
            WITH live AS (
                SELECT * FROM raw.transaction_events
                QUALIFY row_number() OVER (PARTITION BY txn_id ORDER BY version DESC) = 1 AND op = 'upsert'),
            picked AS (
                SELECT *, row_number() OVER (ORDER BY hash(txn_id, 'live')) AS n FROM live)
            SELECT * REPLACE (CAST(amount * 1.25 + 1 AS DECIMAL(18, 2)) AS amount, version + 1 AS version,
                              'settled' AS status),
                   (n - 1) % {steps} + 1 AS step
            FROM picked WHERE n <= {steps * per_step // 2}
            UNION ALL
            SELECT * REPLACE (NULL AS amount, 'delete' AS op, version + 1 AS version), (n - 1) % {steps} + 1
            FROM picked WHERE n > {steps * per_step // 2} AND n <= {steps * per_step * 3 // 4}
            UNION ALL
            SELECT * REPLACE (txn_id + 10000000 AS txn_id, 1 AS version, TIMESTAMP '2024-07-05 05:00:00' AS event_ts),
                   (n - 1) % {steps} + 1
            FROM picked WHERE n > {steps * per_step * 3 // 4} AND n <= {steps * per_step}""")
        return int(s.scalar("SELECT count(*) FROM test_live.pending"))


def live_ingest(spec_path: Path, steps: int, pause_s: float, stop_file: Path, after_stop: int, log: Path) -> None:
    """Each step: append the step's events to the source (stamped with the step's time), then
    apply them through the writer as generation ``ingest-live``. After ``stop_file`` appears,
    run ``after_stop`` more steps (writes landing after publish) and exit."""
    spec = parse_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="ingest-live")
    writer.register_generation("ingest-live", "ingest", code_version="live")
    done, remaining = [], None
    for step in range(1, steps + 1):
        until = LIVE_START + step * STEP
        with writer.engine.transaction() as s:
            s.execute(
                "INSERT INTO raw.transaction_events SELECT * EXCLUDE (step, n, ingested_at), "
                "CAST(? AS TIMESTAMP) - INTERVAL 1 SECOND AS ingested_at FROM test_live.pending WHERE step = ?",
                [until, step],
            )
        res = apply_changes(writer, "ingest-live", since=until - STEP, until=until)
        done.append(
            {
                "step": step,
                "until": until.isoformat(),
                "seqs": list(res.write_seqs),
                "upserted": res.upserted,
                "deleted": res.deleted,
            }
        )
        log.write_text(json.dumps(done))
        if remaining is None and stop_file.exists():
            remaining = after_stop
        if remaining is not None:
            remaining -= 1
            if remaining <= 0:
                break
        time.sleep(pause_s)


def read_public(spec_path: Path, failed: str, stop_file: Path, out: Path) -> None:
    """Read the public name in a loop: every read must see exactly one generation family."""
    spec = parse_spec(spec_path)
    engine = open_engine(spec.warehouse)
    gen = f'"{spec.target.metadata.generation}"'
    seen: dict[str, int] = {"reads": 0, "old": 0, "new": 0, "mixed": 0}
    errors: list[str] = []
    while not stop_file.exists():
        try:
            with engine.session(read_only=True) as s:
                old, new = present(
                    s.fetchone(
                        f"SELECT count(*) FILTER (WHERE {gen} = ?) > 0, "
                        f"count(*) FILTER (WHERE {gen} LIKE 'repair-%') > 0 "
                        f"FROM {spec.target.table_name.sql()}",
                        [failed],
                    )
                )
            seen["reads"] += 1
            seen["mixed" if old and new else "old" if old else "new" if new else "mixed"] += 1
        except Exception as err:  # noqa: BLE001 - every error is an observation
            errors.append(repr(err)[:300])
        out.write_text(json.dumps({**seen, "errors": errors}))
        time.sleep(0.02)


def publish_once(spec_path: Path, incident_id: str, alerts: Path | None = None) -> None:
    """Publish in this process; with ``alerts``, the notice goes to that JSON-lines file (owner ops-oncall)."""
    spec = parse_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec)
    notice = PublishNotice(Notifier(FileChannel(alerts), writer.engine), "ops-oncall") if alerts else None
    print(json.dumps(publish(writer, incident_id, notice=notice), default=str))


def current_plan(spec: DatasetSpec, incident_id: str) -> RepairPlan:
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return present(load_plan(s, incident_id))


def repair_through_library(
    spec: DatasetSpec, incident: Incident, *, wave_size: int = 80, reconcile: bool = True, waves: int | None = None
) -> RepairPlan:
    """Reconcile, plan, build and gate every wave (or the first ``waves``), as the jobs do."""
    if reconcile:
        run_reconciliation(spec, incident.failed_generations, incident_id=incident.incident_id)
    writer = Writer(open_engine(spec.warehouse), spec)
    plan = start_repair(writer, incident, wave_size=wave_size)
    for n in sorted(plan.waves)[:waves]:
        build_wave(writer, current_plan(spec, incident.incident_id), n)
        gate_wave(writer, incident.incident_id, n)
    return current_plan(spec, incident.incident_id)


def key_with_an_older_version(s, namespace: str, partition: str, *, deriving_the_same_partition: bool = False):
    """(txn_id, version) of a key in ``partition`` of ``namespace`` and the latest of its source versions
    older than the one the row holds (with ``deriving_the_same_partition``: an upsert whose event date is
    the row's partition), or None."""
    same = " AND e.op = 'upsert' AND CAST(e.event_ts AS DATE) = t.event_date" if deriving_the_same_partition else ""
    return s.fetchone(
        f"SELECT t.txn_id, max(e.version) FROM {namespace} t JOIN raw.transaction_events e USING (txn_id) "
        f"WHERE CAST(t.event_date AS VARCHAR) = ? AND e.version < t._source_version{same} "
        f"GROUP BY ALL ORDER BY ALL LIMIT 1",
        [partition],
    )


def gate_and_publish(spec: DatasetSpec, incident_id: str) -> dict:
    writer = Writer(open_engine(spec.warehouse), spec)
    gate_candidate(writer, current_plan(spec, incident_id))
    return publish(writer, incident_id)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "ingest":
        live_ingest(Path(args[0]), int(args[1]), float(args[2]), Path(args[3]), int(args[4]), Path(args[5]))
    elif role == "read":
        read_public(Path(args[0]), args[1], Path(args[2]), Path(args[3]))
    elif role == "publish":
        publish_once(Path(args[0]), args[1], Path(args[2]) if len(args) > 2 else None)
    else:
        raise SystemExit(f"unknown role {role}")
