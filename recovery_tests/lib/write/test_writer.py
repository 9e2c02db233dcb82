"""The writer's promises: every write lands stamped and logged, or not at all; a fenced
generation's write never lands (even when the fence commits mid-write); adoption of a
plain table is all-or-nothing; concurrent writer processes lose nothing."""

from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import cast

import duckdb
import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import DatasetSpec, parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.engine.base import Engine, RetryableConflict
from recovery.lib.errors import FencedGenerationError, RecoveryError, SchemaMismatchError
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.writer import Writer
from recovery_tests.support.small_dataset import (
    PAYLOAD,
    build_small_dataset,
    catalog,
    fetch,
    latest_live,
    order_events,
    rows_digest,
)

AT = datetime(2026, 4, 1, 12, 30, 0)
DELTA = f'{SCHEMA}."delta__orders"'
NS = "mart.orders__g0001"


def _setup(tmp_path: Path) -> tuple[DatasetSpec, Writer, Path]:
    spec = load_spec(build_small_dataset(tmp_path / "ds"))
    return spec, Writer(open_engine(spec.warehouse), spec), spec.warehouse.path


def _loaded(tmp_path: Path) -> tuple[DatasetSpec, Writer, Path]:
    """A published dataset holding the source's current rows as generation ingest-1."""
    spec, w, db = _setup(tmp_path)
    w.ensure()
    w.register_generation("ingest-1", "ingest")
    w.write("ingest-1", expected_rows_sql(spec, None), mode="replace_partitions", at=AT)
    return spec, w, db


def _count(db: Path, sql: str, params: list | None = None) -> int:
    return fetch(db, f"SELECT count(*) FROM ({sql})", params)[0][0]


def _clock(db: Path) -> int:
    return fetch(db, f"SELECT seq FROM {SCHEMA}.clock")[0][0]


def _state(db: Path) -> dict:
    """Everything a refused write must leave alone."""
    return {
        "rows": rows_digest(db, "mart.orders"),
        "delta": rows_digest(db, DELTA),
        "writes": rows_digest(db, f"{SCHEMA}.writes"),
        "generations": fetch(db, f"SELECT generation, writes, last_write_seq FROM {SCHEMA}.generations ORDER BY 1"),
        "clock": _clock(db),
    }


# ---- set-up ---------------------------------------------------------------------------------


def test_ensure_publishes_a_view_with_explicit_columns_and_is_idempotent(tmp_path):
    spec, w, db = _setup(tmp_path)
    assert w.ensure() == NS

    cat = catalog(db)
    assert ("mart", "orders", "VIEW") in cat
    assert ("mart", "orders__g0001", "BASE TABLE") in cat
    control = {t for s, t, _ in cat if s == SCHEMA}
    assert {
        "clock",
        "generations",
        "fences",
        "fence_attempts",
        "namespaces",
        "pointers",
        "pointer_history",
        "writes",
        "timeline",
        "delta__orders",
    } <= control
    columns = [r[0] for r in fetch(db, f"DESCRIBE {NS}")]
    assert columns == list(PAYLOAD) + ["src_rev", "gen_id", "landed_at"]
    (view_sql,) = fetch(db, "SELECT sql FROM duckdb_views() WHERE schema_name = 'mart' AND view_name = 'orders'")[0]
    select_list = view_sql.split("SELECT", 1)[1].split("FROM", 1)[0]
    assert "*" not in select_list
    assert [c.strip().strip('"') for c in select_list.split(",")] == columns
    assert fetch(db, f"SELECT public_name, namespace FROM {SCHEMA}.pointers") == [("mart.orders", NS)]

    clock = _clock(db)
    assert w.ensure() == NS
    assert catalog(db) == cat
    assert _clock(db) == clock
    for table in ("namespaces", "pointers", "pointer_history"):
        assert _count(db, f"SELECT * FROM {SCHEMA}.{table}") == 1, table


# ---- stamping, logging, modes ---------------------------------------------------------------


def test_write_stamps_generation_source_version_and_time_and_logs_every_row(tmp_path):
    spec, w, db = _setup(tmp_path)
    w.ensure()
    assert w.register_generation("ingest-1", "ingest") is None  # writes the published namespace
    res = w.write("ingest-1", expected_rows_sql(spec, None), mode="replace_partitions", at=AT)

    live = latest_live(order_events())
    rows = fetch(db, "SELECT region, order_no, shard, qty, sku, gen_id, src_rev, landed_at FROM mart.orders")
    assert res.rows_inserted == len(rows) == len(live) > 100
    assert res.rows_deleted == 0
    for region, order_no, shard, qty, sku, gen_id, src_rev, landed_at in rows:
        want = live[(region, order_no)]
        assert (shard, qty, sku) == (want.shard, want.qty, want.sku)
        assert gen_id == "ingest-1"
        assert src_rev == want.rev
        assert landed_at == AT
    assert res.partitions == tuple(sorted({e.shard for e in live.values()}))

    delta = fetch(db, f"SELECT _delta_op, _delta_seq, _delta_namespace, region, order_no, src_rev, gen_id FROM {DELTA}")
    assert len(delta) == len(live)
    assert {(op, seq, ns, gen) for op, seq, ns, _, _, _, gen in delta} == {("upsert", res.seq, NS, "ingest-1")}
    assert {(r, o): v for _, _, _, r, o, v, _ in delta} == {k: e.rev for k, e in live.items()}
    assert fetch(
        db,
        f"SELECT seq, dataset, generation, namespace, mode, rows_inserted, rows_deleted, written_at "
        f"FROM {SCHEMA}.writes",
    ) == [(res.seq, "orders", "ingest-1", NS, "replace_partitions", len(live), 0, AT)]
    assert fetch(db, f"SELECT writes, last_write_seq FROM {SCHEMA}.generations WHERE generation = 'ingest-1'") == [
        (1, res.seq)
    ]


def test_rerunning_a_replace_partitions_write_leaves_the_table_identical(tmp_path):
    spec, w, db = _loaded(tmp_path)
    before = rows_digest(db, "mart.orders")
    again = w.write("ingest-1", expected_rows_sql(spec, None), mode="replace_partitions", at=AT)
    assert rows_digest(db, "mart.orders") == before
    assert again.rows_deleted == again.rows_inserted == before[0]
    assert _count(db, "SELECT region, order_no FROM mart.orders GROUP BY ALL HAVING count(*) > 1") == 0
    # every key came back, so the log holds re-inserts only, no deletes
    assert fetch(db, f"SELECT _delta_op, count(*) FROM {DELTA} WHERE _delta_seq = ? GROUP BY 1", [again.seq]) == [
        ("upsert", before[0])
    ]


def test_replace_partitions_removes_rows_the_new_partition_no_longer_holds(tmp_path):
    spec, w, db = _loaded(tmp_path)
    shard, n = fetch(db, "SELECT shard, count(*) FROM mart.orders GROUP BY 1 HAVING count(*) >= 3 ORDER BY 1 LIMIT 1")[
        0
    ]
    gone = fetch(
        db, "SELECT region, order_no, qty FROM mart.orders WHERE shard = ? ORDER BY order_no LIMIT 1", [shard]
    )[0]
    others = rows_digest(db, f"(SELECT * FROM mart.orders WHERE shard <> '{shard}')")
    w.register_generation("repair-1", "repair")
    res = w.write(
        "repair-1",
        f"SELECT * FROM ({expected_rows_sql(spec, None)}) WHERE shard = ? AND NOT (region = ? AND order_no = ?)",
        mode="replace_partitions",
        partitions=[shard],
        params=[shard, gone[0], gone[1]],
    )
    assert (res.rows_deleted, res.rows_inserted) == (n, n - 1)
    assert fetch(db, "SELECT count(*), min(gen_id), max(gen_id) FROM mart.orders WHERE shard = ?", [shard]) == [
        (n - 1, "repair-1", "repair-1")
    ]
    assert _count(db, "SELECT * FROM mart.orders WHERE region = ? AND order_no = ?", list(gone[:2])) == 0
    assert rows_digest(db, f"(SELECT * FROM mart.orders WHERE shard <> '{shard}')") == others
    assert fetch(
        db, f"SELECT region, order_no, qty FROM {DELTA} WHERE _delta_seq = ? AND _delta_op = 'delete'", [res.seq]
    ) == [gone]


def test_upsert_keys_replaces_a_keys_row_wherever_it_sits(tmp_path):
    spec, w, db = _loaded(tmp_path)
    region, order_no, old_shard, src_rev = fetch(
        db, "SELECT region, order_no, shard, src_rev FROM mart.orders ORDER BY region, order_no LIMIT 1"
    )[0]
    untouched = f"(SELECT * FROM mart.orders WHERE NOT (region = '{region}' AND order_no = {order_no}))"
    others, total = rows_digest(db, untouched), _count(db, "SELECT * FROM mart.orders")
    w.register_generation("repair-1", "repair")
    res = w.write(
        "repair-1",
        "SELECT region, order_no, 'moved-209912' AS shard, placed_at, 999 AS qty, sku, src_rev + 10 AS src_rev "
        "FROM mart.orders WHERE region = ? AND order_no = ? "
        "UNION ALL SELECT 'atlantis', 1, 'atlantis-202601', TIMESTAMP '2026-01-05', 3, 'SKU-999', 1",
        mode="upsert_keys",
        params=[region, order_no],
        at=AT,
    )
    assert (res.rows_inserted, res.rows_deleted) == (2, 1)
    assert fetch(
        db, "SELECT shard, qty, src_rev, gen_id FROM mart.orders WHERE region = ? AND order_no = ?", [region, order_no]
    ) == [("moved-209912", 999, src_rev + 10, "repair-1")]
    assert _count(db, "SELECT * FROM mart.orders WHERE shard = ?", [old_shard]) == _count(
        db, f"SELECT * FROM {untouched} WHERE shard = ?", [old_shard]
    )
    assert fetch(db, "SELECT gen_id FROM mart.orders WHERE region = 'atlantis'") == [("repair-1",)]
    assert _count(db, "SELECT * FROM mart.orders") == total + 1
    assert rows_digest(db, f"(SELECT * FROM {untouched} WHERE region <> 'atlantis')") == others
    assert fetch(db, f"SELECT _delta_op, count(*) FROM {DELTA} WHERE _delta_seq = ? GROUP BY 1", [res.seq]) == [
        ("upsert", 2)
    ]


def test_delete_keys_removes_the_keys_and_logs_every_tombstone_with_its_version(tmp_path):
    spec, w, db = _loaded(tmp_path)
    victims = fetch(db, "SELECT region, order_no, shard, qty FROM mart.orders ORDER BY order_no DESC, region LIMIT 3")
    total = _count(db, "SELECT * FROM mart.orders")
    values = ", ".join(f"('{r}', {o})" for r, o, _, _ in victims) + ", ('atlantis', 7)"  # one key that is not there
    w.register_generation("repair-1", "repair")
    res = w.write(
        "repair-1",
        f"SELECT region, order_no, 4242 AS src_rev FROM (VALUES {values}) AS v(region, order_no)",
        mode="delete_keys",
        at=AT,
    )
    assert (res.rows_inserted, res.rows_deleted) == (0, 3)
    assert _count(db, "SELECT * FROM mart.orders") == total - 3
    for r, o, _, _ in victims:
        assert _count(db, "SELECT * FROM mart.orders WHERE region = ? AND order_no = ?", [r, o]) == 0
    logged = fetch(
        db,
        f"SELECT region, order_no, shard, qty, src_rev, _delta_op, _delta_namespace FROM {DELTA} "
        f"WHERE _delta_seq = ? ORDER BY order_no DESC, region",
        [res.seq],
    )
    # every tombstone is logged, the absent key's too (a repair generation may still hold it)
    assert logged == [(r, o, s, q, 4242, "delete", NS) for r, o, s, q in victims] + [
        ("atlantis", 7, None, None, 4242, "delete", NS)
    ]
    assert fetch(db, f"SELECT mode, rows_deleted FROM {SCHEMA}.writes WHERE seq = ?", [res.seq]) == [("delete_keys", 3)]


def test_write_of_rows_missing_a_payload_column_is_refused_and_changes_nothing(tmp_path):
    spec, w, db = _loaded(tmp_path)
    before = _state(db)
    with pytest.raises(SchemaMismatchError, match="qty"):
        w.write("ingest-1", f"SELECT * EXCLUDE (qty) FROM ({expected_rows_sql(spec, None)})", mode="replace_partitions")
    with pytest.raises(SchemaMismatchError, match="src_rev"):
        w.write("ingest-1", "SELECT region, order_no FROM mart.orders LIMIT 2", mode="delete_keys")
    assert _state(db) == before


def test_write_by_an_unregistered_generation_is_refused(tmp_path):
    spec, w, db = _loaded(tmp_path)
    before = _state(db)
    with pytest.raises(RecoveryError, match="not registered"):
        w.write("nobody", expected_rows_sql(spec, None), mode="append")
    assert _state(db) == before


# ---- fencing --------------------------------------------------------------------------------


def test_fenced_generation_write_is_refused_and_counted(tmp_path):
    spec, w, db = _loaded(tmp_path)
    w.register_generation("bf-1", "backfill")
    w.write("bf-1", f"SELECT * FROM ({expected_rows_sql(spec, None)}) WHERE region = 'east'", mode="upsert_keys")
    token = w.fence("bf-1", incident_id="INC-7", fenced_by="oncall@ops", reason="wrong join", at=AT)
    assert token == 2 and w.is_fenced("bf-1")
    assert w.fence("bf-1", incident_id="INC-7", fenced_by="oncall@ops") == token  # fencing again is a no-op
    before = _state(db)

    with pytest.raises(FencedGenerationError):
        w.write("bf-1", expected_rows_sql(spec, None), mode="replace_partitions", run_id="run-9")
    with pytest.raises(FencedGenerationError):  # even holding the fence's own token
        w.write("bf-1", expected_rows_sql(spec, None), mode="upsert_keys", token=token, run_id="run-9")

    assert _state(db) == before
    assert fetch(db, f"SELECT generation, dataset, action, run_id FROM {SCHEMA}.fence_attempts ORDER BY action") == [
        ("bf-1", "orders", "write:replace_partitions", "run-9"),
        ("bf-1", "orders", "write:upsert_keys", "run-9"),
    ]
    with pytest.raises(FencedGenerationError):
        w.register_generation("bf-1", "backfill")
    assert _state(db) == before
    assert fetch(db, f"SELECT generation, incident_id, token, fenced_at, fenced_by FROM {SCHEMA}.fences") == [
        ("bf-1", "INC-7", 2, AT, "oncall@ops")
    ]
    assert fetch(db, f"SELECT status FROM {SCHEMA}.generations WHERE generation = 'bf-1'") == [("fenced",)]


def test_write_with_a_stale_token_is_refused(tmp_path):
    spec, w, db = _loaded(tmp_path)
    w.register_generation("bf-2", "backfill")
    rows = f"SELECT * FROM ({expected_rows_sql(spec, None)}) WHERE region = 'west'"
    before = _state(db)
    with pytest.raises(FencedGenerationError, match="stale token"):
        w.write("bf-2", rows, mode="upsert_keys", token=0)
    assert _state(db) == before
    assert _count(db, f"SELECT * FROM {SCHEMA}.fence_attempts WHERE generation = 'bf-2'") == 1
    assert w.write("bf-2", rows, mode="upsert_keys", token=1).rows_inserted > 0  # the current token is accepted

    token = w.fence("bf-2", incident_id="INC-8", fenced_by="oncall@ops")
    fenced = _state(db)
    for stale in (1, token):
        with pytest.raises(FencedGenerationError):
            w.write("bf-2", rows, mode="upsert_keys", token=stale)
    assert _state(db) == fenced


class _ConflictSignallingEngine:
    """Delegates to an engine; sets ``conflicted`` whenever a transaction loses a race."""

    def __init__(self, inner, conflicted: threading.Event):
        self.inner, self.conflicted = inner, conflicted

    def session(self, read_only: bool = False):
        return self.inner.session(read_only)

    @contextmanager
    def transaction(self):
        try:
            with self.inner.transaction() as s:
                yield s
        except RetryableConflict:
            self.conflicted.set()
            raise


def _race_once(spec: DatasetSpec, db: Path, i: int, order: str) -> dict:
    """Writer A (thread) writes as a generation while fencer B (thread) fences it.

    ``write_first``: A has taken its seq, passed the CAS and inserted, and waits before
    COMMIT until B has lost a conflict. ``fence_first``: A has begun and read the
    generation as unfenced, and waits until B's fence has committed. ``free``: both
    start together.
    """
    gen = f"bf-race-{i:02d}"
    writer = Writer(open_engine(spec.warehouse), spec, actor="writer-a")
    writer.register_generation(gen, "backfill")
    b_conflicted, a_paused, release_a, b_done = (threading.Event() for _ in range(4))
    start = threading.Barrier(2, timeout=20)
    fencer = Writer(
        cast(Engine, _ConflictSignallingEngine(open_engine(spec.warehouse), b_conflicted)), spec, actor="fencer-b"
    )
    attempts: list[int] = []
    original = writer.write_in

    def paused_write_in(s, *args, **kwargs):
        attempts.append(1)
        if order == "fence_first" and len(attempts) == 1:
            row = s.fetchone(f"SELECT fenced_at FROM {SCHEMA}.generations WHERE generation = ?", [gen])
            assert row == (None,)
            a_paused.set()
            assert release_a.wait(20)
        result = original(s, *args, **kwargs)
        if order == "write_first" and len(attempts) == 1:
            a_paused.set()
            assert release_a.wait(20)
        return result

    writer.write_in = paused_write_in  # type: ignore[method-assign]
    rows = (
        f"SELECT 'race' AS region, {i * 10 + j} AS order_no, 'race-2026' AS shard, TIMESTAMP '2026-01-01' "
        f"AS placed_at, {j} AS qty, 'SKU-R' AS sku, 1 AS src_rev"
        for j in range(3)
    )
    rows_sql = " UNION ALL ".join(rows)
    out: dict = {"order": order}

    def thread_a():
        try:
            if order == "free":
                start.wait()
            out["result"] = writer.write(gen, rows_sql, mode="append")
        except BaseException as err:  # noqa: BLE001 - recorded and judged below
            out["error"] = err
        finally:
            a_paused.set()

    def thread_b():
        try:
            if order == "free":
                start.wait()
            else:
                assert a_paused.wait(20)
            out["token"] = fencer.fence(gen, incident_id="INC-RACE", fenced_by="fencer-b")
        except BaseException as err:  # noqa: BLE001
            out["fence_error"] = err
        finally:
            b_done.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    if order == "write_first":
        assert b_conflicted.wait(20), "the fence never met A's open transaction"
    elif order == "fence_first":
        assert b_done.wait(20)
    release_a.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    out["attempts"] = len(attempts)
    out["b_conflicted"] = b_conflicted.is_set()
    out["landed"] = _count(db, "SELECT * FROM mart.orders WHERE gen_id = ?", [gen])
    out["write_seqs"] = [r[0] for r in fetch(db, f"SELECT seq FROM {SCHEMA}.writes WHERE generation = ?", [gen])]
    out["fence_seq"] = fetch(db, f"SELECT seq FROM {SCHEMA}.fences WHERE generation = ?", [gen])
    out["fence_attempts"] = _count(db, f"SELECT * FROM {SCHEMA}.fence_attempts WHERE generation = ?", [gen])
    return out


def test_fence_committed_during_a_write_leaves_a_consistent_outcome(tmp_path):
    spec, w, db = _loaded(tmp_path)
    orders = ["write_first", "fence_first", "free"]
    tally = {"landed_before_fence": 0, "refused": 0, "fencer_conflicts": 0, "writer_retries": 0}
    for i in range(20):
        o = _race_once(spec, db, i, orders[i % 3])
        assert "fence_error" not in o, o
        assert len(o["fence_seq"]) == 1, o
        (fence_seq,) = o["fence_seq"][0]
        tally["fencer_conflicts"] += o["b_conflicted"]
        tally["writer_retries"] += o["attempts"] - 1
        if "result" in o:
            assert "error" not in o
            assert o["landed"] == 3 and o["write_seqs"] == [o["result"].seq], o
            assert o["result"].seq < fence_seq, o
            assert o["fence_attempts"] == 0, o
            tally["landed_before_fence"] += 1
        else:
            assert isinstance(o.get("error"), FencedGenerationError), o
            assert o["landed"] == 0 and o["write_seqs"] == [], o
            assert o["fence_attempts"] == 1, o
            tally["refused"] += 1
        if o["order"] == "write_first":
            assert "result" in o and o["b_conflicted"], o  # the fence waited for the open write
        if o["order"] == "fence_first":
            assert "error" in o and o["attempts"] >= 2, o  # the stale transaction conflicted, then was refused
    print(f"fence race over 20 runs: {tally}")
    assert tally["landed_before_fence"] + tally["refused"] == 20, tally
    assert tally["landed_before_fence"] >= 7 and tally["refused"] >= 7, tally


# ---- adoption -------------------------------------------------------------------------------


def _plain_table(spec: DatasetSpec, db: Path) -> None:
    """A table some other tool wrote: same columns, two generations and some unlabelled rows."""
    con = duckdb.connect(str(db))
    try:
        con.execute("CREATE SCHEMA mart")
        con.execute(
            f"CREATE TABLE mart.orders AS SELECT *, "
            "CASE WHEN order_no % 5 = 0 THEN NULL WHEN order_no % 2 = 0 THEN 'legacy-a' ELSE 'legacy-b' "
            "END AS gen_id, "
            f"TIMESTAMP '2026-02-01 00:00:00' + to_minutes(CAST(order_no AS BIGINT)) AS landed_at "
            f"FROM ({expected_rows_sql(spec, None)})"
        )
    finally:
        con.close()


def test_ensure_adopts_a_plain_table_and_infers_its_generations(tmp_path):
    spec, w, db = _setup(tmp_path)
    _plain_table(spec, db)
    before = rows_digest(db, "mart.orders")
    firsts = fetch(db, "SELECT gen_id, min(landed_at) FROM mart.orders WHERE gen_id IS NOT NULL GROUP BY 1 ORDER BY 1")
    assert [g for g, _ in firsts] == ["legacy-a", "legacy-b"]

    assert w.ensure() == NS
    cat = catalog(db)
    assert ("mart", "orders", "VIEW") in cat and ("mart", "orders__g0001", "BASE TABLE") in cat
    assert rows_digest(db, "mart.orders") == before
    assert rows_digest(db, NS) == before
    assert fetch(
        db, f"SELECT generation, dataset, kind, started_at, inferred FROM {SCHEMA}.generations ORDER BY 1"
    ) == [(g, "orders", "unknown", first, True) for g, first in firsts]
    assert fetch(db, f"SELECT reason, to_namespace FROM {SCHEMA}.pointer_history") == [("adopted", NS)]
    assert w.ensure() == NS  # adopting is done once


def test_adoption_that_fails_after_the_rename_leaves_the_plain_table_untouched(tmp_path, monkeypatch):
    import recovery.lib.pointers.managed_views as managed_names

    spec, w, db = _setup(tmp_path)
    _plain_table(spec, db)
    before, cat = rows_digest(db, "mart.orders"), catalog(db)
    seen = {}

    def crash_after_rename(s, name, ns):
        seen["renamed"] = (s.object_kind("mart", "orders"), s.object_kind("mart", "orders__g0001"))
        raise RuntimeError("crash while pointing the view")

    monkeypatch.setattr(managed_names, "point_view", crash_after_rename)
    with pytest.raises(RuntimeError, match="crash while pointing"):
        w.ensure()

    assert seen["renamed"] == (None, "table")  # the failure came after the rename
    assert catalog(db) == cat
    assert rows_digest(db, "mart.orders") == before
    control = {t for s, t, _ in cat if s == SCHEMA}
    for table in ("namespaces", "pointers", "pointer_history", "generations"):
        assert table not in control or _count(db, f"SELECT * FROM {SCHEMA}.{table}") == 0

    monkeypatch.undo()
    assert w.ensure() == NS
    assert rows_digest(db, "mart.orders") == before


# ---- two writer processes -------------------------------------------------------------------

N_WRITES = 15


def _append_worker(spec_path: str, worker: int, rep: int, barrier, results) -> None:
    """Runs in a spawned process: register a generation, then append N_WRITES batches of new keys."""
    try:
        spec = parse_spec(spec_path)
        w = Writer(open_engine(spec.warehouse), spec, actor=f"proc-{worker}")
        gen = f"ingest-r{rep}-p{worker}"
        w.register_generation(gen, "ingest")
        barrier.wait(120)  # both processes registered: start appending together
        seqs = []
        for j in range(N_WRITES):
            order_no = 100_000 + rep * 1_000 + worker * 100 + j
            rows = (
                f"SELECT 'p{worker}' AS region, {order_no} AS order_no, 'p{worker}-r{rep}' AS shard, "
                f"TIMESTAMP '2026-01-01' AS placed_at, {j} AS qty, 'SKU-P' AS sku, 1 AS src_rev"
            )
            seqs.append(w.write(gen, rows, mode="append").seq)
        results.put((worker, gen, seqs, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((worker, None, [], traceback.format_exc()))


def test_two_writer_processes_on_one_file_both_complete_and_every_row_lands(tmp_path):
    spec, w, db = _setup(tmp_path)
    w.ensure()
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    expected_keys, acknowledged, switches = set(), {}, 0
    for rep in range(5):
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [
            ctx.Process(target=_append_worker, args=(str(spec.spec_path), k, rep, barrier, results)) for k in range(2)
        ]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        for worker, gen, seqs, error in outcomes:
            assert error is None, error
            assert len(seqs) == N_WRITES and seqs == sorted(seqs)
            acknowledged[gen] = seqs
            expected_keys |= {(f"p{worker}", 100_000 + rep * 1_000 + worker * 100 + j) for j in range(N_WRITES)}
        order = sorted((s, g) for g in (o[1] for o in outcomes) for s in acknowledged[g])
        switches += sum(a[1] != b[1] for a, b in zip(order, order[1:]))
    elapsed = time.monotonic() - started

    total = sum(len(s) for s in acknowledged.values())
    figures = f"{total} acknowledged appends from 2 processes over 5 races in {elapsed:.1f}s, {switches} interleavings"
    print(figures)
    writes = fetch(db, f"SELECT generation, seq FROM {SCHEMA}.writes ORDER BY seq")
    assert total == len(writes) == 2 * 5 * N_WRITES, figures
    for gen, seqs in acknowledged.items():
        assert [s for g, s in writes if g == gen] == seqs, figures
    keys = fetch(db, "SELECT region, order_no FROM mart.orders")
    assert len(keys) == len(set(keys)) and set(keys) == expected_keys, figures
    # every commit took exactly one seq: ensure + 10 registrations + the writes, no gaps, no repeats
    taken = (
        [s for _, s in writes]
        + [r[0] for r in fetch(db, f"SELECT registered_seq FROM {SCHEMA}.generations")]
        + [r[0] for r in fetch(db, f"SELECT created_seq FROM {SCHEMA}.namespaces")]
    )
    assert sorted(taken) == list(range(1, _clock(db) + 1)), figures
