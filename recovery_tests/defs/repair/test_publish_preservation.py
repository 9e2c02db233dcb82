"""Publish never loses a row a concurrent writer put there (issue #34, item 1).

The small dataset is damaged by a backfill (tripled quantities, duplicated, deleted and
misfiled orders), fenced, and its repair generation is built and gated wave by wave. Then,
for each generated example, normal ingestion writes to the published table in every mode
(``upsert_keys``, ``delete_keys``, ``replace_partitions``, ``append``), through the writer or
a team's asset stored by ``ManagedDuckDBIOManager`` (which has no ``delete_keys``), on keys of
every damage label, with newer, equal and older source versions and orders that move shard,
at every point of the repair: between two waves (the last wave built and gated after the
writes) or after the last, before the candidate is gated, and between the candidate and
publish. After publish the
public table must equal an independent model: the repaired rows with each write applied in
commit order by its own semantics, written here in Python, not by the package's SQL: for a
key the repair rebuilt, an upsert applies when its version is newer than the row's, a
``delete_keys`` tombstone removes the key wherever it sits when the row is not newer, and
a row a partition replace removed goes from that partition only; a carried key a write
touched (outside the rebuilt partitions, nothing to repair) ends as the published table
holds it.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from recovery.io import ManagedDuckDBIOManager
from recovery.io.manager import WRITE_MODE_KEY
from recovery.lib.catalog_checks import load_spec
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.errors import DuplicateKeyError, GateRefusedError
from recovery.lib.incident.model import parse_incident
from recovery.lib.repair.build import build_wave
from recovery.lib.repair.publish import gate_candidate, publish
from recovery.lib.repair.tables import snapshot_table
from recovery.lib.repair.waves import gate_wave
from recovery.lib.write.writer import WriteMode, Writer
from recovery_tests.support.repair_support import current_plan, repair_through_library
from recovery_tests.support.repaired_small import FAILED, INCIDENT, build_damaged
from recovery_tests.support.small_dataset import fetch

COLUMNS = ("region", "order_no", "shard", "placed_at", "qty", "sku", "src_rev")
Row = tuple  # the COLUMNS, in order
Key = tuple[str, int]
INGEST = "ingest-2"


@dataclass(frozen=True)
class Prepared:
    root: Path  # the dataset's folder: spec, incident, warehouse; every wave built and gated
    between_waves: Path  # the same folder with the last wave not built yet
    last_wave: int
    repaired: dict[Key, Row]  # the repair generation before any concurrent write
    rebuilt: frozenset[Key]  # the keys the repair rebuilt from its snapshot
    keys: list[Key]  # keys of every label: held, damaged, deleted by the backfill, misfiled
    misfiled: list[Key]
    shards: list[str]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    root = tmp_path_factory.mktemp("preservation") / "ds"
    r = build_damaged(root, misfiled=True)
    spec, incident = r.spec, parse_incident(r.incident_path)
    plan = repair_through_library(spec, incident, wave_size=6, waves=0)
    *first, last = sorted(plan.waves)
    assert first, "the repair runs in more than one wave"
    writer = Writer(open_engine(spec.warehouse), spec)
    for n in first:
        build_wave(writer, current_plan(spec, INCIDENT), n)
        gate_wave(writer, INCIDENT, n)
    between_waves = root.parent / "between-waves"
    shutil.copytree(root, between_waves)
    _last_wave(writer, last)
    plan = current_plan(spec, INCIDENT)
    db = spec.warehouse.path
    repaired = {(row[0], row[1]): tuple(row) for row in fetch(db, f"SELECT {', '.join(COLUMNS)} FROM {plan.namespace}")}
    published = fetch(db, f"SELECT DISTINCT region, order_no FROM {spec.target.table}")
    misfiled = sorted(
        (row[0], row[1])
        for row in fetch(
            db, f"SELECT region, order_no FROM {spec.target.table} WHERE gen_id = ? AND region = 'west'", [FAILED]
        )
    )
    assert misfiled, "the damage holds misfiled copies"
    keys = sorted(set(repaired) | {tuple(k) for k in published})
    shards = sorted({row[2] for row in repaired.values()})
    rebuilt = frozenset((r[0], r[1]) for r in fetch(db, f"SELECT region, order_no FROM {snapshot_table(spec)}"))
    assert any(k not in rebuilt for k in repaired), "some keys are carried, not rebuilt"
    return Prepared(root, between_waves, last, repaired, rebuilt, keys, misfiled, shards)


def _last_wave(writer: Writer, wave: int) -> None:
    build_wave(writer, current_plan(writer.spec, INCIDENT), wave)
    assert all(g.passed for g in gate_wave(writer, INCIDENT, wave))


@dataclass(frozen=True)
class Write:
    mode: str
    picks: tuple[int, ...]  # indexes into the key pool (or, for a replace, which of its keys to drop)
    rev_step: int  # added to the current version: -1 older, 0 equal, 1 or 2 newer
    move: bool  # an upsert that moves the order to another shard
    shard: int  # index into the shards (replace, append)
    io_manager: bool  # written by a team's asset through ManagedDuckDBIOManager (not delete_keys: it has none)


writes = st.builds(
    Write,
    mode=st.sampled_from(["upsert_keys", "delete_keys", "replace_partitions", "append"]),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=6).map(tuple),
    rev_step=st.sampled_from([-1, 0, 1, 1, 2]),
    move=st.booleans(),
    shard=st.integers(0, 10_000),
    io_manager=st.sampled_from([False, False, True]),  # a third: a run costs more than a write
)


class Model:
    """The expected repair generation, a write at a time, by each write's own semantics."""

    def __init__(self, repaired: dict[Key, Row]):
        self.rows = dict(repaired)
        self.touched: set[Key] = set()

    def upsert(self, row: Row) -> None:
        self.touched.add(row[:2])
        held = self.rows.get(row[:2])
        if held is None or row[6] > held[6]:
            self.rows[row[:2]] = row

    def delete(self, key: Key, rev: int, *, shard: str | None = None) -> None:
        self.touched.add(key)
        held = self.rows.get(key)
        if held is not None and held[6] <= rev and (shard is None or held[2] == shard):
            del self.rows[key]


def _values(rows: list[Row]) -> str:
    def lit(v) -> str:
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if isinstance(v, datetime):
            return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
        return str(v)

    body = ", ".join("(" + ", ".join(lit(v) for v in r) + ")" for r in rows)
    return f"SELECT * FROM (VALUES {body}) AS t({', '.join(COLUMNS)})"


def _published(spec: DatasetSpec, where: str = "true") -> list[Row]:
    return [
        tuple(r)
        for r in fetch(spec.warehouse.path, f"SELECT {', '.join(COLUMNS)} FROM {spec.target.table} WHERE {where}")
    ]


class Source:
    """The change log as the example extends it: every row ingestion writes is a source version
    (a newer one appended here first; an older one taken from the log), as real ingestion's are."""

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        self.events = {
            (r[0], r[1], r[2]): r
            for r in fetch(
                spec.warehouse.path, "SELECT region, order_no, rev, change, placed_at, qty, sku FROM src.order_events"
            )
        }
        self.pending: list[tuple] = []

    def row(self, base: Row, step: int, move: bool) -> Row | None:
        """The row of ``base``'s key ``step`` versions on (a new event) or back (an existing one)."""
        region, order_no = base[0], base[1]
        if step == 0:
            return base
        if step < 0:
            old = self.events.get((region, order_no, base[6] + step))
            if old is None or old[3] != "put":
                return None
            return (region, order_no, f"{region}-{old[4]:%Y%m}", old[4], old[5], old[6], base[6] + step)
        placed = base[3] + timedelta(days=31 if move else 0)
        row = (region, order_no, f"{region}-{placed:%Y%m}", placed, base[4] + 7, base[5], base[6] + step)
        self.put(row)
        return row

    def put(self, row: Row) -> None:
        self.events[(row[0], row[1], row[6])] = (row[0], row[1], row[6], "put", row[3], row[4], row[5])
        self.pending.append(
            (row[0], row[1], row[6], "put", datetime.now(UTC).replace(tzinfo=None), row[3], row[4], row[5])
        )

    def drop(self, key: Key, rev: int) -> None:
        if (key[0], key[1], rev) not in self.events:
            self.events[(key[0], key[1], rev)] = (key[0], key[1], rev, "drop", None, None, None)
            self.pending.append((key[0], key[1], rev, "drop", datetime.now(UTC).replace(tzinfo=None), None, None, None))

    def flush(self, writer: Writer) -> None:
        if self.pending:
            with writer.engine.transaction() as s:
                for e in self.pending:
                    s.execute("INSERT INTO src.order_events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", list(e))
            self.pending.clear()


@functools.cache
def _instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.ephemeral()  # one for the module: an instance per run costs more than the run


def _write(w: Write, writer: Writer, rows: list[Row], mode: WriteMode, shard: str | None = None) -> bool:
    """Write ``rows`` as ingestion does, through the writer or a team's asset; False when refused
    (a replace whose rows hold a key that sits outside its partition), nothing written."""
    if not w.io_manager:
        try:
            writer.write(INGEST, _values(rows), mode=mode, partitions=[shard] if shard else None)
        except DuplicateKeyError:
            if mode != "replace_partitions":
                raise
            return False
        return True
    spec = writer.spec
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    key = [spec.target.table_name.schema, spec.target.table_name.name]
    if shard is not None:  # a partitioned asset: the IO manager replaces its partition

        @dg.asset(key=key, partitions_def=dg.StaticPartitionsDefinition([shard]))
        def orders() -> pd.DataFrame:
            return frame

    else:

        @dg.asset(key=key, metadata={WRITE_MODE_KEY: mode})
        def orders() -> pd.DataFrame:
            return frame

    io = ManagedDuckDBIOManager(database=str(spec.warehouse.path), specs=[str(spec.spec_path)])
    result = dg.materialize(
        [orders], partition_key=shard, instance=_instance(), resources={"io_manager": io}, raise_on_error=False
    )
    if result.success:
        return True
    failure = " ".join(
        f"{e.step_failure_data.error.message if e.step_failure_data.error else ''} "
        f"{e.step_failure_data.user_failure_data.description if e.step_failure_data.user_failure_data else ''}"
        for e in result.all_events
        if e.is_step_failure
    )
    assert mode == "replace_partitions" and "refused: key" in failure and "nothing was written" in failure, failure
    return False


def _apply(w: Write, writer: Writer, model: Model, p: Prepared, source: Source, new_keys: list[int]) -> None:
    spec = writer.spec

    @functools.cache
    def current() -> dict[Key, Row]:  # the published rows of keys the model does not hold, read when first needed
        return {r[:2]: r for r in _published(spec) if r[:2] not in model.rows}

    def base(key: Key) -> Row | None:
        return model.rows[key] if key in model.rows else current().get(key)

    if w.mode == "append":
        shard = p.shards[w.shard % len(p.shards)]
        region, month = shard.split("-")
        rows = []
        for _ in w.picks[:3]:
            new_keys[0] += 1
            placed = datetime(int(month[:4]), int(month[4:]), 10, 12)
            rows.append((region, 90_000 + new_keys[0], shard, placed, 5, "SKU-NEW", 1))
        for r in rows:
            source.put(r)
        source.flush(writer)
        _write(w, writer, rows, "append")
        for r in rows:
            model.upsert(r)
        return
    if w.mode == "replace_partitions":
        shard = p.shards[w.shard % len(p.shards)]
        held = _published(spec, f"shard = '{shard}'")
        # what ingestion recomputes for the shard: the right rows of the orders that belong there (a
        # misfiled copy does not), some at another version, minus the orders it drops
        keep = sorted({r[:2] for r in held if (b := base(r[:2])) is not None and b[2] == shard})
        dropped = {keep[i % len(keep)] for i in w.picks[1:]} if keep else set()
        rows = []
        for i, key in enumerate(keep):
            b = base(key)
            if key in dropped or b is None:
                continue
            moved = source.row(b, w.rev_step if i % 2 == 0 else 0, move=False)
            rows.append(moved if moved is not None else b)
        if (
            w.io_manager
        ):  # a partitioned asset writes its own partition's rows only (an older version may sit elsewhere)
            rows = [r for r in rows if r[2] == shard]
        if not rows:
            return
        source.flush(writer)
        if not _write(w, writer, rows, "replace_partitions", shard):
            return  # refused, nothing written
        incoming = {r[:2] for r in rows}
        removed: dict[Key, int] = {}
        for r in held:
            if r[:2] not in incoming:
                removed[r[:2]] = max(removed.get(r[:2], r[6]), r[6])
        for key, rev in removed.items():
            model.delete(key, rev, shard=shard)
        for r in rows:
            model.upsert(r)
        return
    picked = sorted({p.keys[i % len(p.keys)] for i in w.picks} | {p.misfiled[w.picks[0] % len(p.misfiled)]})
    if w.mode == "delete_keys":
        dels = []
        for k in picked:
            b = base(k)
            rev = (b[6] if b else 1) + w.rev_step
            if w.rev_step > 0:
                source.drop(k, rev)
            dels.append((k, rev))
        source.flush(writer)
        writer.write(
            INGEST,
            "SELECT * FROM (VALUES "
            + ", ".join(f"('{k[0]}', {k[1]}, {rev})" for k, rev in dels)
            + ") AS t(region, order_no, src_rev)",
            mode="delete_keys",
        )
        for k, rev in dels:
            model.delete(k, rev)
        return
    rows = []
    for k in picked:
        b = base(k)
        moved = source.row(b, w.rev_step, w.move) if b is not None else None
        if moved is not None:
            rows.append(moved)
    if rows:
        source.flush(writer)
        _write(w, writer, rows, "upsert_keys")
        for r in rows:
            model.upsert(r)


@settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate] if os.environ.get("PRESERVATION_NO_SHRINK") else list(Phase),
    max_examples=int(os.environ.get("PRESERVATION_EXAMPLES", "200")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    between_waves=st.sampled_from([False, False, True]),
    before=st.lists(writes, max_size=3),
    after=st.lists(writes, max_size=3),
)
def test_the_published_table_is_the_repair_plus_every_concurrent_write_in_its_own_semantics(
    prepared: Prepared,
    tmp_path_factory: pytest.TempPathFactory,
    between_waves: bool,
    before: list[Write],
    after: list[Write],
):
    root = tmp_path_factory.mktemp("example") / "ds"
    shutil.copytree(prepared.between_waves if between_waves else prepared.root, root)
    try:  # 200 examples of a 12 MB warehouse: each copy goes when its example ends
        spec = load_spec(root / "spec.yaml", check_warehouse=False)  # a copy of the fixture's, checked there
        writer = Writer(open_engine(spec.warehouse), spec, actor="ingest")
        writer.register_generation(INGEST, "ingest")
        model, source, new_keys = Model(prepared.repaired), Source(spec), [0]
        for w in before:
            _apply(w, writer, model, prepared, source, new_keys)
        if between_waves:  # the writes above landed between two waves: the last one is built and gated after them
            _last_wave(Writer(open_engine(spec.warehouse), spec), prepared.last_wave)
        plan = current_plan(spec, INCIDENT)  # its from_namespace is the one publish moves the pointer from
        _, results, _ = gate_candidate(writer, plan, with_diffs=False)
        assert all(r.passed for r in results), [r for r in results if not r.passed]
        for w in after:
            _apply(w, writer, model, prepared, source, new_keys)
        publish(writer, INCIDENT)
        carried_now = {}  # carried keys a write touched: as the published table held them, fenced rows left out
        published = []
        cols = ", ".join(COLUMNS)
        for side, *r in fetch(  # one read of both: the generation published from, and the public table now
            spec.warehouse.path,
            f"SELECT 'from', {cols} FROM {plan.from_namespace} WHERE gen_id <> ? "
            f"UNION ALL SELECT 'public', {cols} FROM {spec.target.table}",
            [FAILED],
        ):
            if side == "public":
                published.append(tuple(r))
            elif (r[0], r[1]) in model.touched and (r[0], r[1]) not in prepared.rebuilt:
                carried_now[(r[0], r[1])] = tuple(r)
        expected = [
            row for key, row in model.rows.items() if key in prepared.rebuilt or key not in model.touched
        ] + list(carried_now.values())
        assert sorted(published) == sorted(expected)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def test_a_row_lost_from_the_repair_generation_refuses_the_publish_and_the_pointer_stays(
    prepared: Prepared, tmp_path: Path
):
    """The publish gate itself: a row a concurrent write put into the repair generation, lost after the
    candidate was gated, stops the pointer move with one sentence (exit 1) and a failed gate on record."""
    root = tmp_path / "ds"
    shutil.copytree(prepared.root, root)
    spec = load_spec(root / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec, actor="ingest")
    writer.register_generation(INGEST, "ingest")
    key = sorted(prepared.rebuilt)[0]
    source = Source(spec)
    newer = source.row(prepared.repaired[key], 1, move=False)  # a newer source version, as ingestion writes it
    assert newer is not None
    source.flush(writer)
    writer.write(INGEST, _values([newer]), mode="upsert_keys")
    gate_candidate(writer, current_plan(spec, INCIDENT), with_diffs=False)
    plan = current_plan(spec, INCIDENT)
    with writer.engine.transaction() as s:  # the replayed row lost from the generation after its gate
        s.execute(f"DELETE FROM {plan.namespace} WHERE region = ? AND order_no = ?", [key[0], key[1]])
    with pytest.raises(GateRefusedError) as refused:
        publish(writer, INCIDENT)
    said = str(refused.value)
    assert "\n" not in said and said.startswith("publish refused: repair_concurrent_writes") and "missing 1" in said
    assert f"still points at {plan.from_namespace}" in said
    assert current_plan(spec, INCIDENT).status != "published"
    gate = fetch(
        spec.warehouse.path,
        "SELECT passed, observed FROM _recovery.gate_results WHERE gate = 'repair_concurrent_writes'",
    )
    assert gate == [(False, 1)]
