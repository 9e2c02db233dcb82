"""The value gate: the candidate against the published rows, key by key and column by column.

Row counts and one amount total miss most backfill bugs (a unit change, a sign flip,
swapped columns, a column nulled by a schema misread, a time-zone shift, rounding): they
keep every key and every row. So, in the engine and over the backfilled partitions only:

- **changes**: the candidate and the published generation are joined on the key; per
  partition and column, the keys whose value differs (``IS DISTINCT FROM``), plus the
  keys the candidate drops or adds. A column may change on at most
  ``max_changed_share`` of the range's keys unless the request declares it
  (``expect_change``, optionally with an ``expected_share``).
- **profile**: per partition and column, on either side, the null share, the distinct
  count and, for numbers, booleans, dates and timestamps (as epoch seconds), the mean
  and p10/p50/p90. Shifts are measured in the published column's standard deviation,
  so one default fits every column whatever its unit. A partition with too few
  published rows is profiled against the published history (the partitions outside the
  range) instead; with no history at all the gate says so and leaves the candidate to
  the invariants gate.

Only one row per partition (changes) and one per partition and column (profile) leave
the engine; the defaults need no per-column configuration (``recurrence.anomaly``
overrides them, per column under ``columns``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recovery.lib.dataset_spec.models import AnomalyThresholds, DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.errors import SpecError
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.pointers.namespaces import namespace_sql

HISTORY = "(history)"
_NUMERIC = (
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "FLOAT",
    "DOUBLE",
    "REAL",
)


def column_kind(sql_type: str) -> str:
    """numeric | boolean | temporal | other: how a column is profiled."""
    t = sql_type.upper()
    if t in _NUMERIC or t.startswith(("DECIMAL", "NUMERIC")):
        return "numeric"
    if t == "BOOLEAN":
        return "boolean"
    if t == "DATE" or t.startswith("TIMESTAMP"):
        return "temporal"
    return "other"


def _as_number(col: str, kind: str) -> str | None:
    c = quote(col)
    if kind in ("numeric", "boolean"):
        return f"CAST({c} AS DOUBLE)"
    if kind == "temporal":
        return f"epoch(CAST({c} AS TIMESTAMP))"
    return None


@dataclass(frozen=True)
class Declared:
    """What the request says it is meant to change."""

    columns: tuple[str, ...] = ()
    share: float | None = None

    @classmethod
    def from_mapping(cls, raw: dict | None) -> Declared:
        raw = raw or {}
        return cls(tuple(raw.get("expect_change") or ()), raw.get("expected_share"))

    def covers(self, column: str) -> bool:
        return column in self.columns or (not self.columns and self.share is not None)

    def describe(self) -> str:
        if not self.columns and self.share is None:
            return "nothing declared"
        cols = ", ".join(self.columns) or "any column"
        return f"declared: {cols}" + (f" on up to {self.share:.0%} of keys" if self.share is not None else "")


NOTHING_DECLARED = Declared()


@dataclass(frozen=True)
class ColumnChange:
    column: str
    changed: int
    matched: int
    allowed: float
    declared: bool
    worst_partition: str | None
    worst_share: float
    samples: tuple[tuple[str, str, str, str], ...] = ()  # (key, partition, before, after)

    @property
    def share(self) -> float:
        return self.changed / self.matched if self.matched else 0.0

    @property
    def refused(self) -> bool:
        return self.share > self.allowed


@dataclass(frozen=True)
class Violation:
    """One reason to refuse, as the sentence a person reads."""

    check: str  # changed_share | missing_keys | new_keys | mean | quantile | null_share | distinct
    partition: str  # a partition, or the range
    column: str
    observed: str
    allowed: str

    def sentence(self) -> str:
        return f"{self.check} of {self.column} in {self.partition}: {self.observed} (allowed {self.allowed})"


@dataclass
class ValueReport:
    partitions: list[str]
    columns: list[tuple[str, str]]  # (name, kind) compared
    declared: Declared
    per_partition: list[dict] = field(default_factory=list)  # partition, matched, missing, added, changed per column
    changes: list[ColumnChange] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    baseline_notes: list[str] = field(default_factory=list)
    matched: int = 0
    missing: int = 0
    added: int = 0

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def changed_columns(self) -> list[str]:
        return [c.column for c in self.changes if c.changed]

    def gate(self) -> GateResult:
        cols = ", ".join(f"{c.column} {c.share:.1%}" for c in self.changes if c.changed) or "none"
        base = (
            f"{self.matched:,} keys compared over {len(self.partitions)} partitions; changed: {cols}; "
            f"{self.missing:,} dropped, {self.added:,} added; {self.declared.describe()}"
        )
        notes = ("; " + "; ".join(self.baseline_notes)) if self.baseline_notes else ""
        if self.passed:
            return GateResult("values", True, 0, base + notes)
        worst = "; ".join(v.sentence() for v in self.violations[:6])
        more = f" (+{len(self.violations) - 6} more)" if len(self.violations) > 6 else ""
        return GateResult(
            "values",
            False,
            len(self.violations),
            f"{len(self.violations)} value check(s) failed: {worst}{more}. {base}{notes}. Fix: correct the "
            f"recompute, or declare the intended change with --expect-change COLUMN[,COLUMN] "
            f"(and --expected-share) if it is deliberate",
        )


def compared_columns(s: Session, spec: DatasetSpec, namespace: str) -> list[tuple[str, str]]:
    """Payload columns (key and generation metadata left out), with how each is profiled."""
    meta = spec.target.metadata
    skip = set(spec.key) | {meta.generation, meta.source_version, meta.written_at}
    a = spec.recurrence_policy.anomaly
    cols = s.columns(namespace_sql(namespace))
    names = {c for c, _ in cols}
    for name in a.columns:
        if name not in names:
            raise SpecError(
                f"recurrence.anomaly.columns.{name}",
                f"{name!r} is not a column of {spec.target.table}",
                f"use one of {sorted(names - skip)}",
            )
    return [(c, column_kind(t)) for c, t in cols if c not in skip and not (c in a.columns and a.columns[c].ignore)]


def _limit(a: AnomalyThresholds, column: str, name: str) -> float:
    over = a.columns.get(column)
    value = getattr(over, name) if over is not None else None
    return getattr(a, name) if value is None else value


def _pairs_sql(
    s: Session, spec: DatasetSpec, candidate: str, published: str, partitions: list[str], cols: list[str]
) -> str:
    key = quote_all(spec.key)
    part = quote(spec.target.partition)
    inside = in_partitions(s, spec, partitions)
    # duplicates: the invariants' job
    one = f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY CAST({part} AS VARCHAR)) = 1"
    sel = ", ".join(f"a.{quote(c)} AS a_{i}, b.{quote(c)} AS b_{i}" for i, c in enumerate(cols))
    keys = ", ".join(f"CAST({quote(k)} AS VARCHAR) AS k_{i}" for i, k in enumerate(spec.key))
    return f"""
        SELECT coalesce(CAST(b.{part} AS VARCHAR), CAST(a.{part} AS VARCHAR)) AS partition, {keys},
               a.__a IS NOT NULL AS in_a, b.__b IS NOT NULL AS in_b, {sel}
        FROM (SELECT *, true AS __a FROM {namespace_sql(candidate)} WHERE {inside} {one}) a
        FULL OUTER JOIN (SELECT *, true AS __b FROM {namespace_sql(published)} WHERE {inside} {one}) b USING ({key})"""


def _profile_sql(
    s: Session, relation: str, partition: str, columns: list[tuple[str, str]], label: str | None = None
) -> str:
    """One row per partition and column: rows, nulls, distinct values, mean, std dev, p10/p50/p90
    (each quantile in the session's engine's own spelling)."""
    group = f"'{label}'" if label else f"CAST({quote(partition)} AS VARCHAR)"
    parts = []
    for name, kind in columns:
        c, v = quote(name), _as_number(name, kind)
        num = (
            f"avg({v}), stddev_pop({v}), " + ", ".join(s.quantile_sql(v, q) for q in (0.1, 0.5, 0.9))
            if v
            else "NULL, NULL, NULL, NULL, NULL"
        )
        parts.append(
            f"SELECT {group} AS partition, '{name}' AS col, count(*) AS n, count(*) - count({c}) AS nulls, "
            f"count(DISTINCT {c}) AS distinct_n, {num} FROM {relation} GROUP BY 1"
        )
    return " UNION ALL ".join(parts)


_PROFILE_COLS = ("partition", "col", "n", "nulls", "distinct_n", "mean", "sd", "p10", "p50", "p90")


def _profiles(s: Session, sql: str) -> dict[tuple[str, str], dict]:
    return {(r[0], r[1]): dict(zip(_PROFILE_COLS, r)) for r in s.fetchall(sql)} if sql else {}


def compare_values(
    s: Session,
    spec: DatasetSpec,
    candidate: str,
    published: str,
    partitions: list[str],
    declared: Declared = NOTHING_DECLARED,
    *,
    samples: int = 3,
) -> ValueReport:
    """Every value check of the candidate's backfilled partitions against the published ones."""
    a = spec.recurrence_policy.anomaly
    columns = compared_columns(s, spec, candidate)
    unknown = [c for c in declared.columns if c not in {n for n, _ in columns} and c != spec.target.partition]
    if unknown:
        raise SpecError(
            "expect_change",
            f"{', '.join(unknown)} is not a compared column of {spec.target.table}",
            f"declare one of {[n for n, _ in columns]}",
        )
    report = ValueReport(partitions, columns, declared)
    if not partitions or not columns:
        return report
    names = [n for n, _ in columns]
    s.temp_table("__bf_pairs", f"{_pairs_sql(s, spec, candidate, published, partitions, names)}")
    changed = ", ".join(
        f"count(*) FILTER (WHERE in_a AND in_b AND a_{i} IS DISTINCT FROM b_{i})" for i in range(len(names))
    )
    rows = s.fetchall(
        f"SELECT partition, count(*) FILTER (WHERE in_a AND in_b), count(*) FILTER (WHERE in_b AND NOT in_a), "
        f"count(*) FILTER (WHERE in_a AND NOT in_b), {changed} FROM __bf_pairs GROUP BY 1 ORDER BY 1"
    )
    for r in rows:
        report.per_partition.append(
            {"partition": r[0], "matched": r[1], "missing": r[2], "added": r[3], "changed": dict(zip(names, r[4:]))}
        )
    report.matched = sum(p["matched"] for p in report.per_partition)
    report.missing = sum(p["missing"] for p in report.per_partition)
    unpublished = [p for p in report.per_partition if not p["matched"] and not p["missing"]]
    report.added = sum(p["added"] for p in report.per_partition if p not in unpublished)
    if unpublished:  # nothing to compare with: say so; the invariants gate and the history profile hold them
        report.baseline_notes.append(
            f"{len(unpublished)} partition(s) had no published rows "
            f"({', '.join(p['partition'] for p in unpublished[:3])}; "
            f"{sum(p['added'] for p in unpublished):,} keys): no key-by-key baseline, held to the invariants gate "
            f"and profiled against the published history"
        )
    published_keys = report.matched + report.missing
    rng = f"{partitions[0]}..{partitions[-1]}"
    if published_keys and report.missing / published_keys > a.max_missing_keys_share:
        report.violations.append(
            Violation(
                "missing_keys",
                rng,
                "the key",
                f"{report.missing:,} of {published_keys:,} "
                f"published keys dropped ({report.missing / published_keys:.1%})",
                f"{a.max_missing_keys_share:.0%}",
            )
        )
    if published_keys and report.added / published_keys > a.max_new_keys_share:
        report.violations.append(
            Violation(
                "new_keys",
                rng,
                "the key",
                f"{report.added:,} keys added to {published_keys:,} published ({report.added / published_keys:.1%})",
                f"{a.max_new_keys_share:.0%}",
            )
        )
    key_cols = ", ".join(f"k_{i}" for i in range(len(spec.key)))
    for i, name in enumerate(names):
        per = [(p["partition"], p["changed"][name], p["matched"]) for p in report.per_partition]
        n_changed = sum(c for _, c, _ in per)
        worst = max(per, key=lambda x: x[1] / x[2] if x[2] else 0.0, default=(None, 0, 0))
        is_declared = declared.covers(name)
        allowed = (
            (declared.share if declared.share is not None else 1.0)
            if is_declared
            else _limit(a, name, "max_changed_share")
        )
        sample: tuple = ()
        if n_changed and samples:
            sample = tuple(
                (" / ".join(str(x) for x in row[: len(spec.key)]), row[-3], row[-2], row[-1])
                for row in s.fetchall(
                    f"SELECT {key_cols}, partition, CAST(b_{i} AS VARCHAR), CAST(a_{i} AS VARCHAR) FROM __bf_pairs "
                    f"WHERE in_a AND in_b AND a_{i} IS DISTINCT FROM b_{i} ORDER BY ALL LIMIT {int(samples)}"
                )
            )
        change = ColumnChange(
            name,
            n_changed,
            report.matched,
            allowed,
            is_declared,
            worst[0],
            worst[1] / worst[2] if worst[2] else 0.0,
            sample,
        )
        report.changes.append(change)
        if change.refused:
            report.violations.append(
                Violation(
                    "changed_share",
                    rng,
                    name,
                    f"{n_changed:,} of {report.matched:,} keys changed ({change.share:.1%}; "
                    f"worst {change.worst_partition} {change.worst_share:.0%}; e.g. {_sample_text(sample)})",
                    f"{allowed:.0%}, {'declared' if is_declared else 'not declared'}",
                )
            )
    s.drop_relation("__bf_pairs")
    _profile_checks(s, spec, candidate, published, partitions, columns, declared, report)
    return report


def _sample_text(sample) -> str:
    return ", ".join(f"{k}: {b} -> {a}" for k, _, b, a in sample[:2]) or "none"


def _profile_checks(
    s: Session,
    spec: DatasetSpec,
    candidate: str,
    published: str,
    partitions: list[str],
    columns: list[tuple[str, str]],
    declared: Declared,
    report: ValueReport,
) -> None:
    a = spec.recurrence_policy.anomaly
    part = spec.target.partition
    inside = in_partitions(s, spec, partitions)
    checked = [(n, k) for n, k in columns if not declared.covers(n) and n != part]
    if not checked:
        return
    cand = _profiles(s, _profile_sql(s, f"(SELECT * FROM {namespace_sql(candidate)} WHERE {inside})", part, checked))
    pub = _profiles(s, _profile_sql(s, f"(SELECT * FROM {namespace_sql(published)} WHERE {inside})", part, checked))
    rows = {p: r["n"] for (p, c), r in pub.items() if c == checked[0][0]}
    thin = [p for p in partitions if rows.get(p, 0) < a.min_baseline_rows and any(k[0] == p for k in cand)]
    history = {}
    if thin:
        history = _profiles(
            s,
            _profile_sql(
                s, f"(SELECT * FROM {namespace_sql(published)} WHERE NOT ({inside}))", part, checked, label=HISTORY
            ),
        )
        hist_rows = history.get((HISTORY, checked[0][0]), {}).get("n", 0)
        if hist_rows >= a.min_baseline_rows:
            report.baseline_notes.append(
                f"{len(thin)} partition(s) with under {a.min_baseline_rows} published rows "
                f"({', '.join(thin[:3])}) profiled against the published history ({hist_rows:,} rows)"
            )
        else:
            history = {}
            report.baseline_notes.append(
                f"no baseline for {len(thin)} partition(s) ({', '.join(thin[:3])}): under "
                f"{a.min_baseline_rows} published rows and no published history; only the "
                f"invariants gate checked them"
            )
    for (p, col), c in sorted(cand.items()):
        kind = dict(checked)[col]
        base = history.get((HISTORY, col)) if p in thin else pub.get((p, col))
        if base is None or not base["n"] or not c["n"]:
            continue
        where = p if p not in thin else f"{p} (vs history)"
        null_change = abs(c["nulls"] / c["n"] - base["nulls"] / base["n"])
        lim = _limit(a, col, "max_null_share_change")
        if null_change > lim:
            report.violations.append(
                Violation(
                    "null_share",
                    where,
                    col,
                    f"{c['nulls'] / c['n']:.1%} null vs {base['nulls'] / base['n']:.1%} published",
                    f"±{lim:.0%}",
                )
            )
        if p not in thin:  # distinct counts scale with rows: compare them only partition to partition
            lim = _limit(a, col, "max_distinct_change")
            change = abs(c["distinct_n"] - base["distinct_n"]) / max(base["distinct_n"], 1)
            if change > lim:
                report.violations.append(
                    Violation(
                        "distinct",
                        where,
                        col,
                        f"{c['distinct_n']:,} distinct values vs {base['distinct_n']:,} published",
                        f"±{lim:.0%}",
                    )
                )
        if kind == "other" or base["mean"] is None or c["mean"] is None:
            continue
        if kind == "temporal" and p in thin:  # a partition's times differ from all of history by construction
            continue
        scale = base["sd"] or abs(base["mean"]) * 0.01 or 1.0
        lim = _limit(a, col, "max_mean_shift")
        shift = abs(c["mean"] - base["mean"]) / scale
        if shift > lim:
            report.violations.append(
                Violation(
                    "mean",
                    where,
                    col,
                    f"mean {c['mean']:,.4g} vs {base['mean']:,.4g} published ({shift:,.2f} std devs)",
                    f"{lim} std devs",
                )
            )
        if kind == "boolean":
            continue
        lim = _limit(a, col, "max_quantile_shift")
        for q in ("p10", "p50", "p90"):
            if c[q] is None or base[q] is None:
                continue
            shift = abs(c[q] - base[q]) / scale
            if shift > lim:
                report.violations.append(
                    Violation(
                        "quantile",
                        where,
                        col,
                        f"{q} {c[q]:,.4g} vs {base[q]:,.4g} published ({shift:,.2f} std devs)",
                        f"{lim} std devs",
                    )
                )
                break


def evaluate_values(
    s: Session,
    spec: DatasetSpec,
    candidate: str,
    published: str,
    partitions: list[str],
    declared: Declared = NOTHING_DECLARED,
) -> tuple[GateResult, ValueReport]:
    report = compare_values(s, spec, candidate, published, partitions, declared)
    return report.gate(), report
