"""The profile gate: the published generation's profile, as a Great Expectations suite run on the candidate.

The published rows of the range (or, when the range has too few, the published
history outside it) are profiled in SQL: per column the null share, the distinct
count, the value set of low-cardinality columns and, for numbers, mean, standard
deviation and p10/p50/p90. Each becomes a GE 1.x expectation with the value gate's
tolerances (shifts in published standard deviations, so no per-column setup), and the
suite is validated on the candidate's backfilled partitions through GE's SQL
datasource: every expectation is computed by the warehouse over the whole relation.
Columns the request declares it will change are left out. The UI shows each
expectation's result through the blocking check's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.engine.duckdb_engine import duckdb_connection
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.recurrence.gates.values import NOTHING_DECLARED, Declared, compared_columns
from recovery.lib.repair.sql_suites import SqlSuiteRunner
from recovery.lib.repair.suites import Expectation, Suite, SuiteResult

VALUE_SET_MAX = 30  # a column with at most this many distinct published values gets a value-set expectation


@dataclass(frozen=True)
class ProfileOutcome:
    gate: GateResult
    suite: Suite | None
    result: SuiteResult | None
    baseline: str


def _stats(s: Session, relation: str, name: str, kind: str) -> dict:
    c = quote(name)
    num = (
        (
            f", avg(CAST({c} AS DOUBLE)), stddev_pop(CAST({c} AS DOUBLE)), "
            + ", ".join(s.quantile_sql(f"CAST({c} AS DOUBLE)", q) for q in (0.1, 0.5, 0.9))
        )
        if kind == "numeric"
        else ""
    )
    row = s.fetchrow(f"SELECT count(*), count(*) - count({c}), count(DISTINCT {c}){num} FROM {relation}")
    out = {"n": row[0], "nulls": row[1], "distinct": row[2]}
    if kind == "numeric":
        out.update(zip(("mean", "sd", "p10", "p50", "p90"), row[3:]))
    if row[2] <= VALUE_SET_MAX and kind in ("other", "boolean"):
        out["values"] = [
            r[0] for r in s.fetchall(f"SELECT DISTINCT {c} FROM {relation} WHERE {c} IS NOT NULL ORDER BY 1")
        ]
    return out


def profile_suite(
    s: Session, spec: DatasetSpec, relation: str, columns: list[tuple[str, str]], *, counts: bool = True
) -> Suite:
    """Expectations the candidate must meet to look like ``relation`` (the published baseline); ``counts``: also
    its distinct counts (only when the baseline covers the same partitions: counts grow with rows)."""
    a = spec.recurrence_policy.anomaly
    E = Expectation
    exps: list[Expectation] = []
    for name, kind in columns:
        over = a.columns.get(name)

        def lim(field: str, over=over) -> float:
            value = getattr(over, field) if over is not None else None
            return getattr(a, field) if value is None else value

        st = _stats(s, relation, name, kind)
        if not st["n"]:
            continue
        null_share = st["nulls"] / st["n"]
        if null_share + lim("max_null_share_change") < 1:
            exps.append(
                E(
                    "expect_column_values_to_not_be_null",
                    {"column": name, "mostly": round(1 - null_share - lim("max_null_share_change"), 6)},
                )
            )
        d = lim("max_distinct_change")
        if counts:
            exps.append(
                E(
                    "expect_column_unique_value_count_to_be_between",
                    {
                        "column": name,
                        "min_value": int(st["distinct"] * (1 - d)),
                        "max_value": int(st["distinct"] * (1 + d)) + 1,
                    },
                )
            )
        if st.get("values"):
            exps.append(
                E(
                    "expect_column_values_to_be_in_set",
                    {"column": name, "value_set": st["values"], "mostly": round(1 - lim("max_null_share_change"), 6)},
                )
            )
        if kind == "numeric" and st["mean"] is not None:
            scale = st["sd"] or abs(st["mean"]) * 0.01 or 1.0
            k = lim("max_mean_shift") * scale
            exps.append(
                E(
                    "expect_column_mean_to_be_between",
                    {"column": name, "min_value": st["mean"] - k, "max_value": st["mean"] + k},
                )
            )
            q = lim("max_quantile_shift") * scale
            exps.append(
                E(
                    "expect_column_quantile_values_to_be_between",
                    {
                        "column": name,
                        "quantile_ranges": {
                            "quantiles": [0.1, 0.5, 0.9],
                            "value_ranges": [[st[p] - q, st[p] + q] for p in ("p10", "p50", "p90")],
                        },
                    },
                )
            )
    return Suite("profile", tuple(exps), description="derived from the published generation")


def evaluate_profile(
    s: Session,
    spec: DatasetSpec,
    candidate: str,
    published: str,
    partitions: list[str],
    declared: Declared = NOTHING_DECLARED,
) -> ProfileOutcome:
    a = spec.recurrence_policy.anomaly
    inside = in_partitions(s, spec, partitions)
    columns = [
        (n, k) for n, k in compared_columns(s, spec, candidate) if not declared.covers(n) and n != spec.target.partition
    ]
    in_range = f"(SELECT * FROM {namespace_sql(published)} WHERE {inside})"
    history = f"(SELECT * FROM {namespace_sql(published)} WHERE NOT ({inside}))"
    n_range, n_history = s.fetchrow(f"SELECT (SELECT count(*) FROM {in_range}), (SELECT count(*) FROM {history})")
    part = quote(spec.target.partition)
    published_parts = [r[0] for r in s.fetchall(f"SELECT DISTINCT CAST({part} AS VARCHAR) FROM {in_range} ORDER BY 1")]
    checked = inside
    if n_range >= a.min_baseline_rows:
        relation, baseline = in_range, f"the published rows of the range ({n_range:,})"
        checked = in_partitions(s, spec, published_parts)  # a partition never published has no baseline here
        missing = [p for p in partitions if p not in set(published_parts)]
        if missing:
            baseline += (
                f"; {len(missing)} partition(s) without published rows left to the values gate's history profile"
            )
    elif n_history >= a.min_baseline_rows:
        relation, baseline = (
            history,
            f"the published history outside the range ({n_history:,} rows; the range has {n_range})",
        )
    else:
        return ProfileOutcome(
            GateResult(
                "profile",
                True,
                0,
                "no baseline: under "
                f"{a.min_baseline_rows} published rows in the range and in history; the "
                "candidate is held to the invariants gate only",
            ),
            None,
            None,
            "none",
        )
    suite = profile_suite(s, spec, relation, columns, counts=relation == in_range)
    if not suite.expectations:
        return ProfileOutcome(GateResult("profile", True, 0, "no column to profile"), suite, None, baseline)
    runner = SqlSuiteRunner(duckdb_connection(s), [suite])
    result = runner.validate(f"SELECT * FROM {namespace_sql(candidate)} WHERE {checked}")["profile"]
    if result.passed:
        return ProfileOutcome(
            GateResult(
                "profile",
                True,
                0,
                f"{len(suite.expectations)} expectations derived from {baseline} "
                f"held on the candidate ({result.rows:,} rows, computed in the warehouse)",
            ),
            suite,
            result,
            baseline,
        )
    failing = sorted({label.split("(")[1].rstrip(")") for label in result.failures if "(" in label})
    return ProfileOutcome(
        GateResult(
            "profile",
            False,
            len(result.failures),
            f"{len(result.failures)} of {len(suite.expectations)} expectations derived from "
            f"{baseline} failed on columns {', '.join(failing)}: "
            + "; ".join(f"{k} ({', '.join(map(str, v[:2]))})" for k, v in list(result.samples.items())[:4])
            + ". Fix: correct the recompute, or declare the change with --expect-change",
        ),
        suite,
        result,
        baseline,
    )
