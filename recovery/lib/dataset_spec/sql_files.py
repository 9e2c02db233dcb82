"""User SQL files: one SELECT with named placeholders, rendered by substitution.

A transform reads ``{{ source }}``; a downstream consumer reads ``{{ target }}``.
The package substitutes a parenthesised relation, so the user's SQL never sees the
physical names of generations or snapshots.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sqlglot
import sqlglot.expressions as exp

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def render(sql: str, **relations: str) -> str:
    """Replace each ``{{ name }}`` with ``(relation) AS name``-ready text."""

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in relations:
            raise ValueError(f"unknown placeholder {{{{ {name} }}}}")
        return f"({relations[name]})"

    return _PLACEHOLDER.sub(sub, sql.strip().rstrip(";"))


def check_single_select(sql: str, placeholder: str) -> None:
    """Raise ValueError unless ``sql`` is exactly one query reading ``{{ placeholder }}``."""
    problem = _single_select_problem(sql, placeholder)
    if problem is not None:
        raise ValueError(problem)


@lru_cache(maxsize=256)
def _single_select_problem(sql: str, placeholder: str) -> str | None:
    """What is wrong with ``sql`` as one query reading ``{{ placeholder }}``, else None. A function of
    the text alone, so a process that parses the same spec again (the command, its code location, its
    runs' steps) parses each file's SQL once."""
    names = set(_PLACEHOLDER.findall(sql))
    if placeholder not in names:
        return f"it never reads {{{{ {placeholder} }}}}"
    if names - {placeholder}:
        return f"unknown placeholder(s) {sorted(names - {placeholder})}"
    probe = _PLACEHOLDER.sub("__placeholder__", sql.strip())
    try:
        statements = [s for s in sqlglot.parse(probe, read="duckdb") if s is not None]
    except (sqlglot.errors.SqlglotError, RecursionError) as e:  # tokenizer errors and absurd nesting too
        return f"SQL does not parse: {(str(e).splitlines() or [type(e).__name__])[0]}"
    if len(statements) != 1:
        return f"holds {len(statements)} statements, expected one SELECT"
    if not isinstance(statements[0], exp.Query):
        return f"is a {statements[0].key.upper()} statement, expected a SELECT"
    return None


def joins_nothing(sql: str, placeholder: str) -> bool:
    """Whether ``sql`` reads ``{{ placeholder }}`` alone, with no join of its own (its CTEs aside).

    The reconciliation chooses its own joins' build sides (``Session.joins_as_written``) only
    around a transform like that: the setting holds for a whole statement, and a transform's own
    join, written with its large side on the right, would then be built from that side. False
    when in doubt (the SQL does not parse)."""
    probe = _PLACEHOLDER.sub("__placeholder__", sql.strip().rstrip(";"))
    try:
        tree = sqlglot.parse_one(probe, read="duckdb")
    except (sqlglot.errors.SqlglotError, RecursionError):
        return False
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    tables = {t.name for t in tree.find_all(exp.Table)}
    return tree.find(exp.Join) is None and tables <= {"__placeholder__", *ctes}
