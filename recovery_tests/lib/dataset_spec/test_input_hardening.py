"""Validation that cannot crash: every input the audit found crashing (files that are not
UTF-8, deep nesting, NUL bytes, /dev/zero, absurd settings, empty or overlapping op lists,
consumer columns that are not identifiers, unsafe evidence roots, a date range on a
non-date partition column) is one ``SpecError`` naming the field, the CLI prints it as one
line with exit status 2, and nothing is written. A Hypothesis fuzz of both file kinds runs
on a bounded budget here; ``python -m bench fuzz`` runs 10,000+ cases per kind."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings

from recovery.cli import main as cli
from recovery.lib.catalog_checks import load_spec
from recovery.lib.dataset_spec.loader import MAX_FILE_BYTES
from recovery.lib.errors import SpecError
from recovery.lib.incident.model import check_incident, parse_incident
from recovery_tests.support.input_fuzz import FuzzTarget, build_fuzz_dataset, mutated_document, valid_incident
from recovery_tests.support.rows import present
from recovery_tests.support.small_dataset import file_sha256, spec_dict


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return build_fuzz_dataset(tmp_path_factory.mktemp("hardening") / "ds")


@pytest.fixture
def dataset(template, tmp_path) -> Path:
    d = tmp_path / "ds"
    shutil.copytree(template, d)
    return d


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _dump(d: dict) -> bytes:
    return yaml.safe_dump(d, sort_keys=False).encode()


def _with(path: str, value) -> Callable[[dict], bytes]:
    def make(d: dict) -> bytes:
        *parents, last = path.split(".")
        node = d
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value
        return _dump(d)

    return make


def _nested_flow(d: dict) -> bytes:
    return _dump(d) + b"deep: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"


def _nested_block(d: dict) -> bytes:
    return _dump(d) + b"".join(b"  " * i + b"k:\n" for i in range(200)) + b"  " * 200 + b"v\n"


def _latin1(d: dict) -> bytes:
    return _dump(d).replace(b"owner: ops", "owner: opérations".encode("latin-1"))


def _utf16(d: dict) -> bytes:
    return _dump(d).decode().encode("utf-16")


def _billion_laughs(d: dict) -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)
    ]
    return _dump(d) + ("\n".join(lines) + "\n").encode()


def _bad_date(d: dict) -> bytes:
    return _dump(d) + b"x_date: 2024-02-30\n"


def _fifo(name: str) -> Callable[[dict, Path], bytes]:
    def make(d: dict, directory: Path) -> bytes:
        os.mkfifo(directory / name)
        d["target"]["transform"] = name
        return _dump(d)

    return make


def _file(name: str, content: bytes, field: str) -> Callable[[dict, Path], bytes]:
    def make(d: dict, directory: Path) -> bytes:
        (directory / name).write_bytes(content)
        if field == "transform":
            d["target"]["transform"] = name
        else:
            d["downstream"][0]["sql"] = name
        return _dump(d)

    return make


# (id, builds the file's bytes from the valid dict [and the folder], field the error must name)
SPEC_CASES = [
    ("not_utf8_latin1", _latin1, "spec"),
    ("utf16", _utf16, "spec"),
    ("nested_flow_100k", _nested_flow, "spec"),
    ("nested_block_200", _nested_block, "spec"),
    ("billion_laughs", _billion_laughs, "spec"),
    ("impossible_date", _bad_date, "spec"),
    ("nul_in_a_value", _with("warehouse.path", "wh.duckdb\x00.sql"), "warehouse.path"),
    ("threads_100000", _with("warehouse.threads", 100000), "warehouse.threads"),
    ("memory_limit_negative", _with("warehouse.memory_limit", "-1GB"), "warehouse.memory_limit"),
    ("memory_limit_zero", _with("warehouse.memory_limit", "0KB"), "warehouse.memory_limit"),
    ("busy_timeout_1e308", _with("warehouse.busy_timeout_s", 1e308), "warehouse.busy_timeout_s"),
    ("busy_timeout_inf", _with("warehouse.busy_timeout_s", float("inf")), "warehouse.busy_timeout_s"),
    ("materiality_nan", _with("downstream.0.materiality.abs", float("nan")), "downstream[0].materiality.abs"),
    ("upsert_ops_empty", _with("source.upsert_ops", []), "source.upsert_ops"),
    ("delete_ops_empty", _with("source.delete_ops", []), "source.delete_ops"),
    ("ops_overlap", _with("source.delete_ops", ["drop", "put"]), "source.delete_ops"),
    ("ops_listed_twice", _with("source.upsert_ops", ["put", "put"]), "source.upsert_ops"),
    ("transform_dev_zero", _with("target.transform", "/dev/zero"), "target.transform"),
    ("transform_proc_self", _with("target.transform", "/proc/self/mem"), "target.transform"),
    ("transform_fifo", _fifo("pipe.sql"), "target.transform"),
    ("transform_too_big", _file("big.sql", b"-- x\n" * (MAX_FILE_BYTES // 4), "transform"), "target.transform"),
    (
        "transform_not_utf8",
        _file("latin.sql", "SELECT 'é' AS x, * FROM {{ source }}".encode("latin-1"), "transform"),
        "target.transform",
    ),
    (
        "transform_nested_parens",
        _file("deep.sql", b"SELECT " + b"(" * 5000 + b"1" + b")" * 5000 + b" AS x FROM {{ source }}", "transform"),
        "target.transform",
    ),
    (
        "consumer_column_not_an_identifier",
        _file(
            "aliased.sql",
            b'SELECT shard, count(*) AS "top orders", count(*) AS orders FROM {{ target }} GROUP BY shard',
            "downstream",
        ),
        "downstream[0].sql",
    ),
    # a newline in a path the user gave is quoted as \n, never printed raw (issue 39: a message spanned two lines)
    ("newline_in_warehouse_path", _with("warehouse.path", "no\nsuch.duckdb"), "warehouse.path"),
    ("newline_in_transform_path", _with("target.transform", "no\nsuch.sql"), "target.transform"),
    ("carriage_return_in_consumer_path", _with("downstream.0.sql", "no\r\nsuch.sql"), "downstream[0].sql"),
    (
        "consumer_expression_column",
        _file("expr.sql", b"SELECT shard, count(*) AS orders, sum(qty) FROM {{ target }} GROUP BY shard", "downstream"),
        "downstream[0].sql",
    ),
]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_each_nasty_spec_is_one_spec_error_naming_the_field_and_nothing_is_written(case, dataset):
    _, make, field = case
    d = spec_dict()
    data = make(d, dataset) if make.__code__.co_argcount == 2 else make(d)
    path = dataset / "nasty.yaml"
    path.write_bytes(data)
    before, listing = file_sha256(dataset / "wh.duckdb"), _listing(dataset)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.field == field, str(err)
    assert "\n" not in str(err) and "Fix:" in str(err) and len(str(err)) < 1000
    assert file_sha256(dataset / "wh.duckdb") == before and _listing(dataset) == listing


@pytest.mark.parametrize("where", ["nul", "dev_zero", "directory", "too_big"])
def test_the_spec_file_itself_nul_path_device_directory_or_huge_is_refused(where, dataset):
    path: str | Path
    if where == "too_big":
        big = dataset / "big.yaml"
        big.write_bytes(_dump(spec_dict()) + b"#" * (MAX_FILE_BYTES + 1))
        path = big
    else:
        path = {"nul": str(dataset / "spec\x00.yaml"), "dev_zero": "/dev/zero", "directory": str(dataset)}[where]
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.field == "spec" and "\n" not in str(info.value)


def _other_users_dir(d: Path) -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    (d / "theirs").mkdir()
    os.chown(d / "theirs", 4321, 4321)
    return "theirs"


INCIDENT_CASES = [
    ("evidence_root_slash", lambda d: {"evidence_root": "/"}, "evidence_root"),
    ("evidence_root_proc_self", lambda d: {"evidence_root": "/proc/self"}, "evidence_root"),
    ("evidence_root_dotdot_etc", lambda d: {"evidence_root": "../" * 30 + "etc"}, "evidence_root"),
    ("evidence_root_usr", lambda d: {"evidence_root": "/usr/share/evidence"}, "evidence_root"),
    ("evidence_root_is_a_file", lambda d: {"evidence_root": "wh.duckdb"}, "evidence_root"),
    ("evidence_root_of_another_user", lambda d: {"evidence_root": _other_users_dir(d)}, "evidence_root"),
    ("spec_path_with_nul", lambda d: {"spec": "spec.yaml\x00"}, "spec"),
    ("spec_is_dev_zero", lambda d: {"spec": "/dev/zero"}, "spec"),
    ("nested", lambda d: {"notes": [[[[[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]]]]}, "incident"),
    ("spec_path_with_newline", lambda d: {"spec": "no\nsuch_spec.yaml"}, "spec"),
    ("partition_start_true", lambda d: {"partitions": {"start": True, "end": "north-202601"}}, "partitions.start"),
    ("partition_end_false", lambda d: {"partitions": {"start": "north-202601", "end": False}}, "partitions.end"),
]


@pytest.mark.parametrize("case", INCIDENT_CASES, ids=[c[0] for c in INCIDENT_CASES])
def test_each_nasty_incident_is_one_spec_error_naming_the_field_and_nothing_is_written(case, dataset):
    _, change, field = case
    path = dataset / "incident.yaml"
    path.write_bytes(_dump({**valid_incident(), **change(dataset)}))
    before, listing = file_sha256(dataset / "wh.duckdb"), _listing(dataset)
    with pytest.raises(SpecError) as info:
        check_incident(parse_incident(path))
    assert info.value.field == field, str(info.value)
    assert "\n" not in str(info.value) and "Fix:" in str(info.value)
    assert file_sha256(dataset / "wh.duckdb") == before and _listing(dataset) == listing


def test_the_valid_incident_passes_and_its_evidence_root_is_not_created(dataset):
    path = dataset / "incident.yaml"
    path.write_bytes(_dump(valid_incident()))
    inc = parse_incident(path)
    assert check_incident(inc).dataset == "orders"
    assert inc.evidence_root == (dataset / "ev").resolve() and not present(inc.evidence_root).exists()


CLI_CASES = {
    "not UTF-8": (b"incident_id: INC-\xff\xfe\n", "incident"),
    "deep nesting": (b"incident_id: " + b"[" * 50_000 + b"]" * 50_000 + b"\n", "incident"),
    "spec is /dev/zero": (_dump({**valid_incident(), "spec": "/dev/zero"}), "spec"),
    "evidence_root /": (_dump({**valid_incident(), "evidence_root": "/"}), "evidence_root"),
    "threads 100000": (None, "warehouse.threads"),
    "transform /dev/zero": (None, "target.transform"),
    "a newline in the spec path": (_dump({**valid_incident(), "spec": "spec\n.yaml"}), "spec"),
    "a newline in the warehouse path": (None, "warehouse.path"),
}


@pytest.mark.parametrize("case", list(CLI_CASES), ids=list(CLI_CASES))
def test_the_cli_prints_one_line_and_exits_2_for_the_nastiest_inputs(case, dataset, tmp_path, capsys, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    data, field = CLI_CASES[case]
    if data is None:  # a nasty spec behind a valid incident
        d = spec_dict()
        if field == "warehouse.threads":
            d["warehouse"]["threads"] = 100000
        elif field == "warehouse.path":
            d["warehouse"]["path"] = "wh\n.duckdb"
        else:
            d["target"]["transform"] = "/dev/zero"
        (dataset / "nasty_spec.yaml").write_bytes(_dump(d))
        data = _dump({**valid_incident(), "spec": "nasty_spec.yaml"})
    path = dataset / "cli_incident.yaml"
    path.write_bytes(data)
    before, listing = file_sha256(dataset / "wh.duckdb"), _listing(dataset)
    assert cli(["reconcile", "--incident", str(path)]) == 2
    out = capsys.readouterr()
    lines = [line for line in out.out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and f"{field}:" in lines[0], out.out
    assert "Traceback" not in out.out + out.err
    assert file_sha256(dataset / "wh.duckdb") == before and _listing(dataset) == listing
    assert list(home.iterdir()) == [], "a Dagster run or storage was created"


@pytest.mark.parametrize("kind", ["spec", "incident"])
def test_fuzzed_files_validate_or_fail_with_one_line_and_never_write(kind, dataset):
    """Hypothesis, bounded to a few seconds per kind; ``python -m bench fuzz`` runs 10,000+."""
    target = FuzzTarget(dataset, kind)

    @settings(
        max_examples=120, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(mutated_document(target.base()))
    def run(data: bytes) -> None:
        target.validate(data)

    run()
    t = target.tally
    assert t.cases >= 120
    assert not t.uncaught, f"{len(t.uncaught)} uncaught:\n" + "\n".join(t.uncaught[:3])
    assert not t.multi_line, t.multi_line[:3]
    assert not t.writes, t.writes[:3]
    assert sum(n for k, n in t.outcomes.items() if k.startswith("SpecError")) > 30, t.outcomes


def test_the_fuzz_bench_runs_and_reports_its_figures(tmp_path):
    """``make fuzz`` in miniature, so the bench target keeps working."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "fuzz", "--cases", "25", "--json", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    figures = {r["kind"]: r for r in json.loads(out.read_text())}
    assert sorted(figures) == ["incident", "spec"]
    assert all(r["cases"] >= 25 and r["uncaught"] == 0 and r["writes"] == 0 for r in figures.values())
