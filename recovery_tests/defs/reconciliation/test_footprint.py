"""Footprint reconciliation: cost proportional to the damage, labels exactly a whole-table run's.

A footprint run (``ReconcileInputs.full = False``) labels the keys the failed generations
wrote and the keys held or expected in their partition range, each exactly as a
whole-table run labels it; a whole-table run counts the damage outside that footprint as
drift. Checked on the small orders dataset (string partitions) and on the reconcile
bench's lineitem (DATE partitions), with damage planted outside the range by another
generation. No Dagster here.
"""

from __future__ import annotations

import json
import sys
from datetime import date, timedelta
from pathlib import Path

import duckdb
import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.engine import open_engine
from recovery.lib.reconcile.classify import partition_table, recon_table
from recovery.lib.reconcile.labels import DAMAGE_LABELS
from recovery.lib.reconcile.run import run_reconciliation
from recovery.lib.snapshot import expected_rows_sql
from recovery_tests.support.rows import present
from recovery_tests.support.small_orders import ingested_small, latest_rows_sql, now

ROW_COLUMNS = "* EXCLUDE (incident_id)"


def _recon(spec, incident: str) -> dict[tuple, tuple]:
    """Every labelled key's whole row (label, partitions, versions, evidence, basis)."""
    n = len(spec.key)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        cols = [c for c, _ in s.columns(recon_table(spec))][1:]
        order = [cols.index(k) for k in spec.key]
        rows = s.fetchall(f"SELECT {ROW_COLUMNS} FROM {recon_table(spec)} WHERE incident_id = ?", [incident])
    assert n == len(order)
    return {tuple(r[i] for i in order): tuple(r) for r in rows}


def _partitions(spec, incident: str) -> dict:
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return {
            r[0]: r[1:]
            for r in s.fetchall(
                f"SELECT * EXCLUDE (incident_id) FROM {partition_table(spec)} WHERE incident_id = ?", [incident]
            )
        }


def _footprint_keys(spec, gens: list[str], lo, hi) -> set[tuple]:
    """The footprint by its definition, computed here independently of the package: keys the failed
    generations wrote (target or write log), keys the target holds in [lo, hi], keys expected there."""
    key = ", ".join(f'"{k}"' for k in spec.key)
    part, gen = f'"{spec.target.partition}"', f'"{spec.target.metadata.generation}"'
    g = ", ".join(f"'{x}'" for x in gens)
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    try:
        logged = present(
            con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE schema_name = '_recovery' AND table_name = ?",
                [f"delta__{spec.dataset}"],
            ).fetchone()
        )[0]
        log = f'UNION SELECT {key} FROM _recovery."delta__{spec.dataset}" WHERE {gen} IN ({g}) ' if logged else ""
        rows = con.execute(
            f"SELECT {key} FROM {spec.target.table_name.sql()} WHERE {gen} IN ({g}) OR {part} BETWEEN ? AND ? {log}"
            f"UNION SELECT {key} FROM ({expected_rows_sql(spec, None)}) WHERE {part} BETWEEN ? AND ?",
            [lo, hi, lo, hi],
        ).fetchall()
    finally:
        con.close()
    return {tuple(r) for r in rows}


def _assert_footprint_is_the_full_run_restricted(spec, gens: list[str], partitions, lo, hi) -> tuple:
    full, _ = run_reconciliation(spec, gens, incident_id="FULL", partitions=partitions)
    fp, _ = run_reconciliation(spec, gens, incident_id="FP", full=False, partitions=partitions)
    assert (full.scope, fp.scope) == ("full", "footprint")
    assert fp.footprint_range == full.footprint_range == [str(lo), str(hi)]
    keys = _footprint_keys(spec, gens, lo, hi)
    whole, part = _recon(spec, "FULL"), _recon(spec, "FP")
    assert part == {k: v for k, v in whole.items() if k in keys}
    # the partition findings of the range are the whole run's, partition by partition
    full_parts, fp_parts = _partitions(spec, "FULL"), _partitions(spec, "FP")
    assert fp_parts == {p: v for p, v in full_parts.items() if p is not None and lo <= p <= hi}
    # the whole run's damage outside the footprint is what it reports as drift
    outside: dict[str, int] = {}
    for k, v in whole.items():
        if k not in keys:
            label = v[[c for c in _columns(spec)].index("label")]
            outside[label] = outside.get(label, 0) + 1
    assert full.drift_outside_footprint == outside
    assert fp.drift_outside_footprint is None
    _assert_the_default_run_is_the_footprint_run(spec, gens, partitions, fp, part, fp_parts)
    return full, fp, whole, part


def _assert_the_default_run_is_the_footprint_run(spec, gens, partitions, fp, part, fp_parts) -> None:
    """The default run (``full=None``) over a footprint that holds most of the target classifies the
    whole table and keeps the footprint's keys: the same rows, findings and summary as a footprint run,
    whichever way it goes."""
    from recovery.lib.reconcile import classify, footprint

    for share, wide in ((0.0, True), (1.01, False)):
        taken: list[bool] = []
        real = classify.is_wide

        def seen(*args, real=real, taken=taken) -> bool:
            taken.append(real(*args))
            return taken[-1]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(footprint, "WIDE_SHARE", share)
            mp.setattr(classify, "is_wide", seen)
            default, _ = run_reconciliation(spec, gens, incident_id=f"DEFAULT-{wide}", full=None, partitions=partitions)
        assert taken == [wide]
        assert _recon(spec, f"DEFAULT-{wide}") == part
        assert _partitions(spec, f"DEFAULT-{wide}") == fp_parts
        assert (default.scope, default.footprint_range, default.drift_outside_footprint) == (
            "footprint",
            fp.footprint_range,
            None,
        )
        assert (default.labels, default.damaged_keys) == (fp.labels, fp.damaged_keys)


def _columns(spec) -> list[str]:
    with open_engine(spec.warehouse).session(read_only=True) as s:
        return [c for c, _ in s.columns(recon_table(spec))][1:]


# ---- the small orders dataset: composite key, string partitions ---------------------------------


def test_footprint_labels_equal_the_full_run_on_string_partitions(tmp_path):
    spec, writer = ingested_small(tmp_path)
    con = duckdb.connect(str(spec.warehouse.path), read_only=True)
    shards = [r[0] for r in con.execute("SELECT DISTINCT shard FROM mart.orders ORDER BY 1").fetchall()]
    east = [x for x in shards if x.startswith("east-")]
    west = [x for x in shards if x.startswith("west-")]
    in_range = con.execute(
        "SELECT region, order_no, shard FROM mart.orders WHERE shard LIKE 'east-%' ORDER BY ALL"
    ).fetchall()
    outside = con.execute(
        "SELECT region, order_no, shard FROM mart.orders WHERE shard LIKE 'west-%' ORDER BY ALL"
    ).fetchall()
    multi = con.execute("""SELECT region, order_no, list(rev ORDER BY rev) FROM src.order_events WHERE region = 'east'
                           GROUP BY ALL HAVING count(*) >= 2 AND arg_max(change, rev) = 'put'
                               ORDER BY ALL""").fetchall()
    con.close()
    key = lambda r: f"region = '{r[0]}' AND order_no = {r[1]}"  # noqa: E731
    lo, hi = east[0], east[-1]
    writer.register_generation("bf-9", "backfill")
    # the failed backfill, in its range: replaces one partition without a key, appends a copy of
    # another, writes a stale version, a wrong quantity, and files one key in a west shard
    gone = next(r for r in in_range if r[2] == east[0])
    dup, bad, mis, split = [r for r in in_range if r[2] != east[0]][:4]
    stale = next(m for m in multi if tuple(m[:2]) not in {tuple(x[:2]) for x in (gone, dup, bad, mis, split)})
    e = expected_rows_sql(spec, None)
    writer.write(
        "bf-9",
        f"SELECT * FROM ({e}) WHERE shard = '{east[0]}' AND NOT ({key(gone)})",
        mode="replace_partitions",
        partitions=[east[0]],
    )
    writer.write("bf-9", latest_rows_sql(spec, key(dup)), mode="append", allow_duplicate_keys=True)
    writer.write(
        "bf-9", f"SELECT * REPLACE (qty + 1 AS qty) FROM ({latest_rows_sql(spec, key(bad))})", mode="upsert_keys"
    )
    writer.write("bf-9", latest_rows_sql(spec, key(stale), rev=stale[2][0]), mode="upsert_keys")
    writer.write(
        "bf-9",
        f"SELECT * REPLACE ('north-000000' AS shard) FROM ({latest_rows_sql(spec, key(mis))})",
        mode="upsert_keys",
    )
    # another generation's damage, outside the range: a wrong quantity, and a copy of an in-range key
    # filed in a west shard (a duplicate whose other copy is in the range: in the footprint)
    writer.register_generation("ops-1", "ingest")
    drift = outside[0]
    writer.write(
        "ops-1", f"SELECT * REPLACE (qty + 7 AS qty) FROM ({latest_rows_sql(spec, key(drift))})", mode="upsert_keys"
    )
    writer.write(
        "ops-1",
        f"SELECT * REPLACE ('{west[-1]}' AS shard) FROM ({latest_rows_sql(spec, key(split))})",
        mode="append",
        allow_duplicate_keys=True,
    )
    # a new east order that never reached the target: expected in the range, absent
    later = now() + timedelta(seconds=1)
    with writer.engine.transaction() as s:
        s.execute(
            "INSERT INTO src.order_events VALUES ('east', 9001, 1, 'put', ?, "
            f"TIMESTAMP '{east[1][5:9]}-{east[1][9:]}-03', 2, 'SKU-1')",
            [later],
        )

    # the range widens from the incident's east shards to the north shard the backfill wrote
    full, fp, whole, part = _assert_footprint_is_the_full_run_restricted(spec, ["bf-9"], (lo, hi), lo, "north-000000")
    got = {k: v[_columns(spec).index("label")] for k, v in part.items()}
    assert got == {
        tuple(gone[:2]): "deleted",
        tuple(dup[:2]): "duplicate",
        tuple(bad[:2]): "incorrectly_transformed",
        tuple(stale[:2]): "stale",
        tuple(mis[:2]): "mispartitioned",
        tuple(split[:2]): "duplicate",
        ("east", 9001): "missing",
    }
    assert full.drift_outside_footprint == {"incorrectly_transformed": 1}
    assert tuple(drift[:2]) in whole and tuple(drift[:2]) not in part
    assert fp.damaged_keys == full.damaged_keys - 1


def test_footprint_without_an_incident_range_is_the_partitions_the_failed_generations_wrote(tmp_path):
    spec, writer = ingested_small(tmp_path)
    writer.register_generation("bf-2", "backfill")
    writer.write(
        "bf-2",
        f"SELECT * REPLACE (qty * 2 AS qty) FROM ({expected_rows_sql(spec, None)}) WHERE shard LIKE 'south-%'",
        mode="upsert_keys",
    )
    with writer.engine.session(read_only=True) as s:
        lo, hi = s.fetchone("SELECT min(shard), max(shard) FROM mart.orders WHERE shard LIKE 'south-%'")
    full, fp, whole, part = _assert_footprint_is_the_full_run_restricted(spec, ["bf-2"], None, lo, hi)
    assert part and set(part) == set(whole)
    assert full.drift_outside_footprint == {}


# ---- the bench's lineitem: DATE partitions, every damage kind ------------------------------------

needs_tpchgen = pytest.mark.skipif(
    not Path(sys.executable).with_name("tpchgen-cli").exists(), reason="tpchgen-cli (the bench extra) is not installed"
)


@pytest.fixture(scope="module")
def lineitem_spec(tmp_path_factory):
    from bench import lineitem
    from recovery.lib.write.writer import Writer

    root = tmp_path_factory.mktemp("li")
    spec = load_spec(lineitem.build(root / "li", 20_000, memory_limit="1GB", cache=root))
    # another generation's damage far outside the range: drift, not the backfill's
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    writer.register_generation("ops-1", "ingest")
    writer.write(
        "ops-1",
        f"SELECT * REPLACE (l_quantity + 100 AS l_quantity) FROM ({expected_rows_sql(spec, None)}) "
        f"WHERE ship_month = DATE '1997-06-01' AND l_linenumber = 1",
        mode="upsert_keys",
    )
    return spec


@needs_tpchgen
def test_footprint_labels_equal_the_full_run_on_date_partitions(lineitem_spec):
    from bench import lineitem

    spec = lineitem_spec
    rng = (date.fromisoformat(lineitem.MONTHS[0]), date.fromisoformat(lineitem.MONTHS[-1]))
    # month 8's mispartitioned lines were written into the month after: the range widens to it
    full, fp, whole, part = _assert_footprint_is_the_full_run_restricted(
        spec, [lineitem.FAILED], rng, rng[0], date(1995, 9, 1)
    )
    assert set(fp.labels) == set(DAMAGE_LABELS)
    drift = full.drift_outside_footprint or {}
    assert drift.get("incorrectly_transformed", 0) > 0
    assert fp.damaged_keys == full.damaged_keys - sum(drift.values())


@needs_tpchgen
def test_footprint_scans_push_the_partition_predicate_in_the_columns_own_type(lineitem_spec, tmp_path, monkeypatch):
    from bench import lineitem

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("RECOVERY_TRACE", str(trace))
    monkeypatch.setenv("RECOVERY_TRACE_MIN_S", "0")
    run_reconciliation(
        lineitem_spec,
        [lineitem.FAILED],
        incident_id="FP-SQL",
        full=False,
        partitions=(date(1995, 1, 1), date(1995, 8, 1)),
    )
    sql = [json.loads(line)["what"] for line in trace.read_text().splitlines()]
    predicate = "\"ship_month\" BETWEEN CAST(DATE '1995-01-01' AS DATE) AND CAST(DATE '1995-09-01' AS DATE)"
    target_scans = [q for q in sql if f"FROM {lineitem_spec.target.table_name.sql()} WHERE {predicate}" in q]
    assert target_scans, "no scan of the target with the partition predicate"
    assert not [q for q in sql if 'CAST("ship_month" AS VARCHAR)' in q or "CAST(ship_month AS VARCHAR)" in q]
    # the source's change log is resolved to latest versions only for the footprint's candidate keys
    latest = [q for q in sql if q.startswith("CREATE OR REPLACE TEMP TABLE __latest AS")]
    assert latest and all("SEMI JOIN __fp_cand" in q for q in latest)


# ---- a foreign warehouse: 'YYYY-MM' text partitions, the team's run registry, no write log ----


def test_footprint_labels_equal_the_full_run_on_a_foreign_target_before_containment(tmp_path):
    """Read-only, before containment (results in temp tables): the registry-inferred labels
    (deleted/missing, overwritten/stale) and out_of_order from the metadata columns are the same."""
    from recovery.lib.incident.model import check_incident, parse_incident
    from recovery.lib.reconcile.classify import ReconcileInputs, reconcile
    from recovery.lib.reconcile.summary import summarize
    from recovery_tests.support.foreign_warehouse import generator

    root = tmp_path / "shipments"
    generator().build(root, shipments=3000)
    incident = parse_incident(root / "incident.yaml")
    spec = check_incident(incident)
    assert incident.partitions is not None
    rng = (incident.partitions.start, incident.partitions.end)
    gens = tuple(incident.failed_generations)
    with open_engine(spec.warehouse).session(read_only=True) as s:
        table = recon_table(spec, persist=False)
        out = {}
        for scope, full in (("FULL", True), ("FP", False)):
            inputs = ReconcileInputs(spec, gens, incident_id=scope, persist=False, full=full, partitions=rng)
            facts = reconcile(s, inputs)
            out[scope] = summarize(s, inputs, facts)
        cols = [c for c, _ in s.columns(table)]
        idx = [cols.index(k) for k in spec.key]
        rows = {
            scope: {
                tuple(r[i] for i in idx): r[1:]
                for r in s.fetchall(f"SELECT * FROM {table} WHERE incident_id = ?", [scope])
            }
            for scope in ("FULL", "FP")
        }
        lo, hi = out["FP"].footprint_range or ["", ""]
    assert lo <= "2013-01" and hi >= "2013-04"
    keys = _footprint_keys(spec, list(gens), lo, hi)
    assert rows["FP"] == {k: v for k, v in rows["FULL"].items() if k in keys}
    basis = lambda summary: {k: summary.basis.get(k) for k in ("absent", "older", "out_of_order")}  # noqa: E731
    assert len(rows["FP"]) > 0 and basis(out["FP"]) == basis(out["FULL"])
    assert sum((out["FULL"].drift_outside_footprint or {}).values()) == len(rows["FULL"]) - len(rows["FP"])


# ---- the command and the job accept the scope ------------------------------------------------------


def test_reconcile_takes_full_or_footprint_and_the_job_accepts_it():
    import dagster as dg

    from recovery.cli import build_parser
    from recovery.definitions import defs
    from recovery.lib.incident.phases import RECONCILE

    parser = build_parser()
    assert parser.parse_args(["reconcile", "--incident", "i.yaml", "--footprint"]).footprint is True
    assert parser.parse_args(["reconcile", "--incident", "i.yaml"]).footprint is False
    with pytest.raises(SystemExit):
        parser.parse_args(["reconcile", "--incident", "i.yaml", "--full", "--footprint"])
    job = defs().resolve_job_def(RECONCILE.job)
    config = dg.validate_run_config(job, RECONCILE.run_config("incident.yaml", out_dir="/tmp/out", footprint=True))
    assert config["ops"][RECONCILE.nodes[0]]["config"]["footprint"] is True
