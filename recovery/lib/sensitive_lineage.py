"""Sensitive columns followed by lineage, not by name.

A consumer that writes ``any_value(customer_id) AS top_customer`` holds a customer id
under another name; hashing evidence columns by name alone would copy it in clear.
So the transform and every consumer SQL are read with sqlglot's column lineage: a
target column is sensitive when declared (``target.sensitive``) or derived from a
declared source column (``source.sensitive``), and a consumer's output column is
sensitive when derived from a sensitive target column. The evidence bundle hashes
all of them.

Some SQL exposes a sensitive value where no column hash can hide it: a PIVOT on a
sensitive column turns its values into column *names*. Such a consumer (or a SQL
whose lineage sqlglot cannot follow while it mentions a sensitive column) is refused
at spec time, naming the column and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot
import sqlglot.expressions as exp

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Exposure:
    """A place where a sensitive value would leave in a form no column hash can cover."""

    field: str  # the spec field, e.g. downstream[2].sql
    column: str  # the sensitive column involved
    why: str


@dataclass(frozen=True)
class SensitiveLineage:
    target: frozenset[str]  # target columns holding or derived from a sensitive value
    consumers: dict[str, frozenset[str]] = field(default_factory=dict)  # consumer name -> derived output columns
    exposures: tuple[Exposure, ...] = ()

    def all_columns(self) -> set[str]:
        return set(self.target).union(*self.consumers.values()) if self.consumers else set(self.target)


def derived_outputs(sql: str, placeholder: str, columns: dict[str, str], sensitive: set[str]) -> dict[str, set[str]]:
    """For each output column of ``sql`` (which reads ``{{ placeholder }}`` shaped like
    ``columns``), the sensitive input columns it derives from (empty sets left out).
    Raises ``ValueError`` when the lineage cannot be followed."""
    name = f"__{placeholder}__"
    text = _PLACEHOLDER.sub(name, sql.strip().rstrip(";"))
    schema: dict[str, object] = {name: dict(columns)}
    # sqlglot's lineage and optimizer load here, not with every command (a tenth of a second)
    from sqlglot.lineage import lineage
    from sqlglot.optimizer.qualify import qualify

    try:
        tree = qualify(sqlglot.parse_one(text, read="duckdb"), schema=schema, dialect="duckdb")
        if not isinstance(tree, exp.Query):  # only a query has output columns to follow
            raise ValueError(f"not a query: {text[:200]}")
        out: dict[str, set[str]] = {}
        for col in tree.named_selects:
            node = lineage(col, tree, schema=schema, dialect="duckdb")
            leaves = {n.name.split(".")[-1].strip('"') for n in node.walk() if not n.downstream}
            hits = {c for c in leaves if c.lower() in sensitive}
            if hits:
                out[col] = hits
        return out
    except (sqlglot.errors.SqlglotError, RecursionError, KeyError, AttributeError) as e:
        raise ValueError(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}") from None


def _pivot_exposures(sql: str, placeholder: str, sensitive: set[str], fld: str) -> list[Exposure]:
    name = f"__{placeholder}__"
    try:
        tree = sqlglot.parse_one(_PLACEHOLDER.sub(name, sql), read="duckdb")
    except (sqlglot.errors.SqlglotError, RecursionError):
        return []
    found = []
    for pivot in tree.find_all(exp.Pivot):
        if pivot.args.get("unpivot"):
            continue  # column names become values: no value becomes a name
        # DuckDB's PIVOT t ON col USING agg keeps the ON columns in expressions; standard PIVOT in fields
        on = (pivot.args.get("expressions") or []) if pivot.args.get("using") else (pivot.args.get("fields") or [])
        for f in on:
            for c in f.find_all(exp.Column):
                if c.name.lower() in sensitive:
                    found.append(
                        Exposure(
                            fld,
                            c.name,
                            "a PIVOT on it turns its values into column names, which no column hash can hide",
                        )
                    )
    return found


def follow_sensitive(spec, source_columns: dict[str, str], target_columns: dict[str, str]) -> SensitiveLineage:
    """The sensitive columns of the target and of every consumer, by lineage through the
    transform (over the source) and each consumer's SQL (over the target)."""
    src_sensitive = {c.lower() for c in spec.source.sensitive}
    target = {c.lower() for c in spec.target.sensitive}
    exposures: list[Exposure] = []
    # key columns keep their names through the transform: a sensitive key stays sensitive
    target |= {c.lower() for c in spec.source.key if c.lower() in src_sensitive}
    if src_sensitive and spec.transform_sql:
        pivots = _pivot_exposures(spec.transform_sql, "source", src_sensitive, "target.transform")
        exposures += pivots
        try:
            target |= {c.lower() for c in derived_outputs(spec.transform_sql, "source", source_columns, src_sensitive)}
        except ValueError as e:
            if _mentions(spec.transform_sql, src_sensitive) and not pivots:
                exposures.append(
                    Exposure(
                        "target.transform",
                        ", ".join(sorted(src_sensitive & _words(spec.transform_sql))),
                        f"its lineage cannot be followed ({e}), so derived columns cannot be hashed",
                    )
                )
    consumers: dict[str, frozenset[str]] = {}
    for i, d in enumerate(spec.downstream):
        sql = spec.downstream_sql.get(d.name, "")
        fld = f"downstream[{i}].sql"
        if not target or not sql:
            consumers[d.name] = frozenset()
            continue
        pivots = _pivot_exposures(sql, "target", target, fld)  # the precise reason first
        exposures += pivots
        try:
            derived = derived_outputs(sql, "target", target_columns, target)
        except ValueError as e:
            derived = {}
            if _mentions(sql, target) and not pivots:
                exposures.append(
                    Exposure(
                        fld,
                        ", ".join(sorted(target & _words(sql))),
                        f"its lineage cannot be followed ({e}), so derived columns cannot be hashed",
                    )
                )
        consumers[d.name] = frozenset(c.lower() for c in derived)
    return SensitiveLineage(frozenset(target), consumers, tuple(exposures))


def _words(sql: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}


def _mentions(sql: str, names: set[str]) -> bool:
    return bool(_words(sql) & names)
