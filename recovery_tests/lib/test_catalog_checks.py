"""The spec's meaning checks against the warehouse: once per launcher for its SQL shapes, every time
for what ingestion can change."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from recovery.lib import catalog_checks
from recovery.lib.catalog_checks import check_against_warehouse, checked_once
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.errors import SpecError
from recovery_tests.support.small_dataset import SOURCE_TABLE, build_small_dataset


@pytest.fixture
def shape_checks(monkeypatch) -> list[str]:
    """Counts the shape checks (the transform's and consumers' columns) that actually run."""
    ran: list[str] = []
    real = catalog_checks._check_shapes

    def counting(spec, s, cols, fail):
        ran.append(spec.dataset)
        return real(spec, s, cols, fail)

    monkeypatch.setattr(catalog_checks, "_check_shapes", counting)
    return ran


def test_within_one_launcher_the_shapes_are_checked_once_and_again_after_the_source_changes(
    tmp_path: Path, shape_checks: list[str]
):
    spec_path = build_small_dataset(tmp_path / "orders", n_orders=40)
    memo: set[str] = set()
    with checked_once(memo):
        for _ in range(3):
            check_against_warehouse(parse_spec(spec_path))
        assert len(shape_checks) == 1
        with duckdb.connect(str(parse_spec(spec_path).warehouse.path)) as con:
            con.execute(f"ALTER TABLE {SOURCE_TABLE} ADD COLUMN channel VARCHAR")
        check_against_warehouse(parse_spec(spec_path))  # a new source column: the transform may read it
        assert len(shape_checks) == 2
    check_against_warehouse(parse_spec(spec_path))  # outside a launcher: every call checks
    check_against_warehouse(parse_spec(spec_path))
    assert len(shape_checks) == 4


def test_a_change_to_the_transform_is_checked_even_within_one_launcher(tmp_path: Path, shape_checks: list[str]):
    spec_path = build_small_dataset(tmp_path / "orders", n_orders=40)
    spec = parse_spec(spec_path)
    memo: set[str] = set()
    with checked_once(memo):
        check_against_warehouse(spec)
        transform = spec_path.parent / spec.target.transform.name
        transform.write_text(transform.read_text().replace("sku", "sku_code", 1))
        with pytest.raises(SpecError, match="target.transform"):
            check_against_warehouse(parse_spec(spec_path))
    assert len(shape_checks) == 2


def test_the_change_log_is_checked_every_time_even_within_one_launcher(tmp_path: Path):
    spec_path = build_small_dataset(tmp_path / "orders", n_orders=40)
    with checked_once(set()):
        check_against_warehouse(parse_spec(spec_path))
        with duckdb.connect(str(parse_spec(spec_path).warehouse.path)) as con:  # ingestion writes a change twice
            con.execute(f"INSERT INTO {SOURCE_TABLE} SELECT * FROM {SOURCE_TABLE} LIMIT 1")
        with pytest.raises(SpecError, match="source.key"):
            check_against_warehouse(parse_spec(spec_path))


def test_a_change_without_a_version_is_refused_naming_source_version(tmp_path: Path):
    """Latest versions are resolved by the highest version per key; a NULL one is bad input, said as such."""
    spec_path = build_small_dataset(tmp_path / "orders", n_orders=40)
    spec = parse_spec(spec_path)
    with duckdb.connect(str(spec.warehouse.path)) as con:
        con.execute(
            f"INSERT INTO {SOURCE_TABLE} SELECT * REPLACE (NULL AS {spec.source.version}) FROM {SOURCE_TABLE} LIMIT 1"
        )
    with checked_once(set()), pytest.raises(SpecError, match="source.version") as err:
        check_against_warehouse(parse_spec(spec_path))
    assert "1 changes" in str(err.value) and "no version" in str(err.value)


def test_containment_records_the_change_log_check_so_the_phases_after_it_do_not_scan_the_log_again(
    tmp_path: Path, monkeypatch
):
    """The duplicate (key, version) check is a full scan of the change log (seconds at tens of millions of
    changes); the runbook's first command pays it and records it, the next process reads the record."""
    import yaml

    from recovery.lib.engine import open_engine
    from recovery.lib.engine.duckdb_engine import DuckDBSession
    from recovery.lib.incident.model import parse_incident
    from recovery.lib.pointers.adoption import adopt
    from recovery.lib.write.fencing import fence_incident
    from recovery.lib.write.writer import Writer
    from recovery_tests.support.input_fuzz import build_fuzz_dataset, valid_incident

    d = build_fuzz_dataset(tmp_path / "contain")
    (d / "incident.yaml").write_text(yaml.safe_dump(valid_incident()))
    scans: list[str] = []
    real = DuckDBSession.fetchone

    def counting(self, sql, params=None):
        if "HAVING count(*) > 1" in sql:
            scans.append(sql)
        return real(self, sql, params)

    monkeypatch.setattr(DuckDBSession, "fetchone", counting)

    def fresh_process() -> None:
        monkeypatch.setattr(catalog_checks, "_SCANNED_SOURCES", set())
        monkeypatch.setattr(catalog_checks, "_RECORDED_SOURCES", set())

    fresh_process()
    spec = catalog_checks.load_spec(d / "spec.yaml")  # `recovery contain`: the spec checked, the log scanned
    assert len(scans) == 1
    incident = parse_incident(d / "incident.yaml")
    engine = open_engine(spec.warehouse)
    adopt(engine, spec, actor="test", incident_id=incident.incident_id)
    fence_incident(Writer(engine, spec, actor="test"), incident)

    fresh_process()  # the next phase's process
    catalog_checks.load_spec(d / "spec.yaml")
    assert len(scans) == 1, "the change log was scanned again after containment recorded its check"

    with duckdb.connect(str(spec.warehouse.path)) as con:  # ingestion appends: the record no longer covers it
        con.execute(f"INSERT INTO {spec.source.table_name.sql()} SELECT * FROM {spec.source.table_name.sql()} LIMIT 1")
    fresh_process()
    with pytest.raises(SpecError, match="source.key"):
        catalog_checks.load_spec(d / "spec.yaml")
    assert len(scans) == 2
