"""The spec promises: a valid spec loads with resolved paths and a stable fingerprint;
a bad one fails with one SpecError naming the field and the fix, and the warehouse
file is left byte-for-byte as it was (no write, no WAL, no statement smuggled in)."""

from __future__ import annotations

import copy
import random
import shutil
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import duckdb
import pytest
import yaml

from recovery.lib.catalog_checks import load_spec
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.errors import SpecError
from recovery_tests.support.small_dataset import (
    build_small_dataset,
    catalog,
    fetch,
    file_sha256,
    spec_dict,
    write_spec,
)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """One built dataset per module; each test works on its own copy."""
    d = tmp_path_factory.mktemp("orders_template")
    build_small_dataset(d)
    return d


@pytest.fixture
def dataset(template, tmp_path) -> Path:
    d = tmp_path / "ds"
    shutil.copytree(template, d)
    return d


def _wal(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".wal"))


# ---- the valid spec ---------------------------------------------------------------------


def test_valid_spec_loads_with_resolved_paths_and_a_stable_fingerprint(dataset, monkeypatch):
    before = file_sha256(dataset / "wh.duckdb")
    spec = load_spec(dataset / "spec.yaml")
    monkeypatch.chdir(dataset.parent)
    again = load_spec(Path("ds") / "spec.yaml")  # a relative path from another directory

    assert spec.warehouse.path == (dataset / "wh.duckdb").resolve()
    assert spec.target.transform == (dataset / "orders.sql").resolve()
    assert spec.downstream[0].sql == (dataset / "orders_by_shard.sql").resolve()
    assert spec.spec_path == (dataset / "spec.yaml").resolve()
    assert spec.key == ["region", "order_no"]
    assert str(spec.source.table_name) == "src.order_events"
    assert str(spec.target.table_name) == "mart.orders"
    assert spec.target.metadata.columns == ["gen_id", "src_rev", "landed_at"]
    assert "{{ source }}" in spec.transform_sql
    assert set(spec.downstream_sql) == {"orders_by_shard"}
    assert len(spec.fingerprint) == 16
    assert spec.fingerprint == again.fingerprint
    assert file_sha256(dataset / "wh.duckdb") == before
    assert _wal(dataset) == []


def test_fingerprint_follows_the_transform_sql(dataset):
    first = load_spec(dataset / "spec.yaml").fingerprint
    sql = (dataset / "orders.sql").read_text()
    (dataset / "orders.sql").write_text(sql.replace("qty,", "qty + 0 AS qty,"))
    assert load_spec(dataset / "spec.yaml").fingerprint != first


# ---- bad specs: one SpecError, the right field, a fix, and an untouched warehouse -----------

Mutation = Callable[[dict, Path], object]


@dataclass(frozen=True)
class BadSpec:
    id: str
    mutate: Mutation  # edits the spec dict in place (and files); may return a replacement document
    field: str
    hostile: bool = False


def _set(path: str, value) -> Mutation:
    def mutate(d: dict, _dir: Path) -> None:
        *parents, last = path.split(".")
        node = d
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value

    return mutate


def _both(*mutations: Mutation) -> Mutation:
    def mutate(d: dict, directory: Path) -> None:
        for m in mutations:
            m(d, directory)

    return mutate


def _drop(path: str) -> Mutation:
    def mutate(d: dict, _dir: Path) -> None:
        *parents, last = path.split(".")
        node = d
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        del node[last]

    return mutate


def _transform(sql: str) -> Mutation:
    def mutate(d: dict, directory: Path) -> None:
        (directory / "bad_transform.sql").write_text(sql)
        d["target"]["transform"] = "bad_transform.sql"

    return mutate


def _downstream_sql(sql: str) -> Mutation:
    def mutate(d: dict, directory: Path) -> None:
        (directory / "bad_downstream.sql").write_text(sql)
        d["downstream"][0]["sql"] = "bad_downstream.sql"

    return mutate


def _duplicate_change(d: dict, directory: Path) -> None:
    con = duckdb.connect(str(directory / "wh.duckdb"))
    try:
        con.execute(
            "INSERT INTO src.order_events SELECT * REPLACE (qty + 1 AS qty) FROM src.order_events "
            "ORDER BY region, order_no, rev LIMIT 1"
        )
    finally:
        con.close()


def _two_consumers_one_name(d: dict, _dir: Path) -> None:
    d["downstream"].append(copy.deepcopy(d["downstream"][0]))


def _not_a_mapping(d: dict, directory: Path) -> list:
    return ["dataset", "orders"]


def _yaml_syntax_error(d: dict, directory: Path) -> str:
    return "dataset: orders\nwarehouse: {path: wh.duckdb\n"


BAD_SPECS = [
    BadSpec("missing_required_key", _drop("source.key"), "source.key"),
    BadSpec("missing_required_section", _drop("target"), "target"),
    BadSpec("unknown_extra_field", _set("target.partitions", ["shard"]), "target.partitions"),
    BadSpec("key_given_as_a_string", _set("source.key", "region"), "source.key"),
    BadSpec("threads_given_as_words", _set("warehouse.threads", "many"), "warehouse.threads"),
    BadSpec("engine_not_allowed", _set("warehouse.engine", "postgres"), "warehouse.engine"),
    BadSpec("warehouse_file_missing", _set("warehouse.path", "nowhere.duckdb"), "warehouse.path"),
    BadSpec("warehouse_file_not_a_database", _set("warehouse.path", "orders.sql"), "warehouse.path"),
    BadSpec("warehouse_path_is_a_directory", _set("warehouse.path", "."), "warehouse.path"),
    BadSpec("memory_limit_unparseable", _set("warehouse.memory_limit", "lots"), "warehouse.memory_limit"),
    BadSpec("spark_engine_without_its_section", _set("warehouse.engine", "spark"), "warehouse"),
    BadSpec(
        "spark_data_path_is_an_object_store_url",
        _both(_set("warehouse.engine", "spark"), _set("warehouse.spark", {"data_path": "s3a://lake/recovery"})),
        "warehouse.spark.data_path",
    ),
    BadSpec(
        "spark_section_without_data_path",
        _both(_set("warehouse.engine", "spark"), _set("warehouse.spark", {"master": "local[1]"})),
        "warehouse.spark.data_path",
    ),
    BadSpec("unknown_source_table", _set("source.table", "src.order_evnts"), "source.table"),
    BadSpec("unknown_key_column", _set("source.key", ["region", "order_id"]), "source.key"),
    BadSpec("key_and_version_not_unique", _duplicate_change, "source.key"),
    BadSpec("transform_file_missing", _set("target.transform", "missing.sql"), "target.transform"),
    BadSpec("transform_path_is_a_directory", _set("target.transform", "."), "target.transform"),
    BadSpec(
        "transform_with_two_statements",
        _transform("SELECT region, order_no FROM {{ source }}; DROP TABLE src.order_events"),
        "target.transform",
        hostile=True,
    ),
    BadSpec("transform_not_reading_source", _transform("SELECT 'north' AS region, 1 AS order_no"), "target.transform"),
    BadSpec(
        "transform_is_not_a_select",
        _transform("DELETE FROM src.order_events WHERE {{ source }} IS NULL"),
        "target.transform",
        hostile=True,
    ),
    BadSpec(
        "transform_without_partition_column",
        _transform("SELECT region, order_no, qty FROM {{ source }}"),
        "target.partition",
    ),
    BadSpec(
        "transform_that_fails_to_run",
        _transform("SELECT region, order_no, no_such_col FROM {{ source }}"),
        "target.transform",
    ),
    BadSpec(
        "hostile_target_table",
        _set("target.table", "mart.orders; DROP TABLE src.order_events"),
        "target.table",
        hostile=True,
    ),
    BadSpec("hostile_key_column", _set("source.key", ["region", 'x" OR 1=1 --']), "source.key", hostile=True),
    BadSpec(
        "hostile_source_table",
        _set("source.table", 'src."order_events"; DROP TABLE src.order_events; --'),
        "source.table",
        hostile=True,
    ),
    BadSpec(
        "hostile_partition",
        _set("target.partition", "shard); DROP TABLE src.order_events; --"),
        "target.partition",
        hostile=True,
    ),
    BadSpec(
        "hostile_metadata_column",
        _set("target.metadata.generation", "gen'; DROP TABLE src.order_events; --"),
        "target.metadata.generation",
        hostile=True,
    ),
    BadSpec("op_value_not_listed", _set("source.delete_ops", ["remove"]), "source.op"),
    BadSpec("op_column_not_text", _set("source.op", "qty"), "source.op"),
    BadSpec("two_consumers_share_a_name", _two_consumers_one_name, "downstream"),
    BadSpec(
        "materiality_without_threshold",
        _set("downstream.0.materiality", {"column": "orders"}),
        "downstream[0].materiality",
    ),
    BadSpec("consumer_kind_unknown", _set("downstream.0.kind", "spreadsheet"), "downstream[0].kind"),
    BadSpec("yaml_not_a_mapping", _not_a_mapping, "spec"),
    BadSpec("yaml_syntax_error", _yaml_syntax_error, "spec"),
    BadSpec(
        "downstream_sql_reads_missing_column",
        _downstream_sql("SELECT shard, sum(amount) AS orders FROM {{ target }} GROUP BY shard"),
        "downstream[0].sql",
    ),
    BadSpec("downstream_key_not_produced", _set("downstream.0.key", ["region"]), "downstream[0].key"),
    BadSpec("downstream_sql_reads_the_source", _downstream_sql("SELECT shard FROM {{ source }}"), "downstream[0].sql"),
    BadSpec("metadata_column_collides_with_key", _set("target.metadata.generation", "region"), "target.metadata"),
    BadSpec("metadata_column_collides_with_transform", _set("target.metadata.written_at", "qty"), "target.metadata"),
    # validation that knows the warehouse (issue 39, item 5): each of these passed and then crashed or misled
    BadSpec("amount_names_a_text_column", _set("target.amount", "sku"), "target.amount"),
    BadSpec("amount_names_a_timestamp_column", _set("target.amount", "placed_at"), "target.amount"),
    BadSpec("threads_given_as_true", _set("warehouse.threads", True), "warehouse.threads"),
    BadSpec("busy_timeout_given_as_true", _set("warehouse.busy_timeout_s", True), "warehouse.busy_timeout_s"),
    BadSpec("materiality_given_as_false", _set("downstream.0.materiality.abs", False), "downstream[0].materiality.abs"),
    BadSpec(
        "approvals_required_given_as_true",
        _set("recurrence", {"approval": {"rules": [{"required": True}]}}),
        "recurrence.approval.rules[0].required",
    ),
    BadSpec("available_from_in_the_future", _set("source.available_from", date(2099, 1, 1)), "source.available_from"),
]


def test_a_numeric_amount_whole_numbers_for_numbers_and_a_past_available_from_still_load(dataset):
    d = spec_dict()
    d["target"]["amount"] = "qty"  # INTEGER: summed as it is
    d["warehouse"]["busy_timeout_s"] = 60  # a whole number where a number is meant
    d["downstream"][0]["materiality"]["rel"] = 0
    d["source"]["available_from"] = date(2026, 1, 1)
    spec = load_spec(write_spec(dataset, d, "numbers.yaml"))
    assert spec.target.amount == "qty" and spec.warehouse.busy_timeout_s == 60.0
    assert spec.source.available_from == date(2026, 1, 1)


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_where_a_number_is_meant_names_the_field_and_says_so(value, dataset):
    d = spec_dict()
    d["warehouse"]["threads"] = value
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(dataset, d, "bool.yaml"))
    assert info.value.field == "warehouse.threads"
    assert "true or false, not a whole number" in str(info.value) and "Fix: give a whole number" in str(info.value)


def test_an_amount_that_is_text_is_refused_naming_its_type_and_the_fix(dataset):
    d = spec_dict()
    d["target"]["amount"] = "sku"
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(dataset, d, "amount.yaml"))
    assert "'sku' is VARCHAR, not a number" in str(info.value)
    assert "Fix: name a numeric column" in str(info.value) and "\n" not in str(info.value)


def test_a_future_available_from_is_one_line_naming_the_date(dataset):
    d = spec_dict()
    d["source"]["available_from"] = date(2099, 1, 1)
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(dataset, d, "future.yaml"))
    text = str(info.value)
    assert "source.available_from: 2099-01-01 is in the future" in text and "\n" not in text
    assert "Fix: give a date that has passed" in text


def test_there_are_at_least_twelve_kinds_of_bad_spec():
    assert len({c.id for c in BAD_SPECS}) == len(BAD_SPECS) >= 12
    assert len({c.field for c in BAD_SPECS}) >= 12


@pytest.mark.parametrize("case", BAD_SPECS, ids=[c.id for c in BAD_SPECS])
def test_bad_spec_names_the_field_and_the_fix_and_changes_nothing(case: BadSpec, dataset):
    d = spec_dict()
    replacement = case.mutate(d, dataset)
    spec_path = dataset / "bad.yaml"
    if isinstance(replacement, str):
        spec_path.write_text(replacement)
    else:
        write_spec(dataset, d if replacement is None else replacement, "bad.yaml")
    db = dataset / "wh.duckdb"
    before_hash, before_catalog, before_wal = file_sha256(db), catalog(db), _wal(dataset)
    assert file_sha256(db) == before_hash  # reading the catalog does not touch the file
    source_rows = fetch(db, "SELECT count(*) FROM src.order_events")

    with pytest.raises(SpecError) as info:
        load_spec(spec_path)

    err = info.value
    assert err.field == case.field, str(err)
    assert err.fix and "Fix:" in str(err)
    assert str(err).index("Fix:") > str(err).index(err.field)
    assert file_sha256(db) == before_hash
    assert _wal(dataset) == before_wal == []
    if case.hostile:
        assert catalog(db) == before_catalog
        assert ("src", "order_events", "BASE TABLE") in before_catalog
        assert fetch(db, "SELECT count(*) FROM src.order_events") == source_rows


def test_bad_shape_is_caught_without_opening_the_warehouse(dataset):
    d = spec_dict()
    d["source"]["key"] = "region"
    d["warehouse"]["path"] = "does_not_exist.duckdb"
    with pytest.raises(SpecError) as info:
        parse_spec(write_spec(dataset, d, "shape.yaml"))
    assert info.value.field == "source.key"
    assert not (dataset / "does_not_exist.duckdb").exists()


def test_missing_spec_file_is_a_spec_error(dataset):
    with pytest.raises(SpecError) as info:
        load_spec(dataset / "no_such_spec.yaml")
    assert info.value.field == "spec" and "Fix:" in str(info.value)


# ---- fuzz ---------------------------------------------------------------------------------

_INJECTIONS = [";", "'", '"', "--", "; DROP TABLE src.order_events; --", '" OR 1=1 --', "');--", "\\", "\n"]
_PLAUSIBLE = [
    "region",
    "order_no",
    "rev",
    "change",
    "loaded_at",
    "placed_at",
    "qty",
    "sku",
    "shard",
    "orders",
    "units",
    "src.order_events",
    "mart.orders",
    "orders.sql",
    "wh.duckdb",
    "spark",
    "duckdb",
    "put",
    "drop",
    "report",
    "gen_id",
    "src_rev",
    "landed_at",
    "1GB",
    "lots",
    "2026-01-01",
    ".",
    "",
]


def _paths(node, prefix=()) -> list[tuple]:
    out: list[tuple] = []
    items: Iterable[tuple[object, object]]
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return out
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(_paths(v, prefix + (k,)))
    return out


def _random_value(rng: random.Random):
    pick = rng.randrange(8)
    if pick == 0:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 24)))
    if pick == 1:
        return rng.choice([rng.randint(-3, 64), rng.uniform(-10, 100), 0, True])
    if pick == 2:
        return [_random_value(rng) if rng.random() < 0.3 else rng.choice(_PLAUSIBLE) for _ in range(rng.randint(0, 3))]
    if pick == 3:
        return None
    if pick == 4:
        return {"x": rng.choice(_PLAUSIBLE)}
    return rng.choice(_PLAUSIBLE)


def _mutate(d: dict, rng: random.Random, path: tuple | None = None) -> dict:
    path = path or rng.choice(_paths(d))
    *parents, last = path
    node = d
    for p in parents:
        node = node[p]
    op = rng.randrange(3)
    if op == 0:
        del node[last]
    elif op == 1:
        node[last] = _random_value(rng)
    else:
        inj = rng.choice(_INJECTIONS)
        value = node[last]
        if isinstance(value, list) and value:
            i = rng.randrange(len(value))
            value[i] = f"{value[i]}{inj}" if rng.random() < 0.7 else f"{inj}{value[i]}"
        else:
            node[last] = f"{value}{inj}" if rng.random() < 0.7 else f"{inj}{value}"
    return d


def test_fuzzed_specs_load_or_raise_spec_error_and_never_touch_the_warehouse(dataset):
    rng = random.Random(20261202)
    db = dataset / "wh.duckdb"
    before_hash, before_catalog = file_sha256(db), catalog(db)
    outcomes = {"loaded": 0, "spec_error": 0}
    unexpected = []
    every_path = _paths(spec_dict())
    for i in range(200):
        d = spec_dict()
        d = _mutate(d, rng, every_path[i % len(every_path)])  # each field is hit several times
        for _ in range(rng.randint(0, 2)):
            if not _paths(d):
                break
            d = _mutate(d, rng)
        path = dataset / f"fuzz_{i:03d}.yaml"
        path.write_text(yaml.safe_dump(d, sort_keys=False))
        try:
            load_spec(path)
            outcomes["loaded"] += 1
        except SpecError as err:
            assert err.field and "Fix:" in str(err)
            outcomes["spec_error"] += 1
        except Exception as err:  # noqa: BLE001 - the point is to catch any other type
            unexpected.append(f"{path.name}: {type(err).__name__}: {err}\n{yaml.safe_dump(d, sort_keys=False)}")
        assert file_sha256(db) == before_hash, f"{path.name} changed the warehouse"
        assert _wal(dataset) == []
    assert not unexpected, f"{len(unexpected)} of 200 mutations raised something else:\n" + "\n".join(unexpected[:5])
    assert catalog(db) == before_catalog
    assert outcomes["spec_error"] > 100, outcomes


def test_the_change_log_is_scanned_once_per_process_until_it_grows(dataset, tmp_path, monkeypatch):
    """Every phase's run loads the spec; the two full scans of the change log (key + version
    unique, ops known) run again only when the log has grown, and then still catch a duplicate."""
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("RECOVERY_TRACE", str(trace))
    monkeypatch.setenv("RECOVERY_TRACE_MIN_S", "0")

    def scans() -> int:
        return sum("HAVING count(*) > 1" in line for line in trace.read_text().splitlines()) if trace.exists() else 0

    load_spec(dataset / "spec.yaml")
    load_spec(dataset / "spec.yaml")
    assert scans() == 1
    _duplicate_change({}, dataset)  # the log grows by one row, a duplicate of (key, version)
    with pytest.raises(SpecError) as err:
        load_spec(dataset / "spec.yaml")
    assert err.value.field == "source.key" and scans() == 2
