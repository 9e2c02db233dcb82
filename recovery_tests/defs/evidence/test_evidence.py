"""The evidence bundle: complete, checksummed, immutable, owner-only, and without sensitive values in clear.

One bundle of the failed worked example (200k events) is built per module through
Dagster (``dg.materialize`` against a private copy of the example's instance, so
the backfill's real runs are found). Before it is built, one customer's id is
replaced everywhere by a marker value that cannot occur by chance, so "never in
clear" can be checked byte for byte. Tests that damage a bundle damage a copy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from recovery.cli import main
from recovery.defs.evidence.assets import evidence_bundle
from recovery.defs.resources import warehouse_resource
from recovery.lib.engine import open_engine
from recovery.lib.evidence import (
    KEY_ENV,
    build_evidence,
    load_evidence_key,
    snapshot_entries,
    snapshot_rows_sql,
    verify_bundle,
)
from recovery.lib.incident.model import check_incident, parse_incident
from recovery_tests.support.example_build import SESSION_EVENTS, copy_dataset, env
from recovery_tests.support.rows import present

MARKER = 7_777_777_777_771  # stands in for one customer's id everywhere before the bundle is built
OP = "incident__evidence_bundle"


@dataclass(frozen=True)
class Case:
    root: Path
    home: Path
    incident_file: Path
    bundle: Path
    backfill_id: str
    backfill_run_ids: set[str]
    result: dg.ExecuteInProcessResult

    @property
    def spec_path(self) -> Path:
        return self.root / "spec.yaml"

    def manifest(self) -> dict:
        return json.loads((self.bundle / "manifest.json").read_text())


def plant_marker(warehouse: Path) -> int:
    """Give one customer (present in source and target) the marker id in every table that has the column."""
    con = duckdb.connect(str(warehouse))
    try:
        victim = present(
            con.execute(
                "SELECT t.customer_id FROM analytics.transactions t JOIN raw.transaction_events s USING (txn_id) "
                "WHERE t._generation = 'backfill-0042' GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
            ).fetchone()
        )[0]
        tables = con.execute(
            "SELECT c.table_schema, c.table_name FROM information_schema.columns c JOIN information_schema.tables t "
            "USING (table_schema, table_name) WHERE c.column_name = 'customer_id' AND t.table_type = 'BASE TABLE'"
        ).fetchall()
        for schema, name in tables:
            con.execute(f'UPDATE "{schema}"."{name}" SET customer_id = ? WHERE customer_id = ?', [MARKER, victim])
        return present(
            con.execute("SELECT count(*) FROM analytics.transactions WHERE customer_id = ?", [MARKER]).fetchone()
        )[0]
    finally:
        con.close()


def materialize(case_root: Path, home: Path, incident_file: Path) -> dg.ExecuteInProcessResult:
    with env(DAGSTER_HOME=str(home)), dg.DagsterInstance.get() as instance:
        return dg.materialize(
            [evidence_bundle],
            instance=instance,
            resources={"warehouse": warehouse_resource(str(case_root / "spec.yaml"))},
            run_config={"ops": {OP: {"config": {"incident_file": str(incident_file)}}}},
        )


@pytest.fixture(scope="module")
def case(failed_example, tmp_path_factory) -> Case:
    base = tmp_path_factory.mktemp("evidence")
    root = copy_dataset(failed_example.root, base / "transactions").parent
    home = base / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home)
    assert plant_marker(root / "warehouse.duckdb") > 0
    result = materialize(root, home, root / "incident.yaml")
    assert result.success
    backfill_id = failed_example.info["backfill_id"]
    with env(DAGSTER_HOME=str(home)), dg.DagsterInstance.get() as instance:
        run_ids = {r.run_id for r in instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))}
    return Case(root, home, root / "incident.yaml", root / "evidence" / "INC-2024-031", backfill_id, run_ids, result)


def bundle_files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file())


def folder_fingerprint(folder: Path) -> dict[str, tuple]:
    """Every file's bytes, mode and mtime, and every directory's mode: what 'untouched' means."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.stat()
        rel = p.relative_to(folder).as_posix()
        out[rel] = (
            (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_mtime_ns) if p.is_file() else (st.st_mode,)
        )
    return out


# ---- through Dagster ------------------------------------------------------------------------


def test_the_asset_materializes_through_dagster_and_reports_row_counts(case: Case):
    (mat,) = [e.materialization for e in case.result.get_asset_materialization_events()]
    assert mat.asset_key == dg.AssetKey(["incident", "evidence_bundle"])
    meta = {k: v.value for k, v in mat.metadata.items()}
    manifest = case.manifest()
    parquet_rows = sum(f["rows"] for f in manifest["files"] if f["path"].endswith(".parquet"))
    assert meta["dagster/row_count"] == parquet_rows > 0.85 * SESSION_EVENTS
    assert meta["bundle"] == str(case.bundle)
    assert meta["created"] is True
    assert meta["files"] == len(manifest["files"])
    assert meta["dagster_runs"] == len(case.backfill_run_ids) == 7
    assert meta["manifest_sha256"] == hashlib.sha256((case.bundle / "manifest.json").read_bytes()).hexdigest()


# ---- the manifest ------------------------------------------------------------------------------


def test_the_manifest_matches_every_file(case: Case):
    manifest = case.manifest()
    listed = {f["path"]: f for f in manifest["files"]}
    on_disk = {p.relative_to(case.bundle).as_posix() for p in bundle_files(case.bundle)} - {"manifest.json"}
    assert set(listed) == on_disk
    con = duckdb.connect()
    for rel, entry in listed.items():
        data = (case.bundle / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], rel
        assert len(data) == entry["bytes"], rel
        if rel.endswith(".parquet"):
            rows = present(con.execute("SELECT count(*) FROM read_parquet(?)", [str(case.bundle / rel)]).fetchone())[0]
            assert rows == entry["rows"], rel
        elif rel.endswith(".jsonl"):
            assert len(data.decode().splitlines()) == entry["rows"], rel
        elif rel.endswith(".json") and entry["rows"] is not None:
            assert len(json.loads(data)) == entry["rows"], rel
    con.close()


def test_the_bundle_holds_what_the_runbook_asks_to_preserve(case: Case):
    manifest = case.manifest()
    paths = {f["path"] for f in manifest["files"]}
    (failed,) = manifest["failed_generations"]
    assert failed["generation"] == "backfill-0042" and failed["snapshot_watermark_basis"] == "source_watermark"
    assert {
        "source/change_log.parquet",
        "source/snapshot_at_20240705T010000.keys.parquet",
        "source/snapshot_now.keys.parquet",
        "target/current/backfill-0042.parquet",
        "target/delta/backfill-0042.parquet",
        "config/spec/spec.yaml",
        "config/spec/transforms/transactions.sql",
        "config/incident.yaml",
        "code_version.json",
        "dagster/runs.json",
        "dagster/backfills.json",
    } <= paths
    assert {
        f"control_plane/{t}.parquet"
        for t in (
            "generations",
            "writes",
            "fences",
            "fence_attempts",
            "timeline",
            "pointers",
            "pointer_history",
            "namespaces",
        )
    } <= paths
    # the failed generation's rows and delta-log entries are all there
    con = duckdb.connect()
    con.execute("ATTACH ? AS wh (READ_ONLY)", [str(case.root / "warehouse.duckdb")])
    in_target = present(
        con.execute("SELECT count(*) FROM wh.analytics.transactions WHERE _generation = 'backfill-0042'").fetchone()
    )[0]
    copied = present(
        con.execute(
            "SELECT count(*) FROM read_parquet(?)", [str(case.bundle / "target/current/backfill-0042.parquet")]
        ).fetchone()
    )[0]
    assert copied == in_target > 0
    con.close()
    # code version, incident file and spec as given
    code = json.loads((case.bundle / "code_version.json").read_text())
    import recovery

    assert code["version"] == recovery.__version__ and re.fullmatch(r"[0-9a-f]{40}", code["git_sha"] or "")
    assert (case.bundle / "config/incident.yaml").read_bytes() == case.incident_file.read_bytes()
    assert (case.bundle / "config/spec/spec.yaml").read_bytes() == case.spec_path.read_bytes()
    # the Dagster record: every run of the backfill, its config and tags, and its whole event log
    runs = json.loads((case.bundle / "dagster/runs.json").read_text())
    assert {r["run_id"] for r in runs} == case.backfill_run_ids
    assert all(r["tags"]["dagster/backfill"] == case.backfill_id and "run_config" in r for r in runs)
    with env(DAGSTER_HOME=str(case.home)), dg.DagsterInstance.get() as instance:
        for run_id in case.backfill_run_ids:
            lines = (case.bundle / f"dagster/event_logs/{run_id}.jsonl").read_text().splitlines()
            assert len(lines) == len(instance.all_logs(run_id)) > 0
            entry = dg.deserialize_value(lines[0], dg.EventLogEntry)
            assert entry.run_id == run_id
    assert manifest["orchestrator"]["backfills"] == [case.backfill_id] and manifest["orchestrator"]["notes"] == []


# ---- the source snapshots --------------------------------------------------------------------


def test_each_snapshot_is_the_warehouses_as_of_its_watermark_read_from_the_change_logs_copy(case: Case, monkeypatch):
    """A snapshot is kept as the (key, version) list of its rows in the change log's copy: read
    through it, the rows are the warehouse's snapshot with the same keyed hashes, row for row; the
    manifest's own SELECT gives them from the bundle's folder."""
    from datetime import datetime

    from recovery.lib.evidence.bundle import KEY_VARIABLE, hashed_select, hmac_pads
    from recovery.lib.snapshot import source_snapshot_sql

    spec = check_incident(parse_incident(case.incident_file))
    entries = snapshot_entries(case.manifest())
    assert sorted(e["snapshot"]["as_of"] for e in entries) == ["2024-07-05 01:00:00", "now"]
    inner, outer = hmac_pads(load_evidence_key(case.root / "warehouse.duckdb").secret)
    con = duckdb.connect(str(case.root / "warehouse.duckdb"), read_only=True)
    con.execute(f"SET VARIABLE {KEY_VARIABLE}_inner = ?", [inner])
    con.execute(f"SET VARIABLE {KEY_VARIABLE}_outer = ?", [outer])
    types = {r[0]: r[1] for r in con.execute(f"DESCRIBE {spec.source.table_name.sql()}").fetchall()}
    for entry in entries:
        as_of = entry["snapshot"]["as_of"]
        wm = None if as_of == "now" else datetime.fromisoformat(as_of)
        warehouse, params = hashed_select(source_snapshot_sql(spec, wm), [], ["customer_id"], types)
        bundle = snapshot_rows_sql(case.bundle, entry)
        only_one_side = present(
            con.execute(
                f"SELECT (SELECT count(*) FROM (({warehouse}) EXCEPT ALL ({bundle}))) "
                f"+ (SELECT count(*) FROM (({bundle}) EXCEPT ALL ({warehouse})))",
                params + params,
            ).fetchone()
        )[0]
        assert only_one_side == 0, as_of
        rows = present(con.execute(f"SELECT count(*) FROM ({bundle})").fetchone())[0]
        assert rows == entry["rows"] > SESSION_EVENTS // 4
        monkeypatch.chdir(case.bundle)  # the manifest's SELECT names the files relative to the bundle
        assert present(con.execute(f"SELECT count(*) FROM ({entry['snapshot']['rows']})").fetchone())[0] == rows
    con.close()


def test_the_cli_writes_a_snapshot_out_of_the_bundle_and_overwrites_nothing(case: Case, tmp_path: Path, capsys):
    (entry,) = [e for e in snapshot_entries(case.manifest()) if e["snapshot"]["as_of"] != "now"]
    out = tmp_path / "snapshot.parquet"
    args = ["evidence", "snapshot", "--incident", str(case.incident_file), "--out", str(out)]
    assert main(args) == 0
    assert f"{entry['rows']:,} rows written to {out}" in capsys.readouterr().out
    con = duckdb.connect()
    counts = "SELECT count(*), count(DISTINCT txn_id) FROM read_parquet(?)"
    written = present(con.execute(counts, [str(out)]).fetchone())
    assert written == (entry["rows"], entry["rows"])
    con.close()
    before = out.read_bytes()
    assert main(args) == 2
    assert "exists; name a new file (nothing is overwritten)" in capsys.readouterr().out
    assert out.read_bytes() == before
    assert main([*args[:-1], str(case.bundle / "x.parquet")]) == 2  # the bundle is immutable
    assert "inside the bundle" in capsys.readouterr().out and not (case.bundle / "x.parquet").exists()
    assert main([*args[:-1], str(tmp_path / "other.parquet"), "--as-of", "2020-01-01"]) == 2
    assert "holds no snapshot as of '2020-01-01'; it holds: 2024-07-05 01:00:00, now" in capsys.readouterr().out
    assert main([*args[:-1], str(tmp_path / "now.parquet"), "--as-of", "now"]) == 0


# ---- verify ----------------------------------------------------------------------------------


@pytest.fixture
def bundle_copy(case: Case, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the bundle and an incident file whose evidence_root points at it."""
    root = tmp_path / "evidence"
    shutil.copytree(case.bundle, root / "INC-2024-031")
    raw = yaml.safe_load(case.incident_file.read_text())
    raw.update(spec=str(case.spec_path), evidence_root=str(root))
    incident = tmp_path / "incident.yaml"
    incident.write_text(yaml.safe_dump(raw))
    return root / "INC-2024-031", incident


def verify_cli(incident: Path, capsys) -> tuple[int, str]:
    code = main(["evidence", "verify", "--incident", str(incident)])
    return code, capsys.readouterr().out


def test_verify_passes_on_an_intact_bundle_and_names_a_changed_byte(bundle_copy, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    bundle, incident = bundle_copy
    code, out = verify_cli(incident, capsys)
    assert code == 0, out
    assert "OK" in out

    target = bundle / "target/current/backfill-0042.parquet"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one byte
    target.write_bytes(bytes(data))
    code, out = verify_cli(incident, capsys)
    assert code == 1
    assert "target/current/backfill-0042.parquet: changed" in out
    assert out.count("FAIL") == 1, out


def test_verify_names_a_missing_and_an_extra_file(bundle_copy, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    bundle, incident = bundle_copy
    (bundle / "control_plane/writes.parquet").unlink()
    extra = bundle / "dagster" / "planted.txt"
    extra.write_text("not evidence")
    extra.chmod(0o600)
    code, out = verify_cli(incident, capsys)
    assert code == 1
    assert "control_plane/writes.parquet: missing" in out
    assert "dagster/planted.txt: extra" in out


def test_editing_a_file_and_its_manifest_entry_is_caught_by_the_recorded_manifest_checksum(case: Case, bundle_copy):
    bundle, _ = bundle_copy
    from recovery.lib.evidence import recorded_manifest_sha256

    sha = recorded_manifest_sha256(
        open_engine(check_incident(parse_incident(case.incident_file)).warehouse), "INC-2024-031", case.bundle
    )
    assert sha == hashlib.sha256((case.bundle / "manifest.json").read_bytes()).hexdigest()
    forged = bundle / "config/incident.yaml"
    forged.write_text("incident_id: INC-2024-031\nrequested_by: somebody-else\n")
    manifest = json.loads((bundle / "manifest.json").read_text())
    for f in manifest["files"]:
        if f["path"] == "config/incident.yaml":
            f["sha256"], f["bytes"] = hashlib.sha256(forged.read_bytes()).hexdigest(), forged.stat().st_size
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert verify_bundle(bundle).ok  # the forgery is consistent with itself...
    result = verify_bundle(bundle, recorded_manifest_sha256=sha)
    assert [p.path for p in result.problems] == ["manifest.json"]  # ...but not with the control plane


# ---- immutability ------------------------------------------------------------------------------


def test_a_second_build_leaves_the_first_bundle_byte_identical(case: Case):
    before = folder_fingerprint(case.bundle)
    result = materialize(case.root, case.home, case.incident_file)
    assert result.success
    (mat,) = [e.materialization for e in result.get_asset_materialization_events()]
    assert mat.metadata["created"].value is False
    assert (
        mat.metadata["manifest_sha256"].value
        == case.result.get_asset_materialization_events()[0].materialization.metadata["manifest_sha256"].value
    )
    assert folder_fingerprint(case.bundle) == before
    assert sorted(p.name for p in case.bundle.parent.iterdir()) == ["INC-2024-031"]  # no staging left behind


def test_the_cli_build_runs_the_job_in_the_projects_instance_and_keeps_the_bundle(case: Case, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("RECOVERY_SPEC", str(case.spec_path))  # the code location serves the copied dataset
    monkeypatch.setenv("DAGSTER_HOME", str(case.home))
    before = folder_fingerprint(case.bundle)
    assert main(["evidence", "build", "--incident", str(case.incident_file)]) == 0
    out = capsys.readouterr().out
    assert f"evidence bundle {case.bundle} already existed: left untouched" in out
    assert folder_fingerprint(case.bundle) == before
    with dg.DagsterInstance.get() as instance:
        (run,) = instance.get_runs(dg.RunsFilter(job_name="preserve_evidence"))
    assert run.status == dg.DagsterRunStatus.SUCCESS


# ---- held like the warehouse -------------------------------------------------------------------


def test_files_and_folders_are_readable_only_by_their_owner(case: Case):
    for p in [case.bundle, *case.bundle.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))
        assert mode & 0o077 == 0


def test_sensitive_columns_never_appear_in_clear_yet_still_join(case: Case):
    files = bundle_files(case.bundle)
    con = duckdb.connect()
    con.execute("ATTACH ? AS wh (READ_ONLY)", [str(case.root / "warehouse.duckdb")])
    raw_ids = "SELECT DISTINCT CAST(customer_id AS VARCHAR) FROM wh.raw.transaction_events"
    hashed_files = 0
    for f in files:
        if f.suffix == ".parquet":
            cols = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(f)]).fetchall()]
            if "customer_id" in cols:
                hashed_files += 1
                clear, malformed = present(
                    con.execute(
                        f"SELECT count(*) FILTER (WHERE customer_id IN ({raw_ids})), "
                        "count(*) FILTER (WHERE customer_id IS NOT NULL AND NOT regexp_full_match(customer_id, "
                        f"'[0-9a-f]{{64}}')) "
                        f"FROM read_parquet(?)",
                        [str(f)],
                    ).fetchone()
                )
                assert (clear, malformed) == (0, 0), f
            marker_rows = present(
                con.execute(
                    "SELECT count(*) FROM read_parquet(?) t WHERE contains(CAST(t AS VARCHAR), ?)",
                    [str(f), str(MARKER)],
                ).fetchone()
            )[0]
            assert marker_rows == 0, f
        else:
            text = f.read_bytes()
            assert str(MARKER).encode() not in text, f
            assert not re.search(rb"customer_id[\"']?\s*[:=]\s*\d", text), f  # a value written beside the name
    assert hashed_files >= 5  # source change log, target generations, delta log, consumer outputs

    # the same key hashes the same value the same way in every file: reconciliation can still join
    key = load_evidence_key(case.root / "warehouse.duckdb")
    marker_hash = hmac.new(key.secret.encode(), str(MARKER).encode(), hashlib.sha256).hexdigest()
    (entry,) = [e for e in snapshot_entries(case.manifest()) if e["snapshot"]["as_of"] != "now"]
    src = snapshot_rows_sql(case.bundle, entry)  # the snapshot's rows, from the change log's copy
    tgt = str(case.bundle / "target/current/backfill-0042.parquet")
    joined, same_customer, marker_pairs = present(
        con.execute(
            "SELECT count(*), count(*) FILTER (WHERE s.customer_id = t.customer_id), "
            "count(*) FILTER (WHERE s.customer_id = ? AND t.customer_id = ?) "
            f"FROM ({src}) s JOIN read_parquet(?) t USING (txn_id)",
            [marker_hash, marker_hash, tgt],
        ).fetchone()
    )
    assert joined > SESSION_EVENTS // 4 and same_customer == joined and marker_pairs > 0
    con.close()
    # the key itself is beside the warehouse, owner-only, and in no bundle file
    key_file = Path(key.origin)
    assert key_file.parent == case.root and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert all(key.secret.encode() not in f.read_bytes() for f in files)
    assert case.manifest()["sensitive_columns"]["key_id"] == key.key_id


# ---- without Dagster runs, and the key's sources ------------------------------------------------


def test_a_generation_without_dagster_runs_says_so_in_the_manifest(case: Case, tmp_path: Path):
    from recovery.dagster_history import run_history_for

    incident = parse_incident(case.incident_file).model_copy(update={"evidence_root": tmp_path / "ev"})
    spec = check_incident(incident)
    engine = open_engine(spec.warehouse)
    with dg.instance_for_test() as empty:  # an instance where the backfill never ran
        history = run_history_for(empty, engine, incident.failed_generations, with_logs=True)
    result = build_evidence(incident, spec, engine, history, actor="test")
    manifest = result.manifest
    assert manifest["orchestrator"]["runs"] == 0
    assert any("backfill-0042" in n and "no Dagster runs" in n for n in manifest["orchestrator"]["notes"])
    assert json.loads((result.bundle / "dagster/runs.json").read_text()) == []
    assert not (result.bundle / "dagster/event_logs").exists()
    assert verify_bundle(result.bundle).ok


def test_the_key_comes_from_the_environment_or_one_owner_only_file(tmp_path: Path, monkeypatch):
    warehouse = tmp_path / "wh.duckdb"
    monkeypatch.delenv(KEY_ENV, raising=False)
    first = load_evidence_key(warehouse)
    key_file = tmp_path / "wh.duckdb.evidence-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert load_evidence_key(warehouse) == first  # created once, then reused
    monkeypatch.setenv(KEY_ENV, "x" * 32)
    from_env = load_evidence_key(warehouse)
    assert from_env.secret == "x" * 32 and from_env.key_id != first.key_id
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(Exception, match="too short"):
        load_evidence_key(warehouse)
    monkeypatch.delenv(KEY_ENV)
    os.chmod(key_file, 0o644)
    with pytest.raises(Exception, match="readable by other users"):
        load_evidence_key(warehouse)


def test_verify_refuses_a_folder_without_a_manifest(tmp_path: Path):
    result = verify_bundle(tmp_path)
    assert not result.ok and [p.path for p in result.problems] == ["manifest.json"]
