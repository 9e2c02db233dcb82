"""Reading the phases' SQL for the Spark engine: what a statement touches, and its Spark text.

The phases write one canonical dialect (DuckDB's). The Spark engine needs three things
from each statement, all done on sqlglot's syntax tree rather than by string surgery:
which relations it reads (to route it: a statement naming no Spark relation runs in the
control store as it is), the query with its ``?`` parameters bound as literals (a named
write operation hands over SELECTs and predicates, bound before they are combined), and
the Spark SQL of a query with every relation renamed to the temporary view the engine
registered for it. No DML is read here: writes reach the engine as named operations.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import sqlglot
import sqlglot.expressions as exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.tokens import TokenType

from recovery.lib.control_names import SCHEMA as CONTROL_SCHEMA
from recovery.lib.control_names import is_dataset_table_name
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import sql_literal as literal_sql

_FLAT = re.compile(r"[^A-Za-z0-9_]")


class _KnownCommands(logging.Filter):
    """sqlglot warns when it keeps a statement it has no grammar for (DuckDB's ``RESET VARIABLE``)
    as a ``Command``; the engine routes those to the control store on purpose, so the warning
    only reached the person running the recovery as noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "contains unsupported syntax" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_KnownCommands())


def is_data_relation(schema: str, name: str) -> bool:
    """Datasets, namespaces, consumers, and the per-dataset logs that grow with the data
    (``_recovery.<kind>__<dataset>``) live in Spark; the small transactional control
    plane stays in the store that gives it transactions."""
    if not schema or schema.lower() in ("information_schema", "pg_catalog", "main", "temp"):
        return False
    return schema != CONTROL_SCHEMA or is_dataset_table_name(name)


def full_name(schema: str, name: str) -> str:
    return f"{schema}.{name}" if schema else name


def flat_name(prefix: str, schema: str, name: str) -> str:
    return _FLAT.sub("_", f"{prefix}__{schema}__{name}")


def bind(sql: str, params: Sequence[Any] | None) -> str:
    """Replace each ``?`` (a placeholder token, not one inside a string) by its literal."""
    params = list(params or [])
    holes = [t for t in DuckDB().tokenize(sql) if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    if len(holes) != len(params):
        raise ValueError(f"statement has {len(holes)} parameters but {len(params)} values were given")
    out, last = [], 0
    for tok, value in zip(holes, params):
        out.append(sql[last : tok.start])
        out.append(literal_sql(value))
        last = tok.end + 1
    out.append(sql[last:])
    return "".join(out)


def parse(sql: str) -> exp.Expression:
    tree = sqlglot.parse_one(sql, read="duckdb")
    if not isinstance(tree, exp.Expression):  # every statement node is one; the base Expr is abstract
        raise RecoveryError(f"not a SQL statement: {sql[:200]}")
    return tree


def cte_names(tree: exp.Expression) -> set[str]:
    return {c.alias_or_name for c in tree.find_all(exp.CTE)}


def relations(tree: exp.Expression) -> list[exp.Table]:
    """Relations a statement names (not CTEs, not table functions such as ``range``)."""
    ctes = cte_names(tree)
    out = []
    for t in tree.find_all(exp.Table):
        if not t.name or isinstance(t.this, exp.Func):
            continue
        if not t.db and t.name in ctes:
            continue
        out.append(t)
    return out


def is_query(tree: exp.Expression) -> bool:
    """Whether a parsed statement is a query (``SELECT``, a set operation, a parenthesized one)."""
    return isinstance(tree, (exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Subquery))


def query_of(tree: exp.Expression) -> exp.Expression | None:
    """The query a statement reads rows from, when it only reads: a query itself, or ``DESCRIBE``'s.
    Anything else (DDL, DML, ``COPY``) is None: the Spark engine runs no write given as SQL text."""
    if is_query(tree):
        return tree
    if isinstance(tree, exp.Describe):
        return tree.this
    return None


def unqualify(select: exp.Select, star_columns: Callable[[exp.Expression], list[str]]) -> None:
    """``QUALIFY`` as a filter over a subquery that computes the condition as a column.

    sqlglot's own rewrite keeps its helper column in ``SELECT *``; here the outer query
    names exactly the columns the query had, as the engine resolves them.
    """
    cond = select.args["qualify"].this.copy()
    order, limit = select.args.get("order"), select.args.get("limit")
    inner = select.copy()
    for arg in ("qualify", "order", "limit"):
        inner.set(arg, None)
    names = star_columns(exp.Subquery(this=inner.copy()))
    inner = inner.select(exp.alias_(exp.paren(cond), "__qualify", quoted=True))
    outer = exp.select(*[exp.column(n, quoted=True) for n in names]).from_(
        exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("__qualified")))
    )
    outer = outer.where(exp.column("__qualify", quoted=True))
    if order is not None:
        order = order.copy()
        for c in order.find_all(exp.Column):
            c.set("table", None)
        outer.set("order", order)
    if limit is not None:
        outer.set("limit", limit.copy())
    select.replace(outer) if select.parent is not None else None
    if select.parent is None:  # the statement itself: mutate in place
        for k, v in outer.args.items():
            select.set(k, v)
        select.set("qualify", None)


def to_spark(
    query: exp.Expression,
    rename: Callable[[exp.Table], str | None],
    star_columns: Callable[[exp.Expression], list[str]],
) -> str:
    """Spark SQL of a (bound) query, every relation replaced by the view ``rename`` gives.

    ``SELECT * EXCLUDE (...)`` is expanded to the remaining columns (Spark has no
    ``* EXCEPT``); a relation without an alias keeps its name as the alias, so columns
    qualified by the table name still resolve.
    """
    tree = query.copy()
    ctes = cte_names(tree)
    select: exp.Select | None
    for select in reversed(list(tree.find_all(exp.Select))):
        if select.args.get("qualify") is not None:
            unqualify(select, star_columns)
    for star in list(tree.find_all(exp.Star)):
        excluded, replaced = star.args.get("except"), star.args.get("replace")
        if not excluded and not replaced:
            continue
        select = star.find_ancestor(exp.Select)
        source = select.args.get("from_") if select else None
        relation = source.this if source is not None else None
        if select is None or select.args.get("joins") or not isinstance(relation, (exp.Table, exp.Subquery)):
            raise NotImplementedError("SELECT * EXCLUDE/REPLACE over more than one relation")
        drop = {e.name.lower() for e in excluded or []}
        swap = {a.alias.lower(): a for a in replaced or []}
        keep = [
            swap[c.lower()].copy() if c.lower() in swap else exp.column(c, quoted=True)
            for c in star_columns(relation)
            if c.lower() not in drop
        ]
        i = select.expressions.index(star)
        select.set("expressions", select.expressions[:i] + keep + select.expressions[i + 1 :])
    # a relation's alias passed to a function is the row as a struct in DuckDB (hash(t),
    # to_json(t)); Spark spells that struct(t.a, t.b, ...)
    for select in tree.find_all(exp.Select):
        sources = [select.args.get("from_")] + list(select.args.get("joins") or [])
        aliases = {src.this.alias_or_name: src.this for src in sources if src is not None and src.this is not None}
        for c in list(select.find_all(exp.Column)):
            if (
                not c.table
                and c.name in aliases
                and isinstance(c.parent, exp.Func)
                and c.find_ancestor(exp.Select) is select
            ):
                cols = [exp.column(n, table=c.name, quoted=True) for n in star_columns(aliases[c.name])]
                c.replace(exp.Anonymous(this="STRUCT", expressions=cols))
    for t in list(tree.find_all(exp.Table)):
        if not t.name or isinstance(t.this, exp.Func) or (not t.db and t.name in ctes):
            continue
        view = rename(t)
        if view is None:
            continue
        alias = t.alias or t.name
        t.set("this", exp.to_identifier(view, quoted=True))
        t.set("db", None)
        t.set("catalog", None)
        t.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    # a column qualified as schema.table.column keeps only its table part
    for c in tree.find_all(exp.Column):
        if c.args.get("db") is not None:
            c.set("db", None)
            c.set("catalog", None)
    return tree.sql("spark")
