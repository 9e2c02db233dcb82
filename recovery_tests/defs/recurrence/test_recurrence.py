"""Recurrence gates (the runbook's closing step): every future backfill runs through one guarded
launcher. The worked example's faulty backfill, relaunched through it, is stopped before publish
for each of its bugs and the published table is unchanged; a correct backfill passes every gate
and publishes; a missing approval, an exceeded capacity and a dry run behave as promised."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from recovery.config import EXAMPLE_OUTPUTS, EXAMPLE_SPEC
from recovery.example.relaunch import RECOMPUTE as FAULTY
from recovery.example.relaunch import faulty_2_3_0
from recovery.example.scenario import SCENARIO
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.errors import SpecError
from recovery.lib.recurrence.policy import GATES, active_gates
from recovery.lib.recurrence.publish import verify_backfill_convergence
from recovery.lib.recurrence.request import request_from_mapping
from recovery.lib.snapshot import expected_rows_sql, latest_versions_sql
from recovery.lib.write.writer import Writer
from recovery_tests.support.example_build import env
from recovery_tests.support.recurrence import (
    APPROVER,
    SECOND,
    clean_baseline,
    dataset_writer,
    launch,
    public_hash,
    query_dataset,
)
from recovery_tests.support.rows import present

# ---- the worked example, published correctly, with the spec's recurrence policy -----------------


@pytest.fixture
def dataset(example_copy: Path) -> Path:
    return clean_baseline(example_copy)


def assert_stopped_unchanged(spec_path: Path, before: str, outcome, gate: str) -> None:
    assert outcome.status == "stopped", (outcome.status, outcome.reason)
    assert not outcome.gates[gate].passed, outcome.gates[gate]
    assert public_hash(spec_path) == before
    gen = f"guarded-{outcome.backfill_id}"
    assert (
        query_dataset(spec_path, "SELECT count(*) FROM analytics.transactions WHERE _generation = ?", [gen])[0][0] == 0
    )
    # every write of the backfill landed in its own namespace, never the published one
    assert (
        query_dataset(
            spec_path,
            f"SELECT count(*) FROM {SCHEMA}.writes w JOIN {SCHEMA}.generations g USING (generation) "
            f"WHERE w.generation = ? AND w.namespace IS DISTINCT FROM g.namespace",
            [gen],
        )[0][0]
        == 0
    )
    events = [
        r[0]
        for r in query_dataset(
            spec_path, f"SELECT kind FROM {SCHEMA}.timeline WHERE summary LIKE ?", [f"%{outcome.backfill_id}%"]
        )
    ]
    assert "backfill_stopped" in events and "backfill_gate" in events


def invariant(outcome, name: str):
    return next(r for r in outcome.invariants if r.name == name)


# ---- the faulty backfill, one bug at a time --------------------------------------------------------


def test_overwrite_of_current_partitions_is_refused_by_the_scope_preview(dataset: Path):
    before = public_hash(dataset)
    lo, hi = SCENARIO.requested_range  # the launcher bug: the range ends "today"
    out = launch(dataset, lo.isoformat(), hi.isoformat(), recompute=FAULTY, approved_by=(APPROVER, SECOND))
    assert out.status == "refused"
    scope = out.gates["scope"]
    assert not scope.passed and "2024-07-04" in scope.details and "2024-07-05" in scope.details
    assert out.preflight.preview.current_touched == ["2024-07-04", "2024-07-05"]
    assert public_hash(dataset) == before
    assert (
        query_dataset(dataset, f"SELECT count(*) FROM {SCHEMA}.generations WHERE generation LIKE 'guarded-%'")[0][0]
        == 0
    )
    assert (
        query_dataset(dataset, f"SELECT count(*) FROM {SCHEMA}.namespaces WHERE dataset = 'transactions'")[0][0] == 2
    )  # adopted + clean baseline only


def test_acknowledged_current_partitions_are_fenced_from_concurrent_ingestion(dataset: Path):
    """Even acknowledged, the backfill writes only its own generation, and publish is refused once
    ingestion wrote the range meanwhile: the concurrent write survives, the backfill's rows never show."""
    spec = parse_spec(dataset)

    def faulty_while_ingestion_writes(ctx):
        faulty_2_3_0(ctx)
        ingest = Writer(ctx.writer.engine, spec, actor="ingest_transactions")
        ingest.write(
            "ingest-2024-07-05",
            "SELECT * REPLACE (CAST(amount_usd + 1 AS DECIMAL(18, 2)) AS amount_usd) "
            "FROM analytics.transactions WHERE event_date = DATE '2024-07-05' ORDER BY txn_id LIMIT 3",
            mode="upsert_keys",
        )

    out = launch(
        dataset,
        "2024-07-01",
        "2024-07-05",
        recompute=FAULTY,
        fn=faulty_while_ingestion_writes,
        allow_current_partitions=True,
    )
    assert out.gates["scope"].passed and "acknowledged" in out.gates["scope"].details
    fencing = out.gates["fencing"]
    assert not fencing.passed and "2024-07-05" in fencing.details and "ingestion wrote" in fencing.details
    assert out.status == "stopped"
    assert (
        query_dataset(dataset, "SELECT count(*) FROM analytics.transactions WHERE _generation = 'ingest-2024-07-05'")[
            0
        ][0]
        >= 3
    )
    assert (
        query_dataset(dataset, "SELECT count(*) FROM analytics.transactions WHERE _generation LIKE 'guarded-%'")[0][0]
        == 0
    )


def test_retry_duplicates_are_stopped_by_the_unique_key_invariant(dataset: Path):
    before = public_hash(dataset)
    flaky = SCENARIO.flaky_partitions[0].isoformat()
    out = launch(dataset, "2024-02-12", "2024-02-16", recompute=FAULTY)
    assert_stopped_unchanged(dataset, before, out, "invariants")
    dup = invariant(out, "keys_unique")
    published_that_day = query_dataset(
        dataset, "SELECT count(*) FROM analytics.transactions WHERE event_date = ?", [flaky]
    )[0][0]
    assert max(dup.partitions, key=dup.partitions.get) == flaky
    assert dup.partitions[flaky] >= 2 * 0.9 * published_that_day  # the retried append doubled the partition


def test_dropped_tombstones_are_stopped_by_the_tombstone_invariant(dataset: Path):
    before = public_hash(dataset)
    out = launch(dataset, "2024-01-08", "2024-01-12", recompute=FAULTY)
    assert_stopped_unchanged(dataset, before, out, "invariants")
    spec = parse_spec(dataset)
    watermark = out.preflight.preview.source_watermark
    # independently: keys whose latest change is a delete, whose first ingestion fell in the range
    expected = query_dataset(
        dataset,
        f"""
        WITH latest AS ({latest_versions_sql(spec, watermark, include_deleted=True)}),
             landing AS (SELECT txn_id, CAST(min(ingested_at) AS DATE) AS d FROM raw.transaction_events
                         WHERE ingested_at <= ? GROUP BY 1)
        SELECT count(*) FROM latest JOIN landing USING (txn_id)
        WHERE op = 'delete' AND d BETWEEN DATE '2024-01-08' AND DATE '2024-01-12'""",
        [watermark],
    )[0][0]
    assert expected > 0
    assert invariant(out, "no_tombstoned_keys").violations == expected


def test_schema_v1_misread_is_stopped_by_the_anomaly_gate_on_totals(dataset: Path):
    before = public_hash(dataset)
    out = launch(dataset, "2024-03-04", "2024-03-08", recompute=FAULTY)  # after the buggy cut-over, before the real one
    assert_stopped_unchanged(dataset, before, out, "anomaly")
    anomaly = out.gates["anomaly"]
    assert anomaly.observed == 5  # every partition of the range
    ns = query_dataset(
        dataset, f"SELECT namespace FROM {SCHEMA}.generations WHERE generation = ?", [f"guarded-{out.backfill_id}"]
    )[0][0]
    built, published = query_dataset(
        dataset,
        f"""SELECT (SELECT sum(amount_usd) FROM {ns} WHERE event_date BETWEEN '2024-03-04' AND '2024-03-08'),
        (SELECT sum(amount_usd) FROM analytics.transactions WHERE event_date BETWEEN '2024-03-04' AND '2024-03-08')""",
    )[0]
    assert built / published > 50  # v1 cents read as dollars


def test_mispartitioned_late_events_are_stopped_by_the_partition_invariant(dataset: Path):
    before = public_hash(dataset)
    out = launch(dataset, "2024-06-10", "2024-06-14", recompute=FAULTY)
    assert_stopped_unchanged(dataset, before, out, "invariants")
    watermark = out.preflight.preview.source_watermark
    # independently: each key's latest upsert whose first ingestion day in the range differs from its event day
    late = query_dataset(
        dataset,
        """
        WITH latest AS (SELECT * FROM raw.transaction_events WHERE ingested_at <= ? AND op = 'upsert'
                        QUALIFY row_number() OVER (PARTITION BY txn_id ORDER BY version DESC) = 1),
             landing AS (SELECT txn_id, CAST(min(ingested_at) AS DATE) AS d FROM raw.transaction_events
                         WHERE ingested_at <= ? GROUP BY 1)
        SELECT count(*) FROM latest JOIN landing USING (txn_id)
        WHERE d BETWEEN DATE '2024-06-10' AND DATE '2024-06-14' AND CAST(event_ts AS DATE) <> d""",
        [watermark, watermark],
    )[0][0]
    assert late > 0
    assert invariant(out, "partition_is_event_date").violations == late


# ---- a correct backfill ---------------------------------------------------------------------------


def test_correct_backfill_passes_every_gate_publishes_and_keeps_the_prior_until_convergence(dataset: Path):
    spec = parse_spec(dataset)
    prior = query_dataset(
        dataset, f"SELECT namespace FROM {SCHEMA}.pointers WHERE public_name = 'analytics.transactions'"
    )[0][0]
    outside = query_dataset(
        dataset,
        "SELECT md5(string_agg(CAST(t AS VARCHAR), '|' ORDER BY txn_id)) FROM analytics.transactions t "
        "WHERE event_date NOT BETWEEN '2024-06-01' AND '2024-06-30'",
    )[0][0]
    out = launch(dataset, "2024-06-01", "2024-06-30")
    assert out.status == "published", out.reason
    assert sorted(out.gates) == sorted(GATES) and all(g.passed for g in out.gates.values()), out.gates
    assert len(out.invariants) == 7 and all(i.passed for i in out.invariants)
    rec = query_dataset(
        dataset,
        f"SELECT namespace, manifest_seq, seed_seq, status FROM {SCHEMA}.backfills WHERE backfill_id = ?",
        [out.backfill_id],
    )[0]
    assert rec[0] == out.published_namespace != prior and rec[3] == "published"
    first_write = query_dataset(
        dataset, f"SELECT min(seq) FROM {SCHEMA}.writes WHERE generation = ?", [f"guarded-{out.backfill_id}"]
    )[0][0]
    assert rec[1] < first_write <= rec[2]  # the manifest was committed before the first write
    # consumers read the source's truth in the range, and exactly the prior rows outside it
    diff = query_dataset(
        dataset,
        f"""WITH p AS (SELECT * EXCLUDE (_generation, _written_at) FROM analytics.transactions
                                          WHERE event_date BETWEEN '2024-06-01' AND '2024-06-30'),
                                    e AS (SELECT *
                                        FROM ({expected_rows_sql(spec, out.preflight.preview.source_watermark)})
                                          WHERE event_date BETWEEN '2024-06-01' AND '2024-06-30')
        SELECT (SELECT count(*) FROM (SELECT * FROM p EXCEPT ALL SELECT * FROM e)),
               (SELECT count(*) FROM (SELECT * FROM e EXCEPT ALL SELECT * FROM p))""",
    )[0]
    assert diff == (0, 0)
    assert (
        query_dataset(
            dataset,
            "SELECT md5(string_agg(CAST(t AS VARCHAR), '|' ORDER BY txn_id)) FROM analytics.transactions t "
            "WHERE event_date NOT BETWEEN '2024-06-01' AND '2024-06-30'",
        )[0][0]
        == outside
    )
    assert (
        query_dataset(dataset, f"SELECT status FROM {SCHEMA}.namespaces WHERE namespace = ?", [prior])[0][0]
        == "retained"
    )
    again = launch(dataset, "2024-06-01", "2024-06-30")  # the same request is the same backfill
    assert again.status == "published" and again.published_namespace == out.published_namespace
    verdict = verify_backfill_convergence(dataset_writer(dataset), out.backfill_id)
    assert verdict["converged"], verdict
    assert (
        query_dataset(dataset, f"SELECT status FROM {SCHEMA}.namespaces WHERE namespace = ?", [prior])[0][0]
        == "releasable"
    )


# ---- approval, capacity, dry run, bad input ---------------------------------------------------------


def _nothing_started(spec_path: Path, before: str) -> None:
    assert public_hash(spec_path) == before
    assert (
        query_dataset(spec_path, f"SELECT count(*) FROM {SCHEMA}.generations WHERE generation LIKE 'guarded-%'")[0][0]
        == 0
    )
    assert (
        query_dataset(spec_path, f"SELECT count(*) FROM {SCHEMA}.namespaces WHERE dataset = 'transactions'")[0][0] == 2
    )


def _published_rows(spec_path: Path, first: str, last: str) -> int:
    sql = "SELECT count(*) FROM analytics.transactions WHERE event_date BETWEEN CAST(? AS DATE) AND CAST(? AS DATE)"
    return int(query_dataset(spec_path, sql, [first, last])[0][0])


def _set_policy(spec_path: Path, section: str, value) -> None:
    raw = yaml.safe_load(spec_path.read_text())
    raw["recurrence"][section] = value
    spec_path.write_text(yaml.safe_dump(raw))


def test_missing_approval_refuses_before_any_write(dataset: Path):
    # a large scope needs two approvers: "large" is twice June's rows, so a quarter is large whatever the example's size
    june = _published_rows(dataset, "2024-06-01", "2024-06-30")
    assert june > 0
    rules = [{"required": 1}, {"rows_over": 2 * june, "required": 2}]
    _set_policy(dataset, "approval", {**yaml.safe_load(dataset.read_text())["recurrence"]["approval"], "rules": rules})
    before = public_hash(dataset)
    out = launch(dataset, "2024-06-01", "2024-06-30", approved_by=())
    assert out.status == "refused"
    gate = out.gates["approval"]
    assert (
        not gate.passed
        and "0 of 1 required" in gate.details
        and "Fix: add approved_by from head-of-data" in gate.details
    )
    assert _published_rows(dataset, "2024-01-01", "2024-03-31") > 2 * june
    large = launch(dataset, "2024-01-01", "2024-03-31", approved_by=(APPROVER, "a-stranger"))
    assert large.status == "refused"
    assert (
        "1 of 2 required" in large.gates["approval"].details
        and "not approvers of transactions: a-stranger" in large.gates["approval"].details
    )
    _nothing_started(dataset, before)
    refused = query_dataset(dataset, f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = 'backfill_refused'")[0][0]
    assert refused == 2  # who tried what is on the timeline
    assert launch(dataset, "2024-06-01", "2024-06-30").status == "published"  # approved, the same request runs


def test_capacity_exceeded_refuses_before_any_write(dataset: Path, monkeypatch):
    before = public_hash(dataset)
    raw = yaml.safe_load(dataset.read_text())
    week = _published_rows(dataset, "2024-06-01", "2024-06-07")
    assert week > 10
    raw["recurrence"]["capacity"]["max_rows"] = week // 2  # the week's scope holds about twice as many
    dataset.write_text(yaml.safe_dump(raw))
    out = launch(dataset, "2024-06-01", "2024-06-07")
    assert out.status == "refused"
    assert f"rows > max_rows {week // 2:,}" in out.gates["capacity"].details
    raw["recurrence"]["capacity"]["max_rows"] = 1_000_000
    dataset.write_text(yaml.safe_dump(raw))
    import recovery.lib.recurrence.preview as preview

    monkeypatch.setattr(
        preview.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 10**6, 10**6)
    )
    full = launch(dataset, "2024-06-01", "2024-06-07")
    assert full.status == "refused" and "free on disk" in full.gates["capacity"].details
    _nothing_started(dataset, before)


def _file_hash(spec_path: Path) -> str:
    return hashlib.sha256((spec_path.parent / "warehouse.duckdb").read_bytes()).hexdigest()


def test_dry_run_previews_the_scope_and_writes_nothing(dataset: Path):
    before = _file_hash(dataset)
    lo, hi = SCENARIO.requested_range
    out = launch(dataset, lo.isoformat(), hi.isoformat(), recompute=FAULTY, dry_run=True)
    p = out.preflight.preview
    assert out.status == "dry_run"
    assert (
        len(p.partitions) == (hi - lo).days + 1 and p.partitions[0] == "2024-01-01" and p.partitions[-1] == "2024-07-05"
    )
    assert p.published_rows == query_dataset(dataset, "SELECT count(*) FROM analytics.transactions")[0][0]
    assert p.expected_rows > 0 and p.keys >= p.published_rows and p.estimated_bytes > 0 and p.estimated_seconds > 0
    assert p.current_touched == ["2024-07-04", "2024-07-05"] and not out.gates["scope"].passed
    assert {c.name for c in p.consumers} == {d.name for d in parse_spec(dataset).downstream}
    assert _file_hash(dataset) == before  # byte-identical


def test_backfill_plan_command_is_a_dry_run_through_dagster(dataset: Path, tmp_path: Path, capsys):
    from recovery.cli import main

    before = _file_hash(dataset)
    home = tmp_path / "dagster-home"
    with env(DAGSTER_HOME=str(home), RECOVERY_SPEC=str(dataset)):
        code = main(
            [
                "backfill",
                "plan",
                "--spec",
                str(dataset),
                "--start",
                "2024-06-01",
                "--end",
                "2024-06-30",
                "--approved-by",
                APPROVER,
                "--requested-by",
                "oncall",
            ]
        )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "nothing was written" in printed and "30 (2024-06-01 .. 2024-06-30)" in printed
    assert _file_hash(dataset) == before


def test_bad_requests_name_the_field_and_change_nothing(dataset: Path):
    before = _file_hash(dataset)
    cases: list[tuple[dict, str]] = [
        ({"start": "2024-06-01", "end": "2024-06-30", "requested_by": "a", "approved_by": ["a"]}, "approved_by"),
        ({"start": "2024-06-01", "end": "2024-06-30", "requested_by": "a", "recompute": "os.system"}, "recompute"),
        ({"start": "2024-06-01", "end": "2024-06-30"}, "requested_by"),
        ({"start": "2024-06-01", "end": "2024-06-30", "requested_by": "a", "backfill_id": "x; DROP"}, "backfill_id"),
    ]
    for raw, field in cases:
        with pytest.raises(SpecError) as err:
            request_from_mapping(raw)
        assert err.value.field == field, err.value
    for start, end, field in [("June", "2024-06-30", "start"), ("2024-06-30", "2024-06-01", "end")]:
        with pytest.raises(SpecError) as err:
            launch(dataset, start, end)
        assert err.value.field == field
    with pytest.raises(SpecError) as err:
        launch(dataset, "2024-06-01", "2024-06-02", recompute="recovery.example.nowhere:fn")
    assert err.value.field == "recompute"
    assert _file_hash(dataset) == before


def test_spec_invariants_are_validated_with_the_field_named(tmp_path: Path):
    folder = tmp_path / "transactions"
    shutil.copytree(EXAMPLE_SPEC.parent, folder, ignore=shutil.ignore_patterns(*EXAMPLE_OUTPUTS))
    raw = yaml.safe_load(EXAMPLE_SPEC.read_text())
    raw["recurrence"]["invariants"][0]["sql"] = "DELETE FROM {{ rows }}"
    (folder / "spec.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as err:
        parse_spec(folder / "spec.yaml")
    assert err.value.field == "recurrence.invariants[0].sql" and "SELECT" in str(err.value)
    raw["recurrence"]["capacity"] = {"max_rows": 0}
    raw["recurrence"]["invariants"] = []
    (folder / "spec.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as err:
        parse_spec(folder / "spec.yaml")
    assert err.value.field == "recurrence.capacity.max_rows"


# ---- the Dagster job: gates as blocking asset checks ----------------------------------------------


def _run_guarded_job(dataset: Path, monkeypatch, **config):
    monkeypatch.setenv("RECOVERY_SPEC", str(dataset))
    from recovery.definitions import defs

    job = defs().resolve_job_def("guarded_backfill")
    cfg = {"requested_by": "data-platform-oncall", "approved_by": [APPROVER], **config}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            instance=instance, raise_on_error=False, run_config={"ops": {"recurrence__backfill": {"config": cfg}}}
        )
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        published = [present(e.asset_key) for e in result.get_asset_materialization_events()]
    return result, checks, published


def test_guarded_backfill_job_reports_every_gate_as_a_blocking_check(dataset: Path, monkeypatch):
    result, checks, materialized = _run_guarded_job(dataset, monkeypatch, start="2024-06-01", end="2024-06-07")
    assert result.success
    assert checks == {g: True for g in GATES}
    assert dg.AssetKey(["recurrence", "publication"]) in materialized


def test_guarded_backfill_job_blocks_publication_when_a_gate_fails(dataset: Path, monkeypatch):
    before = public_hash(dataset)
    result, checks, materialized = _run_guarded_job(
        dataset, monkeypatch, start="2024-02-12", end="2024-02-16", recompute=FAULTY
    )
    assert checks["invariants"] is False and checks["manifest"] is True
    assert dg.AssetKey(["recurrence", "publication"]) not in materialized
    assert public_hash(dataset) == before
    status = query_dataset(dataset, f"SELECT status FROM {SCHEMA}.backfills")[0][0]
    assert status == "stopped"


def test_every_dataset_lists_its_active_gates():
    gates = active_gates(parse_spec(EXAMPLE_SPEC))
    assert [g["gate"] for g in gates] == list(GATES)
    assert (
        "partition_is_event_date" in gates[5]["applies"] and "2 approval(s) when rows > 50,000" in gates[0]["applies"]
    )


def test_backfill_run_command_without_approval_exits_1_and_writes_no_data(dataset: Path, tmp_path: Path, capsys):
    from recovery.cli import main

    before = public_hash(dataset)
    with env(DAGSTER_HOME=str(tmp_path / "dagster-home"), RECOVERY_SPEC=str(dataset)):
        code = main(
            [
                "backfill",
                "run",
                "--spec",
                str(dataset),
                "--start",
                "2024-06-01",
                "--end",
                "2024-06-07",
                "--requested-by",
                "oncall",
            ]
        )
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert "refused" in printed and "approval" in printed
    _nothing_started(dataset, before)
