"""Convergence on the second dataset: ingestion lag told apart from drift (issue #41, #34 item 6).

``sample_data/shipments`` is a mart the team's own jobs loaded, its runs in its own registry
(``ops.load_runs``), recovered once here through the CLI; each test copies the
recovered folder and lands late changes in the source as a carrier would, then runs
``recovery verify`` as a user does:

- late corrections younger than ``convergence.max_lag`` are pending, not drift: verify passes
  and says how many wait, how old the oldest is, and the watermark with where it comes from;
- older ones fail it with a sentence saying ingestion is behind and by how much, and the
  scheduled job's alert carries the same figures; once ingestion applies them, it passes;
- a change the target misses behind the watermark is drift and fails it;
- a team's partitioned asset written through the IO manager records the watermark it applied,
  so a partition it rebuilt after late changes is not reported as drift.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from recovery.defs.alerts.resources import NotifierResource
from recovery.defs.alerts.sensors import asset_check_alert_sensor
from recovery.defs.convergence.assets import LAG_CHECK, REPAIRED_CHECK, VERIFY_JOB, convergence, verify_convergence_job
from recovery.defs.resources import warehouse_resource
from recovery.io import ManagedDuckDBIOManager
from recovery.lib.catalog_checks import load_spec
from recovery.lib.control.plane import utcnow
from recovery.lib.convergence import ConvergenceResult, verify_convergence
from recovery.lib.engine import open_engine
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.managed_output import SOURCE_WATERMARK_KEY
from recovery.lib.write.writer import Writer
from recovery_tests.support.foreign_warehouse import build_shipments, cli, fresh_copy
from recovery_tests.support.repaired_small import Receiver
from recovery_tests.support.rows import present

pytestmark = pytest.mark.slow

REGISTRY_WATERMARK = datetime(2013, 7, 8)  # the team's last incremental load read the source up to here
REPAIRED = "2013-02"  # a month the failed backfill damaged and the repair rebuilt


@pytest.fixture(scope="module")
def recovered(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipments incident contained, assessed, repaired and published once, with
    ``convergence.max_lag: 1h`` (the verbs verify needs; evidence, restatement and reports are not)."""
    root = fresh_copy(build_shipments(shared_dir), tmp_path_factory.mktemp("lag") / "shipments")
    spec = root / "spec.yaml"
    spec.write_text(spec.read_text() + "convergence: {max_lag: 1h}\n")
    for verb in ("contain", "assess", "repair", "publish"):
        r = cli(root / "home", verb, "--incident", str(root / "incident.yaml"))
        assert r.code == 0, (verb, r.out)
    return root


@pytest.fixture
def shipments(recovered: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(recovered, tmp_path / "shipments"))


def late_corrections(root: Path, month: str, n: int, arrived: datetime) -> list[tuple[str, int]]:
    """``n`` carriers' corrections (a new revision, cost up by $5) to live shipments of ``month``."""
    con = duckdb.connect(str(root / "warehouse.duckdb"))
    try:
        keys = con.execute(
            "SELECT carrier_code, tracking_no FROM mart.shipments WHERE ship_month = ? ORDER BY ALL LIMIT ?",
            [month, n],
        ).fetchall()
        for carrier, tracking in keys:
            con.execute(
                "INSERT INTO raw.shipment_events SELECT carrier_code, tracking_no, rev + 1, 'U', shipped_on, weight_g, "
                "cost_cents + 500, service, ? FROM raw.shipment_events WHERE carrier_code = ? AND tracking_no = ? "
                "ORDER BY rev DESC LIMIT 1",
                [arrived, carrier, tracking],
            )
    finally:
        con.close()
    return keys


def text(out: str) -> str:
    """The CLI's output with the terminal's line wrapping undone."""
    return " ".join(out.split())


def check(root: Path) -> ConvergenceResult:
    spec = load_spec(root / "spec.yaml")
    return verify_convergence(open_engine(spec.warehouse), spec)


def test_late_changes_younger_than_the_lag_are_pending_not_drift_and_verify_passes(shipments: Path):
    late_corrections(shipments, REPAIRED, 5, utcnow() - timedelta(minutes=10))
    r = cli(shipments / "home", "verify", "--incident", str(shipments / "incident.yaml"))
    assert r.code == 0, r.out
    assert "Traceback" not in r.out
    out = text(r.out)
    assert f"{LAG_CHECK} (passed): ingestion keeps up" in out, out
    assert "pending: 5 changes in 1 partition, the oldest 10m old (convergence.max_lag 1h)" in out
    assert "watermark 2013-07-08 00:00:00 (registry ops.load_runs" in out

    result = check(shipments)
    assert result.converged and not result.drifted()
    by_partition = {p.partition: p for p in result.partitions}
    feb = by_partition[REPAIRED]
    assert (feb.repaired, feb.drift_keys, feb.pending_changes, feb.pending_overdue) == (True, 0, 5, 0)
    assert feb.watermark == REGISTRY_WATERMARK and feb.watermark_basis.startswith("registry ops.load_runs")
    assert result.pending_changes == 5 and result.watermark == REGISTRY_WATERMARK
    assert timedelta(minutes=9) < present(result.lag()) < timedelta(minutes=15)
    # the other repaired months hold nothing pending and equal the source
    others = [p for p in result.partitions if p.partition != REPAIRED]
    assert others and all(p.pending_changes == 0 and p.drift_keys == 0 for p in others)


def test_late_changes_older_than_the_lag_fail_saying_how_far_behind_until_ingestion_applies_them(
    shipments: Path, monkeypatch
):
    monkeypatch.delenv("RECOVERY_UI_URL", raising=False)
    late_corrections(shipments, REPAIRED, 5, utcnow() - timedelta(hours=3))
    r = cli(shipments / "home", "verify", "--incident", str(shipments / "incident.yaml"))
    assert r.code == 1, r.out
    out = text(r.out)
    assert f"{LAG_CHECK} (FAILED): ingestion is behind by 3h" in out, out
    assert "5 source changes that arrived after the watermark 2013-07-08 00:00:00 (registry ops.load_runs" in out
    assert "after convergence.max_lag (1h), in 1 partition (2013-02). Fix: run ingestion" in out
    assert f"not converged: {LAG_CHECK}" in out  # the data itself does not drift: only the lag fails
    assert "(overdue)" in out

    # the scheduled job (default config, no incident) fails the same check, and its alert carries the figures
    spec_path = shipments / "spec.yaml"
    receiver = Receiver()
    try:
        resources = {
            "warehouse": warehouse_resource(str(spec_path)),
            "notifier": NotifierResource(kind="webhook", url=receiver.url),
        }
        defs = dg.Definitions(
            assets=[convergence], jobs=[verify_convergence_job], sensors=[asset_check_alert_sensor], resources=resources
        )
        with dg.instance_for_test() as instance:
            run = defs.resolve_job_def(VERIFY_JOB).execute_in_process(instance=instance)
            checks = {c.check_name: c for c in run.get_asset_check_evaluations()}
            assert checks[LAG_CHECK].passed is False and checks[REPAIRED_CHECK].passed is True
            with dg.build_sensor_context(instance=instance, definitions=defs, resources=resources) as context:
                asset_check_alert_sensor(context)
    finally:
        receiver.close()
    [alert] = [a for a in receiver.received if LAG_CHECK in a["subject"]]
    for figure in (
        "ingestion is behind by 3h",  # how far behind
        "drift: 0 keys in 0 of",  # drift
        "pending: 5 changes in 1 partition, the oldest 3h",  # pending: count and age of the oldest
        "watermark 2013-07-08 00:00:00 (registry ops.load_runs",  # the watermark and where it comes from
    ):
        assert figure in alert["body"], alert["body"]

    # the team's ingestion, now through the writer, applies them: nothing pending, watermark from the write log
    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="ingestion")
    writer.register_generation("inc-catch-up", "ingest")
    apply_changes(writer, "inc-catch-up", until=utcnow())
    after = check(shipments)
    assert after.converged and after.pending_changes == 0 and not after.drifted()
    assert after.watermark_basis.startswith("write log: write") and "inc-catch-up" in after.watermark_basis
    assert REPAIRED in after.recent_partitions  # ingestion wrote it last
    assert cli(shipments / "home", "verify", "--incident", str(shipments / "incident.yaml")).code == 0


def test_a_change_the_target_misses_behind_the_watermark_is_drift_and_fails_verify(shipments: Path):
    late_corrections(shipments, REPAIRED, 2, utcnow() - timedelta(minutes=5))  # pending, reported apart
    [(carrier, tracking)] = late_corrections(shipments, "2013-03", 1, REGISTRY_WATERMARK - timedelta(hours=1))
    r = cli(shipments / "home", "verify", "--incident", str(shipments / "incident.yaml"))
    assert r.code == 1, r.out
    out = text(r.out)
    assert f"not converged: {REPAIRED_CHECK}" in out and "2013-03 (1 keys)" in out, out
    result = check(shipments)
    march = next(p for p in result.partitions if p.partition == "2013-03")
    assert (march.drift_keys, march.changed, march.pending_changes) == (1, 1, 0)
    assert march.sample_keys == [f"{carrier}|{tracking}"]
    feb = next(p for p in result.partitions if p.partition == REPAIRED)
    assert (feb.drift_keys, feb.pending_changes) == (0, 2)
    assert LAG_CHECK not in out.split("not converged:")[1]


def month_asset(spec, months: list[str], *, read_up_to: datetime | None = None, stale: tuple | None = None):
    """What the team writes: ``mart/shipments`` by month, computed from the change log itself; with
    ``read_up_to`` it reads a snapshot of the source and reports how far it read; with ``stale``
    (a bug) it writes that key's version as of the registry's watermark."""

    @dg.asset(key=["mart", "shipments"], partitions_def=dg.StaticPartitionsDefinition(months))
    def shipments_by_month(context):  # unannotated: this module postpones annotations, Dagster reads them
        con = duckdb.connect(str(spec.warehouse.path), read_only=True)
        try:
            frame = con.execute(
                f"SELECT * FROM ({expected_rows_sql(spec, read_up_to)}) WHERE ship_month = ? "
                f"AND (carrier_code, tracking_no) IS DISTINCT FROM (?, ?) UNION ALL "
                f"SELECT * FROM ({expected_rows_sql(spec, REGISTRY_WATERMARK)}) WHERE (carrier_code, "
                "tracking_no) = (?, ?)",
                [context.partition_key, *(stale or (None, None)), *(stale or (None, None))],
            ).df()
        finally:
            con.close()
        reported = {SOURCE_WATERMARK_KEY: read_up_to.isoformat()} if read_up_to else {}
        return dg.Output(frame, metadata=reported)

    return shipments_by_month


def test_an_io_manager_generation_records_its_watermark_and_produces_no_false_drift(shipments: Path):
    spec_path = shipments / "spec.yaml"
    spec = load_spec(spec_path)
    before_late = utcnow() - timedelta(minutes=30)
    may = late_corrections(shipments, "2013-05", 4, utcnow() - timedelta(minutes=20))
    late_corrections(shipments, "2013-06", 3, utcnow() - timedelta(minutes=20))
    resources = {"io_manager": ManagedDuckDBIOManager(database=str(spec.warehouse.path), specs=[str(spec_path)])}
    months = ["2013-05", "2013-06"]
    # May rebuilt from the source as it is now; June from a snapshot taken before the late changes, which
    # the asset reports
    assert dg.materialize([month_asset(spec, months)], partition_key="2013-05", resources=resources).success
    assert dg.materialize(
        [month_asset(spec, months, read_up_to=before_late)], partition_key="2013-06", resources=resources
    ).success

    result = check(shipments)
    by_partition = {p.partition: p for p in result.partitions}
    may_p, june = by_partition["2013-05"], by_partition["2013-06"]
    assert not result.drifted(), [(p.partition, p.drift_keys, p.sample_keys) for p in result.drifted()]
    assert may_p.recent and (may_p.drift_keys, may_p.pending_changes) == (0, 0)  # its rows are newer: no drift
    assert "IO-manager run" in may_p.watermark_basis and "the source when the run started" in may_p.watermark_basis
    assert present(may_p.watermark) > REGISTRY_WATERMARK
    assert (june.drift_keys, june.pending_changes) == (0, 3)  # read before they arrived: pending, not drift
    assert june.watermark == before_late and "reported by the asset" in june.watermark_basis
    # against the dataset's watermark alone (what verify compared with while IO-manager runs recorded none),
    # the corrections May applied would be drift
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    try:
        stale = present(
            con.execute(
                f"SELECT count(*) FROM ({expected_rows_sql(spec, REGISTRY_WATERMARK)}) e JOIN mart.shipments t "
                f"USING (carrier_code, tracking_no) WHERE e.ship_month = '2013-05' AND e.cost_usd <> t.cost_usd"
            ).fetchone()
        )[0]
    finally:
        con.close()
    assert stale == len(may) == 4
    r = cli(shipments / "home", "verify", "--incident", str(shipments / "incident.yaml"))
    assert r.code == 0, r.out

    # a run that writes a key's older version although the newer one had arrived before it started is drift
    # (its recorded watermark says it had the change to read), not a pending change that passes within the lag
    assert dg.materialize(
        [month_asset(spec, months, stale=may[0])], partition_key="2013-05", resources=resources
    ).success
    may_p = next(p for p in check(shipments).partitions if p.partition == "2013-05")
    assert (may_p.drift_keys, may_p.changed, may_p.pending_changes) == (1, 1, 0)
    assert may_p.sample_keys == ["|".join(map(str, may[0]))]


def test_a_bad_max_lag_is_one_line_naming_the_field_and_the_fix(shipments: Path):
    spec = shipments / "spec.yaml"
    spec.write_text(spec.read_text().replace("max_lag: 1h", "max_lag: soon"))
    r = cli(shipments / "home", "verify", "--incident", str(shipments / "incident.yaml"))
    assert r.code == 2, r.out
    assert "convergence.max_lag: 'soon' is not a duration. Fix: give a positive duration such as '6h'" in r.out
    assert len(r.out.strip().splitlines()) == 1 and "Traceback" not in r.out
