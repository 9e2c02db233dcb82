"""``recovery demo``: build the worked example and watch its backfill fail, for real.

Every step is a Dagster run in the project's instance (visible in the UI): normal
ingestion as ``ingest_transactions`` runs, the faulty backfill as a real asset
backfill launched through Dagster's GraphQL API and executed by ``dagster-daemon``
in other processes, and the consumers as ``refresh_consumers``. Simulated time
orders the story (ARCHITECTURE: the backfill starts, ingestion keeps writing,
the backfill clobbers), so the damage is the same on every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import duckdb
from rich.console import Console

from recovery.example.defs import GENERATION_TAG, SIMULATED_TAG, TARGET_KEY, example_definitions
from recovery.example.during_repair import release_repair_window_events
from recovery.example.generator import generate, release_live_events
from recovery.example.scenario import SCENARIO
from recovery.example.truth import build_truth
from recovery.lib.catalog_checks import load_spec
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.engine.duckdb_engine import duckdb_connection
from recovery.lib.errors import RecoveryError
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer
from recovery.orchestration import Daemon, backfill_finished, launch_asset_backfill, run_job


@dataclass
class DemoResult:
    spec_path: Path
    warehouse: Path
    backfill_id: str
    backfill_status: str
    run_ids: dict[str, list[str]] = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    truth_labels: dict = field(default_factory=dict)


def _release(spec, until, producer=release_live_events) -> int:
    engine = open_engine(spec.warehouse)

    def txn() -> int:
        with engine.transaction() as s:
            return producer(duckdb_connection(s), until)

    return retrying(txn)


def run_ingestion(spec_path: Path | None, instance: dg.DagsterInstance, day: str, until) -> str:
    """One run of the example's normal ingestion job (its own code location's, bound to the warehouse
    of ``spec_path``): apply the source's changes up to ``until``."""
    res = run_job(
        example_definitions(spec_path),
        "ingest_transactions",
        instance,
        partition_key=day,
        run_config={
            "ops": {"ingest_changes": {"config": {"until": until.isoformat(), "written_at": until.isoformat()}}}
        },
    )
    return res.run_id


def ingest_during_repair(spec, *, instance: dg.DagsterInstance) -> str:
    """The producer's changes of the repair window, applied by normal ingestion to the published table."""
    sc = SCENARIO
    released = _release(spec, sc.repair_ingest, lambda con, _until: release_repair_window_events(con, scenario=sc))
    run_id = run_ingestion(spec.spec_path, instance, sc.last_day.isoformat(), sc.repair_ingest)
    return f"ingestion run {run_id[:8]} (during the repair) applied {released:,} changes up to {sc.repair_ingest}"


def open_failed_backfill_drafts(instance: dg.DagsterInstance, spec_path: Path) -> list:
    """What backfill_incident_sensor does on its next tick, done now so the run's output says it."""
    from recovery.defs.alerts.resources import notifier_resource
    from recovery.defs.intake.sensors import open_drafts
    from recovery.defs.resources import warehouse_resource

    drafts, _ = open_drafts(instance, warehouse_resource(str(spec_path)), notifier_resource())
    return drafts


def build_failed_backfill(
    spec_path: Path,
    *,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    events: int = 200_000,
    seed: int = 42,
    console: Console | None = None,
    daemon_timeout_s: float = 1800,
    truth: bool = True,
) -> DemoResult:
    """Generate the sample, ingest, run the faulty backfill with ingestion alongside, refresh consumers."""
    console = console or Console(quiet=True)
    sc = SCENARIO
    spec = parse_spec(spec_path)
    wh = spec.warehouse.path
    for p in (wh, wh.with_name(wh.name + ".wal")):
        p.unlink(missing_ok=True)
    with console.status("generating the sample source"):
        counts = generate(wh, events=events, seed=seed)
    console.print(
        f"[bold]1/6[/] source: {counts['source_events']:,} change events as of {sc.t0}, "
        f"{counts['live_events']:,} more arriving during the incident"
    )
    spec = load_spec(spec_path)  # now the warehouse exists: check the spec against it
    runs: dict[str, list[str]] = {"ingest": [], "backfill": [], "consumers": []}

    def ingest(day: str, until, label: str) -> None:
        run_id = run_ingestion(spec_path, instance, day, until)
        runs["ingest"].append(run_id)
        console.print(f"      ingestion run {run_id[:8]} ({label}) applied changes up to {until}")

    with console.status("normal ingestion of history"):
        ingest((sc.t0.date().fromordinal(sc.t0.date().toordinal() - 1)).isoformat(), sc.t0, "history")
    console.print(f"[bold]2/6[/] {spec.target.table} published by normal ingestion")

    # the backfill is requested: its generation starts and fixes its source snapshot
    _release(spec, sc.backfill_start)
    writer = Writer(open_engine(spec.warehouse), spec, actor="data-platform-oncall")
    writer.register_generation(
        sc.backfill_generation,
        "backfill",
        started_at=sc.backfill_start,
        source_watermark=sc.backfill_start,
        code_version="2.3.0",
        note=f"intended range {sc.intended_range[0]}..{sc.intended_range[1]}",
    )
    backfill_id = launch_asset_backfill(
        instance,
        TARGET_KEY.path,
        sc.requested_partitions(),
        tags={
            GENERATION_TAG: sc.backfill_generation,
            SIMULATED_TAG: "true",
            "requested_by": "data-platform-oncall",
            "approved_by": "head-of-data",
        },
        title=f"Recompute transactions history ({sc.backfill_generation})",
        description="Six-month history recompute after the FX normalisation change.",
    )
    with writer.engine.transaction() as s:
        s.execute(
            f"UPDATE {SCHEMA}.generations SET backfill_id = ? WHERE generation = ?",
            [backfill_id, sc.backfill_generation],
        )
    console.print(
        f"[bold]3/6[/] Dagster backfill {backfill_id} requested over {len(sc.requested_partitions())} partitions "
        f"as generation {sc.backfill_generation}"
    )

    # ingestion keeps running while the backfill is queued
    _release(spec, sc.ingest_during)
    with console.status("normal ingestion during the backfill"):
        ingest(sc.last_day.isoformat(), sc.ingest_during, "during the backfill")

    with Daemon() as daemon, console.status("dagster-daemon executing the backfill runs") as status:

        def tick() -> None:
            done = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            status.update(f"dagster-daemon executing the backfill: {len(done)} runs launched")

        daemon.wait_until(lambda: backfill_finished(instance, backfill_id), timeout_s=daemon_timeout_s, on_tick=tick)
    backfill = instance.get_backfill(backfill_id)
    if backfill is None:
        raise RecoveryError(f"backfill {backfill_id} is not in the Dagster instance it was launched on")
    bruns = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    runs["backfill"] = [r.run_id for r in bruns]
    failed = [r for r in bruns if r.status == dg.DagsterRunStatus.FAILURE]
    console.print(
        f"[bold]4/6[/] backfill {backfill_id} ended {backfill.status.value}: {len(bruns)} runs, {len(failed)} failed"
    )
    for draft in open_failed_backfill_drafts(instance, spec_path):
        console.print(
            f"      draft incident {draft.incident_id} {'opened' if draft.newly_opened else 'already open'}: "
            f"{draft.path} (contain: recovery contain --incident {draft.path})",
            highlight=False,
        )

    _release(spec, sc.end)
    with console.status("normal ingestion after the backfill"):
        ingest(sc.last_day.isoformat(), sc.end, "after the backfill")
    res = run_job(defs, "refresh_consumers", instance)
    runs["consumers"].append(res.run_id)
    console.print(f"[bold]5/6[/] consumers re-materialized from the damaged table (run {res.run_id[:8]})")

    labels = {}
    if truth:  # the ground truth, for tests and benchmarks only
        con = duckdb.connect(str(wh))
        try:
            labels = build_truth(con, spec, failed_generation=sc.backfill_generation, watermark=sc.end)
        finally:
            con.close()
    return DemoResult(spec_path, wh, backfill_id, backfill.status.value, runs, counts, labels)


def print_damage(console: Console, summary: dict, impacts: list) -> None:
    """Damage per label and per consumer, as the reconciliation and impact assets found them."""
    from rich.table import Table

    t = Table(title="Damage per label (reconciliation)")
    t.add_column("label")
    t.add_column("keys", justify="right")
    for label, n in sorted(summary["labels"].items(), key=lambda kv: -kv[1]):
        t.add_row(label, f"{n:,}")
    console.print(t)
    console.print("partition findings: " + ", ".join(f"{k} {v}" for k, v in summary["partition_findings"].items()))
    c = Table(title="Damage per consumer (impact)")
    for col in ("consumer", "kind", "owner", "changed", "missing", "extra", "material", "decision"):
        c.add_column(col)
    for i in impacts:
        c.add_row(
            i.consumer,
            i.kind,
            i.owner,
            f"{i.rows_changed:,}",
            f"{i.rows_missing:,}",
            f"{i.rows_extra:,}",
            f"{i.material_rows:,}",
            i.decision,
        )
    console.print(c)


def print_before_after(console: Console, labels: dict, partitions: list[dict]) -> None:
    """Keys per damage label and partition totals, in the damaged and in the repaired generation."""
    from rich.table import Table

    t = Table(title="Before and after the repair (keys per damage label)")
    for col in ("label", "before", "after"):
        t.add_column(col, justify="left" if col == "label" else "right")
    for label, (before, after) in sorted(labels.items(), key=lambda kv: -kv[1][0]):
        t.add_row(label, f"{before:,}", f"{after:,}")
    console.print(t)
    rebuilt = [p for p in partitions if p["action"] == "rebuild"]
    fixed = sum(1 for p in rebuilt if p["rows_after"] == p["rows_expected"] and p["total_after"] == p["total_expected"])
    before = sum(p["total_before"] or 0 for p in rebuilt)
    after = sum(p["total_after"] or 0 for p in rebuilt)
    console.print(
        f"rebuilt partitions: {len(rebuilt)} ({fixed} equal the fixed snapshot's rows and totals, "
        f"{len(rebuilt) - fixed} also hold concurrent ingestion's writes replayed from the delta); "
        f"amount total over them {before:,.2f} before, {after:,.2f} after; "
        f"{sum(1 for p in partitions if p['qualified_reason'])} qualified partitions kept",
        highlight=False,
    )
