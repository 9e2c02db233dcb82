"""The fence against real concurrency: a real Dagster backfill of the faulty asset executing
in ``dagster-daemon``'s processes while ``contain_backfill`` runs, and retries after a fence.

The promise is about commits, not about Dagster's cancellation (which is advisory): after
the fence's commit (its seq in ``_recovery.fences``) no write of the generation commits,
in ``_recovery.writes`` or in the delta log; then, that the backfill ends CANCELED with
every run finished, and that no retry run was launched after the fence.

One daemon serves every iteration (starting one costs ~10 s) and all backfills (two runs each)
are launched before it starts, so its first tick queues all their runs; the run queue (two
slots) decides which executes first, and each iteration contains whichever uncontained
generation first has a STARTED run with a committed write, while the other backfills' runs are
executing or queued.
``RECOVERY_RACE_ITERATIONS`` raises the count (default 3 keeps the suite's time bounded).
"""

import os
import time
from datetime import date, timedelta

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import FINISHED_STATUSES

from recovery.defs.resources import WarehouseResource, warehouse_resource
from recovery.example.defs import PAUSE_TAG, TARGET_KEY, transactions_history
from recovery.lib.control.plane import SCHEMA, delta_table
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.errors import FencedGenerationError
from recovery.lib.identifiers import naive_utc
from recovery.lib.incident.model import Incident
from recovery.lib.incident.phases import CONTAIN
from recovery.lib.write.fencing import GENERATION_TAG, fence_incident
from recovery.lib.write.writer import Writer
from recovery.orchestration import Daemon, backfill_finished, launch_asset_backfill, run_job, workspace_context
from recovery_tests.support.containment import Env  # the env fixture (conftest.py): a private copy, a fresh instance
from recovery_tests.support.rows import present

ITERATIONS = int(os.environ.get("RECOVERY_RACE_ITERATIONS", "3"))


# 44 plain days (none of the scenario's flaky, dying or staging partitions): two runs, 31 + 13
PARTITIONS = [(date(2024, 1, 1) + timedelta(days=d)).isoformat() for d in range(44)]
# Each run waits this long after each partition, so that a run seen writing is still writing when
# containment reaches it (14-18 s under load): without it, a run of 31 partitions finished first, on a
# RAM disk every time, and containment only met the next, QUEUED run.
PARTITION_PAUSE_S = "0.5"


def _one(engine, sql: str, params: list):
    with engine.session(read_only=True) as s:
        return s.fetchone(sql, params)


def _all(engine, sql: str, params: list) -> list[tuple]:
    with engine.session(read_only=True) as s:
        return s.fetchall(sql, params)


def _runs(instance: dg.DagsterInstance, generation: str, backfill_id: str) -> dict[str, dg.RunRecord]:
    found: dict[str, dg.RunRecord] = {}
    for tags in ({GENERATION_TAG: generation}, {"dagster/backfill": backfill_id}):
        found |= {r.dagster_run.run_id: r for r in instance.get_run_records(dg.RunsFilter(tags=tags))}
    return found


def _launch(instance, engine, writer, gens: list[str]) -> dict[str, str]:
    """Register each generation and launch its backfill through GraphQL, as the UI does."""
    backfills = {}
    with workspace_context(instance) as workspace:
        for g in gens:
            writer.register_generation(g, "backfill", note="race test")
            backfills[g] = launch_asset_backfill(
                instance,
                TARGET_KEY.path,
                PARTITIONS,
                tags={GENERATION_TAG: g, PAUSE_TAG: PARTITION_PAUSE_S},
                title=g,
                context=workspace,
            )
            with engine.transaction() as s:
                s.execute(f"UPDATE {SCHEMA}.generations SET backfill_id = ? WHERE generation = ?", [backfills[g], g])
    return backfills


@pytest.mark.slow
def test_no_row_of_a_fenced_generation_lands_while_its_real_backfill_is_in_flight(env: Env):
    from recovery.definitions import defs

    spec = parse_spec(env.spec_path)
    engine = open_engine(spec.warehouse)
    code_location = defs()
    gens = [f"backfill-race-{i}" for i in range(ITERATIONS)]
    figures: dict[str, dict] = {}
    with dg.DagsterInstance.get() as instance:
        t0 = time.monotonic()
        backfills = _launch(instance, engine, Writer(engine, spec, actor="race-test"), gens)
        launched_s = round(time.monotonic() - t0, 1)

        def in_flight() -> str | None:
            """An uncontained generation with a STARTED run and a committed write (the queue picks the order)."""
            for g in gens:
                if (
                    g not in figures
                    and instance.get_run_ids(
                        dg.RunsFilter(tags={"dagster/backfill": backfills[g]}, statuses=[dg.DagsterRunStatus.STARTED])
                    )
                    and _one(engine, f"SELECT count(*) FROM {SCHEMA}.writes WHERE generation = ?", [g])[0]
                ):
                    return g
            return None

        def rest_finished() -> bool:
            return all(backfill_finished(instance, backfills[g]) for g in gens if g not in figures)

        reports = {}
        finished_first: list[str] = []  # backfills that ran to the end while another was being contained
        with Daemon() as daemon:
            while len(figures) < len(gens):
                started = time.monotonic()
                found: list[str | None] = [None]  # the generation the predicate saw: asking again could miss it

                def seen() -> bool:
                    found[0] = in_flight()
                    return found[0] is not None or rest_finished()

                daemon.wait_until(seen, timeout_s=300)
                g, waited = found[0], time.monotonic() - started
                if g is None:  # on a loaded machine the queue can finish a backfill during the last containment
                    finished_first = [x for x in gens if x not in figures]
                    break
                incident = f"INC-RACE-{len(figures)}"
                result = run_job(
                    code_location,
                    CONTAIN.job,
                    instance,
                    run_config={
                        "ops": {
                            "validate_incident": {
                                "config": {
                                    "incident_id": incident,
                                    "failed_generations": [g],
                                    "requested_by": "race-test",
                                }
                            }
                        }
                    },
                )
                reports[g] = result.output_for_node("stop_dagster_work").generations[0]
                figures[g] = {
                    "generation": g,
                    "incident": incident,
                    "waited_for_run_s": round(waited, 1),
                    "contain_s": round(time.monotonic() - started - waited, 1),
                }
            t1 = time.monotonic()
            daemon.wait_until(lambda: all(backfill_finished(instance, b) for b in backfills.values()), timeout_s=300)
            timing = {
                "launch_s": launched_s,
                "wait_cancelled_s": round(time.monotonic() - t1, 1),
                "total_s": round(time.monotonic() - t0, 1),
            }

        retries = [r for r in instance.get_run_records() if r.dagster_run.parent_run_id]  # any retry, of anything
        for g, fig in figures.items():
            fence_seq, fenced_at = _one(engine, f"SELECT seq, fenced_at FROM {SCHEMA}.fences WHERE generation = ?", [g])
            before, after = _one(
                engine,
                f"SELECT count(*) FILTER (WHERE seq < ?), count(*) FILTER (WHERE seq > ?) "
                f"FROM {SCHEMA}.writes WHERE generation = ?",
                [fence_seq, fence_seq, g],
            )
            delta_after = _one(
                engine,
                f"SELECT count(*) FROM {delta_table(spec.dataset)} WHERE _generation = ? AND _delta_seq > ?",
                [g, fence_seq],
            )[0]
            refused = _one(engine, f"SELECT count(*) FROM {SCHEMA}.fence_attempts WHERE generation = ?", [g])[0]
            runs = _runs(instance, g, backfills[g])
            stopped = reports[g].stopped_runs
            terminate_events = {
                r[0]
                for r in _all(
                    engine,
                    f"SELECT run_id FROM {SCHEMA}.timeline WHERE incident_id = ? "
                    f"AND kind = 'containment_terminate_run'",
                    [fig["incident"]],
                )
            }
            # the fencing sensor runs in the daemon too: a run it stopped first is one containment found stopping
            by_sensor = {
                r[0][:8]: r[1].removeprefix("run:")
                for r in _all(
                    engine,
                    f"SELECT run_id, action FROM {SCHEMA}.fence_attempts WHERE generation = ? AND action LIKE 'run:%'",
                    [g],
                )
            }
            fig.update(
                writes_before_fence=before,
                writes_after_fence=after,
                delta_rows_after_fence=delta_after,
                refused_attempts=refused,
                runs=len(runs),
                stopped_by_sensor=by_sensor,
                stopped={r.run_id[:8]: r.status_before for r in stopped},
                backfill=present(instance.get_backfill(backfills[g])).status.value,
                unfinished=[
                    r.dagster_run.status.value for r in runs.values() if r.dagster_run.status not in FINISHED_STATUSES
                ],
                retries_after_fence=[
                    r.dagster_run.run_id for r in retries if naive_utc(r.create_timestamp) > fenced_at
                ],
                terminate_events_match=terminate_events == {r.run_id for r in stopped},
            )

    summary = (
        f"{len(figures)} race iterations ({timing}; finished before containment reached them: "
        f"{finished_first}): {list(figures.values())}"
    )
    assert figures, summary  # at least the first backfill is contained while it runs
    for fig in figures.values():
        assert fig["writes_before_fence"] > 0, summary  # the race was real: rows landed before the fence
        assert fig["writes_after_fence"] == 0, summary  # and none after it
        assert fig["delta_rows_after_fence"] == 0, summary
        assert fig["backfill"] == "CANCELED", summary
        assert fig["unfinished"] == [], summary
        assert fig["retries_after_fence"] == [], summary
        assert fig["terminate_events_match"], summary
    # a run seen mid-way can still finish in the seconds containment takes (its next run is then
    # stopped while QUEUED); at least one iteration must have caught a run in flight: stopped
    # once its process was launched (STARTING/STARTED), or refused a write at the fence
    caught = [
        g
        for g, fig in figures.items()
        if {"STARTING", "STARTED"} & set({**fig["stopped"], **fig["stopped_by_sensor"]}.values())
        or fig["refused_attempts"] > 0
    ]
    assert caught, summary
    print(summary)


def test_an_op_retry_after_the_fence_writes_nothing(env: Env):
    spec = parse_spec(env.spec_path)
    engine = open_engine(spec.warehouse)
    gen = "backfill-retry"
    Writer(engine, spec).register_generation(gen, "backfill")
    incident = Incident(incident_id="INC-RETRY", spec=env.spec_path, failed_generations=[gen], requested_by="race-test")
    table = spec.target.table_name.sql()

    @dg.op(retry_policy=dg.RetryPolicy(max_retries=2))
    def rewrite_partition(context, warehouse: WarehouseResource) -> None:
        writer = warehouse.writer(actor="retrying-op")
        writer.write(
            gen,
            f"SELECT * EXCLUDE (_generation, _written_at) FROM {table} WHERE event_date = DATE '2024-01-02'",
            mode="replace_partitions",
            partitions=["2024-01-02"],
            run_id=context.run_id,
        )
        if context.retry_number == 0:
            fence_incident(writer, incident)  # containment commits while this attempt is finishing
            raise RuntimeError("catalog update timed out after the write")  # a transient failure: retried

    @dg.job
    def retrying_job():
        rewrite_partition()

    with dg.DagsterInstance.get() as instance:
        result = retrying_job.execute_in_process(
            instance=instance, raise_on_error=False, resources={"warehouse": warehouse_resource(str(env.spec_path))}
        )
        assert not result.success
        restarts = [e for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
        assert len(restarts) == 2  # both retries ran...
        fence_seq = _one(engine, f"SELECT seq FROM {SCHEMA}.fences WHERE generation = ?", [gen])[0]
        writes = _all(engine, f"SELECT seq FROM {SCHEMA}.writes WHERE generation = ?", [gen])
        assert len(writes) == 1 and writes[0][0] < fence_seq  # ...and wrote nothing: only attempt 0's write landed
        attempts = _all(engine, f"SELECT action, run_id FROM {SCHEMA}.fence_attempts WHERE generation = ?", [gen])
        assert attempts == [("write:replace_partitions", result.run_id)] * 2

        # the example's asset does not even retry once fenced: it fails at registration, counted
        res = dg.materialize(
            [transactions_history],
            partition_key="2024-01-03",
            instance=instance,
            raise_on_error=False,
            tags={GENERATION_TAG: gen},
            resources={"warehouse": warehouse_resource(str(env.spec_path))},
        )
        assert not res.success
        assert not [e for e in res.all_events if e.event_type_value == "STEP_RESTARTED"]
        assert _all(engine, f"SELECT seq FROM {SCHEMA}.writes WHERE generation = ?", [gen]) == writes
        assert (
            _one(
                engine,
                f"SELECT count(*) FROM {SCHEMA}.fence_attempts WHERE generation = ? AND action = 'register' "
                f"AND run_id = ?",
                [gen, res.run_id],
            )[0]
            == 1
        )
    with pytest.raises(FencedGenerationError):
        Writer(engine, spec).write(
            gen, f"SELECT * EXCLUDE (_generation, _written_at) FROM {table} LIMIT 1", mode="append"
        )
