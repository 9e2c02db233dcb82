"""``recovery.lib.pointers.adoption`` and the registry-based inference, on a tiny warehouse written by plain SQL.

No Dagster here: these are the fast tier's checks of what containment and the
reconciliation promise for a target the package never wrote.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import yaml

from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.errors import SpecError
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.pointers.adoption import adopt, release
from recovery.lib.reconcile.classify import reconcile
from recovery.lib.reconcile.inputs import ReconcileInputs

SPEC = {
    "dataset": "parcels",
    "warehouse": {"engine": "duckdb", "path": "w.duckdb"},
    "source": {"table": "raw.events", "key": ["id"], "version": "v", "op": "op", "ingested_at": "arrived"},
    "target": {
        "table": "mart.parcels",
        "partition": "month",
        "transform": "t.sql",
        "metadata": {"generation": "run", "source_version": "sv", "written_at": "wat"},
    },
    "registry": {
        "table": "ops.runs",
        "generation": "run",
        "kind": "kind",
        "started_at": "started",
        "ended_at": "ended",
        "source_watermark": "wm",
    },
}


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """Keys 1-4 loaded by run i1 (watermark 01:00); backfill b1 starts 02:00 reading 01:00; load i2 (03:00,
    watermark 02:30) writes key 2's new version at 03:05 and key 5 (new); b1 then clobbers month 2013-01 at
    04:00 with its stale read: key 2 overwritten, key 3 dropped (deleted), key 5 dropped (missing: never held
    before b1 started), key 4 stale (its v2 arrived at 01:30, before b1 started; i2 loaded it, b1 clobbered it)."""
    (tmp_path / "t.sql").write_text("SELECT id, month, amount FROM {{ source }}")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    con.execute("""
        CREATE SCHEMA raw; CREATE SCHEMA mart; CREATE SCHEMA ops;
        CREATE TABLE raw.events AS SELECT * FROM (VALUES
          (1, 1, 'upsert', '2013-01', 10, TIMESTAMP '2013-01-10 00:10'),
          (2, 1, 'upsert', '2013-01', 20, TIMESTAMP '2013-01-10 00:20'),
          (3, 1, 'upsert', '2013-01', 30, TIMESTAMP '2013-01-10 00:30'),
          (4, 1, 'upsert', '2013-01', 40, TIMESTAMP '2013-01-10 00:40'),
          (4, 2, 'upsert', '2013-01', 41, TIMESTAMP '2013-01-10 01:30'),
          (2, 2, 'upsert', '2013-01', 21, TIMESTAMP '2013-01-10 02:10'),
          (5, 1, 'upsert', '2013-01', 50, TIMESTAMP '2013-01-10 02:20')
        ) t(id, v, op, month, amount, arrived);
        CREATE TABLE ops.runs AS SELECT * FROM (VALUES
          ('i1', 'incremental', TIMESTAMP '2013-01-10 01:00', TIMESTAMP '2013-01-10 01:05',
              TIMESTAMP '2013-01-10 01:00'),
          ('b1', 'backfill',    TIMESTAMP '2013-01-10 02:00', TIMESTAMP '2013-01-10 04:05',
              TIMESTAMP '2013-01-10 01:00'),
          ('i2', 'incremental', TIMESTAMP '2013-01-10 03:00', TIMESTAMP '2013-01-10 03:05',
              TIMESTAMP '2013-01-10 02:30')
        ) t(run, kind, started, ended, wm);
        CREATE TABLE mart.parcels AS SELECT * FROM (VALUES
          (1, '2013-01', 10, 'b1', 1, TIMESTAMP '2013-01-10 04:00'),
          (2, '2013-01', 20, 'b1', 1, TIMESTAMP '2013-01-10 04:00'),
          (4, '2013-01', 40, 'b1', 1, TIMESTAMP '2013-01-10 04:00')
        ) t(id, month, amount, run, sv, wat);
    """)
    con.close()
    return tmp_path


def _labels(root: Path) -> dict[int, tuple[str, str]]:
    spec = load_spec(root / "spec.yaml")
    with open_engine(spec.warehouse).session(read_only=True) as s:
        reconcile(s, ReconcileInputs(spec, ("b1",), incident_id="INC-1", persist=False))
        return {r[0]: (r[1], r[2]) for r in s.fetchall('SELECT id, label, basis FROM "recon__parcels" ORDER BY 1')}


def test_the_registry_tells_deleted_from_missing_and_overwritten_from_stale(warehouse):
    assert _labels(warehouse) == {
        2: ("overwritten", "registry ops.runs"),  # i2 read its v2 and committed before b1's write
        3: ("deleted", "registry ops.runs"),  # live as of i1, the last load before b1 started
        4: ("stale", "registry ops.runs"),  # its v2 arrived before b1 started
        5: ("missing", "registry ops.runs"),  # first arrived after i1's watermark
    }


def test_without_a_registry_the_labels_fall_back_and_say_so(warehouse):
    spec = yaml.safe_load((warehouse / "spec.yaml").read_text())
    del spec["registry"]
    (warehouse / "spec.yaml").write_text(yaml.safe_dump(spec))
    labels = _labels(warehouse)
    assert labels[2] == ("stale", "none") and labels[3] == ("missing", "none")


def test_adoption_is_one_transaction_idempotent_and_fences_foreign_writes_until_release(warehouse):
    spec = load_spec(warehouse / "spec.yaml")
    engine = open_engine(spec.warehouse)
    first = adopt(engine, spec, actor="oncall")
    assert (
        first.adopted_now and first.rows == 3 and first.registry_rows == 3 and first.namespace == "mart.parcels__g0001"
    )
    assert not adopt(engine, spec, actor="oncall").adopted_now
    con = duckdb.connect(str(warehouse / "w.duckdb"))
    try:
        with pytest.raises(duckdb.Error):
            con.execute("INSERT INTO mart.parcels VALUES (9, '2013-01', 1, 'x', 1, now())")
        kinds = dict(con.execute("SELECT generation, kind FROM _recovery.generations").fetchall())
        assert kinds == {"i1": "ingest", "b1": "backfill", "i2": "ingest"}
    finally:
        con.close()
    assert _labels(warehouse)[2][0] == "overwritten"  # the copied registry keeps the inference
    namespace, rows = release(engine, spec, actor="oncall")
    assert (namespace, rows) == ("mart.parcels__g0001", 3)
    con = duckdb.connect(str(warehouse / "w.duckdb"))
    try:
        con.execute("INSERT INTO mart.parcels VALUES (9, '2013-01', 1, 'x', 1, now())")  # a plain table again
    finally:
        con.close()


@pytest.mark.parametrize(
    ("start", "end", "error"),
    [
        ("'2013-01'", "'2013-01'", None),
        ("'2013-1'", "'2013-01'", "partitions.start: '2013-1' is not a partition of month"),
        ("'2013-02'", "'2013-01'", "end '2013-01' is before start '2013-02'"),
        ("'2014-01'", "'2014-02'", "outside the data"),
    ],
)
def test_a_partition_range_is_checked_in_the_columns_own_type_and_format(warehouse, start, end, error):
    (warehouse / "incident.yaml").write_text(
        f"incident_id: INC-1\nspec: spec.yaml\nfailed_generations: [b1]\npartitions: {{start: {start}, end: {end}}}\n"
        f"requested_by: oncall\n"
    )
    incident = parse_incident(warehouse / "incident.yaml")
    if error is None:
        check_incident(incident)
    else:
        with pytest.raises(SpecError, match=error.replace("(", r"\(")):
            check_incident(incident)


def test_an_integer_partition_takes_integers_and_refuses_text(warehouse):
    con = duckdb.connect(str(warehouse / "w.duckdb"))
    con.execute(
        "CREATE OR REPLACE TABLE mart.parcels AS SELECT id, 201301 AS month, amount, run, sv, wat FROM mart.parcels"
    )
    con.close()
    (warehouse / "t.sql").write_text(
        "SELECT id, CAST(replace(month, '-', '') AS INTEGER) AS month, amount FROM {{ source }}"
    )
    for value, ok in [("201301", True), ("'Jan 2013'", False)]:
        (warehouse / "incident.yaml").write_text(
            f"incident_id: INC-1\nspec: spec.yaml\nfailed_generations: [b1]\npartitions: {{start: {value}, "
            f"end: {value}}}\n"
            f"requested_by: oncall\n"
        )
        incident = parse_incident(warehouse / "incident.yaml")
        if ok:
            check_incident(incident)
        else:
            with pytest.raises(SpecError, match="give a value like '201301'"):
                check_incident(incident)
