"""The gates' SQL says the same however it is shortened.

The row-level suites' frame: a wave's groups only its own keys (a semi join); the candidate's,
whose rebuilt partitions are most of the generation, groups every key. Both must give each row
the same copies, the same derived partition (from the latest version among a duplicated key's
copies) and the same tombstone and fence facts; a duplicated key is where they could part.

The reference: with no published row outside the rebuilt and qualified partitions, it leaves out
the carried rows' anti join; a published row written into a new partition must bring it back.

The key-by-key gate: comparing each row by a checksum of its values finds exactly the keys the
column-by-column comparison finds, whichever column differs; a column whose type differs between
the two sides is compared column by column. The keys' suite: a copy of a key outside the scope
fails it, since the frame counts a key's rows across the whole generation.

The tests read one repaired copy of the example: the first changes only the repair generation,
the second only the published one, and neither reads what the other changes; the others change
the repair generation in a transaction they roll back."""

from __future__ import annotations

import pytest

from recovery.lib.catalog_checks import load_spec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import parse_incident
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.repair.gates import (
    checksum_comparable,
    evaluate_gates,
    reconciliation_gate,
    reference_sql,
    row_frame_sql,
)
from recovery.lib.repair.tables import snapshot_table
from recovery.lib.write.writer import Writer
from recovery_tests.support.example_build import BuiltExample, copy_dataset
from recovery_tests.support.repair_support import key_with_an_older_version, repair_through_library


@pytest.fixture(scope="module")
def repaired(failed_example: BuiltExample, tmp_path_factory: pytest.TempPathFactory):
    """A copy of the failed example with every wave built and gated, not published."""
    spec_path = copy_dataset(failed_example.root, tmp_path_factory.mktemp("gate_sql") / "transactions")
    spec = load_spec(spec_path)
    incident = parse_incident(spec_path.with_name("incident.yaml"))
    return spec, repair_through_library(spec, incident, wave_size=40)


def _differences(s, a: str, b: str) -> int:
    return s.scalar(
        f"SELECT (SELECT count(*) FROM (({a}) EXCEPT ALL ({b}))) + (SELECT count(*) FROM (({b}) EXCEPT ALL ({a})))"
    )


def test_counting_copies_over_the_scope_or_the_generation_gives_every_row_the_same_facts(repaired):
    spec, plan = repaired
    ns = plan.namespace
    first, second = plan.rebuild[0], plan.rebuild[-1]
    with open_engine(spec.warehouse).transaction() as s:
        # a key of the first partition copied into the last one with an older version of its source
        dup = key_with_an_older_version(s, ns, first)
        assert dup is not None
        s.execute(
            f"INSERT INTO {ns} SELECT * REPLACE (CAST(? AS DATE) AS event_date, ? AS _source_version) "
            f"FROM {ns} WHERE txn_id = ?",
            [second, dup[1], dup[0]],
        )
        latest = s.scalar(f"SELECT max(_source_version) FROM {ns} WHERE txn_id = ?", [dup[0]])
        derived = s.scalar(
            "SELECT CAST(CAST(event_ts AS DATE) AS VARCHAR) FROM raw.transaction_events "
            "WHERE txn_id = ? AND version = ?",
            [dup[0], latest],
        )
    with open_engine(spec.warehouse).session(read_only=True) as s:
        for scope in (plan.rebuild, [second], [first, second]):
            narrow = row_frame_sql(s, spec, plan, scope, payload=False)
            whole = row_frame_sql(s, spec, plan, scope, payload=False, most_of_generation=True)
            assert s.scalar(f"SELECT count(*) FROM ({narrow})") > 0
            assert _differences(s, narrow, whole) == 0, scope
            facts = s.fetchall(
                f"SELECT __partition, __key_copies, __derived_partition FROM ({whole}) WHERE txn_id = ? ORDER BY 1",
                [dup[0]],
            )
            # each copy inside the scope is there, counted twice, its partition derived from the latest version
            assert facts == sorted((p, 2, derived) for p in {first, second} if p in scope), (scope, facts)


def test_the_reference_carries_published_rows_outside_the_rebuild_and_only_those(repaired):
    spec, plan = repaired
    engine = open_engine(spec.warehouse)
    writer = Writer(engine, spec)
    published, snap = namespace_sql(plan.from_namespace), snapshot_table(spec)

    def check(expect_carried: int) -> None:
        with engine.transaction() as s:
            outside = (
                f"NOT ({in_partitions(s, spec, plan.rebuild)}) AND NOT ({in_partitions(s, spec, list(plan.qualified))})"
            )
            cols = ", ".join(c for c, _ in s.columns(snap))
            written_out = (
                f"SELECT {cols} FROM {snap} UNION ALL SELECT {cols} FROM {published} "
                f"WHERE {outside} AND txn_id NOT IN (SELECT txn_id FROM {snap})"
            )
            reference = reference_sql(s, spec, plan, plan.low_seq, writer, overlay=False)
            assert s.scalar(f"SELECT count(*) FROM ({reference})") > 0
            assert _differences(s, reference, written_out) == 0
            assert s.scalar(f"SELECT count(*) FROM ({reference}) WHERE {outside}") == expect_carried

    with engine.transaction() as s:  # no published row outside the rebuild: nothing carried
        s.execute(
            f"DELETE FROM {published} WHERE NOT ({in_partitions(s, spec, plan.rebuild)}) "
            f"AND NOT ({in_partitions(s, spec, list(plan.qualified))})"
        )
    check(0)
    with engine.transaction() as s:  # a writer puts a row into a partition nobody rebuilds
        s.execute(
            f"INSERT INTO {published} SELECT * REPLACE (txn_id + 10000000000 AS txn_id, "
            f"DATE '2031-01-01' AS event_date) FROM {published} LIMIT 1"
        )
    check(1)


def test_the_checksum_comparison_finds_exactly_the_keys_the_column_by_column_one_finds(repaired):
    spec, plan = repaired
    ns, snap = plan.namespace, snapshot_table(spec)
    with open_engine(spec.warehouse).session() as s:
        s.execute("BEGIN TRANSACTION")  # rolled back: the other tests read this copy
        scope = plan.rebuild
        where = in_partitions(s, spec, scope)
        columns = [c for c, _ in s.columns(snap) if c not in spec.key]
        picked = [
            r[0]
            for r in s.fetchall(f"SELECT txn_id FROM {ns} WHERE {where} ORDER BY txn_id LIMIT ?", [len(columns) + 2])
        ]
        for txn_id, column in zip(picked, columns, strict=False):  # every compared column, one row each, made NULL
            s.execute(f"UPDATE {ns} SET {column} = NULL WHERE txn_id = ?", [txn_id])
        changed, gone = picked[-2:]
        s.execute(f"UPDATE {ns} SET amount_usd = amount_usd + 0.01 WHERE txn_id = ?", [changed])
        s.execute(f"DELETE FROM {ns} WHERE txn_id = ?", [gone])
        s.execute(
            f"INSERT INTO {ns} SELECT * REPLACE (txn_id + 10000000000 AS txn_id) FROM {ns} WHERE txn_id = ?", [changed]
        )

        def found(reference: str, *, by_checksum: bool) -> list[tuple]:
            result = reconciliation_gate(s, spec, plan, scope, reference, by_checksum=by_checksum)
            rows = s.fetchall("SELECT * FROM __gate_diff ORDER BY ALL")
            assert result.observed == len({r[0] for r in rows}) and not result.passed
            return rows

        reference = f"SELECT * FROM {snap} WHERE {where}"
        assert checksum_comparable(s, f"SELECT * FROM {ns}", reference, columns)
        by_columns = found(reference, by_checksum=False)
        assert found(reference, by_checksum=True) == by_columns
        assert set(picked) | {changed + 10000000000} <= {r[0] for r in by_columns}
        # the reference's amounts as DOUBLE: a checksum would differ for every row; the columns are compared
        as_double = f"SELECT * REPLACE (CAST(amount_usd AS DOUBLE) AS amount_usd) FROM ({reference})"
        assert not checksum_comparable(s, f"SELECT * FROM {ns}", as_double, columns)
        assert found(as_double, by_checksum=True) == by_columns
        s.execute("ROLLBACK")


def test_a_copy_of_a_key_outside_the_scope_fails_the_keys_suite(repaired):
    spec, plan = repaired
    ns = plan.namespace
    inside, outside = plan.rebuild[1], plan.rebuild[2]
    engine = open_engine(spec.warehouse)
    with engine.session() as s:
        s.execute("BEGIN TRANSACTION")  # rolled back: the other tests read this copy

        def keys_suite() -> tuple[bool, int]:
            results = evaluate_gates(
                s, Writer(engine, spec), plan, stage="test", scope=[inside], through_seq=plan.low_seq
            )
            keys = next(r for r in results if r.gate == "repair_keys")
            return keys.passed, keys.observed

        assert keys_suite() == (True, 0)
        copied = s.scalar(f"SELECT min(txn_id) FROM {ns} WHERE CAST(event_date AS VARCHAR) = ?", [inside])
        s.execute(
            f"INSERT INTO {ns} SELECT * REPLACE (CAST(? AS DATE) AS event_date) FROM {ns} WHERE txn_id = ?",
            [outside, copied],
        )
        assert keys_suite() == (False, 1)  # the scope's own row, its copy counted across the generation
        s.execute("ROLLBACK")
