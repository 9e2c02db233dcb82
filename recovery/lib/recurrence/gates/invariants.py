"""The invariants gate: SQL assertions on every backfilled partition of the new generation.

An invariant is one SELECT returning the violating rows of ``{{ rows }}`` (the
backfilled partitions of the new generation); it may read ``{{ generation }}`` (the
whole new generation) and ``{{ source_latest }}`` (each key's latest source change as
of the manifest's watermark, tombstones included). Four follow from the spec's
contract and always run; the spec declares more under ``recurrence.invariants``; its
Great Expectations ``suites`` run too, through GE's SQL datasource on DuckDB (each
expectation computed over the whole relation by the engine; bounded batches on Spark). Violations are counted
per partition in the engine; only counts and a few sample rows leave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.lib.dataset_spec.models import DatasetSpec, InvariantSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import DuckDBSession
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.repair.sql_suites import SqlSuiteRunner
from recovery.lib.repair.suites import BATCH_ROWS, SuiteRunner, declared_suites
from recovery.lib.snapshot import latest_versions_sql, str_list


@dataclass(frozen=True)
class InvariantResult:
    name: str
    violations: int
    partitions: dict[str, int]
    sample: list
    description: str

    @property
    def passed(self) -> bool:
        return self.violations == 0

    def describe(self) -> str:
        if self.passed:
            return f"{self.name}: held"
        parts = ", ".join(f"{p} ({n:,})" for p, n in list(sorted(self.partitions.items()))[:6])
        return (
            f"{self.name}: {self.violations:,} violating rows"
            + (f" in {parts}" if parts else "")
            + f"; e.g. {self.sample[:2]}"
        )


def builtin_invariants() -> list[InvariantSpec]:
    """Invariants every managed dataset has (the key, version and tombstone contract); SQL built per spec."""
    return [
        InvariantSpec.model_construct(
            name="keys_unique", sql="", description="no key has two rows in the new generation"
        ),
        InvariantSpec.model_construct(
            name="no_tombstoned_keys",
            sql="",
            description="no key whose latest source change (as of the watermark) is a delete",
        ),
        InvariantSpec.model_construct(name="keys_in_source", sql="", description="every key exists in the source"),
        InvariantSpec.model_construct(
            name="source_version_current",
            sql="",
            description="every row carries its key's latest source version as of the watermark",
        ),
    ]


def _builtin_sql(spec: DatasetSpec, name: str) -> str:
    src = spec.source
    key = quote_all(spec.key)
    sv = quote(spec.target.metadata.source_version)
    if name == "keys_unique":
        return (
            f"SELECT r.* FROM {{{{ rows }}}} r SEMI JOIN (SELECT {key} FROM {{{{ generation }}}} GROUP BY ALL "
            f"HAVING count(*) > 1) d USING ({key})"
        )
    if name == "no_tombstoned_keys":
        return (
            f"SELECT r.* FROM {{{{ rows }}}} r JOIN {{{{ source_latest }}}} l USING ({key}) "
            f"WHERE l.{quote(src.op)} IN ({str_list(src.delete_ops)})"
        )
    if name == "keys_in_source":
        return f"SELECT r.* FROM {{{{ rows }}}} r ANTI JOIN {{{{ source_latest }}}} l USING ({key})"
    if name == "source_version_current":
        return (
            f"SELECT r.* FROM {{{{ rows }}}} r JOIN {{{{ source_latest }}}} l USING ({key}) "
            f"WHERE l.{quote(src.op)} IN ({str_list(src.upsert_ops)}) AND r.{sv} < l.{quote(src.version)}"
        )
    raise KeyError(name)


def _evaluate(s: Session, spec: DatasetSpec, name: str, sql: str, description: str, relations: dict) -> InvariantResult:
    part = spec.target.partition
    s.temp_table("__bf_violations", f"{render(sql, **relations)}")
    cols = [c for c, _ in s.columns("__bf_violations")]
    n = int(s.scalar("SELECT count(*) FROM __bf_violations") or 0)
    parts = (
        dict(s.fetchall(f"SELECT CAST({quote(part)} AS VARCHAR), count(*) FROM __bf_violations GROUP BY 1"))
        if part in cols and n
        else {}
    )
    shown = [c for c in spec.key + [part] if c in cols] or cols
    sample = (
        [list(map(str, r)) for r in s.fetchall(f"SELECT {quote_all(shown)} FROM __bf_violations ORDER BY ALL LIMIT 3")]
        if n
        else []
    )
    s.drop_relation("__bf_violations")
    return InvariantResult(name, n, parts, sample, description)


def evaluate_invariants(
    s: Session,
    spec: DatasetSpec,
    namespace: str,
    partitions: list[str],
    watermark: datetime | None,
    *,
    batch_rows: int = BATCH_ROWS,
) -> tuple[GateResult, list[InvariantResult]]:
    """Every invariant over the backfilled partitions of ``namespace``; the caller owns the session."""
    ns = namespace_sql(namespace)
    relations = {
        "rows": f"SELECT * FROM {ns} WHERE {in_partitions(s, spec, partitions)}",
        "generation": f"SELECT * FROM {ns}",
        "source_latest": latest_versions_sql(spec, watermark, include_deleted=True),
    }
    results = [
        _evaluate(s, spec, i.name, _builtin_sql(spec, i.name), i.description, relations) for i in builtin_invariants()
    ]
    results += [_evaluate(s, spec, i.name, i.sql, i.description, relations) for i in spec.recurrence_policy.invariants]
    if spec.suites:
        columns = [c for c, _ in s.columns(ns)]
        suites = declared_suites(spec, columns)
        # computed by the warehouse over the whole relation
        # (a Spark session's dialect is "duckdb" too: the type decides)
        if isinstance(s, DuckDBSession):
            suite_results = SqlSuiteRunner(s.conn, suites).validate(relations["rows"])
        else:  # Spark: bounded pandas batches (aggregates are per batch)
            runner = SuiteRunner(suites)
            suite_results = runner.run(s.arrow_batches(relations["rows"], batch_rows))
        for r in suite_results.values():
            results.append(
                InvariantResult(
                    r.name,
                    r.unexpected,
                    {},
                    [r.describe()] if not r.passed else [],
                    "Great Expectations suite declared in the spec",
                )
            )
    failed = [r for r in results if not r.passed]
    total = sum(r.violations for r in failed)
    details = (
        "; ".join(r.describe() for r in failed)
        if failed
        else f"{len(results)} invariants held on {len(partitions)} partitions: " + ", ".join(r.name for r in results)
    )
    return GateResult("invariants", not failed, total, details), results
