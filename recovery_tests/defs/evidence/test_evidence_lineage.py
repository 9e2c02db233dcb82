"""Sensitive values are followed by lineage, not by name: a bundle built over consumers that
alias a sensitive column (``any_value(sku) AS top_sku``, ``lower(sku) AS item``) holds no
sensitive value in clear in any of its files, the stand-ins are HMAC-SHA256 under the
evidence key, and a consumer that would expose a sensitive value where no column hash can
(a PIVOT on it) is refused at spec time naming the column. No Dagster run needed."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

import duckdb
import pytest
import yaml

from recovery.lib.catalog_checks import load_spec
from recovery.lib.consumers.sql import materialize_consumer
from recovery.lib.control.run_history import RunHistory
from recovery.lib.engine import open_engine
from recovery.lib.errors import SpecError
from recovery.lib.evidence import build_evidence, load_evidence_key
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.writer import Writer
from recovery_tests.support.rows import present
from recovery_tests.support.small_dataset import build_small_dataset, fetch, spec_dict, write_spec

CONSUMERS = {
    "top_sku_by_shard": (
        "SELECT shard, any_value(sku) AS top_sku, count(*) AS orders FROM {{ target }} GROUP BY shard",
        ["shard"],
    ),
    "order_items": (
        "SELECT region, order_no, lower(sku) AS item, qty FROM (SELECT * FROM {{ target }}) t",
        ["region", "order_no"],
    ),
    "orders_by_shard": (
        "SELECT shard, count(*) AS orders, sum(qty) AS units FROM {{ target }} GROUP BY shard",
        ["shard"],
    ),
}


def _spec(root: Path, consumers: dict) -> dict:
    d = spec_dict()
    d["source"]["sensitive"] = ["sku"]
    d["downstream"] = []
    for name, (sql, key) in consumers.items():
        (root / f"{name}.sql").write_text(sql + "\n")
        d["downstream"].append({"name": name, "kind": "report", "owner": "ops", "sql": f"{name}.sql", "key": key})
    return d


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    root = tmp_path_factory.mktemp("lineage") / "orders"
    build_small_dataset(root)
    spec_path = write_spec(root, _spec(root, CONSUMERS))
    spec = load_spec(spec_path)
    w = Writer(open_engine(spec.warehouse), spec)
    w.ensure()
    w.register_generation("ingest-1", "ingest")
    apply_changes(w, "ingest-1", until=fetch(spec.warehouse.path, "SELECT max(loaded_at) FROM src.order_events")[0][0])
    w.register_generation("bf-7", "backfill")
    w.write(
        "bf-7",
        f"SELECT * REPLACE (qty * 3 AS qty) FROM ({expected_rows_sql(spec, None)}) WHERE region = 'north'",
        mode="upsert_keys",
    )
    for c in spec.downstream:
        materialize_consumer(w.engine, spec, c)
    (root / "incident.yaml").write_text(
        yaml.safe_dump(
            {"incident_id": "INC-LIN", "spec": "spec.yaml", "failed_generations": ["bf-7"], "requested_by": "oncall"}
        )
    )
    incident = parse_incident(root / "incident.yaml")
    result = build_evidence(incident, check_incident(incident), w.engine, RunHistory("none"), actor="test")
    skus = [r[0] for r in fetch(spec.warehouse.path, "SELECT DISTINCT sku FROM src.order_events")]
    return root, result.bundle, skus


def test_no_file_of_the_bundle_holds_a_sensitive_value_in_clear(bundle):
    root, path, skus = bundle
    assert len(skus) >= 20
    clear = re.compile(rb"(?i)sku-\d{3}")  # every sku, in any case, written anywhere
    con = duckdb.connect()
    scanned = 0
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            rows = con.execute("SELECT CAST(t AS VARCHAR) FROM read_parquet(?) t", [str(f)]).fetchall()
            hits = [r[0] for r in rows if clear.search(r[0].encode())]
            assert not hits, f"{f.relative_to(path)}: {hits[:2]}"
        else:
            assert not clear.search(f.read_bytes()), f.relative_to(path)
        scanned += 1
    assert scanned >= 10


def test_aliased_and_derived_consumer_columns_are_hmac_sha256_of_the_value(bundle):
    root, path, skus = bundle
    key = load_evidence_key(root / "wh.duckdb").secret.encode()
    mac = lambda v: hmac.new(key, v.encode(), hashlib.sha256).hexdigest()  # noqa: E731
    con = duckdb.connect()
    top = {
        r[0]
        for r in con.execute(
            "SELECT top_sku FROM read_parquet(?)", [str(path / "consumers/top_sku_by_shard.parquet")]
        ).fetchall()
    }
    items = {
        r[0]
        for r in con.execute(
            "SELECT item FROM read_parquet(?)", [str(path / "consumers/order_items.parquet")]
        ).fetchall()
    }
    assert top and top <= {mac(s) for s in skus}
    assert items and items <= {mac(s.lower()) for s in skus}
    # source copies hash by name, with the same HMAC: the bundle still joins on the stand-in
    src = {
        r[0]
        for r in con.execute("SELECT sku FROM read_parquet(?)", [str(path / "source/change_log.parquet")]).fetchall()
    }
    assert src == {mac(s) for s in skus}
    # what is not derived from a sensitive column stays readable
    units = present(
        con.execute(
            "SELECT sum(units) FROM read_parquet(?)", [str(path / "consumers/orders_by_shard.parquet")]
        ).fetchone()
    )[0]
    assert units > 0
    manifest = yaml.safe_load((path / "manifest.json").read_text())
    assert manifest["sensitive_columns"]["consumer_columns"] == {
        "order_items": ["item"],
        "top_sku_by_shard": ["top_sku"],
    }
    assert "HMAC-SHA256" in manifest["sensitive_columns"]["stored_as"]


def test_a_consumer_pivoting_on_a_sensitive_column_is_refused_at_spec_time(tmp_path):
    root = tmp_path / "orders"
    build_small_dataset(root)
    spec_path = write_spec(
        root,
        _spec(
            root,
            {
                "sku_pivot": (
                    "SELECT * FROM (PIVOT (SELECT shard, sku, qty FROM {{ target }}) ON sku USING sum(qty) "
                    "GROUP BY shard)",
                    ["shard"],
                )
            },
        ),
    )
    with pytest.raises(SpecError) as info:
        load_spec(spec_path)
    err = info.value
    assert err.field == "downstream[0].sql" and "sku" in err.problem and "column names" in err.problem, str(err)


def test_a_bundle_renamed_into_place_but_never_recorded_is_recorded_once_on_the_rerun(bundle):
    """What a build killed between its rename and its timeline record leaves (kill -9 matrix)."""
    root, path, _ = bundle
    spec = load_spec(root / "spec.yaml")
    engine = open_engine(spec.warehouse)
    with engine.transaction() as s:
        s.execute("DELETE FROM _recovery.timeline WHERE kind = 'evidence_preserved'")
    incident = parse_incident(root / "incident.yaml")

    def events() -> int:
        return fetch(spec.warehouse.path, "SELECT count(*) FROM _recovery.timeline WHERE kind = 'evidence_preserved'")[
            0
        ][0]

    for _ in range(2):
        again = build_evidence(incident, spec, engine, RunHistory("none"), actor="test")
        assert not again.created and again.bundle == path and events() == 1
