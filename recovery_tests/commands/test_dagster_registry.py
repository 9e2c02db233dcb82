"""A target the team's own Dagster asset wrote: the failed Dagster backfill id is all the
incident needs. ``recovery registry dagster`` resolves it to its runs through the Dagster
instance, writes the asset's runs as the registry, and the recovery then labels the
concurrent run's writes the backfill clobbered ``overwritten`` (from that registry) and
publishes the source's truth.

The asset below imports nothing from ``recovery``: it is what a team writes with plain
DuckDB, stamping each row with the run id, the source version and the load time.
"""

from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
import yaml

from recovery_tests.support.example_build import env
from recovery_tests.support.foreign_warehouse import cli
from recovery_tests.support.rows import present

DAYS = ["2025-05-01", "2025-05-02", "2025-05-03"]
BACKFILL = "bfsales01"


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class SalesConfig(dg.Config):
    db: str
    as_of: str | None = None  # a backfill reads the source as of its start
    cents_bug: bool = False  # the bug: even ids' amounts written in cents


@dg.asset(key=["mart", "sales"], partitions_def=dg.StaticPartitionsDefinition(DAYS))
def sales(context: dg.AssetExecutionContext, config: SalesConfig) -> None:
    as_of = datetime.fromisoformat(config.as_of) if config.as_of else utcnow()
    con = duckdb.connect(config.db)
    try:
        con.execute("BEGIN")
        con.execute("DELETE FROM mart.sales WHERE day = ?", [context.partition_key])
        con.execute(
            """INSERT INTO mart.sales
               SELECT id, day, CASE WHEN ? AND id % 2 = 0 THEN amount * 100 ELSE amount END, rev, ?, ?
               FROM (SELECT * FROM raw.events WHERE arrived_at <= ?
                     QUALIFY row_number() OVER (PARTITION BY id ORDER BY rev DESC) = 1)
               WHERE op <> 'D' AND day = ?""",
            [config.cents_bug, context.run.run_id, utcnow(), as_of, context.partition_key],
        )
        con.execute("COMMIT")
    finally:
        con.close()


def _events(con, ids, rev: int, bump: int = 0) -> None:
    rows = pd.DataFrame(
        {
            "id": ids,
            "rev": rev,
            "op": "I" if rev == 1 else "U",
            "day": [pd.Timestamp(DAYS[i % 3]).date() for i in ids],
            "amount": [i * 10 + bump for i in ids],
            "arrived_at": utcnow(),
        }
    )
    con.execute("INSERT INTO raw.events SELECT id, rev, op, day, amount, arrived_at FROM rows")


def _materialize(instance, db: Path, day: str, *, tags: dict | None = None, **config) -> None:
    dg.materialize(
        [sales],
        partition_key=day,
        instance=instance,
        tags=tags or {},
        run_config={"ops": {"mart__sales": {"config": {"db": str(db), **config}}}},
    )


def build(root: Path, home: Path, *, runs: bool = True) -> Path:
    """Normal daily loads, then backfill ``bfsales01`` (runs tagged by Dagster's backfill tag) that
    reads a snapshot taken at its start: day 1 with the cents bug; meanwhile day 2's keys get a
    new version and the normal load writes it; the backfill's day-2 run then writes the old one."""
    root.mkdir(parents=True)
    db = root / "wh.duckdb"
    con = duckdb.connect(str(db))
    con.execute(
        "CREATE SCHEMA raw; CREATE SCHEMA mart; CREATE TABLE raw.events (id INTEGER, rev INTEGER, op VARCHAR, "
        "day DATE, amount DECIMAL(10, 2), arrived_at TIMESTAMP); CREATE TABLE mart.sales (id INTEGER, day DATE, "
        "amount DECIMAL(10, 2), src_rev INTEGER, _run_id VARCHAR, _loaded_at TIMESTAMP)"
    )
    _events(con, list(range(1, 31)), 1)
    con.close()
    with env(DAGSTER_HOME=str(home)), dg.DagsterInstance.get() as instance:
        for day in DAYS if runs else []:
            _materialize(instance, db, day)
        if not runs:
            return _spec(root)
        snapshot = utcnow().isoformat()
        backfill = {"dagster/backfill": BACKFILL}
        _materialize(instance, db, DAYS[0], tags=backfill, as_of=snapshot, cents_bug=True)
        con = duckdb.connect(str(db))
        _events(con, [i for i in range(1, 31) if i % 3 == 1], 2, bump=1)  # day 2's keys change
        con.close()
        _materialize(instance, db, DAYS[1])  # the normal load writes them
        _materialize(instance, db, DAYS[1], tags=backfill, as_of=snapshot)  # the backfill clobbers them
    return _spec(root)


def _spec(root: Path) -> Path:
    (root / "t.sql").write_text("SELECT id, day, CAST(amount AS DECIMAL(10, 2)) AS amount FROM {{ source }}\n")
    (root / "spec.yaml").write_text(
        "dataset: sales\nwarehouse: {engine: duckdb, path: wh.duckdb}\n"
        "source: {table: raw.events, key: [id], version: rev, op: op, upsert_ops: [I, U], delete_ops: [D], "
        "ingested_at: arrived_at}\n"
        "target: {table: mart.sales, partition: day, transform: t.sql, "
        "metadata: {generation: _run_id, source_version: src_rev, written_at: _loaded_at}, amount: amount}\n"
    )
    return root


def test_a_failed_dagster_backfill_id_resolves_to_its_runs_and_the_clobbered_writes_are_overwritten(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    root = build(tmp_path / "sales", home)
    spec, incident = root / "spec.yaml", root / "incident.yaml"

    r = cli(home, "registry", "dagster", "--spec", str(spec), "--backfill", BACKFILL, "--incident-out", str(incident))
    assert r.code == 0, r.out
    assert "Dagster backfill bfsales01: 2 runs, 2 of which wrote 20 rows of mart.sales; 6 runs" in r.out, r.out
    drafted = yaml.safe_load(incident.read_text())
    con = duckdb.connect(str(root / "wh.duckdb"), read_only=True)
    try:
        runs = con.execute("SELECT generation, kind FROM ops.dagster_runs ORDER BY started_at").fetchall()
    finally:
        con.close()
    # the incident names the backfill: its runs and the stamp later runs through the IO manager would carry
    assert drafted["dagster_backfill"] == BACKFILL
    assert sorted(drafted["failed_generations"]) == sorted(
        [g for g, k in runs if k == "backfill"] + [f"backfill-{BACKFILL}"]
    )
    assert [k for _, k in runs].count("ingest") == 4
    # the printed registry section goes into the spec, as a user would paste it
    doc = yaml.safe_load(spec.read_text())
    doc["registry"] = yaml.safe_load(r.out.split("add to the spec:\n", 1)[1].split("draft incident", 1)[0])["registry"]
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    drafted["approved_by"] = ["head-of-data"]
    incident.write_text(yaml.safe_dump(drafted, sort_keys=False))

    assert cli(home, "contain", "--incident", str(incident)).code == 0
    assessed = cli(home, "assess", "--incident", str(incident))
    assert assessed.code == 0, assessed.out
    got = pd.read_parquet(root / "reports" / f"INC-DRAFT-{BACKFILL}" / "reconciliation.parquet")
    labels = dict(zip(got["id"], got["label"], strict=True))
    assert labels == (
        {i: "incorrectly_transformed" for i in range(1, 31) if i % 3 == 0 and i % 2 == 0}
        | {i: "overwritten" for i in range(1, 31) if i % 3 == 1}
    )
    assert {b.split(" (")[0] for b in got.loc[got["label"] == "overwritten", "basis"]} == {"registry ops.dagster_runs"}

    for verb in ("repair", "publish"):
        r = cli(home, verb, "--incident", str(incident))
        assert r.code == 0 and "Traceback" not in r.out, (verb, r.out)
    con = duckdb.connect(str(root / "wh.duckdb"), read_only=True)
    try:
        wrong = present(
            con.execute("""
            WITH truth AS (SELECT id, day, amount, rev FROM raw.events
                           QUALIFY row_number() OVER (PARTITION BY id ORDER BY rev DESC) = 1)
            SELECT count(*) FROM truth t FULL JOIN mart.sales s USING (id)
            WHERE s.id IS NULL OR t.id IS NULL OR s.amount <> t.amount OR s.src_rev <> t.rev""").fetchone()
        )[0]
    finally:
        con.close()
    assert wrong == 0


def test_an_unknown_backfill_id_is_one_line_naming_the_instance(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    root = build(tmp_path / "sales", home, runs=False)
    r = cli(home, "registry", "dagster", "--spec", str(root / "spec.yaml"), "--backfill", "no-such-backfill")
    assert r.code == 2 and "no run of Dagster backfill 'no-such-backfill'" in r.out and "DAGSTER_HOME" in r.out, r.out
    assert "Traceback" not in r.out
