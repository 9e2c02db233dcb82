"""A kill -9 matrix: each phase runs in a child process that is SIGKILLed at a random moment
of its work, then the state is checked and the same step is rerun in process.

Phases (the small orders dataset, composite key, string partitions): ``adopt`` (a plain
target table adopted behind a managed view), ``fence`` (a running backfill fenced),
``evidence`` (the evidence bundle), ``wave`` (one repair wave), ``publish`` (gate-checked
publish that replays ingestion's late writes) and ``restate`` (consumers restated).

After each kill: the public view serves the old or the new result whole (its rows equal
the state before or after an uninterrupted run), the control plane is consistent (the
view reads the namespace the pointer names; no write past the commit clock), and a rerun
converges to the uninterrupted run's result. The suite runs a few points per phase;
``python -m bench kill`` runs 20+.

Kills at the commit (``run_commit_kills``): every named fault point (``faults.checkpoint``) in and
right after the commits of ``contain`` (adoption of the plain target, then the fence), ``evidence``
(the bundle's record), ``assess`` (the reconciliation's results), ``plan`` (the repair generation's
carried rows and plan), ``canary`` (its rows and record, then its gate), ``wave`` (wave 1's rows and
record), ``stop`` (wave 1's gate failing, with the stop of the expansion, then the repair resumed),
``replay`` (the replay to now on its own), ``candidate`` (the replay to now and the publish gates),
``verify`` (a convergence check), ``publish``, ``refuse`` (a publish the preservation gate refuses:
its failed gate and event), ``rollback`` (the pointer moved back, then the read copy), ``release``
(the public name handed back as a plain table), ``restate``, ``notify`` (the restated consumers'
owners told: the delivery, its key and event, the consumer's stamp), ``register`` (a generation
registered, its status set, a fenced one's registration refused and the attempt recorded),
``ingest`` (ingestion's upserts, tombstones and watermark during the repair), ``recur_gate`` (a
guarded backfill's post-build gates), ``recur_publish`` (the gated backfill published, its read
copy exported, its convergence checked and the prior generation released), ``lake_fence`` (a
Delta target's history synced, its fence committed on the table and recorded), ``lake_publish`` (a
repair published in the warehouse committed onto its Delta target: the table's commit, its sync, then
its event), ``draft`` (a draft
incident's file and event), ``output`` (a team's asset output through the IO manager: staged, its
run's generation registered, written, the stage dropped), ``consumer`` (a SQL consumer's output
refreshed) and ``asset_restate`` (a Dagster asset consumer restated: its original captured, its
partitions re-materialized, then its corrected rows, ledger, record, event and check), ``launch`` (a
guarded backfill's manifest, own generation, seed, recompute and build), ``reexecute`` (a team's output
re-executed as a new run after a kill: the killed attempt's stage and empty generation cleared, then its
write), ``decide`` (the impact and decision assets' records), ``lake_adopt`` (a Delta target's adoption),
``registry`` (a run registry from Dagster) and ``patrol`` (the fencing sensor's pass: a backfill's cancel
event, each run's attempt counted) is killed once, injected there, not by timing. After each, no torn state
(``torn_states``: a pointer without its history or view, a public name released with its pointer or
view left (or off its pointer without a release), a fence row without its generation's update or
event, a plan published without its move, a plan without its partitions or event, a partition
recorded built without its write or a wave's write without its record, a gated wave without its
fingerprints or the reverse, a failed gate without the stop of the expansion, a repair stopped (or
building) against its last stop/resume event, results without their timeline event, a ledger without
its restatement or the reverse, a generation without its registration event or namespace, a refused
fenced action or a refused publish without its event or the reverse, a delivered alert without its
event, a notice's stamp apart from its delivery or its ledger rows, a read copy that is not whole, a
guarded backfill's gate result without its event, its publish without its move, generation or event,
its convergence without its event or the prior released, a stop without its event, a lakehouse fence
without its event or at a commit that sets none, a commit after the table's fence judged history, a
lakehouse publish's sync record or event without its table commit, or (once the step ran to its end)
its table commit without its sync record or event, or any of them twice, a guarded backfill without its
manifest's gate and event, seeded without its namespace, seed write or start event, built without its build
event or over a running generation, a stage table or an empty running run generation left once an output
step finished, impact rows without their event, an adopted lakehouse target's write log still at the public
name, a run or backfill stopped in the Dagster instance without its attempt or cancel event, a
draft's event without its file, a run's rows without their write record, a consumer's output apart
from its build record, an asset consumer's restatement without its check or its corrected rows kept),
the kill left the state expected of its point (rolled back whole, or
committed with the rest left to the rerun), and the rerun converges (a refused publish refused
again, its refusal recorded once); after a publish's, a rollback's or a guarded backfill's publish
rerun the BI read copy holds the published view.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import yaml


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple:
    """The one row a state query returns (an aggregate, or a row the phase's template holds)."""
    row = con.execute(sql, params).fetchone() if params is not None else con.execute(sql).fetchone()
    assert row is not None, f"no row for: {sql[:120]}"
    return row


ROOT = Path(__file__).resolve().parents[2]
PHASES = ["adopt", "fence", "evidence", "wave", "publish", "restate"]
PUBLISHING = ("publish", "rollback", "recur_publish")  # phases after whose rerun the read copy holds the public view


# ---- the state each phase starts from ------------------------------------------------------


def build_templates(base: Path) -> dict[str, Path]:
    """One folder per phase, in the state just before the phase runs."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.incident.model import parse_incident
    from recovery.lib.reconcile.run import run_reconciliation
    from recovery.lib.repair.build import start_repair
    from recovery.lib.repair.publish import gate_candidate
    from recovery.lib.snapshot import expected_rows_sql
    from recovery.lib.write.ingest import apply_changes
    from recovery.lib.write.writer import Writer
    from recovery_tests.support.input_fuzz import build_fuzz_dataset, valid_incident
    from recovery_tests.support.repair_support import current_plan, repair_through_library
    from recovery_tests.support.repaired_small import INCIDENT, build_damaged, now

    out = {}
    out["adopt"] = build_fuzz_dataset(base / "adopt")  # mart.orders is a plain table
    out["contain"] = build_fuzz_dataset(base / "contain")  # the same, with bf-7's incident to contain
    (out["contain"] / "incident.yaml").write_text(yaml.safe_dump(valid_incident()))
    damaged = build_damaged(base / "damaged")  # ingested, damaged by bf-7, fenced
    w = damaged.writer
    w.register_generation("bf-8", "backfill")  # a second backfill, still running
    w.write(
        "bf-8",
        f"SELECT * REPLACE (qty + 1 AS qty) FROM ({expected_rows_sql(damaged.spec, None)}) "
        f"WHERE region = 'west' AND order_no % 5 = 0",
        mode="upsert_keys",
    )
    shutil.copytree(base / "damaged", base / "fence")
    out["fence"] = base / "fence"
    shutil.copytree(base / "damaged", base / "evidence")
    out["evidence"] = base / "evidence"
    out["assess"] = base / "evidence"  # not reconciled yet
    out["registry"] = out["contain"]  # a plain target, before containment: its runs' registry next
    out["decide"] = base / "plan"  # reconciled: its impact and decision next
    # repair_through_library's steps (reconcile, plan, the canary built and gated), a template between each
    incident = parse_incident(damaged.incident_path)
    run_reconciliation(damaged.spec, incident.failed_generations, incident_id=incident.incident_id)
    shutil.copytree(base / "damaged", base / "plan")  # reconciled: the repair can start
    out["plan"] = base / "plan"
    repair_writer = Writer(open_engine(damaged.spec.warehouse), damaged.spec)
    start_repair(repair_writer, incident, wave_size=4)
    shutil.copytree(base / "damaged", base / "canary")  # planned: the canary next
    out["canary"] = base / "canary"
    plan = repair_through_library(damaged.spec, incident, wave_size=4, waves=1, reconcile=False)
    shutil.copytree(base / "damaged", base / "wave")  # canary built, wave 1 next
    out["wave"] = base / "wave"
    spec = load_spec(damaged.spec_path)
    writer = Writer(open_engine(spec.warehouse), spec)
    from recovery.lib.repair.build import build_wave
    from recovery.lib.repair.waves import gate_wave

    for n in sorted(plan.waves)[1:]:
        build_wave(writer, current_plan(spec, INCIDENT), n)
        gate_wave(writer, INCIDENT, n)
    shutil.copytree(base / "damaged", base / "candidate")  # every wave built and gated: the candidate next
    out["candidate"] = base / "candidate"
    gate_candidate(writer, current_plan(spec, INCIDENT))
    # ingestion keeps writing after the candidate was gated: publish must replay these
    with writer.engine.transaction() as s:
        s.execute(
            "INSERT INTO src.order_events SELECT * REPLACE (rev + 100 AS rev, qty + 7 AS qty, now()::TIMESTAMP AS "
            "loaded_at) FROM src.order_events WHERE change = 'put' QUALIFY row_number() OVER (PARTITION BY region, "
            "order_no ORDER BY rev DESC) = 1 AND order_no % 9 = 0"
        )
    writer.register_generation("ingest-2", "ingest")
    shutil.copytree(base / "damaged", base / "ingest")  # ingestion's new changes not applied yet
    out["ingest"] = base / "ingest"
    apply_changes(writer, "ingest-2", until=now())
    shutil.copytree(base / "damaged", base / "publish")
    out["publish"] = base / "publish"
    out["replay"] = base / "publish"  # ingestion's late writes not yet replayed into the candidate
    from recovery.lib.repair.publish import publish

    publish(writer, INCIDENT)
    out["restate"] = base / "damaged"  # published: consumers next
    out["release"] = base / "damaged"  # published: the public name can be handed back as a plain table
    out["verify"] = base / "damaged"  # published: convergence can be verified
    out["rollback"] = base / "damaged"  # published: the decision allows rolling back to the prior namespace
    out["register"] = base / "evidence"  # bf-7 fenced: registering it again is refused and recorded
    # a publish the preservation gate refuses: the candidate regated after ingestion's late writes, then
    # one row they put into the repair generation lost
    shutil.copytree(base / "publish", base / "refuse")
    out["refuse"] = base / "refuse"
    spec = load_spec(base / "refuse" / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec)
    gate_candidate(writer, current_plan(spec, INCIDENT), with_diffs=False)
    ns = current_plan(spec, INCIDENT).namespace
    with writer.engine.transaction() as s:
        s.execute(
            f"DELETE FROM {ns} WHERE (region, order_no) = (SELECT (region, order_no) FROM {ns} "
            "WHERE order_no % 9 = 0 ORDER BY region, order_no LIMIT 1)"
        )
    # the consumers restated: their owners' notices next
    shutil.copytree(base / "damaged", base / "notify")
    out["notify"] = base / "notify"
    spec = load_spec(base / "notify" / "spec.yaml")
    from recovery.lib.restatement.restate import restate_consumers

    restate_consumers(open_engine(spec.warehouse), spec, INCIDENT, failed_generations=["bf-7"])
    # wave 1 built, then one of its rows lost: its gate fails and must stop the expansion
    shutil.copytree(base / "wave", base / "stop")
    out["stop"] = base / "stop"
    spec = load_spec(base / "stop" / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec)
    plan = current_plan(spec, INCIDENT)
    build_wave(writer, plan, 1)
    with writer.engine.transaction() as s:
        s.execute(
            f"DELETE FROM {plan.namespace} WHERE (region, order_no) = (SELECT (region, order_no) FROM "
            f"{plan.namespace} WHERE CAST({spec.target.partition} AS VARCHAR) = ? ORDER BY region, order_no LIMIT 1)",
            [plan.waves[1][0]],
        )
    out.update(_guarded_templates(base, base / "damaged"))
    out["draft"] = out["output"] = base / "evidence"  # contained, not reconciled yet
    out["reexecute"] = _reexecute_template(base / "evidence", base / "reexecute")
    out["patrol"] = _patrol_template(base / "evidence", base / "patrol")
    out["consumer"] = base / "damaged"  # published: a consumer's refresh reads the repaired target
    out["lake_fence"] = _lakehouse_template(base / "lake")
    out["lake_publish"] = _lake_publish_template(base / "lake", base / "lake_publish")
    out["lake_adopt"] = _lake_fenced_template(base / "lake", base / "lake_adopt")
    out["asset_restate"] = _asset_consumer_template(base / "damaged", base / "asset_restate")
    return out


ASSET = "marts/orders_by_shard"
ASSET_TABLE = "marts.orders_by_shard"


def _asset_consumer_template(published: Path, d: Path) -> Path:
    """The published, repaired dataset with a Dagster asset downstream of the target (``marts/orders_by_shard``:
    orders and units per shard, stored in ``marts.orders_by_shard`` by the team's IO manager, partitioned by
    shard) as the damage left it: its damaged partitions' units tripled, and no impact traced it (its
    original is captured at the restatement)."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.consumers.assets import damaged_target_partitions
    from recovery.lib.engine import open_engine

    shutil.copytree(published, d)
    raw = yaml.safe_load((d / "spec.yaml").read_text())
    raw["downstream_assets"] = [
        {"asset": ASSET, "key": ["shard"], "table": ASSET_TABLE, "partition": "shard", "owner": "team:sales-ops"}
    ]
    (d / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    spec = load_spec(d / "spec.yaml")
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        damaged = damaged_target_partitions(s, spec, "INC-small")
    assert damaged, "the incident damaged no partition"
    with engine.transaction() as s:
        s.execute("CREATE SCHEMA IF NOT EXISTS marts")
        s.execute(
            f"CREATE TABLE {ASSET_TABLE} AS SELECT shard, count(*) AS orders, sum(qty) * (CASE WHEN shard IN "
            f"({', '.join('?' for _ in damaged)}) THEN 3 ELSE 1 END) AS units FROM mart.orders GROUP BY shard",
            damaged,
        )
    return d


def _lakehouse_template(d: Path) -> Path:
    """The shipments mart as a Delta table (300 shipments; ``sample_data/shipments/build_lakehouse.py``): its
    loads, the failed backfill ``bf-0007`` and its retry as commits, nothing contained yet."""
    import importlib.util

    path = ROOT / "sample_data" / "shipments" / "build_lakehouse.py"
    loader = importlib.util.spec_from_file_location("shipments_build_lakehouse", path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    sys.modules[loader.name] = module
    loader.loader.exec_module(module)
    module.build(d, fmt="delta", shipments=300)
    return d


def _patrol_template(contained: Path, d: Path) -> Path:
    """The contained dataset (bf-7 fenced) with a Dagster instance of its own (``dagster/``, the project's
    ``dagster.yaml``) holding a backfill of bf-7 requested again and two runs of bf-7 queued after the fence (a
    relaunch and its retry)."""
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from recovery.lib.write.fencing import GENERATION_TAG

    shutil.copytree(contained, d)
    (d / "dagster").mkdir()
    shutil.copy(ROOT / "dagster.yaml", d / "dagster" / "dagster.yaml")
    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="recovery.definitions")), "__repository__"
        ),
        "__ASSET_JOB",
    )
    with dg.DagsterInstance.from_config(str(d / "dagster")) as instance:
        instance.add_backfill(
            PartitionBackfill(
                backfill_id=PATROL_BACKFILL,
                status=BulkActionStatus.REQUESTED,
                from_failure=False,
                tags={GENERATION_TAG: "bf-7"},
                backfill_timestamp=time.time(),
            )
        )
        for run_id, parent in ((PATROL_RUNS[0], None), (PATROL_RUNS[1], PATROL_RUNS[0])):
            instance.add_run(
                dg.DagsterRun(
                    job_name="__ASSET_JOB",
                    run_id=run_id,
                    status=dg.DagsterRunStatus.QUEUED,
                    tags={GENERATION_TAG: "bf-7"},
                    parent_run_id=parent,
                    root_run_id=parent,
                    remote_job_origin=origin,
                )
            )
    return d


def _lake_fenced_template(lake: Path, d: Path) -> Path:
    """The Delta dataset with its table fenced and recorded (containment's first step): its adoption next."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.lakehouse.fence import fence_table

    shutil.copytree(lake, d)
    spec = load_spec(d / "spec.yaml", check_warehouse=False)
    fence_table(open_engine(spec.warehouse), spec, LAKE_INCIDENT, ["bf-0007"], actor="kill-matrix")
    return d


def _lake_publish_template(lake: Path, d: Path) -> Path:
    """The Delta dataset contained, reconciled and repaired through the CLI, its candidate gated and published
    in the warehouse (the pointer moved): the table's own publish commit next."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.repair.publish import gate_candidate, publish
    from recovery.lib.write.writer import Writer
    from recovery_tests.support.foreign_warehouse import cli
    from recovery_tests.support.repair_support import current_plan

    shutil.copytree(lake, d)
    for verb in ("contain", "assess", "repair"):
        r = cli(d.parent / "lake_home", verb, "--incident", str(d / "incident.yaml"))
        if r.code != 0:
            raise AssertionError((verb, r.out))
    spec = load_spec(d / "spec.yaml", check_warehouse=False)
    writer = Writer(open_engine(spec.warehouse), spec, actor="kill-matrix")
    gate_candidate(writer, current_plan(spec, LAKE_INCIDENT))
    publish(writer, LAKE_INCIDENT)
    return d


PATROL_BACKFILL = "kbf0007"
PATROL_RUNS = ("0000aaaa-0000-4000-8000-000000000001", "0000aaaa-0000-4000-8000-000000000002")
BACKFILL_ID = "recur-1"
OUTPUT_RUN = "k3run"
REEXECUTED_RUN = "k3run2"  # Dagster's re-execution of OUTPUT_RUN (its parent and root run)


def _reexecute_template(contained: Path, d: Path) -> Path:
    """The contained dataset as a team's asset run ``OUTPUT_RUN`` left it when killed after its IO manager staged
    its output and registered its run's generation: the stage table, the generation with no write."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.write.managed_output import stage_table
    from recovery.lib.write.writer import Writer

    shutil.copytree(contained, d)
    spec = load_spec(d / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec, actor="kill-matrix")
    writer.ensure()
    with writer.engine.transaction() as s:
        s.execute("CREATE SCHEMA IF NOT EXISTS recovery_io")
        s.execute(f"CREATE TABLE {stage_table(OUTPUT_RUN, 'orders')} AS SELECT * FROM mart.orders LIMIT 3")
    writer.register_generation(f"run-{OUTPUT_RUN}", "ingest", run_id=OUTPUT_RUN)
    return d


def _empty_runs(con: duckdb.DuckDBPyConnection) -> list:
    """A run's generations still running with no write (a run killed before its write, never ended)."""
    return con.execute(
        "SELECT generation FROM _recovery.generations WHERE run_id IS NOT NULL AND writes = 0 AND status = 'running' "
        "ORDER BY 1"
    ).fetchall()


def _backfill_request():
    """The guarded backfill of three east partitions the recurrence phases launch, gate and publish."""
    from recovery.lib.recurrence.request import BackfillRequest

    return BackfillRequest(
        start="east-202601",
        end="east-202603",
        recompute="transform",
        requested_by="data-platform-oncall",
        approved_by=["head-of-data", "data-platform-lead"],
        allow_current_partitions=True,
        backfill_id=BACKFILL_ID,
    )


def _launch(writer: Any) -> Any:
    """The guarded backfill launched as its asset (``guarded_backfill_generation``) does: preflight, start (the
    manifest, the own generation, the seed), then the recompute built."""
    from recovery.lib.recurrence.launch import build_backfill, preflight, start_backfill
    from recovery.lib.recurrence.recompute import resolve_recompute

    request = _backfill_request()
    rec = start_backfill(writer, preflight(writer, request))
    if rec.status == "building":
        rec = build_backfill(writer, rec, resolve_recompute(request.recompute))
    if rec.status != "built":
        raise AssertionError(f"the guarded backfill is {rec.status}: {rec.reason}")
    return rec


def _guarded_templates(base: Path, published: Path) -> dict[str, Path]:
    """The published, repaired dataset (its read copy exported) with a guarded backfill of three east
    partitions declared (``launch``: its preflight, manifest, generation, seed and build next), built
    (``recur_gate``: its gates next), then gated (``recur_publish``: its publish and the release of the prior
    next)."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.recurrence.publish import gate_backfill
    from recovery.lib.write.writer import Writer

    shutil.copytree(published, base / "launch")
    # the range's partitions hold a dozen rows each: their quantiles against the history's are noise
    raw = yaml.safe_load((base / "launch" / "spec.yaml").read_text())
    raw["recurrence"] = {"anomaly": {"columns": {"qty": {"max_quantile_shift": 100, "max_mean_shift": 100}}}}
    (base / "launch" / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.copytree(base / "launch", base / "recur_gate")
    spec = load_spec(base / "recur_gate" / "spec.yaml")
    _launch(Writer(open_engine(spec.warehouse), spec, actor="kill-matrix"))
    shutil.copytree(base / "recur_gate", base / "recur_publish")
    spec = load_spec(base / "recur_publish" / "spec.yaml")
    results, _ = gate_backfill(Writer(open_engine(spec.warehouse), spec, actor="kill-matrix"), BACKFILL_ID)
    if not all(r.passed for r in results):
        raise AssertionError([r for r in results if not r.passed])
    return {"launch": base / "launch", "recur_gate": base / "recur_gate", "recur_publish": base / "recur_publish"}


# ---- the phases, as a child process runs them --------------------------------------------


def run_phase(phase: str, d: Path) -> None:
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.write.writer import Writer

    if phase == "lake_fence":  # containment's first step on a Delta target: the fence on the table, recorded
        from recovery.lib.lakehouse.fence import fence_table

        spec = load_spec(d / "spec.yaml", check_warehouse=False)
        fence_table(open_engine(spec.warehouse), spec, LAKE_INCIDENT, ["bf-0007"], actor="kill-matrix")
        return
    if phase == "lake_adopt":  # containment's adoption on a Delta target (adopt_target): the fence found on the
        # table, the warehouse's copy adopted, then the write log's rows pointed at the adopted namespace
        from recovery.lib.lakehouse.adoption import adopted_lakehouse
        from recovery.lib.lakehouse.fence import fence_table
        from recovery.lib.pointers.adoption import adopt

        spec = load_spec(d / "spec.yaml", check_warehouse=False)
        engine = open_engine(spec.warehouse)
        fence = fence_table(engine, spec, LAKE_INCIDENT, ["bf-0007"], actor="kill-matrix")
        adopted_lakehouse(engine, spec, adopt(engine, spec, actor="kill-matrix", incident_id=LAKE_INCIDENT), fence)
        return
    if phase == "lake_publish":  # the repair published in the warehouse: its one commit onto the table, recorded
        from recovery.defs.repair.lakehouse import publish_onto_table

        publish_onto_table(load_spec(d / "spec.yaml", check_warehouse=False), LAKE_INCIDENT)
        return
    if phase == "patrol":  # the fencing sensor's pass: the fenced generation's runs relaunched after the fence
        # stopped, each counted once with its event, then its owner alerted
        import dagster as dg

        from recovery.defs.containment.patrol import patrol
        from recovery.lib.notify import FileChannel, Notifier

        spec = load_spec(d / "spec.yaml")
        engine = open_engine(spec.warehouse)
        with dg.DagsterInstance.from_config(str(d / "dagster")) as instance:
            report = patrol(instance, engine, Notifier(FileChannel(d / "alerts.jsonl"), engine))
        if report.alert_failures:
            raise AssertionError(report.alert_failures)
        return
    if phase == "registry":  # `recovery registry --from-dagster`'s record: the backfill's runs (as the instance
        # listed them) written as the team's run registry table, replaced whole
        from datetime import datetime

        from recovery.launch.dagster_registry import DagsterRun, write_registry

        at = datetime(2026, 3, 2)
        runs = [
            DagsterRun("ingest-1", "ingest", None, "SUCCESS", at.replace(day=1), at.replace(day=1, hour=1)),
            DagsterRun("bf-7", "backfill", "dbf-7", "FAILURE", at, at.replace(hour=2)),
        ]
        write_registry(load_spec(d / "spec.yaml"), runs, "dbf-7", "ops.dagster_runs")
        return
    if phase == "decide":  # the assess job's impact and decision assets materialized (one commit each)
        import dagster as dg
        from dagster_duckdb import DuckDBResource

        from recovery.defs.decision.assets import decision as decision_asset
        from recovery.defs.impact.assets import impact as impact_asset
        from recovery.defs.resources import WarehouseResource

        config = {"config": {"incident_file": str(d / "incident.yaml")}}
        materialized = dg.materialize(
            [impact_asset, decision_asset],
            resources={
                "warehouse": WarehouseResource(
                    spec_path=str(d / "spec.yaml"), duckdb=DuckDBResource(database=str(d / "wh.duckdb"))
                )
            },
            run_config={"ops": {"incident__impact": config, "incident__decision": config}},
            instance=dg.DagsterInstance.ephemeral(),
            raise_on_error=True,
        )
        assert materialized.success
        return
    spec = load_spec(d / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec, actor="kill-matrix")
    if phase == "adopt":
        writer.ensure()
    elif phase == "contain":  # the library's part of `recovery contain`: adopt the plain target, then fence
        from recovery.lib.incident.model import parse_incident
        from recovery.lib.pointers.adoption import adopt
        from recovery.lib.write.fencing import fence_incident

        incident = parse_incident(d / "incident.yaml")
        adopt(writer.engine, spec, actor=incident.requested_by, incident_id=incident.incident_id)
        fence_incident(Writer(writer.engine, spec, actor=incident.requested_by), incident)
    elif phase == "fence":
        writer.fence("bf-8", incident_id="INC-small", fenced_by="kill-matrix")
    elif phase == "evidence":
        from recovery.lib.control.run_history import RunHistory
        from recovery.lib.evidence import build_evidence
        from recovery.lib.incident.model import check_incident, parse_incident

        incident = parse_incident(d / "incident.yaml")
        build_evidence(incident, check_incident(incident), writer.engine, RunHistory("none"), actor="kill-matrix")
    elif phase == "wave":
        from recovery.lib.repair.build import build_wave
        from recovery_tests.support.repair_support import current_plan

        build_wave(writer, current_plan(spec, "INC-small"), 1)  # the template has the canary (wave 0) built
    elif phase == "assess":  # the key-by-key reconciliation, recorded
        from recovery.lib.reconcile.run import run_reconciliation

        run_reconciliation(spec, ["bf-7"], incident_id="INC-small")
    elif phase == "plan":  # the repair generation started: the carried rows and the plan
        from recovery.lib.incident.model import parse_incident
        from recovery.lib.repair.build import start_repair

        start_repair(writer, parse_incident(d / "incident.yaml"), wave_size=4)
    elif phase == "canary":  # the canary built, then gated
        from recovery.lib.repair.build import build_wave
        from recovery.lib.repair.waves import gate_wave
        from recovery_tests.support.repair_support import current_plan

        build_wave(writer, current_plan(spec, "INC-small"), 0)
        gate_wave(writer, "INC-small", 0)
    elif phase == "rollback":  # as the rollback job's step: decide, then roll back
        from recovery.lib.decision import decide
        from recovery.lib.repair.publish import rollback

        with writer.engine.session(read_only=True) as s:
            decision = decide(s, spec, ["bf-7"])
        rollback(Writer(writer.engine, spec, actor="rollback"), "INC-small", decision)
    elif phase == "candidate":  # the whole generation replayed to now and gated
        from recovery.lib.repair.publish import gate_candidate
        from recovery_tests.support.repair_support import current_plan

        gate_candidate(writer, current_plan(spec, "INC-small"))
    elif phase == "verify":
        from recovery.lib.convergence.verify import verify_convergence

        verify_convergence(writer.engine, spec, incident_id="INC-small", actor="kill-matrix")
    elif phase == "publish":
        from recovery.lib.repair.publish import publish

        publish(writer, "INC-small")
    elif phase == "refuse":  # a publish the preservation gate refuses: the refusal recorded, nothing moved
        from recovery.lib.errors import GateRefusedError
        from recovery.lib.repair.publish import publish

        try:
            publish(writer, "INC-small")
        except GateRefusedError:
            pass
        else:
            raise AssertionError("the publish was not refused")
    elif phase == "replay":  # the candidate's replay to now on its own (as the candidate asset's first step)
        from recovery.lib.repair.publish import replay_to_now
        from recovery_tests.support.repair_support import current_plan

        replay_to_now(writer, current_plan(spec, "INC-small"), stage="candidate")
    elif phase == "release":  # the public name handed back as a plain table (recovery release)
        from recovery.lib.pointers.adoption import release

        release(writer.engine, spec, actor="kill-matrix")
    elif phase == "notify":  # the restated consumers' owners told, each once, through a file channel
        from recovery.lib.notify import FileChannel, Notifier
        from recovery.lib.restatement.notices import notify_owners

        failures = notify_owners(
            writer.engine, spec, "INC-small", Notifier(FileChannel(d / "alerts.jsonl"), writer.engine)
        )
        if failures:
            raise AssertionError(failures)
    elif phase == "stop":  # wave 1's gate fails (a row lost after its build) and stops the expansion; then resumed
        from recovery.lib.repair.build import resume
        from recovery.lib.repair.waves import gate_wave
        from recovery_tests.support.repair_support import current_plan

        if all(r.passed for r in gate_wave(writer, "INC-small", 1)):
            raise AssertionError("wave 1's gate passed")
        resume(writer, current_plan(spec, "INC-small"), actor="kill-matrix", note="reviewed")
    elif phase == "register":  # a generation registered and finished; a fenced one refused and the attempt recorded
        from recovery.lib.errors import FencedGenerationError

        writer.register_generation("bf-9", "backfill", own_namespace=True)
        writer.set_status("bf-9", "succeeded")
        try:
            writer.register_generation("bf-7", "backfill")
        except FencedGenerationError:
            pass
        else:
            raise AssertionError("the fenced generation was registered again")
    elif phase == "ingest":  # ingestion's late changes applied while the repair builds
        from recovery.lib.write.ingest import apply_changes
        from recovery_tests.support.repaired_small import now

        apply_changes(writer, "ingest-2", until=now())
    elif phase == "launch":  # a guarded backfill launched through its asset's steps: manifest to build
        _launch(writer)
    elif phase == "recur_gate":  # a built guarded backfill's post-build gates, recorded (the job's blocking checks)
        from recovery.lib.recurrence.publish import gate_backfill

        gate_backfill(writer, BACKFILL_ID)
    elif phase == "recur_publish":  # the gated backfill published (the read copy after), then the prior released
        from recovery.lib.recurrence.publish import publish_backfill, verify_backfill_convergence

        result = publish_backfill(writer, BACKFILL_ID)
        if not result["published"]:
            raise AssertionError(f"the guarded backfill was not published: {result['reason']}")
        if not verify_backfill_convergence(writer, BACKFILL_ID)["converged"]:
            raise AssertionError("the published backfill did not converge")
    elif phase == "draft":  # the draft incident opened for a failed Dagster backfill (the sensor's step)
        from recovery.lib.incident.draft import FailedBackfill, open_draft

        failed = FailedBackfill("bf-9", "COMPLETED_FAILED", ("backfill-bf-9",), ("east-202601",), ("run-9",))
        open_draft(writer.engine, d / "spec.yaml", spec, failed, requested_by="data-platform-oncall")
    elif phase in ("output", "reexecute"):  # a team's asset output through the IO manager: staged, written as its
        # run's generation ("reexecute": as Dagster's re-execution of a run killed after it registered its
        # generation, which first clears that attempt's stage and empty generation)
        from recovery.lib.snapshot import expected_rows_sql
        from recovery.lib.write.managed_output import (
            RunGeneration,
            clear_superseded,
            drop_stage,
            stage_table,
            write_output,
        )

        run_id, earlier = (OUTPUT_RUN, []) if phase == "output" else (REEXECUTED_RUN, [OUTPUT_RUN])
        run = RunGeneration(f"run-{run_id}", "ingest", None)
        clear_superseded(writer, run, run_id, "orders", earlier)  # as the IO manager does first
        stage = stage_table(run_id, "orders")  # the step retried in its run: the same stage and generation
        with (
            writer.engine.transaction() as s
        ):  # the frame the asset computed from its input, as the type handler stages it
            s.execute("CREATE SCHEMA IF NOT EXISTS recovery_io")
            s.execute(
                f"CREATE OR REPLACE TABLE {stage} AS SELECT * REPLACE (qty + 1 AS qty) FROM "
                f"({expected_rows_sql(spec, None)}) WHERE shard = 'east-202601'"
            )
        write_output(writer, stage, run=run, run_id=run_id, partitions=["east-202601"])
        drop_stage(writer, stage)  # as the IO manager does once the write returns
    elif phase == "consumer":  # a SQL consumer refreshed from the published repair (its output published anew)
        from recovery.lib.consumers.sql import materialize_consumer

        materialize_consumer(writer.engine, spec, spec.downstream[0])
    elif phase == "asset_restate":  # a Dagster asset consumer restated: its original kept, its partitions
        # re-materialized (as the team's IO manager writes them, in its own transaction), then the corrected
        # rows kept with the ledger, the record, its event and its check
        from recovery.lib import faults
        from recovery.lib.consumers.assets import PartitionScope, damaged_target_partitions
        from recovery.lib.restatement.assets import original_for, record_restated
        from recovery.lib.restatement.checks import MaterializationRun

        a = spec.downstream_assets[0]
        with writer.engine.session(read_only=True) as s:
            damaged = damaged_target_partitions(s, spec, "INC-small")
        original = original_for(
            writer.engine,
            spec,
            a,
            incident_id="INC-small",
            partitions=damaged,
            scope=PartitionScope(a.partition, tuple(damaged)),
            field="downstream_assets[0]",
        )
        with writer.engine.transaction() as s:  # the team's code on the repaired target, through its IO manager
            where = original.scope.predicate()
            s.execute(f"DELETE FROM {ASSET_TABLE} WHERE {where}")
            s.execute(
                f"INSERT INTO {ASSET_TABLE} SELECT shard, count(*), sum(qty) FROM mart.orders WHERE {where} "
                "GROUP BY shard"
            )
        faults.checkpoint("asset_restate:materialized")
        record_restated(
            writer.engine,
            spec,
            a,
            incident_id="INC-small",
            original=original,
            runs=[MaterializationRun(p, f"run-{p}", True) for p in original.partitions],
            actor="kill-matrix",
            run_id="k4run",
        )
    elif phase == "restate":
        from recovery.lib.restatement.restate import restate_consumers

        restate_consumers(writer.engine, spec, "INC-small", failed_generations=["bf-7"])
    else:
        raise ValueError(phase)


# ---- what is checked -----------------------------------------------------------------------


def _con(d: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(d / "wh.duckdb"), read_only=True)


def observe(phase: str, d: Path) -> dict:
    """The phase's outcome, independent of wall-clock stamps: what must equal the uninterrupted run."""
    if phase.startswith("lake_"):
        return _observe_lake(d)
    con = _con(d)
    try:

        def digest(sql: str) -> str:
            rows = sorted(con.execute(sql).fetchall(), key=repr)
            return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]

        public = digest("SELECT * EXCLUDE (landed_at) FROM mart.orders")
        state: dict[str, Any] = {"public": public}
        cp = _one(con, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = '_recovery'")[0]
        if cp:
            state["pointer"] = con.execute("SELECT namespace FROM _recovery.pointers").fetchall()
            state["fenced"] = con.execute(
                "SELECT generation, token FROM _recovery.generations WHERE fenced_at IS NOT NULL ORDER BY 1"
            ).fetchall()
            state["fences"] = con.execute("SELECT generation, token FROM _recovery.fences ORDER BY 1, 2").fetchall()
        tables = (
            {
                n
                for (n,) in con.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = '_recovery'"
                ).fetchall()
            }
            if cp
            else set()
        )
        if phase in ("wave", "publish", "canary", "candidate", "stop", "replay", "refuse") or (
            phase == "plan" and "repair_plans" in tables
        ):
            state["plan"] = con.execute("SELECT status FROM _recovery.repair_plans").fetchall()
            ns = con.execute("SELECT namespace FROM _recovery.repair_plans").fetchone()
            state["repair_rows"] = digest(f"SELECT * EXCLUDE (landed_at) FROM {ns[0]}") if ns else None
        if phase in ("wave", "plan", "canary", "stop") and "repair_partitions" in tables:
            state["partitions"] = con.execute(
                "SELECT partition, wave, status, rows_after, round(total_after, 6) FROM _recovery.repair_partitions "
                "ORDER BY ALL"
            ).fetchall()
            # (the fingerprint itself hashes the plan's own stamp: another run's differs)
            state["fingerprints"] = con.execute(
                "SELECT partition, rows, stage FROM _recovery.repair_fingerprints ORDER BY ALL"
            ).fetchall()
        if phase == "replay":
            # the last other generation's write the high watermark covers (the watermark itself is the clock,
            # which the replay's own writes into the repair generation move: a second replay sets it past them)
            state["replayed_through"] = con.execute(
                "SELECT max(w.seq) FROM _recovery.writes w, _recovery.repair_plans p WHERE w.generation <> "
                "p.generation AND w.seq <= p.high_seq"
            ).fetchall()
        if phase == "candidate":
            state["high_seq"] = con.execute("SELECT high_seq FROM _recovery.repair_plans").fetchall()
            state["gates"] = con.execute(
                "SELECT DISTINCT stage, gate, passed FROM _recovery.gate_results ORDER BY ALL"
            ).fetchall()
            state["diffs"] = digest("SELECT * FROM _recovery.repair_diffs")
        if phase == "refuse":  # each refusal recorded once, whatever the reruns
            state["refusals"] = con.execute(
                "SELECT gate, passed, observed, count(*) FROM _recovery.gate_results WHERE stage = 'publish' "
                "GROUP BY ALL ORDER BY ALL"
            ).fetchall()
        if phase == "register":
            state["generations"] = con.execute(
                "SELECT generation, kind, status, namespace IS NOT NULL, fenced_at IS NOT NULL "
                "FROM _recovery.generations ORDER BY 1"
            ).fetchall()
            state["attempts"] = con.execute(
                "SELECT DISTINCT generation, action FROM _recovery.fence_attempts ORDER BY ALL"
            ).fetchall()
        if phase == "ingest":
            state["watermarks"] = con.execute(
                "SELECT generation, source_watermark IS NOT NULL FROM _recovery.generations WHERE kind = 'ingest' "
                "ORDER BY 1"
            ).fetchall()
        if phase == "draft":
            state["drafted"] = _one(con, "SELECT count(*) FROM _recovery.timeline WHERE kind = 'incident_drafted'")[0]
        if phase in ("output", "reexecute"):
            state["stages"] = _one(
                con, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'recovery_io'"
            )[0]
            state["writes"] = con.execute(  # (a step retried after its write writes the same rows again)
                "SELECT DISTINCT generation, mode, partitions FROM _recovery.writes WHERE generation = ?",
                [f"run-{OUTPUT_RUN if phase == 'output' else REEXECUTED_RUN}"],
            ).fetchall()
            state["open_runs"] = _empty_runs(con)
        if phase == "launch":
            state["backfill"] = (
                con.execute(
                    "SELECT b.status, b.namespace IS NOT NULL, b.seed_seq IS NOT NULL, g.status, g.namespace = "
                    "b.namespace FROM _recovery.backfills b LEFT JOIN _recovery.generations g USING (generation) "
                    "WHERE b.backfill_id = ?",
                    [BACKFILL_ID],
                ).fetchall()
                if "backfills" in tables
                else []
            )
            state["backfill_gates"] = (
                con.execute(
                    "SELECT DISTINCT stage, gate, passed FROM _recovery.backfill_gates WHERE backfill_id = ? "
                    "ORDER BY ALL",
                    [BACKFILL_ID],
                ).fetchall()
                if "backfill_gates" in tables
                else []
            )
            built = (
                con.execute("SELECT namespace FROM _recovery.backfills WHERE backfill_id = ?", [BACKFILL_ID]).fetchone()
                if "backfills" in tables
                else None
            )
            state["built_rows"] = (
                digest(f"SELECT * EXCLUDE (landed_at) FROM {built[0]}") if built and built[0] else None
            )
        if phase in ("recur_gate", "recur_publish"):
            state["backfill"] = con.execute(
                "SELECT status, published_seq IS NOT NULL, converged_seq IS NOT NULL FROM _recovery.backfills "
                "WHERE backfill_id = ?",
                [BACKFILL_ID],
            ).fetchall()
            state["backfill_gates"] = con.execute(
                "SELECT DISTINCT stage, gate, passed FROM _recovery.backfill_gates WHERE backfill_id = ? ORDER BY ALL",
                [BACKFILL_ID],
            ).fetchall()
            state["namespaces"] = con.execute(
                "SELECT namespace, status FROM _recovery.namespaces ORDER BY ALL"
            ).fetchall()
        if phase == "release":
            state["managed"] = con.execute(
                "SELECT table_type FROM information_schema.tables WHERE table_schema = 'mart' AND table_name = 'orders'"
            ).fetchall()
            state["moves"] = con.execute(
                "SELECT public_name, from_namespace, to_namespace, reason FROM _recovery.pointer_history "
                "WHERE public_name = 'mart.orders' ORDER BY seq"
            ).fetchall()
            state["namespaces"] = con.execute(
                "SELECT namespace, status FROM _recovery.namespaces ORDER BY ALL"
            ).fetchall()
        if phase == "notify":
            state["notified"] = con.execute(
                "SELECT consumer, notified_at IS NOT NULL FROM _recovery.restatements ORDER BY 1"
            ).fetchall()
            state["delivered"] = (
                con.execute("SELECT dedupe_key FROM _recovery.notifications ORDER BY 1").fetchall()
                if "notifications" in tables
                else []
            )
        if phase == "registry":
            state["registry"] = (
                con.execute("SELECT * FROM ops.dagster_runs ORDER BY ALL").fetchall()
                if _one(con, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'ops'")[0]
                else None
            )
        if phase == "patrol":
            state["run_attempts"] = con.execute(
                "SELECT run_id, action, count(*) FROM _recovery.fence_attempts WHERE action LIKE 'run:%' GROUP BY ALL "
                "ORDER BY ALL"
            ).fetchall()
            state["alerted"] = (
                _one(con, "SELECT count(*) FROM _recovery.notifications WHERE dedupe_key LIKE 'fence-attempt:%'")[0]
                if "notifications" in tables
                else 0
            )
        if phase == "decide":
            state["impact"] = digest("SELECT * FROM _recovery.impact__orders") if "impact__orders" in tables else None
        if phase == "assess":
            recon = "recon__orders" in tables
            state["recon"] = digest("SELECT * FROM _recovery.recon__orders") if recon else None
        if phase == "verify" and "convergence__orders" in tables:
            state["last_check"] = digest(
                "SELECT * EXCLUDE (check_id, checked_at, pending_oldest) FROM _recovery.convergence__orders "
                "WHERE check_id = (SELECT max(check_id) FROM _recovery.convergence__orders)"
            )
        if cp and phase in (
            "contain",
            "fence",
            "publish",
            "restate",
            "assess",
            "patrol",
            "decide",
            "plan",
            "canary",
            "wave",
            "candidate",
            "verify",
            "rollback",
            "stop",
            "refuse",
            "register",
            "replay",
            "notify",
            "release",
            "launch",
            "recur_gate",
            "recur_publish",
            "draft",
            "output",
            "reexecute",
            "consumer",
            "asset_restate",
        ):
            # what the phase put on the timeline: each (kind, subject) once, whatever the reruns
            state["timeline"] = con.execute(
                "SELECT DISTINCT kind, coalesce(json_extract_string(details, '$.generation'), "
                "json_extract_string(details, '$.consumer'), '') FROM _recovery.timeline ORDER BY ALL"
            ).fetchall()
        if phase in PUBLISHING:
            state["read_copy"] = _read_copy_digest(d)
        if phase == "asset_restate":
            state["asset"] = digest(f"SELECT * FROM {ASSET_TABLE}")
            state["asset_copies"] = con.execute(  # the original and corrected rows kept, never pointed at
                "SELECT namespace, status FROM _recovery.namespaces WHERE dataset = ? ORDER BY 1",
                [f"orders:{ASSET}"],
            ).fetchall()
        if phase in ("restate", "asset_restate"):
            tables = {
                n
                for (n,) in con.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = '_recovery'"
                ).fetchall()
            }
            state["restatements"] = (
                con.execute(
                    "SELECT consumer, original_namespace, corrected_namespace, ledger_rows, material_rows, "
                    "round(original_total, 6), round(corrected_total, 6) FROM _recovery.restatements ORDER BY 1"
                ).fetchall()
                if "restatements" in tables
                else []
            )
            ledger = sorted(n for n in tables if n.startswith("restatement_ledger__"))
            state["ledger"] = digest(f"SELECT * EXCLUDE (notified_at) FROM _recovery.{ledger[0]}") if ledger else None
            state["checks"] = (
                con.execute(
                    "SELECT DISTINCT consumer, check_name, passed FROM _recovery.restatement_checks ORDER BY ALL"
                ).fetchall()
                if "restatement_checks" in tables
                else []
            )
        if phase == "evidence":
            state["evidence_events"] = _one(
                con, "SELECT count(*) FROM _recovery.timeline WHERE kind = 'evidence_preserved'"
            )[0]
        if phase == "consumer":
            state["builds"] = con.execute(
                "SELECT consumer, namespace, row_count, reason FROM _recovery.consumer_builds ORDER BY ALL"
            ).fetchall()
        if phase in ("restate", "consumer"):
            state["consumers"] = {
                name: digest(f"SELECT * FROM consumers.{name}")
                for (name,) in con.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'consumers' "
                    "AND table_type = 'VIEW' "
                    "ORDER BY 1"
                ).fetchall()
            }
    finally:
        con.close()
    if phase == "notify":  # delivered at least once each (a kill between the delivery and its record re-delivers)
        alerts = d / "alerts.jsonl"
        state["alerts"] = (
            sorted({json.loads(line)["dedupe_key"] for line in alerts.read_text().splitlines()})
            if alerts.exists()
            else []
        )
    if phase == "draft":
        draft = d / "incidents" / "INC-DRAFT-bf-9.yaml"
        state["draft_file"] = (  # (it names itself by its path: the copy's folder left out)
            hashlib.sha256(draft.read_text().replace(str(d), "").encode()).hexdigest()[:16] if draft.exists() else None
        )
    if phase == "evidence":
        bundle = d / "evidence" / "INC-small"
        state["bundle"] = (
            sorted(
                (f["path"], f["rows"])
                for f in json.loads((bundle / "manifest.json").read_text())["files"]
                if f["path"].endswith(".parquet")
            )
            if (bundle / "manifest.json").exists()
            else None
        )
    return state


def consistency_problems(phase: str, d: Path, *, finished: bool = False) -> list[str]:
    """The control plane agrees with the catalog, and no half-built thing is visible (``finished``: the step
    ran to its end, so nothing it commits outside the control plane may be left unrecorded)."""
    if phase.startswith("lake_"):
        return _lake_problems(d) + _lake_publish_problems(d, finished=finished)
    problems = []
    con = _con(d)
    try:
        if _one(con, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = '_recovery'")[0]:
            view = con.execute(
                "SELECT sql FROM duckdb_views() WHERE schema_name = 'mart' AND view_name = 'orders'"
            ).fetchall()
            pointer = con.execute(
                "SELECT namespace FROM _recovery.pointers WHERE public_name = 'mart.orders'"
            ).fetchall()
            if view and pointer and pointer[0][0].split(".")[-1] not in view[0][0]:
                problems.append(f"view reads other than pointer {pointer[0][0]}")
            if not view and pointer:
                problems.append("pointer without a managed view")
            clock = _one(con, "SELECT seq FROM _recovery.clock")[0]
            late = _one(con, "SELECT count(*) FROM _recovery.writes WHERE seq > ?", [clock])[0]
            if late:
                problems.append(f"{late} writes past the commit clock")
            fenced_without = _one(
                con,
                "SELECT count(*) FROM _recovery.generations g WHERE fenced_at IS NOT NULL AND NOT "
                "EXISTS (SELECT 1 FROM _recovery.fences f WHERE f.generation = g.generation)",
            )[0]
            if fenced_without:
                problems.append("a generation fenced without its fence record")
            problems += torn_states(con)
    finally:
        con.close()
    if phase in PUBLISHING:
        problems += read_copy_problems(d)
    if phase == "patrol":  # a run the sensor stopped (its instance's runs, read from its SQLite file) is counted
        import sqlite3

        runs = sqlite3.connect(str(d / "dagster" / "history" / "runs.db"))
        try:
            stopped = {r for (r,) in runs.execute("SELECT run_id FROM runs WHERE status IN ('CANCELED', 'CANCELING')")}
        finally:
            runs.close()
        con = _con(d)
        try:
            counted = {
                r
                for (r,) in con.execute(
                    "SELECT run_id FROM _recovery.fence_attempts WHERE action LIKE 'run:%'"
                ).fetchall()
            }
        finally:
            con.close()
        if stopped - counted:
            problems.append(
                f"runs of a fenced generation stopped without their attempt counted: {sorted(stopped - counted)}"
            )
        runs = sqlite3.connect(str(d / "dagster" / "history" / "runs.db"))
        try:
            cancelled = {
                k for (k,) in runs.execute("SELECT key FROM bulk_actions WHERE status IN ('CANCELING', 'CANCELED')")
            }
        finally:
            runs.close()
        con = _con(d)
        try:
            told = {
                b
                for (b,) in con.execute(
                    "SELECT json_extract_string(details, '$.backfill_id') FROM _recovery.timeline WHERE kind IN "
                    "('fence_cancel_backfill', 'containment_cancel_backfill')"
                ).fetchall()
            }
        finally:
            con.close()
        if cancelled - told:
            problems.append(
                f"backfills of a fenced generation cancelled without their event: {sorted(cancelled - told)}"
            )
        con = _con(d)
        try:
            twice = con.execute(
                "SELECT json_extract_string(details, '$.backfill_id') FROM _recovery.timeline "
                "WHERE kind = 'fence_cancel_backfill' GROUP BY 1 HAVING count(*) > 1"
            ).fetchall()
        finally:
            con.close()
        if twice:
            problems.append(f"a backfill's cancel by the fencing sensor recorded twice: {sorted(r[0] for r in twice)}")
    if finished and phase in ("output", "reexecute"):  # the step ended: nothing of any attempt's left behind
        con = _con(d)
        try:
            stages = con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'recovery_io' ORDER BY 1"
            ).fetchall()
            empty = _empty_runs(con)
        finally:
            con.close()
        if stages:
            problems.append(f"stage tables left once the output was written: {stages}")
        if empty:
            problems.append(f"run generations left running with no write: {empty}")
    if phase == "evidence":
        bundle = d / "evidence" / "INC-small"
        if bundle.exists():
            from recovery.lib.evidence import verify_bundle

            v = verify_bundle(bundle)
            if not v.ok:
                problems.append(f"bundle does not verify: {v.problems[:2]}")
    return problems


def torn_states(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Control-plane rows that only make sense together, found apart: a pointer moved without its
    history or its view, a fence row without its generation's update (or the reverse) or its
    timeline event, a plan published without the move (or the move without the plan), a
    restatement without its ledger, or a ledger without its restatement; a Dagster asset consumer's
    restatement (its copies never pointed at) without its corrected rows kept or its check."""
    problems: list[str] = []
    tables = {
        n
        for (n,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = '_recovery'"
        ).fetchall()
    }
    views = {
        f"{s}.{v}": sql
        for s, v, sql in con.execute(
            "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
    }
    for public, ns, seq in con.execute("SELECT public_name, namespace, seq FROM _recovery.pointers").fetchall():
        sql = views.get(public)
        if sql is None:
            problems.append(f"{public}: a pointer without its view")
        elif ns.split(".")[-1] not in sql:
            problems.append(f"{public}: the view reads other than its pointer {ns}")
        last = con.execute(
            "SELECT to_namespace, seq FROM _recovery.pointer_history WHERE public_name = ? ORDER BY seq DESC LIMIT 1",
            [public],
        ).fetchone()
        if last is None or tuple(last) != (ns, seq):
            problems.append(f"{public}: pointer {ns} (seq {seq}) without its history (last move {last})")
    # a public name whose last move is its release: no pointer, a plain table, the release's event; and the
    # reverse, a public name off its pointer without that release
    for public, reason, pointed in con.execute(
        "SELECT public_name, arg_max(reason, seq), bool_or(public_name IN (SELECT public_name FROM "
        "_recovery.pointers)) FROM _recovery.pointer_history GROUP BY 1"
    ).fetchall():
        released = reason == "released"
        if released == pointed:
            problems.append(f"{public}: last move {reason!r}, pointer row {pointed}")
        if released:
            if public in views:
                problems.append(f"{public} released, still a managed view")
            if not _one(con, "SELECT count(*) FROM _recovery.timeline WHERE kind = 'target_released'")[0]:
                problems.append(f"{public} released without its timeline event")
    for gen, token, fenced_at, g_token, events in con.execute(
        "SELECT f.generation, f.token, g.fenced_at, g.token, (SELECT count(*) FROM _recovery.timeline t WHERE "
        "t.kind = 'fence' AND json_extract_string(t.details, '$.generation') = f.generation) "
        "FROM _recovery.fences f LEFT JOIN _recovery.generations g USING (generation)"
    ).fetchall():
        if fenced_at is None or g_token is None or g_token < token:
            problems.append(f"fence row of {gen} (token {token}) without its generation's update")
        if not events:
            problems.append(f"fence of {gen} without its timeline event")
    if "repair_plans" in tables:
        for incident, ns, gen, status in con.execute(
            "SELECT incident_id, namespace, generation, status FROM _recovery.repair_plans"
        ).fetchall():
            published = status == "published"
            pointed = bool(  # the pointer at it, or moved off it by a rollback, the release or a guarded backfill since
                _one(con, "SELECT count(*) FROM _recovery.pointers WHERE namespace = ?", [ns])[0]
                or _one(
                    con,
                    "SELECT count(*) FROM _recovery.pointer_history WHERE from_namespace = ? AND (reason IN (?, "
                    "'released') OR reason LIKE 'publish guarded backfill %')",
                    [ns, f"rollback for {incident}"],
                )[0]
            )
            moved = _one(con, "SELECT count(*) FROM _recovery.pointer_history WHERE to_namespace = ?", [ns])[0]
            event = _one(
                con, "SELECT count(*) FROM _recovery.timeline WHERE kind = 'publish' AND incident_id = ?", [incident]
            )[0]
            g_status = con.execute("SELECT status FROM _recovery.generations WHERE generation = ?", [gen]).fetchone()
            g_published = g_status is not None and g_status[0] == "published"
            if (published, pointed, bool(moved), bool(event), g_published) not in (
                (True, True, True, True, True),
                (False, False, False, False, False),
            ):
                problems.append(
                    f"publish of {incident} half done: plan {status}, pointer at it {pointed}, moves {moved}, "
                    f"publish events {event}, generation {g_status}"
                )
    if "repair_plans" in tables:
        problems += _repair_torn_states(con)
    problems += _recorded_without_event(con, tables)
    problems += _registry_torn_states(con, tables)
    if "backfills" in tables:
        problems += _backfill_torn_states(con)
    if "consumer_builds" in tables:  # a consumer's output holds the rows its build record counts
        for public, ns, recorded in con.execute(
            "SELECT p.public_name, p.namespace, b.row_count FROM _recovery.pointers p JOIN _recovery.consumer_builds b "
            "USING (namespace)"
        ).fetchall():
            held = _one(con, f"SELECT count(*) FROM {ns}")[0]
            if held != recorded:
                problems.append(f"{public}: {ns} holds {held} rows, its build recorded {recorded}")
    for incident, file in con.execute(
        "SELECT incident_id, json_extract_string(details, '$.incident_file') FROM _recovery.timeline "
        "WHERE kind = 'incident_drafted'"
    ).fetchall():
        if file and not Path(file).exists():
            problems.append(f"draft incident {incident} opened on the timeline without its file {file}")
    for gen, rows, writes in con.execute(  # a run's output: its rows in the public view with their write record
        "SELECT g.generation, (SELECT count(*) FROM mart.orders o WHERE o.gen_id = g.generation), (SELECT count(*) "
        "FROM _recovery.writes w WHERE w.generation = g.generation) FROM _recovery.generations g WHERE g.run_id "
        "IS NOT NULL AND EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema = 'mart' AND "
        "table_name = 'orders')"
    ).fetchall():
        if rows and not writes:
            problems.append(f"{rows} rows of run generation {gen} in the public view without their write record")
    for public, ns, reason in con.execute(
        "SELECT p.public_name, p.namespace, h.reason FROM _recovery.pointers p JOIN _recovery.pointer_history h "
        "ON h.public_name = p.public_name AND h.seq = p.seq WHERE h.reason LIKE 'restatement of incident %'"
    ).fetchall():
        incident = reason.removeprefix("restatement of incident ")
        recorded = (
            "restatements" in tables
            and _one(
                con,
                "SELECT count(*) FROM _recovery.restatements WHERE incident_id = ? AND consumer = ? "
                "AND corrected_namespace = ?",
                [incident, public.split(".")[-1], ns],
            )[0]
        )
        if not recorded:
            problems.append(f"{public} moved to {ns} by the restatement of {incident} without its restatement record")
    if "restatements" in tables:
        ledger = sorted(n for n in tables if n.startswith("restatement_ledger__"))
        rows = con.execute(
            "SELECT incident_id, consumer, corrected_namespace, ledger_rows FROM _recovery.restatements"
        ).fetchall()
        checked = (
            set(con.execute("SELECT incident_id, consumer FROM _recovery.restatement_checks").fetchall())
            if "restatement_checks" in tables
            else set()
        )
        for incident, consumer, corrected, ledger_rows in rows:
            # a Dagster asset's copies are never pointed at (its own table stays the team's): its corrected rows
            # kept in the catalog with its check, committed with the record
            copy = con.execute(
                "SELECT n.status, n.public_name IN (SELECT public_name FROM _recovery.pointer_history) FROM "
                "_recovery.namespaces n WHERE namespace = ?",
                [corrected],
            ).fetchone()
            if copy is not None and not copy[1]:
                if (
                    copy[0] != "retained"
                    or not _one(
                        con,
                        "SELECT count(*) FROM information_schema.tables WHERE table_schema || '.' || table_name = ?",
                        [corrected],
                    )[0]
                ):
                    problems.append(f"restatement of asset {consumer} names {corrected}, kept {copy[0]!r}")
                if (incident, consumer) not in checked:
                    problems.append(f"restatement of asset {consumer} without its check")
            else:
                pointer = con.execute(
                    "SELECT namespace FROM _recovery.pointers WHERE public_name = ?", [f"consumers.{consumer}"]
                ).fetchone()
                if pointer is None or pointer[0] != corrected:
                    problems.append(f"restatement of {consumer} names {corrected}, the consumer points at {pointer}")
            event = _one(
                con,
                "SELECT count(*) FROM _recovery.timeline WHERE kind = 'restatement' AND incident_id = ? "
                "AND json_extract_string(details, '$.consumer') = ?",
                [incident, consumer],
            )[0]
            if not event:
                problems.append(f"restatement of {consumer} without its timeline event")
            if ledger:
                n, other = _one(
                    con,
                    f"SELECT count(*) FILTER (WHERE change IN ('changed', 'missing', 'extra')), "
                    f"count(*) FILTER (WHERE corrected_namespace IS DISTINCT FROM ?) FROM _recovery.{ledger[0]} "
                    f"WHERE incident_id = ? AND consumer = ?",
                    [corrected, incident, consumer],
                )
                if n != ledger_rows or other:
                    problems.append(
                        f"ledger of {consumer} half written: {n} rows for {ledger_rows} recorded, "
                        f"{other} of another output"
                    )
        if ledger:
            recorded = {(i, c) for i, c, _, _ in rows}
            for incident, consumer in con.execute(
                f"SELECT DISTINCT incident_id, consumer FROM _recovery.{ledger[0]}"
            ).fetchall():
                if (incident, consumer) not in recorded:
                    problems.append(f"ledger rows of {consumer} without its restatement record")
    return problems


def _repair_torn_states(con: duckdb.DuckDBPyConnection) -> list[str]:
    """A repair's plan, its waves and their gates, each found whole: a plan without its partitions, its
    timeline event or its generation (or the carried rows without the plan); a partition recorded
    built without the write of its rows, or a wave's write without its partitions recorded built; a
    gated wave without its fingerprints, or fingerprints without the wave's gate event."""
    problems: list[str] = []
    plans = con.execute("SELECT incident_id, generation, namespace FROM _recovery.repair_plans").fetchall()
    planned = {gen for _, gen, _ in plans}
    for (gen,) in con.execute(
        "SELECT DISTINCT generation FROM _recovery.writes w JOIN _recovery.generations g USING (generation) "
        "WHERE g.kind = 'repair'"
    ).fetchall():
        if gen not in planned:
            problems.append(f"rows written by repair generation {gen} without its plan")
    for incident, gen, ns in plans:
        parts, started, registered = _one(
            con,
            "SELECT (SELECT count(*) FROM _recovery.repair_partitions WHERE incident_id = $1), "
            "(SELECT count(*) FROM _recovery.timeline WHERE kind = 'repair_started' AND incident_id = $1), "
            "(SELECT count(*) FROM _recovery.generations WHERE generation = $2 AND namespace = $3)",
            [incident, gen, ns],
        )
        if not (parts and started and registered):
            problems.append(
                f"plan of {incident} half recorded: {parts} partitions, {started} start events, generation {registered}"
            )
        # every partition recorded built names the write that rebuilt it; every wave's write is recorded
        for part, built_seq in con.execute(
            "SELECT partition, built_seq FROM _recovery.repair_partitions p WHERE incident_id = ? "
            "AND status IN ('built', 'published') AND NOT EXISTS (SELECT 1 FROM _recovery.writes w "
            "WHERE w.seq = p.built_seq AND w.generation = ? AND list_contains(w.partitions, p.partition))",
            [incident, gen],
        ).fetchall():
            problems.append(f"partition {part} of {incident} recorded built (seq {built_seq}) without its rows' write")
        for seq, part, note in con.execute(
            "SELECT w.seq, p.partition, w.note FROM _recovery.writes w, unnest(w.partitions) AS p(partition) "
            "WHERE w.generation = ? AND w.mode = 'replace_partitions' AND NOT EXISTS (SELECT 1 FROM "
            "_recovery.repair_partitions r WHERE r.incident_id = ? AND r.partition = p.partition "
            "AND r.status IN ('built', 'published') AND r.built_seq >= w.seq)",
            [gen, incident],
        ).fetchall():
            problems.append(f"{note} (seq {seq}) wrote {part} without recording it built")
        gated = {
            stage
            for (stage,) in con.execute(
                "SELECT DISTINCT regexp_extract(summary, '^(canary|wave [0-9]+) of', 1) FROM _recovery.timeline "
                "WHERE kind = 'repair_wave' AND incident_id = ? AND summary LIKE '%: passed'",
                [incident],
            ).fetchall()
        }
        fingerprinted = {
            stage
            for (stage,) in con.execute(
                "SELECT DISTINCT stage FROM _recovery.repair_fingerprints WHERE incident_id = ?", [incident]
            ).fetchall()
        }
        # a failed gate stops the expansion: its event is followed by a stop
        for (summary,) in con.execute(
            "SELECT summary FROM _recovery.timeline t WHERE kind = 'repair_wave' AND incident_id = $1 AND summary "
            "LIKE '%: FAILED %' AND NOT EXISTS (SELECT 1 FROM _recovery.timeline u WHERE u.kind = 'repair_stopped' "
            "AND u.incident_id = $1 AND u.event_id > t.event_id)",
            [incident],
        ).fetchall():
            problems.append(f"a failed gate of {incident} without the stop of its expansion: {summary[:60]}")
        # a stopped repair's last stop/resume event is its stop; a building one's (if any) its resume
        last = con.execute(
            "SELECT kind FROM _recovery.timeline WHERE incident_id = ? AND kind IN ('repair_stopped', "
            "'repair_resumed') ORDER BY event_id DESC LIMIT 1",
            [incident],
        ).fetchone()
        status = _one(con, "SELECT status FROM _recovery.repair_plans WHERE incident_id = ?", [incident])[0]
        if (status == "stopped") != (last is not None and last[0] == "repair_stopped") and status in (
            "stopped",
            "building",
        ):
            problems.append(f"repair of {incident} {status}, its last stop/resume event {last}")
        if gated - fingerprinted:
            problems.append(f"{sorted(gated - fingerprinted)} of {incident} gated without their fingerprints")
        if fingerprinted - gated:
            problems.append(f"fingerprints of {sorted(fingerprinted - gated)} of {incident} without their gate event")
    return problems


LAKE_INCIDENT = "INC-SHIP-7"


def _lake_con(d: Path) -> duckdb.DuckDBPyConnection | None:
    """The lakehouse dataset's control plane (``recovery.duckdb``), None before anything was recorded."""
    path = d / "recovery.duckdb"
    if not path.exists():
        return None
    con = duckdb.connect(str(path), read_only=True)
    if not _one(
        con,
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = '_recovery' AND table_name = "
        "'lakehouse_fences'",
    )[0]:
        con.close()
        return None
    return con


def _observe_lake(d: Path) -> dict:
    """The Delta table (its rows, head version and fence properties) and what the control plane recorded of it."""
    from deltalake import DeltaTable

    from recovery.lib.lakehouse.fence import FENCE_PROPERTY, INCIDENT_PROPERTY

    table = DeltaTable(str(d / "lake" / "shipments"))
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=repr)
    conf = table.metadata().configuration
    state: dict = {
        "public": hashlib.sha256(repr(rows).encode()).hexdigest()[:16],
        "head": table.version(),
        "on_table": (conf.get(FENCE_PROPERTY), conf.get(INCIDENT_PROPERTY)),
        "table_publishes": _table_publishes(d),
    }
    con = _lake_con(d)
    if con is None:
        return state
    try:  # (empty tables are as good as none: containment creates them before its first record)
        recorded = {
            "fences": con.execute(
                "SELECT incident_id, version, generations FROM _recovery.lakehouse_fences ORDER BY ALL"
            ).fetchall(),
            "commits": con.execute(
                "SELECT version, status, generation FROM _recovery.lakehouse_commits ORDER BY ALL"
            ).fetchall(),
            "timeline": con.execute("SELECT DISTINCT kind FROM _recovery.timeline ORDER BY ALL").fetchall(),
            "publish_events": con.execute(
                "SELECT incident_id, count(*) FROM _recovery.timeline WHERE kind = 'lakehouse_publish' GROUP BY 1 "
                "ORDER BY 1"
            ).fetchall(),
        }
        if (
            _one(
                con,
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = '_recovery' AND table_name IN "
                "('pointers', 'writes', 'delta__shipments')",
            )[0]
            == 3
        ):
            recorded["adopted"] = con.execute(  # the pointer, and the namespaces the write log's rows name
                "SELECT (SELECT list(namespace ORDER BY namespace) FROM _recovery.pointers), (SELECT list(DISTINCT "
                "namespace ORDER BY namespace) FROM _recovery.writes), (SELECT list(DISTINCT _delta_namespace ORDER "
                "BY _delta_namespace) FROM _recovery.delta__shipments)"
            ).fetchall()
    finally:
        con.close()
    return state | {k: v for k, v in recorded.items() if v}


def _table_publishes(d: Path) -> list[tuple[int, str]]:
    """(version, incident) of each commit the package's publish made on the Delta table, oldest first."""
    from deltalake import DeltaTable

    return sorted(
        (int(h["version"]), str(h.get("recovery.incident")))
        for h in DeltaTable(str(d / "lake" / "shipments")).history()
        if h.get("recovery.writer") == "publish"
    )


def _lake_publish_problems(d: Path, *, finished: bool) -> list[str]:
    """A publish onto the lakehouse table found whole: an incident's publish committed on the table more than
    once, recorded (synced as published, or on the timeline) more than once, a sync record or a timeline event
    of a publish the table does not hold at that version; once the step ``finished``: a publish commit on the
    table without its sync record or its timeline event."""
    on_table = _table_publishes(d)
    problems = [
        f"the publish of {incident} committed on the table {n} times"
        for incident, n in sorted({i: sum(1 for _, j in on_table if j == i) for _, i in on_table}.items())
        if n > 1
    ]
    con = _lake_con(d)
    synced: dict[int, str] = {}
    events: list[tuple[str, int | None]] = []
    if con is not None:
        try:
            synced = dict(
                con.execute(
                    "SELECT version, incident_id FROM _recovery.lakehouse_commits WHERE status = 'published'"
                ).fetchall()
            )
            events = [
                (i, None if v is None else int(v))
                for i, v in con.execute(
                    "SELECT incident_id, json_extract(details, '$.version') FROM _recovery.timeline "
                    "WHERE kind = 'lakehouse_publish'"
                ).fetchall()
            ]
        finally:
            con.close()
    held = dict(on_table)
    for version, incident in sorted(synced.items()):
        if held.get(version) != incident:
            problems.append(f"version {version} synced as {incident}'s publish, not a publish commit of it")
    for incident in sorted({i for i in synced.values()}):
        if sum(1 for i in synced.values() if i == incident) > 1:
            problems.append(f"the publish of {incident} synced as published more than once")
    for incident in sorted({i for i, _ in events}):
        mine = [v for i, v in events if i == incident]
        if len(mine) > 1:
            problems.append(f"the publish of {incident} on the timeline {len(mine)} times")
        for v in mine:
            if v is None or held.get(v) != incident or synced.get(v) != incident:
                problems.append(f"a publish event of {incident} at version {v} without its commit or sync record")
    if finished:
        for version, incident in on_table:
            if synced.get(version) != incident:
                problems.append(f"the publish commit of {incident} (version {version}) without its sync record")
            if (incident, version) not in events:
                problems.append(f"the publish commit of {incident} (version {version}) without its timeline event")
    return problems


def _lake_problems(d: Path) -> list[str]:
    """A lakehouse target's fence found whole: a fence recorded without its event (or the reverse), or at a
    version whose commit does not set it; a commit after the table's fence commit judged the damaged
    generation's history."""
    con = _lake_con(d)
    if con is None:
        return []
    problems: list[str] = []
    try:
        for incident, version, events in con.execute(
            "SELECT coalesce(f.incident_id, e.incident_id), f.version, coalesce(e.n, 0) FROM "
            "_recovery.lakehouse_fences f FULL JOIN (SELECT incident_id, count(*) AS n FROM _recovery.timeline "
            "WHERE kind = 'lakehouse_fence' GROUP BY 1) e USING (incident_id)"
        ).fetchall():
            if version is None or events != 1:
                problems.append(f"lakehouse fence of {incident}: version {version}, {events} fence events")
        for incident, version, setter in con.execute(
            "SELECT f.incident_id, f.version, json_extract_string(c.properties, '$.\"recovery.fenced_by\"') FROM "
            "_recovery.lakehouse_fences f JOIN _recovery.lakehouse_commits c USING (dataset, version)"
        ).fetchall():
            if setter != incident:
                problems.append(
                    f"lakehouse fence of {incident} pinned at version {version}, a commit that sets no fence"
                )
        for version, fence_commit in con.execute(
            "SELECT c.version, f.version FROM _recovery.lakehouse_commits c, (SELECT min(version) AS version FROM "
            "_recovery.lakehouse_commits WHERE json_extract_string(properties, '$.\"recovery.fenced_by\"') IS NOT "
            "NULL) f WHERE c.version > f.version AND c.status = 'history'"
        ).fetchall():
            problems.append(f"version {version}, after the table's fence commit {fence_commit}, judged history")
        if (
            _one(
                con,
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = '_recovery' AND table_name IN "
                "('pointers', 'writes', 'delta__shipments')",
            )[0]
            == 3
        ):
            # adopted: no write log row names the public name, now a managed view, as where its rows live
            for public, writes, logged in con.execute(
                "SELECT p.public_name, (SELECT count(*) FROM _recovery.writes w WHERE w.namespace = p.public_name), "
                "(SELECT count(*) FROM _recovery.delta__shipments l WHERE l._delta_namespace = p.public_name) "
                "FROM _recovery.pointers p"
            ).fetchall():
                if writes or logged:
                    problems.append(
                        f"{public} adopted, {writes} writes and {logged} logged rows still placed at the public name"
                    )
    finally:
        con.close()
    return problems


def _backfill_torn_states(con: duckdb.DuckDBPyConnection) -> list[str]:
    """A guarded backfill's record, found whole: a gate result without its timeline event or the reverse;
    a backfill published without the pointer's move to its namespace, its generation published or its
    event (or a move that publishes it without the backfill recorded published); a backfill converged
    without its event or its prior namespace releasable (or the prior releasable without it); a
    backfill stopped without its event."""
    problems: list[str] = []
    for bf, gate, stage, rows, events in con.execute(
        "SELECT coalesce(a.backfill_id, e.backfill_id), coalesce(a.gate, e.gate), coalesce(a.stage, e.stage), "
        "coalesce(a.n, 0), coalesce(e.n, 0) FROM (SELECT backfill_id, gate, stage, count(*) AS n FROM "
        "_recovery.backfill_gates GROUP BY ALL) a FULL JOIN (SELECT json_extract_string(details, '$.backfill_id') "
        "AS backfill_id, json_extract_string(details, '$.gate') AS gate, json_extract_string(details, '$.stage') "
        "AS stage, count(*) AS n FROM _recovery.timeline WHERE kind = 'backfill_gate' GROUP BY ALL) e "
        "USING (backfill_id, gate, stage)"
    ).fetchall():
        if rows != events:
            problems.append(f"backfill {bf}: {rows} {stage} results of gate {gate}, {events} on the timeline")
    for bf, gen, ns, prior, status, published_seq in con.execute(
        "SELECT backfill_id, generation, namespace, from_namespace, status, published_seq FROM _recovery.backfills"
    ).fetchall():
        published = status in ("published", "converged")
        moved = _one(
            con,
            "SELECT count(*) FROM _recovery.pointer_history WHERE to_namespace = ? AND reason = ?",
            [ns, f"publish guarded backfill {bf}"],
        )[0]
        g_status = con.execute("SELECT status FROM _recovery.generations WHERE generation = ?", [gen]).fetchone()
        event = _one(
            con,
            "SELECT count(*) FROM _recovery.timeline WHERE kind = 'backfill_published' AND "
            "json_extract_string(details, '$.to') = ?",
            [ns],
        )[0]
        seen = (published, published_seq is not None, bool(moved), g_status == ("published",), bool(event))
        if seen not in ((True,) * 5, (False,) * 5):
            problems.append(
                f"publish of backfill {bf} half done: {status}, published_seq {published_seq}, moves {moved}, "
                f"generation {g_status}, publish events {event}"
            )
        converged = status == "converged"
        told = _one(
            con,
            "SELECT count(*) FROM _recovery.timeline WHERE kind = 'backfill_convergence' AND summary LIKE ?",
            [f"backfill {bf}: converged;%"],
        )[0]
        prior_status = con.execute("SELECT status FROM _recovery.namespaces WHERE namespace = ?", [prior]).fetchone()
        releasable = prior_status is not None and prior_status[0] in ("releasable", "released")
        if converged != bool(told) or converged != releasable:
            problems.append(
                f"convergence of backfill {bf} half recorded: {status}, {told} converged events, prior {prior_status}"
            )
        stopped = _one(
            con,
            "SELECT count(*) FROM _recovery.timeline WHERE kind = 'backfill_stopped' AND summary LIKE ?",
            [f"backfill {bf} stopped%"],
        )[0]
        if (status == "stopped") != bool(stopped):
            problems.append(f"backfill {bf} {status} with {stopped} stop events")
    # its launch: the manifest with its gate and event; once seeded (building or later), its own generation's
    # namespace, the seed's write and the start event; once built, the build's event and its generation complete
    for bf, status, ns, seed_seq, g_status, g_ns, manifests, gates, started, built, seeded in con.execute(
        "SELECT b.backfill_id, b.status, b.namespace, b.seed_seq, g.status, g.namespace, (SELECT count(*) FROM "
        "_recovery.timeline t WHERE t.kind = 'backfill_manifest' AND starts_with(t.summary, 'backfill ' || "
        "b.backfill_id || ' manifest')), (SELECT count(*) FROM _recovery.backfill_gates x WHERE x.backfill_id = "
        "b.backfill_id AND x.gate = 'manifest'), (SELECT count(*) FROM _recovery.timeline t WHERE t.kind = "
        "'backfill_started' AND starts_with(t.summary, 'backfill ' || b.backfill_id || ' writes')), (SELECT count(*) "
        "FROM _recovery.timeline t WHERE t.kind = 'backfill_built' AND starts_with(t.summary, 'backfill ' || "
        "b.backfill_id || ' built')), (SELECT count(*) FROM _recovery.writes w WHERE w.seq = b.seed_seq AND "
        "w.generation = b.generation) FROM _recovery.backfills b LEFT JOIN _recovery.generations g USING (generation) "
        "WHERE b.status <> 'refused'"
    ).fetchall():
        if manifests != 1 or gates != 1:
            problems.append(f"backfill {bf} {status}: {gates} manifest gates, {manifests} manifest events")
        if status == "manifest":
            if seed_seq is not None or started:
                problems.append(f"backfill {bf} seeded (seq {seed_seq}, {started} start events) still at its manifest")
        elif ns is None or g_ns != ns or seed_seq is None or not seeded or started != 1:
            problems.append(
                f"backfill {bf} {status} half seeded: namespace {ns} (its generation's {g_ns}), seed seq {seed_seq} "
                f"({seeded} writes), {started} start events"
            )
        if status in ("built", "published", "converged") and built != 1:
            problems.append(f"backfill {bf} {status} with {built} build events")
        if status == "built" and g_status != "complete":
            problems.append(f"backfill {bf} built, its generation {g_status}")
    return problems


def _registry_torn_states(con: duckdb.DuckDBPyConnection, tables: set[str]) -> list[str]:
    """The generation registry and what it records with its event: a registered generation without its
    ``generation_registered`` event or its own namespace's table, a refused fenced action
    (``fence_attempts``) without its ``fence_attempt`` event or the reverse, a publish the
    preservation gate refused (its failed gate) without its ``publish_refused`` event or the reverse."""
    problems: list[str] = []
    existing = {
        f"{s}.{t}" for s, t in con.execute("SELECT table_schema, table_name FROM information_schema.tables").fetchall()
    }
    for gen, ns, events in con.execute(
        "SELECT g.generation, g.namespace, (SELECT count(*) FROM _recovery.timeline t WHERE t.kind = "
        "'generation_registered' AND t.summary LIKE '% generation ' || g.generation || ' registered%') "
        "FROM _recovery.generations g WHERE NOT g.inferred AND coalesce(g.note, '') NOT LIKE 'from %'"
    ).fetchall():  # (an adopted table's generations, inferred or from the team's registry, come with the adoption)
        if not events:
            problems.append(f"generation {gen} registered without its timeline event")
        if ns is not None and ns not in existing:
            problems.append(f"generation {gen} names namespace {ns}, not in the catalog")
    for gen, action, rows, events in con.execute(
        "SELECT coalesce(a.generation, e.generation), coalesce(a.action, e.action), coalesce(a.n, 0), "
        "coalesce(e.n, 0) FROM (SELECT generation, action, count(*) AS n FROM _recovery.fence_attempts "
        "GROUP BY ALL) a FULL JOIN (SELECT json_extract_string(details, '$.generation') AS generation, "
        "json_extract_string(details, '$.action') AS action, count(*) AS n FROM _recovery.timeline "
        "WHERE kind = 'fence_attempt' GROUP BY ALL) e USING (generation, action)"
    ).fetchall():
        if rows != events:
            problems.append(f"{rows} refused {action} attempts of {gen} recorded, {events} on the timeline")
    if "notifications" in tables:
        for key, delivered, events in con.execute(
            "SELECT coalesce(n.dedupe_key, e.dedupe_key), n.dedupe_key IS NOT NULL, coalesce(e.n, 0) FROM "
            "_recovery.notifications n FULL JOIN (SELECT json_extract_string(details, '$.dedupe_key') AS dedupe_key, "
            "count(*) AS n FROM _recovery.timeline WHERE kind = 'alert' GROUP BY ALL) e USING (dedupe_key)"
        ).fetchall():
            if not delivered or not events:
                problems.append(f"alert {key}: delivery recorded {delivered}, {events} alert events")
    if "restatements" in tables:
        ledger = sorted(n for n in tables if n.startswith("restatement_ledger__"))
        for incident, consumer, at, key_at in con.execute(
            "SELECT incident_id, consumer, notified_at, (SELECT delivered_at FROM _recovery.notifications n WHERE "
            "n.dedupe_key = 'restatement:' || r.dataset || ':' || r.incident_id || ':' || r.consumer) "
            "FROM _recovery.restatements r"
            if "notifications" in tables
            else "SELECT incident_id, consumer, notified_at, NULL FROM _recovery.restatements"
        ).fetchall():
            if at is not None and key_at is not None and at != key_at:
                problems.append(f"notice of {consumer} stamped {at}, delivered {key_at}")
            if ledger:
                off = _one(
                    con,
                    f"SELECT count(*) FROM _recovery.{ledger[0]} WHERE incident_id = ? AND consumer = ? "
                    "AND notified_at IS DISTINCT FROM ?",
                    [incident, consumer, at],
                )[0]
                if off:
                    problems.append(f"{off} ledger rows of {consumer} stamped other than its restatement ({at})")
    if "gate_results" in tables:
        refused = set(
            con.execute(
                "SELECT incident_id, gate, evaluated_seq FROM _recovery.gate_results WHERE stage = 'publish' "
                "AND NOT passed"
            ).fetchall()
        )
        told = set(
            con.execute(
                "SELECT incident_id, json_extract_string(details, '$.gate'), "
                "CAST(json_extract(details, '$.seq') AS BIGINT) FROM _recovery.timeline WHERE kind = 'publish_refused'"
            ).fetchall()
        )
        if refused - told:
            problems.append(f"publish refusals {sorted(refused - told)} without their timeline event")
        if told - refused:
            problems.append(f"publish_refused events {sorted(told - refused)} without their failed gate")
    return problems


def _recorded_without_event(con: duckdb.DuckDBPyConnection, tables: set[str]) -> list[str]:
    """Results that commit with their timeline event, found without it (or the reverse): a
    reconciliation's rows, a convergence check's rows."""
    problems: list[str] = []
    for table in sorted(n for n in tables if n.startswith("recon__")):
        for (incident,) in con.execute(f'SELECT DISTINCT incident_id FROM _recovery."{table}"').fetchall():
            if not _one(
                con,
                "SELECT count(*) FROM _recovery.timeline WHERE kind = 'reconciliation' AND incident_id = ?",
                [incident],
            )[0]:
                problems.append(f"reconciliation rows of {incident} without their timeline event")
    for table in sorted(n for n in tables if n.startswith(("impact__", "asset_impact__"))):
        for (incident,) in con.execute(f'SELECT DISTINCT incident_id FROM _recovery."{table}"').fetchall():
            if not _one(
                con, "SELECT count(*) FROM _recovery.timeline WHERE kind = 'impact' AND incident_id = ?", [incident]
            )[0]:
                problems.append(f"impact rows of {incident} ({table}) without their timeline event")
    checks = {
        int(c)
        for (c,) in con.execute(
            "SELECT json_extract_string(details, '$.check_id') FROM _recovery.timeline WHERE kind = 'convergence'"
        ).fetchall()
        if c is not None
    }
    for table in sorted(n for n in tables if n.startswith("convergence__")):
        rows = {c for (c,) in con.execute(f'SELECT DISTINCT check_id FROM _recovery."{table}"').fetchall()}
        if rows - checks:
            problems.append(f"convergence checks {sorted(rows - checks)} without their timeline event")
        if checks - rows:
            problems.append(f"convergence events {sorted(checks - rows)} without their check's rows")
    return problems


def _read_copy_digest(d: Path) -> str | None:
    """The BI read copy's rows (``published/<table>/current.duckdb``), as ``observe`` digests the view."""
    path = d / "published" / "mart.orders" / "current.duckdb"
    if not path.exists():
        return None
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = sorted(con.execute("SELECT * EXCLUDE (landed_at) FROM orders").fetchall(), key=repr)
    finally:
        con.close()
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def read_copy_problems(d: Path) -> list[str]:
    """The read copy is whole: it holds exactly the rows of the namespace its marker names, or of the
    one the pointer names (a kill between the catalog's swap and the marker's leaves the marker one
    export behind; the rerun rewrites both)."""
    marker_path = d / "published" / "mart.orders" / "current.json"
    copy = _read_copy_digest(d)
    if copy is None:
        return []
    from recovery.lib.identifiers import TableName

    names = [json.loads(marker_path.read_text())["namespace"]] if marker_path.exists() else []
    con = _con(d)
    try:
        names += [
            ns
            for (ns,) in con.execute(
                "SELECT namespace FROM _recovery.pointers WHERE public_name = 'mart.orders'"
            ).fetchall()
        ]
        digests = {
            hashlib.sha256(
                repr(
                    sorted(
                        con.execute(f"SELECT * EXCLUDE (landed_at) FROM {TableName.parse(ns).sql()}").fetchall(),
                        key=repr,
                    )
                ).encode()
            ).hexdigest()[:16]
            for ns in names
        }
    finally:
        con.close()
    if copy not in digests:
        return [f"the read copy holds the rows of neither {' nor '.join(names)}"]
    return []


# ---- one trial -----------------------------------------------------------------------------


@dataclass
class Trial:
    phase: str
    delay_s: float
    killed: bool
    left: str = (
        ""  # what the kill left: "old" (as before), "new" (as after) or "between" (e.g. half a bundle cleaned up later)
    )
    problems: list[str] = field(default_factory=list)


def _preimport() -> None:
    """Everything a phase imports: the kill must land in the phase's work, not in Python's start-up."""
    import dagster_duckdb  # noqa: F401 (the decide phase's warehouse resource)
    import deltalake  # noqa: F401 (the lakehouse phases' table log)
    import great_expectations  # noqa: F401 (the gates' suites: seconds to import)

    import recovery.defs.containment.patrol  # noqa: F401
    import recovery.defs.decision.assets  # noqa: F401
    import recovery.defs.impact.assets  # noqa: F401
    import recovery.defs.repair.lakehouse  # noqa: F401
    import recovery.launch.dagster_registry  # noqa: F401
    import recovery.lib.consumers.sql  # noqa: F401
    import recovery.lib.convergence.verify  # noqa: F401
    import recovery.lib.decision  # noqa: F401
    import recovery.lib.evidence  # noqa: F401
    import recovery.lib.incident.draft  # noqa: F401
    import recovery.lib.lakehouse.fence  # noqa: F401
    import recovery.lib.notify  # noqa: F401
    import recovery.lib.pointers.adoption  # noqa: F401
    import recovery.lib.reconcile.run  # noqa: F401
    import recovery.lib.recurrence.launch  # noqa: F401
    import recovery.lib.recurrence.publish  # noqa: F401
    import recovery.lib.repair.build  # noqa: F401
    import recovery.lib.repair.publish  # noqa: F401
    import recovery.lib.repair.sql_suites  # noqa: F401
    import recovery.lib.repair.suites  # noqa: F401
    import recovery.lib.repair.waves  # noqa: F401
    import recovery.lib.restatement.assets  # noqa: F401
    import recovery.lib.restatement.notices  # noqa: F401
    import recovery.lib.restatement.restate  # noqa: F401
    import recovery.lib.write.fencing  # noqa: F401
    import recovery.lib.write.ingest  # noqa: F401
    import recovery.lib.write.managed_output  # noqa: F401
    import recovery_tests.support.repair_support  # noqa: F401


def child(phase: str, d: Path, ready: Path) -> None:
    _preimport()
    ready.write_text("ready")
    run_phase(phase, d)
    ready.write_text("done")


def uninterrupted(phase: str, template: Path, work: Path) -> tuple[dict, dict, float]:
    """(state before, state after, seconds) of the phase run to completion on a copy."""
    d = work / f"{phase}-reference"
    shutil.copytree(template, d)
    before = observe(phase, d)
    t0 = time.monotonic()
    run_phase(phase, d)
    took = time.monotonic() - t0
    return before, observe(phase, d), took


class _Forked:
    """A phase's child process forked by the zygote: polled by its pid, its exit told by a status file
    (none when it was killed)."""

    def __init__(self, pid: int, status: Path):
        self.pid, self.status = pid, status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)  # the zygote reaps its children: an exited one is gone
            except ProcessLookupError:
                text = self.status.read_text() if self.status.exists() else "-9\n"
                self.returncode = int(text.split("\n", 1)[0])
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def error(self) -> str:
        return self.status.read_text().split("\n", 1)[-1][-300:] if self.status.exists() else ""


class _Zygote:
    """One Python process with every phase's modules imported, forking a child per phase run: a child
    starts in milliseconds instead of seconds (the imports, the gates' libraries), and, a fresh fork of a
    process that opened no warehouse, shares nothing with the tests' own connections."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recovery_tests.support.kill_matrix", "--zygote"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def spawn(self, phase: str, d: Path, ready: Path, env: dict[str, str]) -> _Forked:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        status = ready.with_name(ready.name + ".status")
        self.proc.stdin.write(json.dumps([phase, str(d), str(ready), str(status), env]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kill matrix's zygote exited ({self.proc.wait()})")
        return _Forked(int(line), status)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


_zygote: _Zygote | None = None


def _child(phase: str, d: Path, ready: Path, **env: str) -> _Forked:
    """The phase run on ``d`` in a child process forked by the zygote, ``env`` added to its environment."""
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = _Zygote()
        atexit.register(_zygote.close)
    return _zygote.spawn(phase, d, ready, env)


def zygote() -> None:
    """Read ``[phase, folder, ready, status, env]`` lines; fork a child for each and write its pid."""
    import traceback

    _preimport()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped as they exit
    for line in sys.stdin:
        phase, d, ready, status, env = json.loads(line)
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)  # the pid protocol's pipe is the zygote's
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.environ.update(env)
            code, err = 0, ""
            try:
                child(phase, Path(d), Path(ready))
            except BaseException:  # noqa: BLE001 (told to the test through the status file)
                code, err = 1, traceback.format_exc()
            Path(status).write_text(f"{code}\n{err}")
            os._exit(code)
        print(pid, flush=True)


def trial(phase: str, template: Path, work: Path, n: int, delay_s: float, before: dict, after: dict) -> Trial:
    d = work / f"{phase}-{n}"
    shutil.copytree(template, d)
    ready = work / f"{phase}-{n}.ready"
    proc = _child(phase, d, ready)
    while not ready.exists() and proc.poll() is None:
        time.sleep(0.005)
    time.sleep(delay_s)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t = Trial(phase, delay_s, killed)
    if not killed and proc.returncode != 0:
        t.problems.append(f"child failed: {proc.error()}")
    t.problems += consistency_problems(phase, d)
    mid = observe(phase, d)
    t.left = "old" if mid == before else "new" if mid == after else "between"
    if mid["public"] not in (before["public"], after["public"]):
        t.problems.append("the public view serves neither the old nor the new result")
    run_phase(phase, d)  # the rerun of the same step
    t.problems += consistency_problems(phase, d, finished=True)
    again = observe(phase, d)
    if again != after:
        t.problems.append(f"rerun did not converge: {_diff(again, after)}")
    shutil.rmtree(d, ignore_errors=True)
    return t


def _diff(a: dict, b: dict) -> str:
    return "; ".join(
        f"{k}: {a.get(k)!r:.120} != {b.get(k)!r:.120}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
    )


def run_matrix(
    base: Path,
    points: int,
    *,
    phases: list[str] | None = None,
    seed: int = 20,
    templates: dict[str, Path] | None = None,
) -> dict[str, list[Trial]]:
    rng = random.Random(seed)
    templates = templates or build_templates(base / "templates")
    out = {}
    for phase in phases or PHASES:
        before, after, took = uninterrupted(phase, templates[phase], base)
        # kill points spread over the phase's run (its duration measured uninterrupted, plus
        # the child's own start-up margin), a few beyond it: those must simply complete. The first
        # lies in the run's first 60%, so a phase the child runs faster than the measurement
        # (a loaded machine during it) is still killed at least once.
        out[phase] = [
            trial(
                phase, templates[phase], base, n, rng.uniform(0, took * (0.6 if n == 0 else 1.2) + 0.05), before, after
            )
            for n in range(points)
        ]
    return out


# ---- kills at the commit: each named fault point of each phase's commit window ----------

# the points inside and right after the commit of each phase (``faults.checkpoint``), in order,
# with what a kill there leaves: "old" (rolled back whole), "between" (committed, what follows the
# commit not done yet: the rerun finishes it) or "new"
COMMIT_POINTS: dict[str, dict[str, str]] = {
    "contain": {  # adoption's transaction (the plain target taken under management), then Writer.fence's
        "adopt:renamed": "old",
        "adopt:view_moved": "old",
        "adopt:recorded": "old",
        "adopt:committed": "between",  # adopted, not fenced yet
        "fence:locked": "between",
        "fence:generation_updated": "between",
        "fence:fence_recorded": "between",
        "fence:event_recorded": "between",
        "fence:committed": "new",
    },
    "publish": {
        "publish:locked": "old",
        "publish:replayed": "old",
        "publish:view_moved": "old",
        "publish:recorded": "old",
        "publish:committed": "between",  # the read copy and its timeline entry follow the commit
        "publish:exported": "between",  # the read copy's timeline entry follows
        "publish:read_copy_recorded": "new",
    },
    "evidence": {  # the bundle is written to disk first, then its timeline event commits
        "evidence:recorded": "between",  # the bundle whole on disk, its event rolled back
        "evidence:committed": "new",
    },
    "assess": {"reconcile:recorded": "old", "reconcile:committed": "new"},
    "registry": {  # a run registry from Dagster written for a plain target: the table replaced whole, one transaction
        "registry:recorded": "old",
        "registry:committed": "new",
    },
    "patrol": {  # the fencing sensor's pass over bf-7's backfill requested again and its two runs queued after the
        # fence: the backfill's cancel recorded (one transaction), then each run counted with its event (one
        # transaction each) and stopped; then each attempt's owner alerted (the points of the alerts'
        # delivery are killed in "notify")
        "events:recorded": "old",  # the backfill's cancel event, not committed
        "events:committed": "between",
        "run_attempt:recorded": "between",
        "run_attempt:committed": "between",  # the first run counted, not stopped yet
    },
    "decide": {  # the assess job's impact (its rows and event) and decision (its event): one transaction each
        "impact:recorded": "old",
        "impact:committed": "between",  # the impact recorded, not decided yet (decision:recorded leaves the same)
        "decision:committed": "new",
    },
    "plan": {  # the repair generation is registered first (its own transaction), then the plan's
        "plan:carried": "old",  # the carried rows rolled back (the generation stays registered, unused)
        "plan:recorded": "old",
        "plan:committed": "new",
    },
    "canary": {  # the canary's rows and their record, then its gate: one transaction each (the
        # wave's points inside its transaction are all killed in "wave"; the gate's cold start in a
        # child process costs seconds, so one point inside its transaction and one after)
        "wave:recorded": "old",
        "wave:committed": "between",  # built, not gated
        "gate:recorded": "between",  # the gate's results, fingerprints and event rolled back
        "gate:committed": "new",
    },
    "wave": {  # wave 1 after the canary: rows and record in one transaction
        "wave:written": "old",
        "wave:recorded": "old",
        "wave:committed": "new",
    },
    "candidate": {  # the replay to now, the gates and the diffs, in one transaction
        "candidate:recorded": "old",
        "candidate:committed": "new",
    },
    "verify": {
        "verify:recorded": "old",
        "verify:committed": "new",
    },
    "rollback": {  # the pointer moved back in one transaction, then the read copy refreshed
        "rollback:view_moved": "old",
        "rollback:recorded": "old",
        "rollback:committed": "between",  # the read copy still holds the published view
        "rollback:exported": "new",
    },
    "restate": {  # per consumer, one transaction; the points fire in the first consumer's
        "restate:original_found": "old",
        "restate:output_published": "old",
        "restate:ledger_written": "old",
        "restate:decisions_written": "old",
        "restate:row_recorded": "old",
        "restate:recorded": "old",
        "restate:committed": "between",  # the first consumer restated, the second not yet
        "restate:checked": "new",
    },
    "release": {  # the public name handed back: table, pointer, history, namespaces and event in one transaction
        "release:table_released": "old",
        "release:recorded": "old",
        "release:committed": "new",
    },
    "notify": {  # per consumer: the notice delivered, its key and event recorded, then the consumer stamped
        "notify:sent": "between",  # delivered, not recorded: the rerun delivers again (at least once)
        "notify:recorded": "between",
        "notify:committed": "between",
        "notice:stamped": "between",
        "notice:committed": "between",  # the first consumer told and stamped, the second not yet
    },
    "stop": {  # wave 1's gate fails and stops the expansion (one transaction), then the repair resumed (another)
        "gate:recorded": "old",
        "gate:committed": "between",  # failed and stopped, not resumed yet
        "resume:recorded": "between",
        "resume:committed": "new",
    },
    "refuse": {  # a publish refused by the preservation gate: its failed gate and its event, one transaction
        "publish:refusal_gated": "old",
        "publish:refusal_recorded": "old",
        "publish:refusal_committed": "new",  # the rerun is refused again and finds the refusal recorded
    },
    "replay": {  # the candidate's replay to now and its high watermark, one transaction
        "replay:recorded": "old",
        "replay:committed": "new",
    },
    "register": {  # a generation registered (with its namespace and event), its status set, then a
        # fenced generation's registration refused and the attempt recorded: one transaction each
        "register:recorded": "old",
        "register:committed": "between",
        "status:committed": "between",
        "fence_attempt:recorded": "between",
        "fence_attempt:committed": "new",
    },
    "launch": {  # a guarded backfill launched: its manifest (one transaction), its own generation (another), its
        # seed (a third), the recompute's write (a fourth), then the build recorded with its generation ended (a
        # fifth). A kill inside a transaction leaves the state of the point after the commit before it: those of the
        # generation, the seed and the write (register:recorded, backfill_seed:recorded, write:recorded) are left
        # out here (the same functions' are killed in "register", "ingest" and "output")
        "backfill_manifest:recorded": "old",
        "backfill_manifest:committed": "between",  # the manifest recorded, no generation yet: the rerun resumes
        "register:committed": "between",
        "backfill_seed:committed": "between",  # building: the rerun builds
        "backfill_built:recorded": "between",  # the recompute's rows written, the build not recorded
        "backfill_built:committed": "new",  # (its generation ended in the same commit)
    },
    "recur_gate": {  # a guarded backfill's post-build gates: each result and its event, one transaction
        "backfill_gate:recorded": "old",
        "backfill_gate:committed": "new",
    },
    "recur_publish": {  # the gated backfill published (one transaction), its read copy exported, then its
        # convergence checked (the check's own transaction) and the prior generation released (another)
        "backfill_publish:recorded": "old",
        "backfill_publish:committed": "between",  # the read copy still holds the prior generation
        "backfill_publish:exported": "between",  # published, not converged
        "verify:committed": "between",  # the check recorded, the prior not yet releasable
        "backfill_converge:recorded": "between",
        "backfill_converge:committed": "new",
    },
    "lake_fence": {  # a Delta target fenced: the history synced (one transaction), the fence committed on the
        # table, recorded in the control plane with its event (another), then the fence commit synced
        "lake_sync:recorded": "old",
        "lake_fence:table_fenced": "between",  # the table fenced, the control plane not told
        "lake_fence:recorded": "between",
        "lake_fence:committed": "between",  # recorded, the fence commit itself not synced yet
    },
    "lake_adopt": {  # containment's adoption on a Delta target, its fence recorded: the warehouse's copy adopted (one
        # transaction, the write log's rows pointed at it in the same commit), then that pointing again for a
        # target adopted before it did (another). (adopt:renamed and adopt:view_moved, earlier in the same
        # transaction as adopt:recorded, are killed in "contain".)
        "adopt:recorded": "old",
        "adopt:committed": "new",
        "lake_adopt:committed": "new",  # (lake_adopt:recorded, inside it, leaves the same: nothing left to point)
    },
    "lake_publish": {  # a published repair committed onto the Delta target (one table commit), the commit
        # synced (one transaction), then its timeline event (another)
        "lake_publish:committed": "between",  # the table's commit landed, not synced nor on the timeline
        "lake_sync:recorded": "between",  # the sync of the publish commit, not committed
        "lake_publish:recorded": "between",  # synced, its event not committed
        "lake_publish:event_committed": "new",
    },
    "draft": {  # the draft incident: its file written in place inside the transaction that records its event
        "draft:written": "between",  # the file on disk, its event rolled back: the rerun keeps the file, records it
        "draft:recorded": "between",
        "draft:committed": "new",
    },
    "output": {  # an asset's output through the IO manager: the stage prepared, the run's generation registered,
        # the rows written (one transaction each), then the stage dropped
        "output:staged": "between",  # (every point leaves the stage table behind: the step's retry drops it)
        "register:committed": "between",
        "write:recorded": "between",
        "output:written": "between",
    },
    "reexecute": {  # Dagster's re-execution of a run killed after it registered its generation: that attempt's
        # stage dropped and its empty generation ended (one transaction), then its own output written as "output"'s
        # (its points between those two are killed in "output")
        "superseded:cleared": "old",
        "superseded:committed": "between",  # the killed attempt cleared, the output not written yet
        "output:written": "between",  # written, its stage not dropped: the step's retry drops it
    },
    "consumer": {  # a SQL consumer's output refreshed: built, pointed at and recorded in one transaction
        "consumer:refreshed": "old",
        "consumer:committed": "new",
    },
    "asset_restate": {  # a Dagster asset consumer restated: its original captured (one transaction), its
        # partitions re-materialized by the team's code (another), then the corrected rows kept, the ledger, the
        # record, its event and its check (a third)
        "asset_original:captured": "old",
        "asset_original:committed": "between",  # the original kept, the asset not re-materialized yet
        "asset_restate:materialized": "between",  # re-materialized, not recorded: the rerun must keep the original
        "restate:ledger_written": "between",
        "asset_restate:checked": "between",
        "asset_restate:committed": "new",
    },
    "ingest": {  # ingestion's upserts, its tombstones (with the write log's watermark), then the generation's watermark
        "write:recorded": "old",  # inside the upserts' transaction
        "ingest:upserted": "between",
        "ingest:tombstoned": "between",  # the generation's watermark still behind: the rerun reapplies the window
        "ingest:advanced": "new",
    },
}


@dataclass
class CommitKill:
    phase: str
    point: str
    left: str = ""
    problems: list[str] = field(default_factory=list)


def commit_kill(phase: str, point: str, template: Path, work: Path, before: dict, after: dict) -> CommitKill:
    """Run the phase in a child process, SIGKILL it once it reaches ``point``, then check the state
    and rerun the phase in process."""
    name = f"{phase}-{point.replace(':', '-')}"
    d = work / name
    shutil.copytree(template, d)
    ready, reached = work / f"{name}.ready", work / f"{name}.reached"
    proc = _child(phase, d, ready, RECOVERY_FAULT_AT=point, RECOVERY_FAULT_READY=str(reached))
    t = CommitKill(phase, point)
    deadline = time.monotonic() + 120
    while not reached.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if not reached.exists():  # the point was never reached: the kill proves nothing
        err = proc.error()
        t.problems.append(f"the child never reached {point} (exit {proc.returncode}): {err}")
        return t
    t.problems += [f"after the kill: {p}" for p in consistency_problems(phase, d)]
    mid = observe(phase, d)
    t.left = "old" if mid == before else "new" if mid == after else "between"
    if t.left != COMMIT_POINTS[phase][point]:
        t.problems.append(f"the kill left {t.left}, expected {COMMIT_POINTS[phase][point]}: {_diff(mid, after)}")
    if mid["public"] not in (before["public"], after["public"]):
        t.problems.append("the public view serves neither the old nor the new result")
    try:
        run_phase(phase, d)  # the rerun of the same step
    except Exception as e:  # noqa: BLE001 (a rerun that fails is the finding)
        t.problems.append(f"the rerun failed: {type(e).__name__}: {str(e)[:200]}")
        return t
    t.problems += [f"after the rerun: {p}" for p in consistency_problems(phase, d, finished=True)]
    again = observe(phase, d)
    if again != after:
        t.problems.append(f"rerun did not converge: {_diff(again, after)}")
    if phase in PUBLISHING and again.get("read_copy") != again["public"]:
        t.problems.append("after the rerun the read copy (current.duckdb) differs from the published view")
    shutil.rmtree(d, ignore_errors=True)
    return t


def run_commit_kills(
    base: Path, templates: dict[str, Path], phases: list[str] | None = None
) -> dict[str, list[CommitKill]]:
    """Every commit point of each phase killed once; the uninterrupted run is the reference."""
    out = {}
    for phase in phases or list(COMMIT_POINTS):
        before, after, _ = uninterrupted(phase, templates[phase], base)
        out[phase] = [
            commit_kill(phase, point, templates[phase], base, before, after) for point in COMMIT_POINTS[phase]
        ]
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
