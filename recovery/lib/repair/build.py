"""Start the repair generation at the low watermark, then rebuild its partitions wave by wave.

Starting is one transaction: it fixes the source snapshot by materializing the
expected rows of the partitions to rebuild, copies the partitions that need no
repair (and the rows of qualified partitions the source cannot speak for) from the
published namespace with their original stamps, and takes the low watermark: the
commit sequence of that copy, so every write before it is in the carried state and
every write after it is in the delta log. The snapshot is
physically fixed: a source purged or rewritten during the repair cannot change what
the waves write.

Rebuilding a partition replaces exactly that partition of the repair generation
(``replace_partitions``), stamped with the plan's fixed time, so a re-run leaves the
same rows.
"""

from __future__ import annotations

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, utcnow
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.errors import FencedGenerationError, RecoveryError
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.incident.model import Incident
from recovery.lib.pointers.namespaces import current_namespace, namespace_sql, published_namespace
from recovery.lib.reconcile.expected_cache import expected_rows
from recovery.lib.repair.plan import (
    RepairPlan,
    choose_canary,
    damaged_partitions,
    load_plan,
    make_waves,
    qualified_partitions,
    require_plan,
    wave_name,
)
from recovery.lib.repair.tables import PARTITIONS, PLANS, ensure_repair_tables, snapshot_table
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer, WriteResult


def repair_generation_id(incident_id: str) -> str:
    return f"repair-{incident_id}"


def partition_total_sql(spec) -> str:
    """The amount total of a group of rows, as DOUBLE (NULL when the spec declares no amount)."""
    return f"CAST(sum({quote(spec.target.amount)}) AS DOUBLE)" if spec.target.amount else "CAST(NULL AS DOUBLE)"


def start_repair(
    writer: Writer,
    incident: Incident,
    *,
    canary: list[str] | None = None,
    canary_max: int = 5,
    wave_size: int = 30,
    run_id: str | None = None,
    actor: str = "repair",
) -> RepairPlan:
    """Plan the repair and start its generation; idempotent per incident (a second call returns the plan)."""
    spec = writer.spec
    if canary_max < 1:
        raise RecoveryError("canary_max must be at least 1. Fix: give a positive number of canary partitions")
    if wave_size < 1:
        raise RecoveryError("wave_size must be at least 1. Fix: give a positive number of partitions per wave")
    engine = writer.engine
    with engine.session(read_only=True) as s:
        existing = load_plan(s, incident.incident_id)
        if existing is not None:
            return existing
        busy = (
            s.scalar(
                f"SELECT incident_id FROM {PLANS} WHERE dataset = ? AND status NOT IN ('published', 'abandoned')",
                [spec.dataset],
            )
            if s.object_kind(SCHEMA, "repair_plans")
            else None
        )
        if busy:
            raise RecoveryError(
                f"a repair of {spec.dataset} for incident {busy} is in progress; publish or abandon it first"
            )
        current = published_namespace(s, spec)
        damaged = damaged_partitions(s, spec, incident.incident_id, current, incident.failed_generations)
        qualified = qualified_partitions(s, spec, incident.incident_id, list(damaged), current)
    rebuild = {p: labels for p, labels in damaged.items() if p not in qualified}
    chosen = choose_canary(rebuild, canary_max=canary_max, explicit=canary)
    waves = make_waves(list(rebuild), chosen, wave_size)

    generation = repair_generation_id(incident.incident_id)
    namespace = writer.register_generation(
        generation,
        "repair",
        own_namespace=True,
        run_id=run_id,
        parent=",".join(incident.failed_generations),
        code_version=spec.fingerprint,
        note=f"repair of incident {incident.incident_id}",
    )

    def txn() -> None:
        with engine.transaction() as s:
            ensure_repair_tables(s)
            if s.scalar(f"SELECT count(*) FROM {PLANS} WHERE incident_id = ?", [incident.incident_id]):
                return  # another attempt finished first
            if current_namespace(s, spec) != current:
                raise RecoveryError(f"{spec.target.table} was republished while planning; plan again")
            watermark = s.scalar(f"SELECT max({quote(spec.source.ingested_at)}) FROM {spec.source.table_name.sql()}")
            stamped_at = utcnow()
            rebuilt = list(rebuild)
            snap = snapshot_table(spec)
            part = quote(spec.target.partition)
            s.materialize(
                snap,
                f"SELECT * FROM ({expected_rows(s, spec, watermark, keep=True)}) "
                f"WHERE {in_partitions(s, spec, rebuilt)}",
            )
            # carried: every row outside the rebuilt partitions, except a key the snapshot rebuilds
            # elsewhere (a stray copy of a duplicated or mispartitioned key)
            carry = writer.write_in(
                s,
                generation,
                f"SELECT t.* FROM {namespace_sql(current)} t ANTI JOIN {snap} USING ({quote_all(spec.key)}) "
                f"WHERE NOT ({in_partitions(s, spec, rebuilt)})",
                mode="append",
                at=stamped_at,
                run_id=run_id,
                note="carry over partitions that need no repair",
                keep_stamps=True,
                log_delta=False,
            )
            low_seq = carry.seq
            faults.checkpoint("plan:carried")  # the repair generation holds the carried rows, no plan yet
            s.execute(
                f"INSERT INTO {PLANS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, 'building', ?, ?, ?, NULL)",
                [
                    incident.incident_id,
                    spec.dataset,
                    generation,
                    namespace,
                    current,
                    incident.failed_generations,
                    low_seq,
                    watermark,
                    stamped_at,
                    utcnow(),
                    canary_max,
                    wave_size,
                ],
            )
            s.execute(
                "CREATE OR REPLACE TEMP TABLE __plan (partition VARCHAR, wave INTEGER, reason VARCHAR, "
                "labels VARCHAR[])"
            )
            for n, parts in waves.items():
                for p in parts:
                    s.execute("INSERT INTO __plan VALUES (?, ?, NULL, ?)", [p, n, rebuild[p]])
            for p, reason in qualified.items():
                s.execute("INSERT INTO __plan VALUES (?, NULL, ?, ?)", [p, reason, damaged[p]])
            s.replace_rows(  # the control-plane rows read the (data-plane) namespace and snapshot
                PARTITIONS,
                [n for n, _ in s.columns(PARTITIONS)],
                insert=f"""
                SELECT ?, pl.partition, pl.wave, CASE WHEN pl.reason IS NULL THEN 'rebuild' ELSE 'keep (qualified)' END,
                       pl.reason, pl.labels, coalesce(b.n, 0), b.t, coalesce(e.n, 0), e.t, NULL, NULL, NULL, NULL,
                       CASE WHEN pl.reason IS NULL THEN 'planned' ELSE 'kept' END
                FROM __plan pl
                LEFT JOIN (SELECT CAST({part} AS VARCHAR) AS p, count(*) AS n, {partition_total_sql(spec)} AS t
                           FROM {namespace_sql(current)} GROUP BY 1) b ON b.p = pl.partition
                LEFT JOIN (SELECT CAST({part} AS VARCHAR) AS p, count(*) AS n, {partition_total_sql(spec)} AS t
                           FROM {snap} GROUP BY 1) e ON e.p = pl.partition""",
                params=[incident.incident_id],
            )
            EventSource(dataset=spec.dataset, incident_id=incident.incident_id, actor=actor, run_id=run_id).record(
                s,
                "repair_started",
                f"repair generation {generation} in {namespace}: {len(rebuilt)} partitions to rebuild "
                "from the source "
                f"as of {watermark} ({len(waves[0])} canary, {len(waves) - 1} waves), "
                f"{len(qualified)} qualified and kept, "
                f"{carry.rows_inserted:,} rows carried over; low watermark seq {low_seq}",
                {"low_seq": low_seq, "source_watermark": str(watermark), "waves": waves, "qualified": qualified},
            )
            faults.checkpoint("plan:recorded")  # everything written, not committed

    retrying(txn)
    faults.checkpoint("plan:committed")
    with engine.session(read_only=True) as s:
        return require_plan(s, incident.incident_id)


def build_wave(writer: Writer, plan: RepairPlan, wave: int, *, run_id: str | None = None) -> int:
    """Rebuild one wave's partitions from the fixed snapshot. Returns the rows written."""
    spec = writer.spec
    if plan.status != "building":
        raise RecoveryError(
            f"the repair of {plan.incident_id} is {plan.status}"
            + (f" ({plan.stopped_reason})" if plan.stopped_reason else "")
            + "; no wave can be built"
        )
    earlier = [n for n in plan.waves if n < wave and any(p not in plan.built for p in plan.waves[n])]
    if earlier:
        raise RecoveryError(
            f"{wave_name(earlier[0])} of {plan.incident_id} has not been built and gated yet; "
            f"build the waves in order (canary first)"
        )
    partitions = plan.waves[wave]
    part = quote(spec.target.partition)

    # the wave's rows and its partitions' "built" status commit together
    def txn() -> WriteResult:
        with writer.engine.transaction() as s:
            result = writer.write_in(
                s,
                plan.generation,
                f"SELECT * FROM {snapshot_table(spec)} WHERE {in_partitions(s, spec, partitions)}",
                mode="replace_partitions",
                partitions=partitions,
                at=plan.stamped_at,
                run_id=run_id,
                note=f"{wave_name(wave)} of the repair of {plan.incident_id}",
            )
            faults.checkpoint("wave:written")  # the wave's rows written, its partitions not yet recorded built
            # the wave's partition totals (from the data plane) collected for the control-plane UPDATE
            s.collect_table(
                "__wave_totals",
                f"""SELECT CAST({part} AS VARCHAR) AS p, count(*) AS n, {partition_total_sql(spec)} AS t
                FROM {namespace_sql(plan.namespace)} WHERE {in_partitions(s, spec, partitions)} GROUP BY 1""",
            )
            s.execute(
                f"""UPDATE {PARTITIONS} SET status = 'built', built_seq = ?, built_run_id = ?,
                        rows_after = coalesce(a.n, 0),
                       total_after = a.t
                FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS p) w
                LEFT JOIN __wave_totals a ON a.p = w.p
                WHERE incident_id = ? AND partition = w.p""",
                [result.seq, run_id, partitions, plan.incident_id],
            )
            s.drop_relation("__wave_totals")
            faults.checkpoint("wave:recorded")  # everything written, not committed
            return result

    try:
        written = retrying(txn).rows_inserted
        faults.checkpoint("wave:committed")
        return written
    except FencedGenerationError as err:
        writer.record_fence_attempt(plan.generation, "write:replace_partitions", run_id=run_id, detail=str(err))
        raise


def stop_in(s: Session, writer: Writer, plan: RepairPlan, reason: str, *, run_id: str | None = None) -> None:
    """Stop the repair inside the caller's transaction (a failed gate's, so that no kill leaves its results
    without the stop): no further wave, both generations kept, the reason on the timeline."""
    s.execute(
        f"UPDATE {PLANS} SET status = 'stopped', stopped_reason = ? WHERE incident_id = ?",
        [reason, plan.incident_id],
    )
    EventSource(dataset=writer.spec.dataset, incident_id=plan.incident_id, actor="repair", run_id=run_id).record(
        s, "repair_stopped", f"expansion stopped, {plan.namespace} and {plan.from_namespace} both kept: {reason}"
    )


def resume(writer: Writer, plan: RepairPlan, *, actor: str, note: str) -> None:
    """Let a stopped repair continue after the cause was understood (recorded on the timeline)."""

    def txn() -> None:
        with writer.engine.transaction() as s:
            s.execute(
                f"UPDATE {PLANS} SET status = 'building', stopped_reason = NULL WHERE incident_id = ? "
                "AND status = 'stopped'",
                [plan.incident_id],
            )
            EventSource(dataset=writer.spec.dataset, incident_id=plan.incident_id, actor=actor).record(
                s, "repair_resumed", f"repair resumed: {note}"
            )
            faults.checkpoint("resume:recorded")  # building again and on the timeline, not committed

    retrying(txn)
    faults.checkpoint("resume:committed")
