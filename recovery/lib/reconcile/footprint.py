"""The failed generation's footprint: the keys a reconciliation has to look at after a backfill.

A backfill usually rewrites a few partitions of a large table. Its footprint is

- every key the failed generations wrote: their rows in the target, and their rows in the
  package's write log (upserts and the removals their writes made);
- every key the target holds in the footprint range;
- every key whose expected row (E) lies in the footprint range, held by the target or not.

The footprint range is the incident's ``partitions`` range, widened to every partition the
failed generations wrote (their rows, their logged rows, the write log's ``partitions``);
without an incident range, those written partitions alone. Bounds are compared in the
partition column's own type: ``CAST(<literal> AS <column type>)``, never the column cast to text,
so the engine prunes the target's scan by the partition predicate.

A footprint reconciliation labels exactly those keys, each as a whole-table run labels it:
each footprint key is looked at with all of its target rows (copies outside the range
included) and its whole source history. The source is resolved to latest versions only for
candidate keys: the keys above from the target and the write log, and every key any of whose
source changes the transform files in the range (a superset of the keys expected there, found
by one scan of the change log through the transform, without ranking it). This assumes what
``expected_rows_sql`` already does: the transform maps each source row of a key to at most
one row of the same key (no aggregation across keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recovery.lib.control.plane import SCHEMA, delta_table, has_dataset_table
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, quote_all, sql_literal, str_list, ts_literal
from recovery.lib.reconcile.inputs import ReconcileInputs


@dataclass(frozen=True)
class Footprint:
    """The footprint range as SQL bounds in the partition column's type, and as text for the summary."""

    lo: str  # SQL expression, e.g. CAST(DATE '2024-01-01' AS DATE)
    hi: str
    lo_text: str
    hi_text: str
    column_type: str

    def between(self, column_sql: str) -> str:
        """The partition predicate, in the column's own type."""
        return f"{column_sql} BETWEEN {self.lo} AND {self.hi}"


def _bound(value: Any, column_type: str) -> str:
    return f"CAST({sql_literal(value)} AS {column_type})"


def resolve_footprint(s: Session, inputs: ReconcileInputs) -> Footprint | None:
    """The footprint range: the incident's range widened to the partitions the failed generations
    wrote (or those alone). None when there is neither (no range given, nothing written)."""
    spec = inputs.spec
    target = spec.target.table_name.sql()
    part, gen = quote(spec.target.partition), quote(spec.target.metadata.generation)
    column_type = dict(s.columns(target))[spec.target.partition]
    gens = str_list(list(inputs.failed_generations))
    written = [f"SELECT min({part}) AS lo, max({part}) AS hi FROM {target} WHERE {gen} IN ({gens})"]
    if has_dataset_table(s, "delta", spec.dataset):
        written.append(f"SELECT min({part}), max({part}) FROM {delta_table(spec.dataset)} WHERE {gen} IN ({gens})")
    # a replaced partition the failed generation left empty shows only in the write log, as text (read on
    # its own: the control plane's table), and the incident's range is text too: both cast to the column's type
    texts: list[str] = []
    if s.object_kind(SCHEMA, "writes") is not None:
        texts = [
            r[0]
            for r in s.fetchall(
                f"SELECT DISTINCT p FROM (SELECT unnest(partitions) AS p FROM {SCHEMA}.writes "
                f"WHERE dataset = {sql_literal(spec.dataset)} AND generation IN ({gens})) WHERE p IS NOT NULL"
            )
        ]
    if inputs.partitions is not None:
        texts += [v.isoformat() if hasattr(v, "isoformat") else str(v) for v in inputs.partitions]
    if texts:
        values = ", ".join(f"({sql_literal(x)})" for x in texts)
        written.append(
            f"SELECT min(TRY_CAST(x AS {column_type})), max(TRY_CAST(x AS {column_type})) "
            f"FROM (VALUES {values}) AS v(x)"
        )
    row = s.fetchone(f"SELECT min(lo), max(hi) FROM ({' UNION ALL '.join(written)})")
    if row is None or row[0] is None or row[1] is None:
        return None
    lo, hi = row
    return Footprint(_bound(lo, column_type), _bound(hi, column_type), str(lo), str(hi), column_type)


WIDE_SHARE = 0.5
"""A footprint range holding at least this share of the target's rows is classified as a whole-table
run and narrowed to the footprint's keys after (``is_wide``)."""


def is_wide(s: Session, inputs: ReconcileInputs, fp: Footprint) -> bool:
    """Whether the footprint range holds most of the target (one pass over its partition column).

    A footprint pays passes of its own before the classification (its candidate keys through the
    transform, the target's rows of its keys), which only pay back when it leaves most of the table
    out; a backfill that recomputed most of the history is cheaper classified whole. The labels are
    the same either way: a footprint run labels each of its keys as a whole-table run does."""
    target = inputs.spec.target.table_name.sql()
    part = quote(inputs.spec.target.partition)
    row = s.fetchone(f"SELECT count(*) FILTER (WHERE {fp.between(part)}), count(*) FROM {target}")
    return bool(row and row[1] and row[0] >= WIDE_SHARE * row[1])


def footprint_keys_sql(s: Session, inputs: ReconcileInputs, fp: Footprint, recon: str) -> str:
    """The keys of a whole-table run's ``recon`` that lie in the footprint: written by the failed
    generations, held in the range, or expected there (every other damaged key is drift)."""
    key = quote_all(inputs.spec.key)
    has_delta = has_dataset_table(s, "delta", inputs.spec.dataset)
    inside = written_keys_sql(inputs, fp, has_delta, within=recon) + [
        f"SELECT {key} FROM {recon} WHERE {fp.between('expected_partition')}"
    ]
    return " UNION ALL ".join(inside)


def written_keys_sql(inputs: ReconcileInputs, fp: Footprint, has_delta: bool, within: str | None = None) -> list[str]:
    """SELECTs of the footprint's keys read from the target and the write log (each its own scan, so
    the range's is pruned by the partition predicate). ``within``: only keys of that relation."""
    spec = inputs.spec
    key = quote_all(spec.key)
    part, gen = quote(spec.target.partition), quote(spec.target.metadata.generation)
    gens = str_list(list(inputs.failed_generations))
    semi = f" SEMI JOIN {within} USING ({key})" if within else ""
    target = spec.target.table_name.sql()
    out = [
        f"SELECT {key} FROM {target}{semi} WHERE {fp.between(part)}",
        f"SELECT {key} FROM {target}{semi} WHERE {gen} IN ({gens})",
    ]
    if has_delta:
        out.append(f"SELECT {key} FROM {delta_table(inputs.spec.dataset)}{semi} WHERE {gen} IN ({gens})")
    return out


def stage_candidates(s: Session, inputs: ReconcileInputs, fp: Footprint, watermark: Any) -> None:
    """``__fp_t`` (footprint keys from the target and the write log) and ``__fp_cand`` (those, plus
    every source key any change of which the transform files in the range): the keys whose
    source history is resolved."""
    spec = inputs.spec
    src = spec.source
    key = quote_all(spec.key)
    has_delta = has_dataset_table(s, "delta", spec.dataset)
    s.temp_table("__fp_t", f"{' UNION '.join(written_keys_sql(inputs, fp, has_delta))}")
    where = f" WHERE {quote(src.ingested_at)} <= {ts_literal(watermark)}" if watermark else ""
    changes = f"SELECT * FROM {src.table_name.sql()}{where}"
    s.temp_table(
        "__fp_cand",
        f"SELECT {key} FROM __fp_t UNION "
        f"SELECT {key} FROM ({render(spec.transform_sql, source=changes)}) "
        f"WHERE {fp.between(quote(spec.target.partition))}",
    )


def stage_footprint(s: Session, inputs: ReconcileInputs, fp: Footprint) -> None:
    """``__fp``: the footprint's keys (from ``__fp_t`` and the expected rows ``__e`` of the candidates)."""
    key = quote_all(inputs.spec.key)
    s.temp_table(
        "__fp",
        f"SELECT {key} FROM __fp_t UNION SELECT {key} FROM __e WHERE {fp.between(quote(inputs.spec.target.partition))}",
    )


def drift_outside_sql(s: Session, inputs: ReconcileInputs, fp: Footprint) -> str:
    """Damaged keys of a whole-table run (``__recon``) outside the footprint: drift, not the backfill's damage."""
    key = quote_all(inputs.spec.key)
    inside = footprint_keys_sql(s, inputs, fp, "__recon")
    return f"SELECT label, count(*) FROM __recon ANTI JOIN ({inside}) USING ({key}) GROUP BY 1 ORDER BY 1"
